"""Every recipe loads and validates for the world it is written for, with no GPU and no network."""
import pytest

from conftest import ROOT
from rlcore.cli import available_recipes, load_recipe
from rlcore.parallel import ParallelDims
from rlcore.trainer import validate

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
    assert {"demo", "grpo", "ppo", "ppo_tiny", "reinforce_pp", "reinforce_pp_tiny"} <= set(
        available_recipes(ROOT / "recipes"))
    for name in available_recipes(ROOT / "recipes"):
        assert load_recipe(name, ROOT / "recipes").algorithm is not None


def test_tool_recipe_is_valid_and_its_calculator_answers():
    """recipe=grpo_tools: grpo's node and model, a calculator environment over up to 4 turns. Its tool answers
    well-formed calls, explains malformed ones in a tool message, and ends the trajectory on a final answer."""
    from rlcore.rollout.env import Step, as_step
    cfg = load_recipe("grpo_tools", ROOT / "recipes")
    dims = ParallelDims(world_size=8, tp=cfg.rollout.tensor_parallel)
    dims.validate(QWEN25_15B["heads"], QWEN25_15B["kv_heads"])
    validate(cfg, dims)
    assert cfg.data.max_prompt_tokens + cfg.rollout.max_total_tokens <= QWEN25_15B["context"]
    assert cfg.rollout.max_total_tokens >= cfg.rollout.max_new_tokens and cfg.data.chat_template
    env = cfg.rollout.env({"question": "...", "answer": "#### 42"})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*4-6"}}</tool_call>'
    assert as_step(env.step(f"Let me compute. {call}", [])) == Step([{"role": "tool", "content": "42"}])
    assert as_step(env.step('<tool_call>{"expression": "1/0"}</tool_call>', [])).observation[0]["content"] == \
        "error: KeyError: 'arguments'"
    bad = as_step(env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}'
                           '</tool_call>', []))
    assert bad.observation[0]["content"].startswith("error: ValueError: unsupported expression") and not bad.done
    assert as_step(env.step("So the answer is\n#### 42", [])) == Step(None, 0.0, True) and env.calls == 3
