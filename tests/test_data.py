"""Prompt loading: local files, the prompt column, chat templates, and sharding across rollout groups."""
import json

import pytest

from rlcore.config import DataConfig
from rlcore.data import PromptStream, load_table, tokenize_prompts
from rlcore.tasks import tiny

ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10, 42)]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_jsonl_and_parquet_load_the_same_rows(jsonl, tmp_path):
    table = load_table(str(jsonl), "train", "", "data.path")
    table.to_parquet(str(tmp_path / "p.parquet"))
    again = load_table(str(tmp_path / "p.parquet"), "train", "", "data.path")
    assert table.column_names == ["prompt", "answer"] and list(again) == list(table) == ROWS


def test_bad_paths(tmp_path):
    (tmp_path / "p.csv").write_text("prompt\n1+1=\n")
    with pytest.raises(ValueError, match=r"data.path '.*p.csv' has an unsupported type '.csv'"):
        load_table(str(tmp_path / "p.csv"), "train", "", "data.path")
    with pytest.raises(ValueError, match="data.eval_path '.*missing.jsonl' does not exist"):
        load_table(str(tmp_path / "missing.jsonl"), "train", "", "data.eval_path")


def test_prompt_column_and_length_filter(jsonl):
    tok = tiny.build_tokenizer()
    table = load_table(str(jsonl), "train", "", "data.path")
    with pytest.raises(ValueError, match="data.prompt_column 'question' is not a column of data.path"):
        tokenize_prompts(table, DataConfig(prompt_column="question"), tok, "data.path")
    out = tokenize_prompts(table, DataConfig(max_prompt_tokens=7), tok, "data.path")
    assert out[0]["prompt_ids"] == [1, 5, 4, 14, 5, 4, 17]  # <bos> 1 0 + 1 0 =
    assert len(out) == len(ROWS)  # "<bos>" + 6 characters = 7 tokens: nothing dropped
    with pytest.raises(ValueError, match=r"no prompt of data.path fits data.max_prompt_tokens=6 \(the shortest "
                                         r"has 7 tokens\)"):
        tokenize_prompts(table, DataConfig(max_prompt_tokens=6), tok, "data.path")


def test_chat_template(jsonl):
    tok = tiny.build_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}?{% endfor %}{% if add_generation_prompt %}={% endif %}"
    table = load_table(str(jsonl), "train", "", "data.path")
    out = tokenize_prompts(table, DataConfig(chat_template=True, system_prompt="0"), tok, "data.path")
    assert tok.decode(out[0]["prompt_ids"], skip_special_tokens=True) == "0?10+10=?="


def test_groups_get_disjoint_prompts_and_epochs_reshuffle(jsonl):
    table = load_table(str(jsonl), "train", "", "data.path")
    streams = [PromptStream(table, batch_size=4, groups=2, group=g, seed=0) for g in range(2)]
    epoch0 = [[r["prompt"] for _ in range(4) for r in s.next_batch()] for s in streams]
    assert not set(epoch0[0]) & set(epoch0[1]) and len(set(epoch0[0])) == 16
    again = PromptStream(table, batch_size=4, groups=2, group=0, seed=0)
    assert [r["prompt"] for r in again.next_batch()] == epoch0[0][:4]  # same seed, same order
    epoch1 = [r["prompt"] for _ in range(4) for r in streams[0].next_batch()]
    assert epoch1 != epoch0[0] and streams[0].epoch == 1
    with pytest.raises(ValueError, match="fewer than one step needs"):
        PromptStream(table, batch_size=20, groups=2, group=0, seed=0)


def test_the_tiny_tokenizer_loads_as_saved(tmp_path):
    """A character-level tokenizer saved beside a qwen2 config keeps its spaces (AutoTokenizer alone would
    swap in Qwen2Tokenizer, which drops them): environment text is encoded as the model was taught."""
    from rlcore.data import load_tokenizer
    from rlcore.tasks import tiny
    tokenizer = load_tokenizer(str(tiny.build_random_model(tmp_path / "m")))
    assert tokenizer(" 47= ").input_ids == [1, 19, 8, 11, 17, 19]
    assert tokenizer.decode([8, 11, 19, 2], skip_special_tokens=True) == "47 "
