"""Whatever a model writes, the tool-call parsers and the observation path answer with something bounded and
encodable, quickly, and never raise (rlcore.rollout.toolcall, .tools, .observation). Seeded random texts
built from the pieces that break parsers (markers, brackets, escapes, NaN, 5000-digit integers, lone
surrogates, megabytes), plus the known worst cases one by one; each goes through all three formats, a
ToolEnv's step within a turn's limits, and the startup path's real encoder (rlcore.tasks.tiny's chat tokenizer)."""
import json
import random
import time

import pytest

from rlcore.rollout.env import Limits, as_step, within
from rlcore.rollout.observation import CHARS_PER_TOKEN, Unencodable, bounded
from rlcore.rollout.toolcall import MAX_ERRORS, PARSERS, parse
from rlcore.rollout.tools import Toolbox, ToolEnv

MAX_CALLS, MAX_CHARS, MAX_TOTAL = 8, 2000, 4096


def add(a: int, b: float = 1.0) -> float:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def echo(text: str) -> str:
    """Repeat a text (a tool that returns what the model wrote).

    Args:
        text: what to repeat
    """
    return text


def odd(kind: str):
    """Return an awkward value.

    Args:
        kind: nan, circular, deep, surrogate or huge
    """
    if kind == "circular":
        loop = []
        loop.append(loop)
        return loop
    deep = []
    for _ in range(5000):
        deep = [deep]
    return {"nan": float("nan"), "deep": deep, "surrogate": "\ud800" * 10, "huge": "x" * 10 ** 7}.get(kind, kind)


TOOLS = [add, echo, odd]
ENVS = {fmt: type(f"Fuzz_{fmt}", (ToolEnv,), {"toolbox": Toolbox(TOOLS, format=fmt, max_chars=MAX_CHARS)})
        for fmt in PARSERS}

PIECES = ["<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<|eom_id|>", "{", "}", "[", "]", '"',
          ":", ",", ";", "\\", "\\u", "\\ud800", "\\udfff\\ud800", "\ud800", "\udfff", "NaN", "Infinity", "-Infinity",
          "1e400", "-1e999", "9" * 5000, '"name"', '"arguments"', '"parameters"', '"add"', '"echo"', '"odd"', '"a"',
          '"text"', '"kind"', "true", "null", "0", "-1.5", " ", "\n", "\x00", "\u2603", "\U0001f600", "<|im_end|>",
          "x" * 1000]
CALLS = ['{"name": "add", "arguments": {"a": 2, "b": 40}}', '{"name": "echo", "arguments": {"text": "hi"}}',
         '{"name": "odd", "arguments": {"kind": "%s"}}', '{"name": "echo", "parameters": {"text": "\\ud800"}}']


def wrap(fmt: str, body: str) -> str:
    return {"hermes": f"<tool_call>{body}</tool_call>", "llama3": f"<|python_tag|>{body}",
            "mistral": f"[TOOL_CALLS][{body}]"}[fmt]


def adversarial() -> list[str]:
    """The worst cases known, each as model text (JSON escapes decode to lone surrogates)."""
    big = "A\\ud800" * 200_000  # 1.4 MB of text, a lone surrogate every two characters once decoded
    cases = []
    for fmt in PARSERS:
        cases += [wrap(fmt, "[" * 1000), wrap(fmt, "{" * 5000), wrap(fmt, '{"a":' * 900 + "1" + "}" * 900),
                  wrap(fmt, '{"name": "\\ud800", "arguments": {}}'),
                  wrap(fmt, '{"name": "' + "n" * 100_000 + '", "arguments": {}}'),
                  wrap(fmt, '{"name": ' + json.dumps(list(range(10_000))) + "}"),
                  wrap(fmt, '{"name": "echo", "arguments": {"text": "' + big + '"}}'),
                  wrap(fmt, '{"name": "add", "arguments": {"a": ' + "7" * 5000 + "}}"),
                  wrap(fmt, '{"name": "add", "arguments": {"a": NaN, "b": 1e400}}'),
                  wrap(fmt, '{"name": "add", "arguments": {"' + "k\\udfff" * 5000 + '": 1}}'),
                  wrap(fmt, '{"name": "echo", "arguments": {"text": "a"}};' * 20_000),
                  wrap(fmt, ",".join([CALLS[0]] * 100))]
        cases += [wrap(fmt, CALLS[2] % kind) for kind in ("nan", "circular", "deep", "surrogate", "huge")]
    cases += ["<tool_call>" * 20_000, "<tool_call>" * 5000 + "</tool_call>", "<tool_call>{}</tool_call>" * 20_000,
              "<tool_call>" + "\\" * 100_000, '<tool_call>"' + '\\"' * 100_000, "x" * 3_000_000]
    return cases


def random_texts(rng: random.Random, n: int) -> list[str]:
    texts = []
    for _ in range(n):
        pieces = rng.choices(PIECES + CALLS, k=rng.choice([1, 5, 50, 500, 5000, 20_000]))
        text = "".join(p % rng.choice(["nan", "deep", "x"]) if "%s" in p else p for p in pieces)
        if rng.random() < 0.5:
            text = wrap(rng.choice(list(PARSERS)), text)
        texts.append(text)
    return texts


@pytest.fixture(scope="module")
def encode(tmp_path_factory):
    """The encoder the startup path builds (rlcore.rollout.envs.make_envs), on the tiny tool-calling tokenizer."""
    from rlcore.config import Config, DataConfig, ModelConfig, RolloutConfig
    from rlcore.preflight.checks import load_inputs
    from rlcore.tasks.tiny import build_chat_tokenizer
    tmp = tmp_path_factory.mktemp("fuzz")
    build_chat_tokenizer().save_pretrained(tmp / "model")
    (tmp / "train.jsonl").write_text(json.dumps({"prompt": "2+40?"}) + "\n")
    cfg = Config(model=ModelConfig(path=str(tmp / "model")),
                 data=DataConfig(path=str(tmp / "train.jsonl"), chat_template=True, max_prompt_tokens=4096),
                 rollout=RolloutConfig(env=ENVS["hermes"], max_new_tokens=64, max_total_tokens=MAX_TOTAL))
    tokenizer, _, _, envs, _ = load_inputs(cfg, 256)
    return tokenizer, envs.encode


def check_turn(fmt: str, text: str, tokenizer, encode) -> None:
    """One model turn through the parser, a ToolEnv's step (within a turn's limits) and the encoder."""
    calls, error = parse(fmt, text)
    assert isinstance(calls, list) and (error is None or isinstance(error, str))
    assert error is None or len(error) <= MAX_ERRORS * 300 + 40, error[:200]
    env = ENVS[fmt]({})
    step = as_step(within(Limits.starting_now(30.0, MAX_CALLS), env.step, text, []))
    if step.done:
        assert step.observation is None and not calls and error is None
        return
    messages = step.observation
    assert 1 <= len(messages) <= MAX_CALLS + 2
    for m in messages:
        assert len(m["content"]) <= MAX_CHARS + 40 and len(m.get("name", "")) <= 70
        (m["content"] + m.get("name", "")).encode("utf-8")  # no lone surrogate reaches the tokenizer
    assert env.stats.calls == len(calls) + (error is not None)
    assert env.stats.too_many_calls == max(len(calls) - MAX_CALLS, 0)
    ids = encode(messages)
    assert 0 < len(ids) <= MAX_TOTAL + 1 and all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids).startswith("\n<|im_start|>user\n<tool_response>")


def test_known_worst_cases(encode):
    tokenizer, enc = encode
    for text in adversarial():
        for fmt in PARSERS:
            t0 = time.perf_counter()
            check_turn(fmt, text, tokenizer, enc)
            assert time.perf_counter() - t0 < 5.0, (fmt, text[:60])


def test_seeded_random_turns(encode):
    tokenizer, enc = encode
    rng = random.Random(23)
    t0 = time.perf_counter()
    for text in random_texts(rng, 200):
        for fmt in PARSERS:
            check_turn(fmt, text, tokenizer, enc)
    assert time.perf_counter() - t0 < 60.0  # about 2 s


def test_parsers_take_linear_time():
    """Many short calls in one Llama/Mistral turn: slicing the rest of the text after each call made 40k calls
    (1.8 MB) take 4.4 s, quadratic; now a text past MAX_CALL_CHARS is refused at once and 5000 calls under it
    parse in 20 ms. Unclosed <tool_call> openers: the first reads to the end, one call."""
    one = '{"name": "echo", "arguments": {"text": "a"}};'
    for n, count, error in ((5000, 5000, None), (40_000, 0, "the call is 1800000 characters long; at most 262144 "
                                                              "are read")):
        t0 = time.perf_counter()
        calls, err = parse("llama3", one * n)
        assert (len(calls), err) == (count, error) and time.perf_counter() - t0 < 2.0
    t0 = time.perf_counter()
    assert parse("hermes", "<tool_call>" * 20_000) == ([], "invalid JSON (Expecting value, line 1 column 1)")
    calls, error = parse("hermes", "<tool_call>{}</tool_call>" * 20_000)
    assert calls == [] and error.endswith("; and 19997 more errors") and len(error) < 200
    assert time.perf_counter() - t0 < 2.0  # 0.06 s here; bounds for a loaded machine, far below quadratic


def test_errors_name_what_is_wrong():
    """The model reads these: short and specific."""
    assert parse("hermes", "<tool_call>" + "[" * 1000) == ([], "invalid JSON (nested deeper than 64 levels)")
    assert parse("llama3", '{"name": "add", "parameters": {"a": NaN}}') == ([], "invalid JSON (NaN is not a JSON number)")
    assert parse("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1e400}}]') == (
        [], "invalid JSON (1e400 is out of range)")
    _, error = parse("hermes", '<tool_call>{"name": "add", "arguments": {"a": ' + "7" * 5000 + "}}</tool_call>")
    assert error.startswith("invalid JSON (Exceeds the limit (4300 digits) for integer string conversion")
    _, error = parse("hermes", '<tool_call>{"name": ' + "1" * 5 + ", " + "x" * 300_000 + "}</tool_call>")
    assert error == "the call is 300017 characters long; at most 262144 are read"
    env = ENVS["hermes"]({})
    step = env.step('<tool_call>{"name": "\\ud800' + "z" * 100 + '", "arguments": {}}</tool_call>', [])
    assert step.observation == [{"role": "tool", "name": "?" + "z" * 63 + "...",
                                 "content": "error: unknown tool '?" + "z" * 63 + "...'; tools: add, echo, odd"}]
    step = env.step(wrap("hermes", CALLS[2] % "circular") + wrap("hermes", CALLS[2] % "deep"), [])
    assert [m["content"].split(":")[0] for m in step.observation] == ["error", "error"]
    assert env.stats.tool_raised == 2


def test_observations_are_cleaned_and_cut(encode):
    """Any environment's observation: lone surrogates become "?", strings are cut to CHARS_PER_TOKEN characters
    per token of budget in all, ids to one more than the budget (which the loop then drops)."""
    tokenizer, enc = encode
    assert bounded("a\ud800b", 10) == "a?b" and bounded([{"role": "tool", "content": "\udfff" * 3}], 2) == [
        {"role": "tool", "content": "??"}]
    assert tokenizer.decode(enc("\ud800x")) == "?x"
    assert len(enc("y" * 10_000_000)) == MAX_TOTAL + 1
    assert len(enc([{"role": "tool", "content": "z" * 10_000_000}] * 1000)) == MAX_TOTAL + 1
    assert len(enc(list(range(100)) * 100_000)) == MAX_TOTAL + 1
    assert CHARS_PER_TOKEN * MAX_TOTAL < 10_000_000
    with pytest.raises(ValueError, match="observation token id 300 is outside the model's vocabulary"):
        enc([300])  # the environment's bug: still stops the run


def test_content_a_template_refuses_fails_the_trajectory_not_the_run(tmp_path):
    from rlcore.rollout.observation import encoder
    from rlcore.tasks.tiny import HERMES_TEMPLATE, build_chat_tokenizer
    strict = "{%- for m in messages %}{%- if 'BOOM' in m.content %}{{ raise_exception('refused') }}{%- endif %}" \
             "{%- endfor %}" + HERMES_TEMPLATE
    enc = encoder(build_chat_tokenizer(strict), 256, 64)
    assert enc([{"role": "tool", "content": "ok"}])
    with pytest.raises(Unencodable, match=r"^its observation could not be encoded \(TemplateError: refused"):
        enc([{"role": "tool", "content": "BOOM"}])
