"""Every recipe loads and validates for the world it is written for, with no GPU and no network."""
import pytest

from conftest import ROOT
from rlcore.cli import available_recipes, load_recipe
from rlcore.parallel import ParallelDims
from rlcore.config import validate

# Qwen2.5-1.5B-Instruct's config.json: 12 attention heads, 2 key/value heads, 32768 positions.
QWEN25_15B = {"heads": 12, "kv_heads": 2, "context": 32768}


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


# Qwen3-30B-A3B's config.json: a mixture of experts, 128 experts of which 8 are routed per token.
QWEN3_30B_A3B = {"heads": 32, "kv_heads": 4, "head_dim": 128, "context": 40960, "layers": 48, "hidden": 2048,
                 "experts": 128, "moe_intermediate": 768, "vocab": 151936, "tied": False}
GPU_GB = 80  # an H100 / A100 80 GB node


def parameter_count(c: dict) -> int:
    attention = c["hidden"] * c["head_dim"] * (2 * c["heads"] + 2 * c["kv_heads"]) + 2 * c["head_dim"]
    experts = c["experts"] * 3 * c["hidden"] * c["moe_intermediate"]
    layer = attention + experts + c["hidden"] * c["experts"] + 2 * c["hidden"]  # + router, norms
    return c["layers"] * layer + c["vocab"] * c["hidden"] * (1 if c["tied"] else 2) + c["hidden"]


def test_grpo_moe_recipe_fits_one_8_gpu_node():
    """recipe=grpo_moe: Qwen3-30B-A3B, FSDP2 over 8 GPUs (a decoder layer with its experts is one unit) and
    two TP=4 engines; the memory arithmetic of its docstring, from the model's config numbers."""
    cfg = load_recipe("grpo_moe", ROOT / "recipes")
    c, tp, world = QWEN3_30B_A3B, cfg.rollout.tensor_parallel, 8
    dims = ParallelDims(world_size=world, tp=tp)
    dims.validate(c["heads"], c["kv_heads"])
    validate(cfg, dims)
    assert cfg.model.path == "Qwen/Qwen3-30B-A3B" and tp == 4 and dims.rollout_groups == 2
    assert cfg.model.mixed_precision == "bfloat16" and cfg.model.activation_checkpointing
    assert not cfg.algorithm.needs_reference  # no KL term: no reference model to hold
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens <= c["context"]
    n = parameter_count(c)
    assert 30.4e9 < n < 30.6e9  # the model card's 30.5B
    gb = 1e9
    at_rest = n * (4 + 8) / world / gb  # fp32 weights + AdamW moments, sharded
    training = at_rest + n * 4 / world / gb + 2 * 2 * n / c["layers"] / gb  # + fp32 grads, 2 gathered layers
    engine = cfg.rollout.gpu_memory_utilization * GPU_GB
    engine_weights = 2 * n / tp / gb  # bf16, this rank's tensor-parallel slice
    kv_per_token = c["layers"] * 2 * max(1, c["kv_heads"] // tp) * c["head_dim"] * 2 / gb
    # The engine sleeps while training; >= 10 GB are left for activations (checkpointed, micro-batches of 2).
    assert GPU_GB - training > 10
    assert at_rest + engine < 0.9 * GPU_GB  # generating: trainer shards + the engine's whole budget
    assert (engine - engine_weights) / kv_per_token > 100_000  # KV cache tokens per engine rank
    # TP=2 would not fit beside the trainer: its engine weights alone exceed the engine's budget.
    assert 2 * n / 2 / gb > engine


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
    assert cfg.prepare == "rlcore.tiny:prepare"


def test_every_recipe_loads():
    assert {"demo", "grpo", "grpo_moe", "ppo", "ppo_tiny", "reinforce_pp", "reinforce_pp_tiny"} <= set(
        available_recipes(ROOT / "recipes"))
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
