"""Built-in rewards on hand-picked strings; resolution of reward specs; the weighted sum; bad rewards."""
import math

import pytest
import torch

from rlcore import rewards
from rlcore.rewards import RewardError, arithmetic_exact, final_number, gsm8k, resolve, score


def test_arithmetic_exact():
    got = arithmetic_exact(["12+34="] * 4, ["46", " 46 ", "046", "47"], answer=["46"] * 4)
    assert got == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("text, number", [
    ("3 + 4 = 7. #### 1,234", 1234.0), ("The answer is $72.", 72.0), ("no idea", None),
    ("first 5 then 6 #### -3", -3.0), ("it is 2.50 dollars", 2.5),
])
def test_final_number(text, number):
    assert final_number(text) == number


def test_gsm8k():
    refs = ["Natalia sold 48/2 = 24 clips. #### 72"] * 3
    assert gsm8k(["q"] * 3, ["so 72", "#### 72.0", "about 71"], answer=refs) == [1.0, 1.0, 0.0]


def test_resolve_module_file_and_callable(tmp_path):
    (tmp_path / "mine.py").write_text("def length(prompts, completions, **c):\n"
                                      "    return [float(len(x)) for x in completions]\n")
    assert resolve("rlcore.rewards:gsm8k") is gsm8k
    assert resolve(f"{tmp_path}/mine.py:length")(["p"], ["abc"]) == [3.0]
    assert resolve(arithmetic_exact) is arithmetic_exact
    with pytest.raises(ValueError, match="has no function 'nope'"):
        resolve("rlcore.rewards:nope")
    with pytest.raises(ValueError, match="does not exist"):
        resolve(f"{tmp_path}/missing.py:f")


def test_weighted_sum():
    def length(prompts, completions, **_):
        return [float(len(c)) for c in completions]

    total, per_fn = score([(arithmetic_exact, 2.0), (length, 0.5)], ["1+1=", "1+2="], ["2", "33"],
                          {"answer": ["2", "3"]})
    assert torch.equal(total, torch.tensor([2.0 * 1 + 0.5 * 1, 2.0 * 0 + 0.5 * 2]))
    assert per_fn["arithmetic_exact"].tolist() == [1.0, 0.0]


def _raises(prompts, completions, **_):
    return [1.0 / (len(c) - 2) for c in completions]  # ZeroDivisionError on a 2-character completion


def _short(prompts, completions, **_):
    return [0.0]


def _nan(prompts, completions, **_):
    return [0.0, math.nan]


def _text(prompts, completions, **_):
    return ["1", "0"]


@pytest.mark.parametrize("fn, message", [
    (_raises, "reward function '_raises' raised on sample 1 (prompt '1+2=', completion '33'): ZeroDivisionError"),
    (_short, "reward function '_short' returned 1 scores for 2 samples"),
    (_nan, "reward function '_nan' returned nan (NaN or inf) for sample 1"),
    (_text, "reward function '_text' returned '1' (not a number) for sample 0"),
])
def test_bad_reward_functions(fn, message):
    with pytest.raises(RewardError) as e:
        score([(fn, 1.0)], ["1+1=", "1+2="], ["2", "33"], {"answer": ["2", "3"]})
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_builtins_are_listed_in_the_module():
    assert {"arithmetic_exact", "gsm8k"} <= set(dir(rewards))


def test_score_takes_reward_specs_by_name_and_keeps_repeats_apart():
    from rlcore.config import RewardSpec

    specs = [RewardSpec(fn="arithmetic_exact", weight=1.0), RewardSpec(fn=arithmetic_exact, weight=0.5)]
    total, per_fn = score(specs, ["1+1=", "1+2="], ["2", "4"], {"answer": ["2", "3"]})
    assert total.tolist() == [1.5, 0.0] and set(per_fn) == {"arithmetic_exact", "arithmetic_exact#2"}


def test_bools_count_as_numbers_and_a_non_list_is_an_error():
    total, _ = score([(lambda p, c, **_: [x == "2" for x in c], 1.0)], ["1+1=", "1+2="], ["2", "4"], {})
    assert total.tolist() == [1.0, 0.0]

    def scalar(prompts, completions, **_):
        return 1.0

    with pytest.raises(RewardError, match="reward function 'scalar' returned a float, not a list of scores for 2 samples"):
        score([(scalar, 1.0)], ["a", "b"], ["x", "y"], {})


def test_resolve_errors_name_the_spec(tmp_path):
    with pytest.raises(ValueError, match="reward 'no_such_reward' is not a built-in"):
        resolve("no_such_reward")
    with pytest.raises(ValueError, match="reward 'not_a_module_xyz:f': cannot import module"):
        resolve("not_a_module_xyz:f")
    (tmp_path / "broken.py").write_text("import not_a_module_xyz\n")
    with pytest.raises(ValueError, match=r"broken.py:f': running .* failed: ModuleNotFoundError"):
        resolve(f"{tmp_path}/broken.py:f")
