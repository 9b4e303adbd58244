"""The embedded tiny task: tokenizer, task sets, SFT loss, and the cache build (small, fast checks)."""
import json
import math
import random

import pytest
import torch

from rlcore.algorithms.sft import sft_loss
from rlcore.tasks import tiny


def test_tokenizer_round_trip():
    tok = tiny.build_tokenizer()
    ids = tok("12+34=").input_ids
    assert ids == [1, 5, 6, 14, 7, 8, 17]  # <bos> then one id per character
    assert tok.decode(ids[1:] + [tok.eos_token_id], skip_special_tokens=True) == "12+34="


def test_model_shape_fits_vllm_cpu():
    for arch in ("qwen2", "qwen3", "llama"):
        cfg = tiny.tiny_config(arch)
        assert cfg.hidden_size // cfg.num_attention_heads == 32 and cfg.vocab_size == 32


def test_held_out_problems_never_reach_training():
    train = tiny.problem_set(2048, 2, heldout=False)
    held_out = tiny.problem_set(256, 1, heldout=True)
    assert len(held_out) == 256 and not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(str(eval(r["prompt"][:-1])) == r["answer"] for r in held_out[:20])  # noqa: S307 (test data)
    assert all(tiny.is_heldout(r["prompt"]) for r in held_out)
    assert not any(tiny.is_heldout(f"{a}+{b}=") for a, b in (tiny.sample_problem(random.Random(0), False)
                                                             for _ in range(500)))  # warm-start problems


def test_sloppy_answer_forgets_the_carry_from_the_ones():
    assert [tiny.sloppy_answer(a, b) for a, b in ((47, 38), (58, 67), (45, 55), (12, 34))] == ["75", "115", "90", "46"]


def test_encode_masks_answer_and_eos_only():
    tok = tiny.build_tokenizer()
    ids, mask = tiny._encode(tok, [("12+34=", "46", 1.0), ("58+67=", "115", 0.8)])
    assert ids[0].tolist() == [1, 5, 6, 14, 7, 8, 17, 8, 10, 2, 0]  # <bos> 12+34= 46 <eos> <pad>
    # position t predicts token t + 1: "=" (t = 6) predicts "4", ..., "6" (t = 8) predicts <eos>
    assert mask[0].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert mask[1].tolist() == pytest.approx([0, 0, 0, 0, 0, 0, 0.8, 0.8, 0.8, 0.8])


def test_sft_loss_by_hand():
    # vocab 2, one sequence [0, 1, 0]: logits give p(next = 1) = sigmoid(l1 - l0)
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(3.0), 0.0], [0.0, 0.0]]])  # [1, 3, 2]
    ids = torch.tensor([[0, 1, 0]])
    loss, metrics = sft_loss(logits, ids, torch.tensor([[1.0, 1.0]]))
    # p(1 | 0) = 3/4 and p(0 | 0, 1) = 3/4 -> mean NLL = -log 0.75
    assert abs(loss.item() + math.log(0.75)) < 1e-6 and metrics["sft/tokens"].item() == 2.0
    loss, _ = sft_loss(logits, ids, torch.tensor([[0.0, 1.0]]), num_tokens=4)
    assert abs(loss.item() + math.log(0.75) / 4) < 1e-6  # a global count divides, not the call's own


def test_prepare_is_complete_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCORE_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "LEARN_STEPS", 3)
    monkeypatch.setattr(tiny, "HABIT_STEPS", 2)
    tiny.prepare()
    meta = json.loads((tmp_path / tiny.VERSION / "meta.json").read_text())
    assert meta["warm_start_steps"] == 5
    assert (tiny.model_dir() / "model.safetensors").exists() and len(tiny.eval_file().read_text().splitlines()) == 256
    stamp = (tmp_path / tiny.VERSION / "meta.json").stat().st_mtime_ns
    tiny.prepare()  # cached: nothing rebuilt
    assert (tmp_path / tiny.VERSION / "meta.json").stat().st_mtime_ns == stamp
    assert built(tmp_path) == [tiny.VERSION]  # no temporary folder left behind


def test_concurrent_builder_keeps_the_first_complete_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCORE_CACHE", str(tmp_path))
    target = tmp_path / tiny.VERSION

    def build_while_another_finishes(out_dir):
        (out_dir / "meta.json").write_text("{}")
        target.mkdir()  # another process renamed its complete build into place meanwhile
        (target / "meta.json").write_text('{"winner": true}')

    monkeypatch.setattr(tiny, "build", build_while_another_finishes)
    tiny.prepare()
    assert json.loads((target / "meta.json").read_text()) == {"winner": True}
    assert built(tmp_path) == [tiny.VERSION]  # the loser's copy is gone


def test_crashed_build_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCORE_CACHE", str(tmp_path))

    def crash(out_dir):
        (out_dir / "half.bin").write_text("x")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny, "build", crash)
    with pytest.raises(KeyboardInterrupt):
        tiny.prepare()
    assert built(tmp_path) == []


def test_a_second_builder_waits_for_the_first_and_builds_nothing(tmp_path, monkeypatch):
    """Two processes (here threads, each with its own lock file handle) prepare the same cache at once: one
    builds, the other waits on the lock and then reads that build."""
    import threading

    monkeypatch.setenv("RLCORE_CACHE", str(tmp_path))
    started, release, builds = threading.Event(), threading.Event(), []

    def slow_build(out_dir):
        builds.append(out_dir)
        started.set()
        release.wait(10)
        (out_dir / "meta.json").write_text(json.dumps({"build": len(builds)}))

    first = threading.Thread(target=tiny.prepare_cached, args=(tiny.VERSION, slow_build))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=tiny.prepare_cached, args=(tiny.VERSION, slow_build))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting on the lock, not building a copy
    release.set()
    first.join(10)
    second.join(10)
    assert len(builds) == 1 and json.loads((tmp_path / tiny.VERSION / "meta.json").read_text()) == {"build": 1}
    assert built(tmp_path) == [tiny.VERSION]


def built(cache) -> list[str]:
    """The cache's folders (its lock files aside)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
