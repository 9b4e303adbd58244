"""The launch plan (rlcore/preflight/plan.py): counts against hand arithmetic (model sizes: tests/test_sizes.py), fit
verdicts and levers, the two entry points (launch/plan.py, launch/train.py plan=true), and torchrun's failure report
naming the cause.

Model shapes are written into the test as config.json folders: no hub, no weights, no GPU."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, rank_exit_codes, train_cmd, train_warm
from rlcore.config.cli import parse_argv
from rlcore.preflight import plan

GB = 2**30
TINY = dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=100, tie_word_embeddings=False, max_position_embeddings=512)
QWEN25_1P5B = dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                   max_position_embeddings=32768)
QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                 max_position_embeddings=32768)
SHAPE_72B = dict(model_type="qwen2", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                 num_key_value_heads=8, intermediate_size=29568, vocab_size=152064, tie_word_embeddings=False,
                 max_position_embeddings=32768)


def model_dir(tmp_path, name, config):
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config | {"architectures": ["Qwen2ForCausalLM"]}))
    return path


def grpo_plan(tmp_path, config, *overrides, gpus=8, gpu_gb=80):
    cfg = parse_argv(["recipe=grpo", f"model.path={model_dir(tmp_path, 'm', config)}", *overrides], ROOT / "recipes")
    return plan.build(cfg, gpus, 1, gpu_gb)


def part(bar, prefix):
    return sum(b for name, b in bar.parts if name.startswith(prefix))


def test_tiny_counts_by_hand():
    """The meta model's counts (rlcore/preflight/shapes.py) against arithmetic; every architecture and the
    real models are tests/test_sizes.py's."""
    s = plan.Shapes.from_config(TINY)  # h 64, d 64/4 = 16, kv width 2*16 = 32
    q, k, v = 64 * 64 + 64, 64 * 32 + 32, 64 * 32 + 32  # qwen2: q/k/v have biases
    o, mlp, norms = 64 * 64, 3 * 64 * 128, 2 * 64
    assert s.layer == q + k + v + o + mlp + norms == 37120
    assert s.root == 100 * 64 + 64 + 100 * 64  # embedding, final norm, untied head
    assert s.params == 2 * 37120 + s.root == 87104
    assert plan.Shapes.from_config(TINY, "critic").params == 87104 - 100 * 64 + 64 + 1  # value head, with bias
    assert plan.Shapes.from_config(TINY, "reward").params == 87104 - 100 * 64 + 64  # score head, no bias
    assert s.kv_bytes_per_token(tp=1, dtype_bytes=2) == 2 * 2 * 2 * 16 * 2 == 256  # K and V, L, n_kv, d, bf16
    assert s.kv_bytes_per_token(tp=2, dtype_bytes=2) == 128
    assert s.kv_bytes_per_token(tp=4, dtype_bytes=2) == 128  # kv heads replicated when tp > n_kv


@pytest.mark.parametrize("config, params, kv_tp1", [
    # per layer: q h*h + h, k and v h*(n_kv*128) + n_kv*128, o h*h, MLP 3*h*I, two norms 2h
    (QWEN25_1P5B, 28 * (1536 * 1536 + 1536 + 2 * (1536 * 256 + 256) + 1536 * 1536 + 3 * 1536 * 8960 + 2 * 1536)
     + 151936 * 1536 + 1536, 2 * 28 * 2 * 128 * 2),  # tied: one embedding
    (QWEN25_7B, 28 * (3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584)
     + 2 * 152064 * 3584 + 3584, 2 * 28 * 4 * 128 * 2),  # untied: embedding and lm_head
])
def test_qwen_counts_by_hand(tmp_path, config, params, kv_tp1):
    assert params in (1_543_714_304, 7_615_616_512)
    p = grpo_plan(tmp_path, config, "rollout.tensor_parallel=1")
    actor = p.models[0]
    assert actor.role == "actor" and actor.params == params
    assert p.kv_per_token == kv_tp1  # 1.5B: 28,672 B/token; 7B: 57,344 B/token (bf16 engine)
    # float32 master weights, FSDP over 8: params 4P/8, grads 4P/8, AdamW m and v 8P/8 bytes per GPU
    assert part(p.train, "actor params") == 4 * params / 8
    assert part(p.train, "actor grads") == 4 * params / 8
    assert part(p.train, "actor AdamW") == 8 * params / 8
    assert part(p.generation, "actor grads") == 0  # freed after the optimizer step
    assert grpo_plan(tmp_path, config, "rollout.tensor_parallel=2").kv_per_token == kv_tp1 // 2


def test_grpo_fits_on_8_gpus_of_80gb(tmp_path):
    p = grpo_plan(tmp_path, QWEN25_1P5B)
    assert p.fits and p.levers == {} and p.error() == ""
    # micro-batch 8 x (512 + 1024) = 12288 tokens; logits in chunks of 1024 tokens: 1024 * 151936 * (2 + 16)
    assert p.micro_tokens == 12288
    assert part(p.train, "logits") == 1024 * 151936 * 18
    assert p.train.total / GB == pytest.approx(38.1 - 11 * 1024 * 151936 * 18 / GB, abs=0.1)
    # unchunked, all 12288 tokens' logits are held at once: 28.6 GB more
    whole = grpo_plan(tmp_path, QWEN25_1P5B, "train.logprob_chunk_tokens=0")
    assert part(whole.train, "logits") == 12288 * 151936 * 18
    assert whole.train.total / GB == pytest.approx(38.1, abs=0.1)
    assert p.generation.total / GB == pytest.approx(34.9, abs=0.1)  # 0.4 * 80 GB engine + trainer state
    assert p.kv_per_token == 14336  # tp=2: one KV head per rank
    text = p.render()
    assert "FSDP over ranks 0-7; 4 rollout group(s) x tp=2: [0,1] [2,3] [4,5] [6,7]" in text
    assert "reference" in text and "critic    none" in text


def test_72b_does_not_fit_and_names_the_levers(tmp_path):
    p = grpo_plan(tmp_path, SHAPE_72B)
    assert not p.fits and not p.train.fits and not p.generation.fits
    message = p.error()
    assert message.startswith("the TRAIN bar needs") and "the GENERATION bar" in message
    levers = p.levers["train"]
    assert 2 <= len(levers) <= 3
    assert [saved for _, saved, _ in levers] == sorted((saved for _, saved, _ in levers), reverse=True)
    names = [name for name, _, _ in levers]
    assert "--nnodes 8" in names and "model.dtype=bfloat16" in names
    assert all(name in message for name in names)


@pytest.mark.slow
def test_plan_cli_exit_codes(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(ROOT / "launch" / "plan.py"), *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    ok = run("recipe=grpo", f"model.path={model_dir(tmp_path, 'q15', QWEN25_1P5B)}", "--nproc-per-node", 8,
             "--gpu-memory-gb", 80)
    assert ok.returncode == 0, ok.stderr
    assert "mesh: world 8" in ok.stdout and "TRAIN bar per GPU" in ok.stdout and "GENERATION bar" in ok.stdout
    big = run("recipe=grpo", f"model.path={model_dir(tmp_path, 'q72', SHAPE_72B)}", "--nproc-per-node=8",
              "--gpu-memory-gb=80")
    assert big.returncode == 1
    assert big.stdout.strip().splitlines()[-1].startswith("rlcore: does not fit: the TRAIN bar needs")
    split = run("recipe=grpo", f"model.path={tmp_path / 'q15'}", "rollout.ranks=3", "--nproc-per-node", 8,
                "--gpu-memory-gb", 80)
    assert split.returncode == 2 and split.stdout == ""
    assert split.stderr.strip() == ("rlcore: error: rollout.ranks=3 must be a multiple of rollout.tensor_parallel=2 "
                                    "below the world size 8 (the rest of the ranks train); valid: [2, 4, 6] or 0 "
                                    "(colocated)")
    missing = run("recipe=grpo", f"model.path={tmp_path}/nope", "--nproc-per-node", 8, "--gpu-memory-gb", 80)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (f"rlcore: error: model.path '{tmp_path}/nope' has no config.json locally or "
                                      f"in the hub cache; the plan reads model shapes from there (download the "
                                      f"model, or run the recipe's prepare first)")


@pytest.mark.slow
def test_train_plan_true_prints_and_exits(tmp_path):
    proc = train_warm("recipe=demo", "plan=true", f"model.path={model_dir(tmp_path, 'tiny', TINY)}",
                      f"output_dir={tmp_path}/runs", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("rlcore plan: demo on 1 node(s) x 2") == 1  # rank 0 only
    assert "mesh: world 2; FSDP over ranks 0-1; 2 rollout group(s) x tp=1: [0] [1]" in proc.stdout
    assert not (tmp_path / "runs").exists(), "plan=true starts nothing and writes nothing"


@pytest.mark.slow
def test_torchrun_report_names_the_error(tmp_path):
    proc = train_cmd("recipe=demo", "optim.lr=fast", f"output_dir={tmp_path}", timeout=300)
    assert rank_exit_codes(proc) == {2}
    root_cause = proc.stderr.split("Root Cause")[-1]
    assert "rlcore: error: config key 'optim.lr' expects float, got 'fast'" in root_cause, proc.stderr[-3000:]


def test_lora_plan_drops_the_reference_and_the_base_optimizer_state(tmp_path):
    """LoRA (lora=true): adapter params by hand; the train bar holds the frozen base, and only the adapters'
    params, grads and AdamW moments; no reference copy; the sync moves the adapters only."""
    full = grpo_plan(tmp_path, QWEN25_1P5B, "algorithm.kl_coef=0.01")
    p = grpo_plan(tmp_path, QWEN25_1P5B, "algorithm.kl_coef=0.01", "lora=true", "lora.rank=16")
    h, q, kv, i = 1536, 1536, 256, 8960  # 12 heads x 128, 2 kv heads x 128
    per_rank = (h + q) + 2 * (h + kv) + (q + h) + 3 * (h + i)  # q, k, v, o, gate, up, down
    adapters = 28 * 16 * per_rank
    assert p.models[0].adapters == adapters == 18_464_768
    assert [m.role for m in p.models] == ["actor"] and "reference" in [m.role for m in full.models]
    assert part(p.train, "actor LoRA adapters") == 4 * adapters / 8
    assert part(p.train, "actor AdamW m + v of the adapters") == 8 * adapters / 8
    assert part(p.train, "actor adapter grads") == 4 * adapters / 8
    assert part(p.train, "reference") == 0 and part(p.train, "actor AdamW m + v (") == 0
    assert p.train.total < full.train.total - 3 * 0.7 * GB  # base grads, AdamW and the reference gone
    assert p.sync_bytes == 2 * adapters and full.sync_bytes == 2 * full.models[0].params  # in the bf16 engine dtype
    text = p.render()
    assert "reference the actor with its adapters off (LoRA): no copy" in text
    assert "SYNC per step" in text and "LoRA adapters only" in text


def test_split_7b_trainer_bars_hold_a_quarter_of_the_state_rollout_bars_none(tmp_path):
    """rollout.ranks=4 of 8: the models shard over the 4 trainer ranks (1/4 each, not 1/8); a rollout GPU
    holds its engine and the largest unit of the weight transfer, no model state."""
    params = 7_615_616_512
    root = 2 * 152064 * 3584 + 3584  # untied: embedding + lm_head, final norm
    layer = 3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    colocated = grpo_plan(tmp_path, QWEN25_7B)
    p = grpo_plan(tmp_path, QWEN25_7B, "rollout.ranks=4")
    assert [bar.name for bar in p.bars] == ["rollout", "trainer"] and p.fits
    assert part(colocated.train, "actor AdamW") == 8 * params / 8 and part(p.train, "actor AdamW") == 8 * params / 4
    assert part(p.train, "actor params") == part(p.train, "actor grads") == part(p.train, "reference") == 4 * params / 4
    # params + grads + AdamW of the actor and the frozen reference: 20 bytes per parameter, over 4 ranks not 8
    assert p.train.total - colocated.train.total == pytest.approx(20 * params / 4 - 20 * params / 8)
    assert part(p.train, "dormant engine") == 0  # asleep at level 2 from the start
    # between steps rank 4 holds 2 roots + a layer in bf16 in flight, less than the step frees: adds nothing
    send = next(name for name, _ in p.train.parts if name.startswith("weight send"))
    assert f"{2 * (2 * root + layer) / GB:.2f} in flight" in send and part(p.train, "weight send") == 0
    assert p.train.total / GB == pytest.approx(48.34, abs=0.01)
    assert [name.split(" ")[0] for name, _ in p.generation.parts] == ["engine", "weight"]  # no model state
    assert p.generation.total == 0.4 * 80 * GB + 2 * root
    assert p.kv_bytes == colocated.kv_bytes and p.sync_bytes == colocated.sync_bytes == 2 * params
    text = p.render()
    assert "mesh: world 8, split (rollout.ranks=4): ranks 0-3 generate, 2 engine(s) x tp=2: [0,1] [2,3]" in text
    assert "ranks 4-7 train, FSDP over them; their engines are dormant (dummy weights, eager, asleep at level 2)" in text
    assert "ROLLOUT bar per GPU, ranks 0-3: an engine" in text and "TRAINER bar per GPU, ranks 4-7: the models" in text
    assert "FSDP over 4 ranks" in text and "a step samples 512 per engine" in text  # 128 prompts / 2 engines x 8


def test_split_fit_check_covers_both_kinds_of_gpu(tmp_path):
    """Two trainer ranks cannot hold a 7B's state and an engine at 0.95 of the GPU leaves no room for the
    transfer's unit: both bars fail, each with its own levers."""
    p = grpo_plan(tmp_path, QWEN25_7B, "rollout.ranks=6", "rollout.prompts_per_step=96",
                  "rollout.gpu_memory_utilization=0.95")
    assert not p.generation.fits and not p.train.fits
    message = p.error()
    assert message.startswith("the ROLLOUT bar needs 78.0 GB, 6.0 GB over the 72.0 GB usable per GPU; levers: ")
    assert ("rollout.gpu_memory_utilization=0.85", 0.1 * 80 * GB, True) in p.levers["rollout"]
    # 4 trainer ranks instead of 2 fit, as do bf16 master weights or the reference offloaded to CPU
    assert [(name, ok) for name, _, ok in p.levers["trainer"]] == [
        ("model.offload_frozen=true", True), ("model.dtype=bfloat16", True), ("rollout.ranks=4", True)]
    assert "the TRAINER bar needs 83.8 GB, 11.8 GB over the 72.0 GB usable per GPU" in message


@pytest.mark.parametrize("ranks", [3, 8])
def test_split_bad_rollout_ranks_is_one_line(tmp_path, ranks):
    with pytest.raises(ValueError) as e:
        grpo_plan(tmp_path, QWEN25_7B, f"rollout.ranks={ranks}")
    assert str(e.value) == (f"rollout.ranks={ranks} must be a multiple of rollout.tensor_parallel=2 below the world "
                            f"size 8 (the rest of the ranks train); valid: [2, 4, 6] or 0 (colocated)")


def test_split_on_nodes_names_them(tmp_path):
    """4 nodes x 8: node 0 generates, nodes 1-3 train; the state shards over 24 trainer ranks."""
    cfg = parse_argv(["recipe=grpo", f"model.path={model_dir(tmp_path, 'm', QWEN25_7B)}", "rollout.ranks=8",
                      "rollout.prompts_per_step=96"], ROOT / "recipes")
    p = plan.build(cfg, 8, 4, 80)
    assert part(p.train, "actor AdamW") == 8 * 7_615_616_512 / 24
    text = p.render()
    assert "ranks 0-7 (node 0) generate, 4 engine(s) x tp=2" in text and "ranks 8-31 (nodes 1-3) train" in text
    assert "TRAINER bar per GPU, ranks 8-31 (nodes 1-3): the models" in text


def test_split_on_cpu_shares_the_host(tmp_path, monkeypatch):
    """CPU: the dormant engines keep their weights and KV cache, and one host holds the rollout rank and
    both trainer ranks: each bar is checked against that sum."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(plan, "host_memory", lambda: 64 * GB)
    cfg = parse_argv(["recipe=demo", f"model.path={model_dir(tmp_path, 'tiny', TINY)}", "rollout.ranks=1"],
                     ROOT / "recipes")
    p = plan.build(cfg, 3)
    rollout, trainer = p.generation, p.train
    assert rollout.total == 1 * GB + 4 * 87104 + GB / 2 + 4 * 37120  # runtime, engine, KV, a layer (> root)
    assert part(trainer, "dormant engine KV cache") == GB / 2 and part(trainer, "actor AdamW") == 8 * 87104 / 2
    assert (rollout.ranks_sharing, rollout.neighbours) == (1, (2, 2 * trainer.total))
    assert (trainer.ranks_sharing, trainer.neighbours) == (2, (1, rollout.total))
    assert rollout.used == trainer.used == rollout.total + 2 * trainer.total and p.fits
    assert "total x 2 ranks + 1 rollout rank(s)" in p.render()
