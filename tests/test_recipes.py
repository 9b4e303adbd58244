"""Every recipe loads and validates for the world it is written for, with no GPU and no network; every recipe
that names a hub model fits one node of 8 x 80 GB by the launch plan of that model's real config.json
(tests/hub_configs.py)."""
import re

import pytest

from conftest import ROOT
from hub_configs import QWEN25_1P5B_INSTRUCT, QWEN25_7B_INSTRUCT, REAL, hub_ids, model_dir
from rlcore.config import validate
from rlcore.config.cli import available_recipes, load_recipe, parse_argv
from rlcore.distributed.parallel import ParallelDims
from rlcore.preflight import plan

# Qwen2.5-1.5B-Instruct's config.json: 12 attention heads, 2 key/value heads, 32768 positions.
QWEN25_15B = {"heads": QWEN25_1P5B_INSTRUCT["num_attention_heads"],
              "kv_heads": QWEN25_1P5B_INSTRUCT["num_key_value_heads"],
              "context": QWEN25_1P5B_INSTRUCT["max_position_embeddings"]}
GPU_RECIPES = ["grpo", "grpo_lora", "grpo_moe", "grpo_python_tool", "grpo_tools", "gspo_moe", "ppo", "reinforce_pp"]


def test_grpo_recipe_is_valid_for_one_8_gpu_node():
    cfg = load_recipe("grpo", ROOT / "recipes")
    dims = ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel)
    dims.validate(QWEN25_15B["heads"], QWEN25_15B["kv_heads"])
    validate(cfg, dims)
    assert dims.rollout_groups == 4 and cfg.rollout.tensor_parallel == 2
    assert cfg.model.mixed_precision == "bfloat16" and cfg.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert cfg.data.path == "openai/gsm8k" and cfg.rewards[0].fn == "rlcore.rewards:gsm8k"
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens <= QWEN25_15B["context"]
    # Each of the 8 ranks trains on whole prompt groups: 128 prompts / 8 ranks * 8 samples = 128 sequences.
    assert cfg.rollout.prompts_per_step // 8 * cfg.rollout.group_size == 128


def test_the_gpu_recipes_are_those_that_name_hub_models():
    named = {name for name in available_recipes(ROOT / "recipes") if hub_ids(load_recipe(name, ROOT / "recipes"))}
    assert named == set(GPU_RECIPES)


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipe_fits_one_8_gpu_node_by_the_launch_plan(tmp_path, name):
    """The launch plan (rlcore/preflight/plan.py) of the recipe with its models' real config.json, on 8 x 80 GB:
    every bar fits, and the models have their published sizes."""
    cfg = load_recipe(name, ROOT / "recipes")
    keys = {"model.path": cfg.model.path, "critic.path": cfg.critic.path}
    assert set(hub_ids(cfg)) <= set(keys.values())  # no reward model or teacher from the hub to point elsewhere
    overrides = [f"{key}={model_dir(tmp_path, path)}" for key, path in keys.items() if path in REAL]
    p = plan.build(parse_argv([f"recipe={name}", *overrides], ROOT / "recipes"), nproc_per_node=8, gpu_memory_gb=80)
    assert p.fits, p.render()
    assert p.models[0].role == "actor" and p.models[0].params == REAL[cfg.model.path][1]


def part(bar, prefix):
    return sum(b for name, b in bar.parts if name.startswith(prefix))


def test_grpo_moe_recipe_fits_one_8_gpu_node(tmp_path):
    """recipe=grpo_moe: Qwen3-30B-A3B, FSDP2 over 8 GPUs (a decoder layer with its experts is one unit) and two
    TP=4 engines. The launch plan of its real config.json gives the numbers of the recipe's docstring."""
    path = model_dir(tmp_path, "Qwen/Qwen3-30B-A3B")
    cfg = parse_argv(["recipe=grpo_moe", f"model.path={path}"], ROOT / "recipes")
    dims = ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel)
    validate(cfg, dims)
    assert load_recipe("grpo_moe", ROOT / "recipes").model.path == "Qwen/Qwen3-30B-A3B"
    assert cfg.rollout.tensor_parallel == 4 and dims.rollout_groups == 2
    assert cfg.model.mixed_precision == "bfloat16" and cfg.model.activation_checkpointing
    assert not cfg.algorithm.needs_reference  # no KL term: no reference model to hold
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens <= REAL["Qwen/Qwen3-30B-A3B"][0][
        "max_position_embeddings"]
    p = plan.build(cfg, nproc_per_node=8, gpu_memory_gb=80)
    assert p.fits, p.render()
    n = p.models[0].params
    assert [m.role for m in p.models] == ["actor"] and n == 30_532_122_624  # the model card's 30.5B
    # At rest: fp32 weights and AdamW moments, 12 bytes a parameter over 8 ranks (15.3 + 30.5 GB, 1e9 bytes)
    assert part(p.train, "actor params") + part(p.train, "actor AdamW") == 12 * n / 8
    # The engine, 0.3 of the GPU: bf16 weights over TP 4 (15.3 GB) and a KV cache of 24 KiB a token
    # (48 layers x 1 KV head x 128 x K and V x bf16) that holds 340,017 tokens
    assert p.kv_per_token == 48 * 1 * 128 * 2 * 2 and p.kv_tokens > 300_000
    # Packed micro-batches of 2 x 1536 tokens (the bound of 2 padded rows), and a checkpoint every 50 steps:
    # weights + AdamW, 366 GB, ~183 s at the assumed 2 GB/s, more than the 170 s a Slurm signal leaves: a warning.
    assert p.micro_tokens == 2 * 1536 and cfg.train.save_every == 50
    assert p.checkpoint_bytes == 12 * n and p.save_seconds == pytest.approx(12 * n / 2e9)
    assert not p.save_fits_grace and "rlcore: warning: a checkpoint on preemption may not finish" in p.render()
    # TP=2 would not fit: the engine's bf16 weights alone (30.5 GB) exceed its 0.3 x 80 GB budget
    tp2 = plan.build(parse_argv(["recipe=grpo_moe", f"model.path={path}", "rollout.tensor_parallel=2"],
                                ROOT / "recipes"), nproc_per_node=8, gpu_memory_gb=80)
    assert not tp2.fits and tp2.generation.kv_short > 0


def test_gpu_recipes_pack_and_checkpoint(tmp_path):
    """Every GPU recipe packs its micro-batches and checkpoints on a cadence; the 1.5B recipes' checkpoint (weights +
    AdamW, 18.5 GB) writes in ~9 s, inside the grace of a Slurm signal (launch/slurm_node.sh's default, read here)."""
    grace = re.search(r"RLCORE_SHUTDOWN_TIMEOUT:-(\d+)", (ROOT / "launch" / "slurm_node.sh").read_text())
    assert int(grace.group(1)) == plan.SHUTDOWN_GRACE_S
    for name in GPU_RECIPES:
        cfg = load_recipe(name, ROOT / "recipes")
        assert cfg.train.max_tokens_per_micro_batch >= cfg.data.max_prompt_tokens + (
            cfg.rollout.max_total_tokens or cfg.rollout.max_new_tokens) and cfg.train.save_every > 0, name
    cfg = parse_argv(["recipe=grpo", f"model.path={model_dir(tmp_path, 'Qwen/Qwen2.5-1.5B-Instruct')}"],
                     ROOT / "recipes")
    p = plan.build(cfg, nproc_per_node=8, gpu_memory_gb=80)
    assert p.checkpoint_bytes == 12 * 1_543_714_304 and p.save_fits_grace
    assert "CHECKPOINT every 25 steps and at the end: 18.5 GB (trained weights + AdamW), ~9 s" in p.render()


def test_grpo_lora_recipe_fits_one_8_gpu_node_without_a_reference_or_base_optimizer_state(tmp_path):
    """recipe=grpo_lora: Qwen2.5-7B, LoRA r=16 on every linear, adapter sync, 8 x 80 GB. The launch plan from
    the real 7B shape against hand arithmetic: no reference copy, AdamW over the adapters only."""
    from rlcore.models.lora import optim_config
    path = model_dir(tmp_path, "Qwen/Qwen2.5-7B-Instruct")
    cfg = parse_argv(["recipe=grpo_lora", f"model.path={path}"], ROOT / "recipes")
    dims = ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel)
    dims.validate(QWEN25_7B_INSTRUCT["num_attention_heads"], QWEN25_7B_INSTRUCT["num_key_value_heads"])
    validate(cfg, dims)
    assert load_recipe("grpo_lora", ROOT / "recipes").model.path == "Qwen/Qwen2.5-7B-Instruct"
    lo = cfg.lora
    assert lo.enabled and lo.sync == "adapter" and (lo.rank, lo.alpha) == (16, 32.0) and len(lo.targets) == 7
    assert cfg.algorithm.needs_reference  # a KL term, so the adapters-off reference is in use
    assert optim_config(lo, cfg.optim).lr == pytest.approx(1e-5)  # 10 x the full fine-tuning 1e-6

    p = plan.build(cfg, 8, 1, 80)
    assert p.fits
    h, L, V, I, q, kv = 3584, 28, 152064, 18944, 28 * 128, 4 * 128
    layer = 2 * h * q + 2 * h * kv + 3 * h * I + 2 * h + (q + 2 * kv)  # + qkv biases
    P = L * layer + 2 * V * h + h  # untied embedding and lm_head, final norm
    assert P == 7_615_616_512
    # r * (in + out) of q, k, v, o, gate, up, down, in every layer: 0.53% of the model
    A = L * 16 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + I) + (I + h))
    assert A == 40_370_176 and p.models[0].adapters == A
    assert [m.role for m in p.models] == ["actor"]  # no reference model, no critic
    parts = dict(p.train.parts)
    optimizer = {n: b for n, b in parts.items() if "AdamW" in n}
    assert optimizer == {"actor AdamW m + v of the adapters (float32, /8)": 8 * A / 8}  # adapters only
    assert not any("reference" in n or n.startswith("actor grads") for n in parts)
    T = 8 * (512 + 1024)  # micro-batch rows x (prompt + response) tokens
    hand = (4 * P / 8 + (4 + 4 + 8) * A / 8  # frozen fp32 base; adapters, their grads and AdamW (fp32)
            + 2 * ((2 * V * h + h) + 2 * layer) + 4 * A / L  # bf16 root + 2 layers gathered, one layer's grads
            + T * (2 * h * L + 10 * h + 4 * kv + 8 * I)  # checkpointed activations, bf16
            + 1024 * V * (2 + 16))  # a 1024-token chunk of logits and its fp32 copies; the engine sleeps
    assert p.train.total == pytest.approx(hand)
    assert hand < 0.9 * 80 * 2**30 and p.train.total / 2**30 == pytest.approx(13.6, abs=0.05)
    assert p.sync_bytes == 2 * A  # a bf16 adapter, ~81 MB, instead of 2 * P = 15.2 GB
    # Full fine-tuning of the same recipe: a reference copy, full grads and AdamW, and a root gradient.
    full = plan.build(parse_argv(["recipe=grpo_lora", f"model.path={path}", "lora=false"], ROOT / "recipes"),
                      8, 1, 80)
    saved = (4 + 4 + 8) * P / 8 + (2 * (2 * V * h + h) + 4 * layer - 4 * A / L) - 16 * A / 8
    assert full.train.total - p.train.total == pytest.approx(saved)  # 17.0 GB a GPU
    assert full.sync_bytes == 2 * P


@pytest.mark.parametrize("name, algorithm, critic", [("ppo", "PPO", "policy"), ("reinforce_pp", "ReinforcePP", "")])
def test_gpu_recipes_match_grpo_s_setup(name, algorithm, critic):
    """recipe=ppo and recipe=reinforce_pp: the same node, model, data and engines as recipe=grpo."""
    cfg, grpo = load_recipe(name, ROOT / "recipes"), load_recipe("grpo", ROOT / "recipes")
    validate(cfg, ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel))
    assert type(cfg.algorithm).__name__ == algorithm and cfg.critic.path == critic
    assert cfg.algorithm.needs_reference and cfg.model.offload_frozen  # the KL penalty in the reward
    assert (cfg.model.path, cfg.data, cfg.rollout) == (grpo.model.path, grpo.data, grpo.rollout)


@pytest.mark.parametrize("name", ["demo", "ppo_tiny", "reinforce_pp_tiny"])
def test_tiny_recipes_are_valid_for_two_cpu_ranks(name):
    cfg = load_recipe(name, ROOT / "recipes")
    validate(cfg, ParallelDims(world_size=2, tp=cfg.rollout.tensor_parallel))
    assert cfg.model.dtype == "float32" and cfg.model.mixed_precision == "none"
    assert cfg.prepare == "rlcore.tasks.tiny:prepare"


def test_every_recipe_loads():
    assert {"demo", "demo_lora", "grpo", "grpo_lora", "grpo_moe", "grpo_python_tool", "ppo", "ppo_tiny",
            "reinforce_pp", "reinforce_pp_tiny"} <= set(available_recipes(ROOT / "recipes"))
    for name in available_recipes(ROOT / "recipes"):
        assert load_recipe(name, ROOT / "recipes").algorithm is not None


def test_tool_recipe_is_valid_and_its_calculator_answers():
    """recipe=grpo_tools: grpo's node and model, a calculator tool (native Hermes calls, rlcore.rollout.tools)
    over up to 4 turns. It answers well-formed calls, explains bad ones in a tool message, and ends the
    trajectory on a final answer."""
    from rlcore.rollout.env import Step, as_step
    cfg = load_recipe("grpo_tools", ROOT / "recipes")
    dims = ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel)
    dims.validate(QWEN25_15B["heads"], QWEN25_15B["kv_heads"])
    validate(cfg, dims)
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_total_tokens <= QWEN25_15B["context"]
    assert cfg.rollout.max_total_tokens >= cfg.rollout.max_new_tokens and cfg.data.chat_template
    env = cfg.rollout.env({"question": "...", "answer": "#### 42"})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*4-6"}}</tool_call>'
    assert as_step(env.step(f"Let me compute. {call}", [])) == \
        Step([{"role": "tool", "name": "calculator", "content": "42"}])
    assert as_step(env.step('<tool_call>{"expression": "1/0"}</tool_call>', [])).observation[0]["content"] == \
        'error: malformed tool call: no "name" field'
    bad = as_step(env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}'
                           '</tool_call>', []))
    assert bad.observation[0]["content"].startswith("error: calculator raised ValueError: unsupported expression")
    assert not bad.done
    assert as_step(env.step("So the answer is\n#### 42", [])) == Step(None, 0.0, True) and env.stats.calls == 3


def test_python_tool_recipe_fits_one_8_gpu_node_and_runs_its_tool_in_the_sandbox(tmp_path):
    """recipe=grpo_python_tool: grpo_tools' node and model with the sandboxed python tool (rlcore.rollout.tools).
    Valid for 8 ranks and fits 8 x 80 GB by the launch plan of Qwen2.5-1.5B's shape; the prompt as startup renders
    it through a chat template that shows tools (rlcore.tasks.tiny's Hermes one: the hub's Qwen2.5 template is not here)
    carries the system prompt and the tool's schema; a call runs in the sandbox with the recipe's limits."""
    import dataclasses
    import json

    import datasets

    from rlcore.data import tokenize_prompts
    from rlcore.rollout.env import Step, as_step
    from rlcore.sandbox import SandboxConfig, configure
    from rlcore.sandbox.pool import GRACE_S
    from rlcore.tasks.tiny import build_chat_tokenizer
    cfg = load_recipe("grpo_python_tool", ROOT / "recipes")
    dims = ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel)
    dims.validate(QWEN25_15B["heads"], QWEN25_15B["kv_heads"])
    validate(cfg, dims)
    assert cfg.model.path == "Qwen/Qwen2.5-1.5B-Instruct" and dims.rollout_groups == 4
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_total_tokens <= QWEN25_15B["context"]
    toolbox = cfg.rollout.env.toolbox
    assert toolbox.names == ["python"] and toolbox.format == "hermes" and cfg.data.chat_template
    # 128 trajectories per rank, stepped in 8 threads, each with a sandbox worker of its own
    assert cfg.rollout.prompts_per_step // 8 * cfg.rollout.group_size == 128
    assert cfg.sandbox.workers == cfg.rollout.env_workers == 8
    assert cfg.rollout.env_timeout_s >= 4 * (cfg.sandbox.timeout_s + GRACE_S)  # 4 programs at their limit a turn
    # the limits reach the sandbox from the command line too
    assert parse_argv(["recipe=grpo_python_tool", "sandbox.timeout_s=10"], ROOT / "recipes").sandbox.timeout_s == 10.0

    path = model_dir(tmp_path, "Qwen/Qwen2.5-1.5B-Instruct")
    p = plan.build(parse_argv(["recipe=grpo_python_tool", f"model.path={path}"], ROOT / "recipes"), 8, 1, 80)
    assert p.fits, p.error()

    tokenizer = build_chat_tokenizer()
    toolbox.check_template(tokenizer, "tiny-hermes")
    rows = datasets.Dataset.from_list([{"question": "Tom has 3 apples and buys 4 more. How many has he?"}])
    data = dataclasses.replace(cfg.data, max_prompt_tokens=4096)  # one token per character here, not Qwen's
    ids = tokenize_prompts(rows, data, tokenizer, "data.path", toolbox.schemas)[0]["prompt_ids"]
    prompt = tokenizer.decode(ids)
    assert prompt.startswith(f"<|im_start|>system\n{cfg.data.system_prompt}\n\n# Tools")
    assert json.dumps(toolbox.schemas[0]) in prompt and prompt.endswith("more. How many has he?<|im_end|>\n"
                                                                        "<|im_start|>assistant\n")

    configure(cfg.sandbox)  # as the trainer does at startup
    env = cfg.rollout.env({"question": "...", "answer": "#### 7"})
    code = json.dumps("apples = 3 + 4\nprint(apples)")
    call = f'<tool_call>\n{{"name": "python", "arguments": {{"code": {code}}}}}\n</tool_call>'
    assert as_step(env.step(f"Let me count. {call}", [])) == Step([{"role": "tool", "name": "python",
                                                                    "content": "7\n"}])
    flood = as_step(env.step('<tool_call>{"name": "python", "arguments": {"code": "print(\\"7\\" * 5000)"}}'
                             '</tool_call>', []))
    assert flood.observation[0]["content"] == "7" * 1024 + "\n[output truncated]\n"  # 1 KiB kept
    assert as_step(env.step("He has 7.\n#### 7", [])) == Step(None, 0.0, True) and env.stats.calls == 2
    configure(SandboxConfig())
