"""Bad input, class by class, through the real entry point (launch/train.py): every case ends in exit 2 and
one `rlcore: error:` line naming the key or file, before any engine starts, with no run directory written.

Classes (the "Bad input" table of docs/bad_input.md): (a) user files missing, empty, truncated, corrupted or of the
wrong kind; (b) numeric fields out of range, zero, negative or NaN, and named choices that do not exist;
(c) output locations that cannot be created, and run names that would leave output_dir; (d) the user's own
code raising (recipe, prepare, reward and environment files), and tools declared wrongly or that the model's chat
template cannot show; (e) an error only some ranks see.
(a)-(d) run launch/train.py's main() at world size 1 (the same code path as every torchrun rank), case after
case in one warm process (conftest.EntryServer) instead of a new `python launch/train.py` each; (e) runs
under torchrun with 2 ranks.
"""
import shutil
import time

import pytest

from conftest import ROOT, rank_exit_codes, train_cmd, train_warm



def rejected(proc, out) -> str:
    """The one error line of a run that was refused before writing anything under `out`."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not out.exists() or not any(out.iterdir()), f"{list(out.iterdir())} written"
    return lines[0]


def broken_model(tmp_path, demo_model, how):
    path = tmp_path / "model"
    shutil.copytree(demo_model, path)
    weights = path / "model.safetensors"
    if how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif how == "no weights":
        weights.unlink()
    elif how == "corrupted weights":
        weights.write_bytes(b"\xff" * 64 + weights.read_bytes()[64:])
    elif how == "empty config.json":
        (path / "config.json").write_text("")
    elif how == "config.json of the wrong kind":
        (path / "config.json").write_text('["not", "a", "config"]')
    elif how == "corrupted tokenizer":
        (path / "tokenizer.json").write_text("{ this is not json")
    return path


# ------------------------------------------------------------------------------------------- (a) files

@pytest.mark.parametrize("how, says", [
    ("truncated weights", "model.safetensors is truncated or corrupted: its header needs"),
    ("no weights", "has no weights (*.safetensors or pytorch_model.bin)"),
    ("corrupted weights", "model.safetensors is not a safetensors file (empty or corrupted header"),
    ("empty config.json", "is not a loadable transformers model"),
    ("config.json of the wrong kind", "is not a loadable transformers model"),
    ("corrupted tokenizer", "the tokenizer cannot be loaded"),
])
def test_broken_model_folder(entry, tmp_path, demo_model, how, says):
    path = broken_model(tmp_path, demo_model, how)
    proc = entry.train("recipe=demo", "prepare=", f"model.path={path}", f"output_dir={tmp_path}/runs")
    line = rejected(proc, tmp_path / "runs")
    assert f"model.path '{path}'" in line and says in line


@pytest.mark.parametrize("content, name, says", [
    ("", "prompts.jsonl", "data.path '{}' is empty; expected a .jsonl file of prompts"),
    ('{"prompt": "1+1="}\n{"prompt": "2+', "prompts.jsonl", "data.path '{}' is not a readable .jsonl file"),
    ("this is text, not parquet", "prompts.parquet", "data.path '{}' is not a readable .parquet file"),
    ("prompt,answer\n1+1=,2\n", "prompts.csv", "data.path '{}' has an unsupported type '.csv'"),
    ('{"prompt": "1+1=1+1=1+1=1+1=1+1=1+1="}\n', "prompts.jsonl", "no prompt of data.path fits "
                                                                   "data.max_prompt_tokens=16"),
])
def test_broken_prompt_file(entry, tmp_path, demo_model, content, name, says):
    file = tmp_path / name
    file.write_text(content)
    proc = entry.train("recipe=demo", f"data.path={file}", f"output_dir={tmp_path}/runs")
    assert says.format(file) in rejected(proc, tmp_path / "runs")


@pytest.mark.parametrize("content, says", [
    ("", "defines no config() function returning a Config"),
    ("def config(:\n    pass\n", "failed to run: SyntaxError: "),
    ("import json\ndef config():\n    return json.loads('{')\n", "config() raised JSONDecodeError"),
])
def test_broken_recipe_file(entry, tmp_path, content, says):
    (tmp_path / "bad.py").write_text(content)
    proc = entry.train(f"recipe={tmp_path}/bad.py", f"output_dir={tmp_path}/runs")
    line = rejected(proc, tmp_path / "runs")
    assert f"{tmp_path}/bad.py" in line and says in line


# ------------------------------------------------------------------------------------ (b) values

@pytest.mark.parametrize("override, says", [
    ("optim.lr=nan", "optim.lr must be >= 0 (got nan)"),
    ("rollout.temperature=-0.5", "rollout.temperature must be in (0, 2] (vLLM refuses more) (got -0.5)"),
    ("rollout.temperature=3", "rollout.temperature must be in (0, 2] (vLLM refuses more) (got 3.0)"),
    ("train.micro_batch_size=0", "train.micro_batch_size must be >= 1 (got 0)"),
    ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization must be in (0, 1] (got 1.5)"),
    ("rollout.cpu_kv_cache_gb=nan", "rollout.cpu_kv_cache_gb must be > 0 (got nan)"),
    ("optim.betas=[0.9,1.5]", "optim.betas must be two numbers in [0, 1) (got [0.9, 1.5])"),
    ("rewards.0.weight=inf", "rewards[0].weight must be a finite number (got inf)"),
    ("critic.optim.min_lr_ratio=2", "critic.optim.min_lr_ratio must be in [0, 1] (got 2.0)"),
    ("model.dtype=float16", "model.dtype must be one of float32, bfloat16 (got 'float16')"),
    ("optim.schedule=cosin", "optim.schedule must be one of constant, linear, cosine (got 'cosin')"),
    ("model.attn_implementation=flash", "model.attn_implementation must be one of sdpa, eager, flash_attention_2"),
    ("resume=step_7", "resume"),
    ("rollout.env_workers=0", "rollout.env_workers must be >= 1 (got 0)"),
    ("rollout.max_tool_calls=0", "rollout.max_tool_calls must be a whole number >= 1 (got 0)"),
    ("rollout.max_tool_calls=-3", "rollout.max_tool_calls must be a whole number >= 1 (got -3)"),
    ("rollout.turn_deadline_s=0", "rollout.turn_deadline_s must be a finite number of seconds > 0 (got 0.0)"),
    ("rollout.turn_deadline_s=-1", "rollout.turn_deadline_s must be a finite number of seconds > 0 (got -1.0)"),
    ("rollout.turn_deadline_s=inf", "rollout.turn_deadline_s must be a finite number of seconds > 0 (got inf)"),
    ("rollout.turn_deadline_s=nan", "rollout.turn_deadline_s must be a finite number of seconds > 0 (got nan)"),
    ("sandbox.workers=0", "sandbox.workers must be a whole number >= 1 (got 0)"),
    ("sandbox.timeout_s=0", "sandbox.timeout_s must be a finite number of seconds > 0 (got 0.0)"),
    ("sandbox.cpu_s=-5", "sandbox.cpu_s must be a finite number of seconds > 0 (got -5.0)"),
    ("sandbox.memory_mb=-1", "sandbox.memory_mb must be a whole number >= 1 (got -1)"),
    ("sandbox.file_mb=0", "sandbox.file_mb must be a whole number >= 1 (got 0)"),
    ("sandbox.tmp_mb=0", "sandbox.tmp_mb must be a whole number >= 1 (got 0)"),
    ("sandbox.max_processes=0", "sandbox.max_processes must be a whole number >= 1 (got 0)"),
    ("sandbox.max_output_bytes=-1", "sandbox.max_output_bytes must be a whole number >= 1 (got -1)"),
    ("sandbox.preload=[math,nump]", "sandbox.preload: there is no module named 'nump' to import into the sandbox "
                                    "workers"),
    ("sandbox.preload=[math,no_pkg.sub]", "sandbox.preload: there is no module named 'no_pkg.sub'"),
    ("rollout.ranks=-1", "rollout.ranks must be >= 0 (got -1)"),
    ("rollout.max_staleness=-1", "rollout.max_staleness must be >= 0 (got -1)"),
    ("rollout.ranks=1", "rollout.ranks=1 must be a multiple of rollout.tensor_parallel=1 below the world size 1 "
                        "(the rest of the ranks train); valid: none or 0 (colocated)"),
    ("rollout.max_staleness=1", "rollout.max_staleness=1 needs a split mesh: set rollout.ranks"),
    ("rollout.stream=true", "rollout.stream=true needs a split mesh: set rollout.ranks (the ranks that only generate)"),
    ("rollout.max_running=-8", "rollout.max_running must be >= 0 (got -8)"),
    ("train.watchdog_s=0", "train.watchdog_s must be a finite number of seconds > 0 (got 0.0)"),
    ("train.watchdog_s=-30", "train.watchdog_s must be a finite number of seconds > 0 (got -30.0)"),
    ("train.watchdog_s=inf", "train.watchdog_s must be a finite number of seconds > 0 (got inf)"),
    ("train.watchdog_s=nan", "train.watchdog_s must be a finite number of seconds > 0 (got nan)"),
])
def test_bad_values(entry, tmp_path, override, says):
    proc = entry.train("recipe=demo", override, f"output_dir={tmp_path}/runs")
    assert says in rejected(proc, tmp_path / "runs")


@pytest.mark.parametrize("overrides, says", [
    (["algorithm.seq_mask=geometric", "algorithm.seq_mask_low=1.02"],
     "algorithm.seq_mask_low and seq_mask_high must satisfy 0 < low < 1 < high < inf (got [1.02, 1.01])"),
    (["algorithm.seq_mask=product", "algorithm.seq_mask_low=0"], "0 < low < 1 < high < inf (got [0.0, 1.01])"),
    (["algorithm.seq_mask=product", "algorithm.seq_mask_high=inf"], "0 < low < 1 < high < inf (got [0.99, inf])"),
    (["algorithm.seq_mask=mean"], "algorithm.seq_mask must be one of (empty: off), geometric, product (got 'mean')"),
    (["algorithm.tis_cap=5", "algorithm.tis_low=0.5"], "algorithm.tis_low=0.5 is a mask's lower bound: it needs "
                                                       "tis_mode=mask and tis_cap > 0"),
    (["algorithm.tis_cap=5", "algorithm.tis_mode=mask", "algorithm.tis_low=-1"], "algorithm.tis_low must be >= 0"),
    (["algorithm.tis_cap=0.5"], "algorithm.tis_cap must be 0 (off) or >= 1 (got 0.5)"),
    (["algorithm.tis_level=batch"], "algorithm.tis_level must be one of token, sequence, geometric (got 'batch')"),
    (["rollout.seeds=global"], "rollout.seeds must be one of request, engine (got 'global')"),
    (["rollout.seeds=engine", "rollout.schedule=continuous"], "rollout.seeds=engine draws a sample's noise from "
                                                               "whatever the engine runs beside it"),
])
def test_bad_mismatch_corrections(entry, tmp_path, overrides, says):
    """The mismatch corrections (rlcore.algorithms.corrections) are options of every algorithm's loss: GRPO's here;
    then settings refused in combination (rollout.seeds)."""
    proc = entry.train("recipe=demo", *overrides, f"output_dir={tmp_path}/runs")
    assert says in rejected(proc, tmp_path / "runs")


# ------------------------------------------------------------------------------------ (c) outputs

@pytest.mark.parametrize("where, says", [
    ("output_dir={tmp}/a_file", "output_dir '{tmp}/a_file': '{tmp}/a_file' is a file, not a folder"),
    ("output_dir={tmp}/a_file/runs", "output_dir '{tmp}/a_file/runs': '{tmp}/a_file' is a file, not a folder"),
    ("output_dir=/proc/rlcore-runs", "output_dir '/proc/rlcore-runs': cannot create folders in '/proc'"),
    ("name=../escaped", "name must be a plain folder name inside output_dir, without '/' or '..' (got '../escaped')"),
    ("name=a/b", "name must be a plain folder name inside output_dir"),
    ("name=..", "name must be a plain folder name inside output_dir"),
])
def test_impossible_outputs(entry, tmp_path, where, says):
    (tmp_path / "a_file").write_text("not a folder")
    args = [where.format(tmp=tmp_path)] + ([] if where.startswith("output_dir") else [f"output_dir={tmp_path}/runs"])
    proc = entry.train("recipe=demo", *args)
    assert says.format(tmp=tmp_path) in rejected(proc, tmp_path / "runs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"], "nothing may be created"


# ------------------------------------------------------------------------------------ (d) user code

USER = '''
def reward(prompts, completions, **columns):
    return [0.0] * len(prompts)

raise RuntimeError("the grader's database is down")
'''
RECIPE = '''
from rlcore.config.cli import load_recipe
from pathlib import Path

def prepare(cfg):
    raise OSError("no space left for the tiny model")

def config():
    cfg = load_recipe("demo", Path("{root}/recipes"))
    cfg.prepare = "{module}:prepare"
    return cfg
'''


@pytest.mark.parametrize("case, says", [
    ("recipe", "recipe '{tmp}/boom.py': config() raised ZeroDivisionError: division by zero (at boom.py:3)"),
    ("reward file", "rewards[0].fn '{tmp}/grader.py:reward': running '{tmp}/grader.py' failed: RuntimeError: the "
                    "grader's database is down (at grader.py:5)"),
    ("prepare", "prepare 'prep_recipe:prepare' raised OSError: no space left for the tiny model (at prep_recipe.py:6)"),
    ("environment", "rollout.env '{tmp}/grader.py:reward': running '{tmp}/grader.py' failed: RuntimeError"),
])
def test_user_code_raising(entry, tmp_path, case, says):
    (tmp_path / "boom.py").write_text("def config():\n    x = 0\n    return 1 / x\n")
    (tmp_path / "grader.py").write_text(USER)
    (tmp_path / "prep_recipe.py").write_text(RECIPE.format(root=ROOT, module="prep_recipe"))
    args = {"recipe": [f"recipe={tmp_path}/boom.py"],
            "reward file": ["recipe=demo", f"rewards.0.fn={tmp_path}/grader.py:reward"],
            "prepare": [f"recipe={tmp_path}/prep_recipe.py"],
            "environment": ["recipe=demo", f"rollout.env={tmp_path}/grader.py:reward", "rollout.max_total_tokens=16"],
            }[case]
    proc = entry.train(*args, f"output_dir={tmp_path}/runs", path=[tmp_path])
    assert says.format(tmp=tmp_path) in rejected(proc, tmp_path / "runs")
    debug = entry.train(*args, f"output_dir={tmp_path}/runs", path=[tmp_path], env={"RLCORE_DEBUG": "1"})
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("rlcore: error:")


FORK = '''
from pathlib import Path
from rlcore.algorithms.objectives import PolicyLoss
from rlcore.config.cli import load_recipe

class Forgot(PolicyLoss):  # a fork that never wrote its advantages
    pass

class Duck:  # not a subclass: no flags
    def advantages(self, batch, reduce):
        return batch.loss_mask, {{}}

    def loss(self, batch, logprobs, norm):
        return logprobs.sum(), {{}}

def config():
    cfg = load_recipe("demo", Path("{root}/recipes"))
    cfg.algorithm = {algorithm}()
    return cfg
'''


@pytest.mark.parametrize("algorithm, says", [
    ("Forgot", "algorithm Forgot does not implement advantages(): see its docstring in "
               "rlcore.algorithms.base.Algorithm"),
    ("Duck", "algorithm Duck has no needs_critic: subclass rlcore.algorithms.base.Algorithm, which documents every "
             "hook and gives each flag its default"),
])
def test_forked_algorithm_missing_a_piece(entry, tmp_path, algorithm, says):
    (tmp_path / "fork.py").write_text(FORK.format(root=ROOT, algorithm=algorithm))
    proc = entry.train(f"recipe={tmp_path}/fork.py", f"output_dir={tmp_path}/runs")
    assert rejected(proc, tmp_path / "runs") == f"rlcore: error: {says}"


# ------------------------------------------------------------------------- (d) tools (rlcore.rollout.tools)

TOOL_RECIPE = '''
from pathlib import Path
from rlcore.config.cli import load_recipe
from rlcore.rollout.tools import Toolbox, ToolEnv


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def no_doc(a: int) -> int:
    return a


def no_hint(a) -> int:
    """Return a.

    Args:
        a: a number
    """
    return a


class Tools(ToolEnv):
    toolbox = Toolbox({tools}, format="{format}")


def config():
    cfg = load_recipe("demo", Path("{root}/recipes"))
    cfg.rollout.env = Tools
    cfg.rollout.max_total_tokens = 16
    cfg.data.chat_template = True
    cfg.data.max_prompt_tokens = 40
    return cfg
'''
NO_TOOLS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def no_tools_model(tmp_path_factory):
    """A random tiny Qwen2 with a ChatML tokenizer (rlcore.tasks.tiny's) whose chat template does not show tools."""
    from transformers import AutoModelForCausalLM

    from rlcore.tasks.tiny import build_chat_tokenizer, tiny_config
    path = tmp_path_factory.mktemp("no_tools") / "model"
    tokenizer = build_chat_tokenizer(NO_TOOLS)
    config = tiny_config()
    config.vocab_size, config.bos_token_id, config.eos_token_id = 128, None, tokenizer.eos_token_id
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("tools, format, how, says", [
    ("[add, 3]", "hermes", "recipe", "failed to run: ValueError: tool 1 (3) is not callable; tools need a type "
                                     "hint on every argument and a Google-style docstring"),
    ("[no_doc]", "hermes", "recipe", "failed to run: ValueError: tool 'no_doc' has no docstring; tools need"),
    ("[no_hint]", "hermes", "recipe", "failed to run: ValueError: tool 'no_hint': argument 'a' has no type hint"),
    ("[add, add]", "hermes", "recipe", "failed to run: ValueError: two tools are named 'add'; tool names must be "
                                       "unique"),
    ("[add, add]", "hermes", "rollout.env", "rollout.env '{file}:Tools': running '{file}' failed: ValueError: two "
                                            "tools are named 'add'; tool names must be unique"),
    ("[add]", "qwen", "recipe", "failed to run: ValueError: unknown tool-call format 'qwen'; valid: hermes, llama3, "
                                "mistral"),
    ("[add]", "hermes", "template", "the chat template of {model} does not render tools: tool 'add' is absent from a "
                                    "prompt rendered with tools=; use the model's tool-calling template"),
])
def test_bad_tools(entry, tmp_path, demo_model, no_tools_model, tools, format, how, says):
    file = tmp_path / "tool_recipe.py"
    file.write_text(TOOL_RECIPE.format(root=ROOT, tools=tools, format=format))
    args = {"recipe": [f"recipe={file}"], "template": [f"recipe={file}", f"model.path={no_tools_model}"],
            "rollout.env": ["recipe=demo", f"rollout.env={file}:Tools"]}[how]
    line = rejected(entry.train(*args, f"output_dir={tmp_path}/runs"), tmp_path / "runs")
    assert says.format(file=file, model=no_tools_model) in line
    assert how != "recipe" or line.startswith(f"rlcore: error: recipe '{file}' failed to run")


TRL_RECIPE = '''
from pathlib import Path
from rlcore.config.cli import load_recipe
from rlcore.rollout.standards import trl_environment, trl_rewards


class Env:
{reset}
    def add(self, a: int, b: int) -> int:
{doc}
        return a + b


def correct(completions, answer{kwargs}):
    return [1.0 for _ in completions]


def config():
    cfg = load_recipe("demo", Path("{root}/recipes"))
    cfg.rollout.env = trl_environment(Env, max_tool_calling_iterations=1)
    cfg.rewards = trl_rewards([correct], env=Env)
    cfg.rollout.max_total_tokens = 16
    cfg.data.chat_template = True
    cfg.data.max_prompt_tokens = 40
    return cfg
'''
RESET = "    def reset(self, **row):\n        return None\n"
DOC = '        """Add two integers.\n\n        Args:\n            a: the first\n            b: the second\n        """'


@pytest.mark.parametrize("reset, doc, kwargs, says", [
    ("", DOC, ", **kwargs", "TRL environment 'Env' has no reset() method; the convention needs reset(**row)"),
    (RESET, "", ", **kwargs", "TRL environment 'Env': tool 'add' has no docstring; tools need a type hint"),
    (RESET, DOC, "", "TRL reward function 'correct' takes no **kwargs; TRL calls reward functions with prompts="),
], ids=["no reset", "a method without docstring", "a reward without kwargs"])
def test_bad_trl_environment(entry, tmp_path, reset, doc, kwargs, says):
    """TRL's environment_factory convention (rlcore.rollout.standards): what TRL would refuse stops at startup."""
    file = tmp_path / "trl_recipe.py"
    file.write_text(TRL_RECIPE.format(root=ROOT, reset=reset, doc=doc, kwargs=kwargs))
    line = rejected(entry.train(f"recipe={file}", f"output_dir={tmp_path}/runs"), tmp_path / "runs")
    assert line.startswith(f"rlcore: error: recipe '{file}': config() raised ValueError: {says}"), line


# ------------------------------------------------------------------------------- (e) some ranks only

ONE_RANK = '''
import os
from pathlib import Path
from rlcore.config.cli import load_recipe

def config():
    cfg = load_recipe("demo", Path("{root}/recipes"))
    if os.environ.get("RANK") == "1":
        {what}
    return cfg
'''


@pytest.mark.parametrize("what, says, code, launch", [
    # before the ranks connect: rank 1 stops, torchrun stops rank 0; its report names rank 1's line
    ("raise KeyError('only on rank 1')", "config() raised KeyError: 'only on rank 1'", None, train_cmd),
    # after: every rank raises the same error together, exit 2 on both; torchrun's report names it (a fresh launch),
    # and the second, in the slow tier's shared launch, reads the ranks' own lines and codes
    ("cfg.data.path = '/nowhere/prompts.jsonl'", "data.path '/nowhere/prompts.jsonl' does not exist", {2}, train_cmd),
    ("cfg.rewards[0].fn = 'no_such_module:reward'", "rewards[0].fn 'no_such_module:reward': cannot import module",
     {2}, train_warm),
])
@pytest.mark.slow
def test_an_error_only_one_rank_sees_stops_every_rank(tmp_path, what, says, code, launch):
    (tmp_path / "ranked.py").write_text(ONE_RANK.format(root=ROOT, what=what))
    start = time.monotonic()
    proc = launch(f"recipe={tmp_path}/ranked.py", f"output_dir={tmp_path}/runs", timeout=240)
    assert time.monotonic() - start < 200
    assert proc.returncode != 0
    if code:
        assert rank_exit_codes(proc) == code, proc.stderr[-3000:]
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
        assert len(lines) == 1 and says in lines[0], proc.stderr[-3000:]
    if launch is train_cmd:
        assert says in proc.stderr.split("Root Cause")[-1], proc.stderr[-3000:]
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------ (e) agents

AGENTS = '''
def plain(client, row):
    return 1.0

async def agent(client, row):
    return 1.0
'''


@pytest.mark.parametrize("overrides, says", [
    (["rollout.agent={tmp}/agents.py:plain"],
     "rollout.agent '{tmp}/agents.py:plain' is a plain function, not an async function; an agent is `async def "
     "agent(client, row) -> reward`"),
    (["rollout.agent={tmp}/agents.py:agent"], "rollout.agent '{tmp}/agents.py:agent' needs rollout.max_turns >= 1"),
    (["rollout.agent={tmp}/agents.py:agent", "rollout.env={tmp}/agents.py:agent", "rollout.max_turns=2"],
     "rollout.agent '{tmp}/agents.py:agent' and rollout.env '{tmp}/agents.py:agent' are two ways to run a "
     "trajectory; set one"),
    (["rollout.agent={tmp}/agents.py:agent", "rollout.agent_tool_format=qwen"],
     "rollout.agent_tool_format must be one of hermes, llama3, mistral (got 'qwen')"),
])
def test_bad_agent(entry, tmp_path, overrides, says):
    """An agent that is not an async function, without a call budget, beside an environment: one line, exit 2."""
    (tmp_path / "agents.py").write_text(AGENTS)
    proc = entry.train("recipe=demo", *(o.format(tmp=tmp_path) for o in overrides), f"output_dir={tmp_path}/runs")
    assert says.format(tmp=tmp_path) in rejected(proc, tmp_path / "runs")
