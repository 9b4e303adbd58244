"""Native tool calls (rlcore.rollout.tools and .toolcall): schemas from typed functions, one-line startup
errors, the parser of each model family, execution errors as messages the model reads (and their counts),
tools rendered through a real chat template (rlcore.tasks.tiny's Hermes template on a character-level tokenizer)
on the startup path, and a tool-call rollout through the turn loop."""
import asyncio
import json

import pytest

from rlcore.rollout.chat import check_prefix_preserving, observation_ids
from rlcore.rollout.env import Step, as_step
from rlcore.rollout.toolcall import PARSERS, ToolCall, parse_hermes, parse_llama3, parse_mistral
from rlcore.rollout.tools import Toolbox, ToolEnv, ToolStats, bad_tool_calls, python, tool_calls, tool_schema
from rlcore.tasks.tiny import build_chat_tokenizer


def add(a: int, b: float = 1.0) -> float:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: the numerator
        b: the denominator
    """
    return a / b


async def shout(text: str, times: list[int] | None = None) -> str:
    """Upper-case a text.

    Args:
        text: what to shout
        times: unused repeat counts
    """
    await asyncio.sleep(0)
    return text.upper()


# ---- declarations ----------------------------------------------------------------------------------------

def test_schema_from_a_typed_function():
    assert tool_schema(add, 0) == {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "the first"},
                                                        "b": {"type": "number", "description": "the second"}},
                       "required": ["a"]},
        "return": {"type": "number"}}}
    box = Toolbox([add, shout], format="llama3")
    assert box.names == ["add", "shout"] and box.parse is parse_llama3
    assert box.schemas[1]["function"]["parameters"]["properties"]["times"] == {
        "type": "array", "items": {"type": "integer"}, "nullable": True, "description": "unused repeat counts"}


def no_doc(a: int) -> int:
    return a


def no_hint(a) -> int:
    """No hint.

    Args:
        a: a number
    """
    return a


def no_args_section(a: int) -> int:
    """Has no Args section."""
    return a


HINT = "; tools need a type hint on every argument and a Google-style docstring"


@pytest.mark.parametrize("tools, fmt, message", [
    ([add, 3], "hermes", "tool 1 (3) is not callable" + HINT),
    ([no_doc], "hermes", "tool 'no_doc' has no docstring" + HINT),
    ([no_hint], "hermes", "tool 'no_hint': argument 'a' has no type hint" + HINT),
    ([no_args_section], "hermes", "tool 'no_args_section': the docstring has no description for the argument 'a'"
                                  + HINT),
    ([add, divide, add], "hermes", "two tools are named 'add'; tool names must be unique"),
    ([add], "qwen", "unknown tool-call format 'qwen'; valid: hermes, llama3, mistral"),
])
def test_bad_declarations_are_one_line_errors(tools, fmt, message):
    with pytest.raises(ValueError) as e:
        Toolbox(tools, format=fmt)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


# ---- parsers ----------------------------------------------------------------------------------------------

C1 = ToolCall("add", {"a": 2, "b": 40})
C2 = ToolCall("divide", {"a": 1, "b": 3})


@pytest.mark.parametrize("parse, text, calls, error", [
    # Hermes / Qwen: blocks anywhere in the turn, an unclosed last block read to the end
    (parse_hermes, 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>',
     [C1], None),
    (parse_hermes, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>\n'
                   '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 3}}', [C1, C2], None),
    (parse_hermes, '<tool_call>{"name": "add", </tool_call>', [],
     "invalid JSON (Expecting property name enclosed in double quotes, line 1 column 17)"),
    (parse_hermes, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>'
                   '<tool_call>{"arguments": {}}</tool_call>', [C1], 'tool call 2: no "name" field'),
    (parse_hermes, '<tool_call>{"name": "add", "arguments": "a=2"}</tool_call>', [],
     '"arguments" must be a JSON object, got string'),
    (parse_hermes, "<tool_call>[1, 2]</tool_call>", [], "a call must be a JSON object, got array"),
    (parse_hermes, 'The answer is {"name": "add"}.', [], None),
    # Llama 3.1 / 3.2: the whole turn, after <|python_tag|> or without it (a special token the decode drops)
    (parse_llama3, '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 40}}<|eom_id|>', [C1], None),
    (parse_llama3, ' {"name": "add", "arguments": {"a": 2, "b": 40}}; {"name": "divide", "parameters": '
                   '{"a": 1, "b": 3}};', [C1, C2], None),
    (parse_llama3, '{"name": "add", "parameters": {"a": 2,}}', [],
     "invalid JSON (Expecting property name enclosed in double quotes, line 1 column 39)"),
    (parse_llama3, '{"name": "add"} and then some', [], "unexpected text after the call: 'and then some'"),
    (parse_llama3, '{"parameters": {"a": 2}}', [], 'no "name" field'),
    (parse_llama3, '{"name": 7, "parameters": {}}', [], '"name" must be a non-empty string, got 7'),
    (parse_llama3, "The sum is 42.", [], None),
    # Mistral (before v11): [TOOL_CALLS] then a JSON list; without the marker, a turn starting with [{
    (parse_mistral, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 40}}]', [C1], None),
    (parse_mistral, '[{"name": "add", "arguments": {"a": 2, "b": 40}}, {"name": "divide", "arguments": '
                    '{"a": 1, "b": 3}}]', [C1, C2], None),
    (parse_mistral, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 40}]', [],
     "invalid JSON (Expecting ',' delimiter, line 1 column 48)"),
    (parse_mistral, '[TOOL_CALLS][{"arguments": {"a": 2}}, {"name": "divide", "arguments": {"a": 1, "b": 3}}]',
     [C2], 'no "name" field'),
    (parse_mistral, "[TOOL_CALLS][]", [], "an empty list of calls"),
    (parse_mistral, "The sum is [42].", [], None),
])
def test_parsers(parse, text, calls, error):
    assert parse(text) == (calls, error)


def test_hermes_parses_what_the_template_renders():
    """The template writes an assistant turn's tool_calls the way the model should: parsing it gives them back."""
    tok = build_chat_tokenizer()
    calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in (C1, C2)]
    text = tok.apply_chat_template([{"role": "user", "content": "?"},
                                    {"role": "assistant", "content": "", "tool_calls": calls}], tokenize=False)
    assert parse_hermes(text.split("<|im_start|>assistant\n")[1]) == ([C1, C2], None)


# ---- execution ----------------------------------------------------------------------------------------------

SIGNATURE = "; expected add(a: integer, b?: number)"


@pytest.mark.parametrize("call, content, kind", [
    (ToolCall("add", {"a": 2, "b": 40}), "42", None),
    (ToolCall("add", {"a": 2}), "3.0", None),
    (ToolCall("divide", {"a": 1, "b": 4}), "0.25", None),
    (ToolCall("shout", {"text": "hi", "times": None}), "HI", None),  # an async tool, nullable argument
    (ToolCall("sub", {"a": 1}), "error: unknown tool 'sub'; tools: add, divide, shout", "unknown_tool"),
    (ToolCall("add", {"b": 2}), "error: add: missing required argument 'a'" + SIGNATURE, "bad_arguments"),
    (ToolCall("add", {"a": 1, "c": 2}), "error: add: unexpected argument 'c'" + SIGNATURE, "bad_arguments"),
    (ToolCall("add", {"a": "2"}), "error: add: argument 'a' must be integer, got string" + SIGNATURE,
     "bad_arguments"),
    (ToolCall("add", {"a": 2.5}), "error: add: argument 'a' must be integer, got number" + SIGNATURE,
     "bad_arguments"),
    (ToolCall("add", {"a": True}), "error: add: argument 'a' must be integer, got boolean" + SIGNATURE,
     "bad_arguments"),
    (ToolCall("shout", {"text": "hi", "times": [1, "2"]}), "error: shout: argument 'times' item 1 must be "
     "integer, got string; expected shout(text: string, times?: array)", "bad_arguments"),
    (ToolCall("divide", {"a": 1, "b": 0}), "error: divide raised ZeroDivisionError: division by zero",
     "tool_raised"),
])
def test_calls_answer_with_readable_messages(call, content, kind):
    box = Toolbox([add, divide, shout])
    assert box.call(call) == (content, kind)


def test_run_returns_tool_messages_and_counts():
    box = Toolbox([add, divide])
    text = ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>'
            '<tool_call>{"name": "sub", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>')
    messages, stats = box.run(*box.parse(text))
    assert messages == [
        {"role": "tool", "name": "add", "content": "42"},
        {"role": "tool", "name": "sub", "content": "error: unknown tool 'sub'; tools: add, divide"},
        {"role": "tool", "name": "divide", "content": "error: divide raised ZeroDivisionError: division by zero"},
        {"role": "tool", "name": "add", "content": "error: add: missing required argument 'a'" + SIGNATURE},
        {"role": "tool", "content": "error: malformed tool call: tool call 5: invalid JSON (Expecting ',' delimiter, "
                                    "line 1 column 38)"}]
    assert stats == ToolStats(calls=5, malformed=1, unknown_tool=1, bad_arguments=1, tool_raised=1)
    total = sum([stats, ToolStats(calls=1)], ToolStats())
    assert total.metrics() == {"tool/calls": 6, "tool/malformed": 1, "tool/unknown_tool": 1,
                               "tool/bad_arguments": 1, "tool/tool_raised": 1, "tool/too_many_calls": 0,
                               "tool/deadline": 0}


def test_long_results_are_cut():
    def echo(text: str) -> str:
        """Echo.

        Args:
            text: the text
        """
        return text
    assert Toolbox([echo], max_chars=4).call(ToolCall("echo", {"text": "abcdefg"})) == \
        ("abcd... [3 more characters]", None)
    assert Toolbox([echo]).call(ToolCall("echo", {"text": {"k": [1]}}))[1] == "bad_arguments"
    assert Toolbox([divide], max_chars=30).call(ToolCall("divide", {"a": 1, "b": 0})) == \
        ("error: divide raised ZeroDivis... [26 more characters]", "tool_raised")


# ---- the environment and the chat template ----------------------------------------------------------------

class Adder(ToolEnv):
    toolbox = Toolbox([add, divide], format="hermes")
    max_turns = 3


def test_tool_env_answers_calls_and_ends_on_an_answer():
    env = Adder({"prompt": "2+40?"})
    step = as_step(env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>', []))
    assert step == Step([{"role": "tool", "name": "add", "content": "42"}], 0.0, False)
    step = env.step("<tool_call>{oops</tool_call>", [])
    assert not step.done and step.observation[0]["content"].startswith("error: malformed tool call: invalid JSON")
    assert env.step("It is 42.", []) == Step(done=True)
    assert env.stats == ToolStats(calls=2, malformed=1)
    with pytest.raises(TypeError, match="^ToolEnv needs a class attribute toolbox = Toolbox"):
        ToolEnv({})


def test_tools_render_through_the_chat_template():
    """The tool's schema is in the prompt; tool messages render as the template's <tool_response> turn; the
    template passes the prefix check with tool turns, so the observation ids are the full render's suffix."""
    tok = build_chat_tokenizer()
    box = Adder.toolbox
    box.check_template(tok, "tiny-hermes")
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+40?"}], tools=box.schemas, tokenize=False,
                                     add_generation_prompt=True)
    assert json.dumps(box.schemas[0]) in prompt and json.dumps(box.schemas[1]) in prompt
    check_prefix_preserving(tok, roles=("tool", "tool", "assistant"))
    step = Adder({}).step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>'
                          '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>', [])
    assert tok.decode(observation_ids(tok, step.observation)) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_templates_without_tools_are_rejected():
    no_tools = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    box = Adder.toolbox
    with pytest.raises(ValueError, match=r"^the chat template of org/base-model does not render tools: tool 'add' "
                                         r"is absent from a prompt rendered with tools=; use the model's"):
        box.check_template(build_chat_tokenizer(no_tools), "org/base-model")
    with pytest.raises(ValueError, match=r"^the chat template of m fails when rendering tools \(no tools here\)$"):
        box.check_template(build_chat_tokenizer("{{ raise_exception('no tools here') if tools }}"), "m")
    with pytest.raises(ValueError, match="^the tokenizer of m has no chat template"):
        box.check_template(build_chat_tokenizer(None), "m")


def test_every_format_is_registered():
    assert PARSERS == {"hermes": parse_hermes, "llama3": parse_llama3, "mistral": parse_mistral}


# ---- startup: the tools reach every prompt, bad settings stop before the engines ---------------------------

def startup_config(tmp_path, template=None, chat_template=True):
    from rlcore.config import Config, DataConfig, ModelConfig, RolloutConfig
    tok = build_chat_tokenizer() if template is None else build_chat_tokenizer(template)
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "2+40?"}) + "\n")
    return Config(model=ModelConfig(path=str(tmp_path / "model")),
                  data=DataConfig(path=str(tmp_path / "train.jsonl"), chat_template=chat_template,
                                  max_prompt_tokens=4096),
                  rollout=RolloutConfig(env=Adder, max_new_tokens=8, max_total_tokens=64))


def test_startup_renders_the_tools_into_prompts(tmp_path):
    from rlcore.preflight.checks import load_inputs
    tokenizer, _, table, envs, _ = load_inputs(startup_config(tmp_path), 256)
    prompt = tokenizer.decode(table[0]["prompt_ids"])
    assert prompt.startswith("<|im_start|>system\n# Tools")
    assert prompt.endswith("2+40?<|im_end|>\n<|im_start|>assistant\n")
    assert json.dumps(Adder.toolbox.schemas[1]) in prompt and envs.max_turns == 3
    assert envs.encode([{"role": "tool", "content": "42"}]) == tokenizer.encode(
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False)


def test_startup_refuses_tools_the_model_cannot_see(tmp_path):
    from rlcore.data import load_tokenizer
    from rlcore.rollout.envs import make_envs
    cfg = startup_config(tmp_path)
    cfg.rollout.env = lambda row: Adder(row)
    with pytest.raises(ValueError, match=r"^rollout.env '.*' makes environments with tools but does not declare "
                                         r"them itself, so prompts cannot show them: name the ToolEnv subclass"):
        make_envs(cfg, load_tokenizer(cfg.model.path), {"prompt": "2+40?"}, 256)
    cfg = startup_config(tmp_path, chat_template=False)
    with pytest.raises(ValueError, match=r"^rollout.env '.*Adder' declares tools, which reach the model through its "
                                         r"chat template: set data.chat_template=true$"):
        make_envs(cfg, load_tokenizer(cfg.model.path), {"prompt": "2+40?"}, 256)
    no_tools = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cfg = startup_config(tmp_path, template=no_tools)
    with pytest.raises(ValueError, match=f"^the chat template of {cfg.model.path} does not render tools"):
        make_envs(cfg, load_tokenizer(cfg.model.path), {"prompt": "2+40?"}, 256)


def test_tool_envs_step_concurrently():
    """rlcore steps environments in a thread pool: each trajectory's ToolEnv keeps its own counts."""
    from rlcore.rollout.env import call_all
    envs = [Adder({}) for _ in range(16)]
    calls = [lambda e=e, k=k: e.step(f'<tool_call>{{"name": "add", "arguments": {{"a": {k}, "b": 1}}}}</tool_call>'
                                     + "<tool_call>{}</tool_call>" * (k % 2), []) for k, e in enumerate(envs)]
    outs = call_all(calls, timeout_s=10.0, workers=4)
    assert [o.value.observation[0]["content"] for o in outs] == [str(k + 1) for k in range(16)]
    assert [e.stats.malformed for e in envs] == [k % 2 for k in range(16)]
    assert sum((e.stats for e in envs), ToolStats()) == ToolStats(calls=24, malformed=8)
    # as reward functions (weight 0: logged per trajectory; negative: a cost), from the rollout's `envs` column
    assert tool_calls([""] * 16, [""] * 16, envs=envs) == [1.0 + k % 2 for k in range(16)]
    assert bad_tool_calls([""] * 16, [""] * 16, envs=envs) == [float(k % 2) for k in range(16)]


def test_a_tool_call_rollout_reads_as_the_chat_it_is(tmp_path):
    """The turn loop (rlcore.rollout.turns) with a scripted engine, the startup path's Envs and a ToolEnv: the
    model calls a tool, the tool answers, the model answers. Prompt + tokens equal the chat template's render
    of the whole conversation (tools included) token for token; the answer ends the trajectory."""
    from rlcore.engine.rollout_engine import Sample
    from rlcore.preflight.checks import load_inputs
    from rlcore.rollout.turns import Trajectory, rollout
    tokenizer, _, table, envs, _ = load_inputs(startup_config(tmp_path), 256)
    turns = ['<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>', "It is 42."]

    class Engine:  # the model says turns[k] in its k-th turn, then <|im_end|> (its EOS)
        calls = 0

        def generate(self, prompts, n, max_tokens, temperature, seeds, stop_token_ids=None):
            ids = tokenizer.encode(turns[self.calls], add_special_tokens=False) + [tokenizer.eos_token_id]
            self.calls += 1
            return [[Sample(ids, [-0.5] * len(ids), "stop")]]

    x = Trajectory(list(table[0]["prompt_ids"]), {"prompt": "2+40?"}, seed=0, owner=0)
    rollout(Engine(), [x], envs, max_new_tokens=128, max_total=512, group_size=1, temperature=1.0, tp_rank=0,
            tp_group=None)
    conv = [{"role": "user", "content": "2+40?"}, {"role": "assistant", "content": turns[0]},
            {"role": "tool", "content": "42"}, {"role": "assistant", "content": turns[1]}]
    full = tokenizer.apply_chat_template(conv, tools=Adder.toolbox.schemas, tokenize=True)
    full = list(full["input_ids"] if hasattr(full, "keys") else full)
    assert x.prompt_ids + x.tokens == full[:-1]  # the template's "\n" after the last <|im_end|> is never sampled
    sampled = tokenizer.decode([t for t, s in zip(x.tokens, x.sampled) if s])
    assert sampled == f"{turns[0]}<|im_end|>{turns[1]}<|im_end|>"  # only the model's tokens carry loss
    assert x.done and not x.truncated and len(x.turns) == 2 and x.env.stats == ToolStats(calls=1)


def test_tool_stats_reach_the_step_metrics(monkeypatch):
    """collect.sample counts each rank's ToolEnv stats (trajectories without them count nothing) and
    env_metrics sums them over draws and ranks into tool/... metrics (the other rank's totals stand in here
    for the all-reduce; the learning run of tests/test_tasks.py checks the real one)."""
    from types import SimpleNamespace

    from rlcore.rollout import collect
    from rlcore.rollout.tools import tool_stats
    envs = [Adder({}) for _ in range(3)] + [object()]
    envs[0].step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>', [])
    envs[1].step('<tool_call>{"name": "sub", "arguments": {}}</tool_call><tool_call>{"name": </tool_call>', [])
    envs[2].step('<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>', [])
    envs[2].step('<tool_call>{"name": "add", "arguments": {"b": 1}}</tool_call>', [])
    mine = tool_stats(envs)
    assert mine == ToolStats(calls=5, malformed=1, unknown_tool=1, bad_arguments=1, tool_raised=1)
    # the other rank's totals, in all_sum's order: turns, truncated, timeouts, model and env tokens, failed
    # trajectories, active per turn, then the tool/ keys sorted (bad_arguments, calls, deadline, malformed,
    # too_many_calls, tool_raised, unknown_tool)
    other = [6, 1, 0, 30, 12, 1, 4, 2, 0, 7, 2, 0, 5, 3, 2]
    monkeypatch.setattr(collect, "all_sum", lambda *values: [a + b for a, b in zip(values, other)])
    run = SimpleNamespace(rollout=SimpleNamespace(envs=SimpleNamespace(max_turns=2)),
                          cfg=SimpleNamespace(rollout=SimpleNamespace(schedule="lockstep")))
    totals = {"turns": 5, "truncated": 0, "timeouts": 1, "model_tokens": 20, "env_tokens": 8, "failed": 1,
              "active": [4, 1], "env_s": 0.5} | mine.metrics("tool/")
    out = collect.env_metrics(run, totals, n=8)
    assert {k: v for k, v in out.items() if k.startswith("tool/")} == {
        "tool/calls": 12, "tool/malformed": 1, "tool/unknown_tool": 3, "tool/bad_arguments": 1, "tool/tool_raised": 4,
        "tool/too_many_calls": 5, "tool/deadline": 2}
    assert out["env/turns_mean"] == 11 / 8 and out["env/active_turn1"] == 8 and out["env/active_turn2"] == 3
    assert out["rollout/failed_trajectories"] == 2
    for key in mine.metrics("tool/"):
        del totals[key]
    assert not any(k.startswith("tool/") for k in collect.env_metrics(run, totals, n=8))  # no ToolEnv: no keys


# ---- the sandboxed python tool ------------------------------------------------------------------------------

@pytest.fixture
def run_sandbox():
    """The rank's shared sandbox with a run's limits, as the trainer configures it from cfg.sandbox."""
    from rlcore.sandbox import SandboxConfig, configure
    configure(SandboxConfig(timeout_s=1.5, cpu_s=5, memory_mb=256, max_output_bytes=300, workers=2))
    yield
    configure(SandboxConfig())  # closes it


class Coder(ToolEnv):
    toolbox = Toolbox([python], format="hermes")


def test_python_tool_answers_with_what_the_model_should_read(run_sandbox):
    assert python("print(12 * 4 - 6)") == "42\n"
    assert python("x = 12 * 4 - 6") == "[no output: print() the values you want to see]"
    error = python("print(1)\nprint(1 / 0)")
    assert error.startswith('1\nTraceback (most recent call last):\n  File "<sandbox>", line 2, in <module>\n')
    assert error.endswith("\nZeroDivisionError: division by zero\n")
    assert python("import sys; sys.exit(3)") == "[exit code 3]"
    # hostile programs: each answer is a readable observation, with no timings in it (rollouts reproduce)
    assert python("print('start', flush=True)\nwhile True: pass") == "start\n[timeout: stopped after 1.5 s]"
    assert python("x = bytearray(1024 ** 3)").endswith("MemoryError\n[memory: the program ran out of memory (256 MiB)]")
    assert python("while True: print('y' * 10)") == ("y" * 10 + "\n") * 27 + "yyy" + "\n[output truncated]\n"
    assert python("print(sum(range(10)))") == "45\n"  # and the sandbox goes on serving


def test_python_tool_in_a_tool_env(run_sandbox):
    """The schema the model sees, and a Hermes call whose code (a JSON string) holds newlines and quotes."""
    assert Coder.toolbox.schemas == [{"type": "function", "function": {
        "name": "python", "description": "Run a Python program and return what it printed; each call starts afresh, "
                                         "so print() every value you need.",
        "parameters": {"type": "object", "properties": {"code": {
            "type": "string", "description": 'the whole program, e.g. "print(12 * 4 - 6)"'}}, "required": ["code"]},
        "return": {"type": "string"}}}]
    env = Coder({})
    code = json.dumps("total = 0\nfor k in range(1, 5):\n    total += k\nprint(f'sum: {total}')")
    step = as_step(env.step(f'<tool_call>\n{{"name": "python", "arguments": {{"code": {code}}}}}\n</tool_call>', []))
    assert step == Step([{"role": "tool", "name": "python", "content": "sum: 10\n"}])
    step = as_step(env.step('<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>', []))
    assert step.observation[0]["content"] == "[timeout: stopped after 1.5 s]" and not step.done
    assert env.stats == ToolStats(calls=2)  # a program that fails is an answer, not a bad call
