"""Packed micro-batches (rlcore.train.packing): the plan, packed vs padded outputs of tiny models in fp32, and the
update's gradients with packing over two gloo ranks of very different sequence lengths."""
import json

import pytest
import torch

from conftest import FP32_EPS, WORKERS, torchrun_warm
from rlcore.algorithms.objectives import AGG_MODES
from rlcore.models import build as models
from rlcore.tasks import tiny
from rlcore.train import packing

LENGTHS = [9, 4, 13, 6, 2]  # real tokens per right-padded row
L = 14

# Packed vs padded update: rank 0's 75 tokens regrouped into other micro-batches, the 2 ranks' gradients summed, and
# matrix products (K <= 256) whose sums may run in another order for other shapes: (75 + 2 + 256) * eps = 4.0e-5,
# relative to the largest entry (gradients) or to max(|v|, 1) (metrics).
UPDATE_BOUND = (75 + 2 + 256) * FP32_EPS


def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, tiny.VOCAB_SIZE, (len(LENGTHS), L), generator=g)
    mask = (torch.arange(L)[None] < torch.tensor(LENGTHS)[:, None]).long()
    return ids * mask, mask  # pad id 0 after each row's real tokens


def tiny_model(kind: str = "lm", use_cache: bool = False):
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification)

    config = tiny.tiny_config("qwen2")
    config.use_cache = use_cache
    config.num_labels = 1
    auto = {"lm": AutoModelForCausalLM, "values": AutoModelForTokenClassification,
            "scores": AutoModelForSequenceClassification}[kind]
    torch.manual_seed(0)
    return auto.from_config(config, attn_implementation="sdpa").float().eval()


def test_first_fit_decreasing():
    assert packing.first_fit_decreasing([5, 3, 7, 2], 8) == [[2], [0, 1], [3]]  # the docstring's example
    assert packing.first_fit_decreasing([20, 3, 4], 8) == [[0], [1, 2]]  # too long for the cap: alone
    assert packing.first_fit_decreasing([], 8) == []
    lengths = torch.randint(1, 50, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    bins = packing.first_fit_decreasing(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(200))  # every row exactly once
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)  # a hard cap
    assert len(bins) <= sum(lengths) / 64 * 11 / 9 + 1  # FFD's bound: at most 11/9 OPT + 1 bins


def test_pack_layout_and_unpack():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [4, 3, 2, 1]])
    mask = (ids > 0).long()
    p = packing.pack(ids, mask)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3, 2, 1]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert p.last.tolist() == [2, 4, 8]
    per_token = torch.arange(1.0, 9.0)[None]  # [1, N - 1]: position p scores packed token p + 1
    # row 0 gets positions 0-1, row 1 position 3, row 2 positions 5-7; 2 and 4 cross a boundary
    assert p.unpack(per_token).tolist() == [[1, 2, 0], [4, 0, 0], [6, 7, 8]]
    d = packing.dummy("cpu")
    assert d.unpack(torch.ones(1, 1)).shape == (0, 1)


def test_split_pack_layout_and_unpack():
    """split=True: rows as wide as the longest sequence (4), first-fit-decreasing, each ended by a pad segment
    whose positions restart at 0; outputs [r, W - 1] unpack to the same rows as one packed row's."""
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [4, 3, 2, 1], [7, 0, 0, 0]])
    mask = (ids > 0).long()
    p = packing.pack(ids, mask, split=True)  # lengths [3, 2, 4, 1]: rows [2], [0, 3], [1] + pad
    assert p.input_ids.tolist() == [[4, 3, 2, 1], [5, 6, 7, 7], [8, 9, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 1]]
    assert p.last.tolist() == [6, 9, 3, 7]  # into the flattened [3, 4] input
    per_token = torch.arange(1.0, 10.0).view(3, 3)  # [r, W - 1]
    assert p.unpack(per_token).tolist() == [[4, 5, 0], [7, 0, 0], [1, 2, 3], [0, 0, 0]]


def logprobs(model, ids, mask, packed=None, **kw):
    if packed is None:
        return models.token_logprobs(model, ids, mask, 0.8, with_entropy=True, **kw)
    return packed.unpack(models.token_logprobs(model, packed.input_ids, None, 0.8, with_entropy=True,
                                               position_ids=packed.position_ids, **kw))


@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("chunk", [0, 16])
def test_packed_logprobs_equal_padded(use_cache, chunk):
    """One packed row of all five sequences scores every real token as the padded rows do (1e-5), entropy
    too, and so do split rows (split=True, the update's packing under sdpa); with use_cache on in the model
    config as well (token_logprobs passes use_cache=False)."""
    model = tiny_model(use_cache=use_cache)
    ids, mask = batch()
    scored = mask[:, 1:].bool()  # positions whose next token is real
    with torch.no_grad():
        ref_lp, ref_ent = logprobs(model, ids, mask, chunk_tokens=chunk)
        for split in (False, True):  # one packed row; rows as wide as the longest sequence
            lp, ent = logprobs(model, ids, mask, packing.pack(ids, mask, split=split), chunk_tokens=chunk)
            assert (lp - ref_lp)[scored].abs().max() < 1e-5, split
            assert (ent - ref_ent)[scored].abs().max() < 1e-5, split
            assert (lp[~scored] == 0).all()


def test_positions_that_do_not_restart_disagree():
    """Negative control: the same packed row with positions 0..N-1 (no boundaries, so one long causal
    sequence) scores the later sequences differently."""
    model = tiny_model()
    ids, mask = batch()
    scored = mask[:, 1:].bool()
    p = packing.pack(ids, mask)
    with torch.no_grad():
        ref_lp, _ = logprobs(model, ids, mask)
        p.position_ids = torch.arange(p.input_ids.shape[1])[None]
        lp, _ = logprobs(model, ids, mask, p)
    assert (lp - ref_lp)[scored].abs().max() > 1e-2


def test_a_cache_drops_the_packing_mask():
    """The trap token_logprobs avoids: called with use_cache=True, the model lets packed sequences attend
    across their boundaries (sdpa), so the packed logits are wrong."""
    model = tiny_model(use_cache=True)
    ids, mask = batch()
    p = packing.pack(ids, mask)
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [B, L, V]
        for use_cache, agrees in ((False, True), (True, False)):
            packed = model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=use_cache).logits
            last_row = packed[0, -LENGTHS[-1]:]  # the last sequence in the pack: [2, V]
            assert torch.allclose(last_row, padded[-1, :LENGTHS[-1]], atol=1e-5) == agrees


def test_packed_values_and_scores_equal_padded():
    ids, mask = batch()
    p = packing.pack(ids, mask)
    scored = mask[:, 1:].bool()
    with torch.no_grad():
        critic = tiny_model("values")
        # A value head that is not zero, at the logprobs' scale: v ~ N(0, 1), |v| < 4.5, so 1e-5 is 20-40 ulps as
        # for the logprobs above (std 1 made |v| ~ 30, where 1e-5 is 5 ulps: one more rounding on another CPU).
        torch.nn.init.normal_(critic.score.weight, std=critic.config.hidden_size ** -0.5)
        ref_values = models.token_values(critic, ids, mask)
        values = p.unpack(models.token_values(critic, p.input_ids, None, p.position_ids))
        assert (values - ref_values)[scored].abs().max() < 1e-5
        rm = tiny_model("scores")
        ref = models.sequence_scores(rm, ids, mask)
        scores = models.sequence_scores(rm, p.input_ids, None, p.position_ids, last=p.last)
        assert scores.shape == (len(LENGTHS),) and (scores - ref).abs().max() < 1e-5
        split = packing.pack(ids, mask, split=True)
        values = split.unpack(models.token_values(critic, split.input_ids, None, split.position_ids))
        assert (values - ref_values)[scored].abs().max() < 1e-5
        scores = models.sequence_scores(rm, split.input_ids, None, split.position_ids, last=split.last)
        assert (scores - ref).abs().max() < 1e-5
        assert ref.std() > 1e-3  # five different scores, so a misplaced index would show


def test_token_budget_is_validated():
    from conftest import ROOT
    from rlcore.config import validate
    from rlcore.config.cli import load_recipe
    from rlcore.distributed.parallel import ParallelDims

    cfg = load_recipe("demo", ROOT / "recipes")
    cfg.train.max_tokens_per_micro_batch = 256
    validate(cfg, ParallelDims(2, 1))
    cfg.train.max_tokens_per_micro_batch = -1
    with pytest.raises(ValueError, match="train.max_tokens_per_micro_batch must be >= 0"):
        validate(cfg, ParallelDims(2, 1))


@pytest.fixture(scope="module")
def update_worker(tiny_models, tmp_path_factory) -> dict:
    """One run of tests/workers/update_worker.py on 2 gloo ranks (about 15 s), for the two tests below."""
    out = tmp_path_factory.mktemp("update") / "update.json"
    proc = torchrun_warm(WORKERS / "update_worker.py", tiny_models["qwen2"], out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_two_ranks_of_different_lengths_pack_like_padded(update_worker):
    """2 FSDP2 ranks, rank 0 with 8-30-token sequences and rank 1 with 3-6, budgets 16 (below rank 0's
    longest) and 40 vs padded micro-batches of 2 rows (tests/workers/update_worker.py): both ranks run the
    same number of forward passes although rank 1 packs fewer micro-batches (so it ran dummies), and finish;
    old logprobs and values agree to 1e-5; a PPO update (2 mini-batches, so 2 optimizer steps, temperature
    0.9, chunked logprobs) gives the padded path's policy and critic gradients (1e-5 relative to each
    tensor's largest entry) and metrics for every aggregation mode.

    On-policy (1 mini-batch), padded and packed, the same worker checks the update that computes the old
    logprobs itself (forward.takes_old_logprobs): see test_on_policy_update_takes_its_own_old_logprobs."""
    r = update_worker
    for budget in (16, 40):
        # rank 1 packs fewer micro-batches, so it must run dummies to keep in step
        assert r[f"{budget}/packs/rank1"] < r[f"{budget}/packs/rank0"]
        assert sum(r[f"{budget}/mini_packs/rank1"]) < sum(r[f"{budget}/mini_packs/rank0"])
        # the policy's forwards for the old logprobs of the whole batch
        assert r[f"{budget}/forward_passes/rank0"] == r[f"{budget}/forward_passes/rank1"] \
            == r[f"{budget}/packs/rank0"]
        assert r[f"{budget}/forward_diff/rank0"] < 1e-5 and r[f"{budget}/forward_diff/rank1"] < 1e-5
    for agg in AGG_MODES:
        assert r[f"{agg}/policy_grad_scale"] > 1e-3 and r[f"{agg}/critic_grad_scale"] > 1e-3
        assert r[f"{agg}/steps"] == 2  # optimizer steps applied (each compared)
        for budget in (16, 40):
            passes = [r[f"{agg}/{budget}/update_passes/rank{k}"] for k in (0, 1)]
            assert passes[0] == passes[1] == sum(r[f"{budget}/mini_packs/rank0"])
            for key in ("policy_grad", "critic_grad", "metrics"):
                assert r[f"{agg}/{budget}/{key}"] < UPDATE_BOUND, (agg, budget, key, r[f"{agg}/{budget}/{key}"])


@pytest.mark.slow
def test_on_policy_update_takes_its_own_old_logprobs(update_worker):
    """The second half of tests/workers/update_worker.py, 2 ranks, padded and packed (budget 16): an
    on-policy update given batch.old_logprobs=None fills them from its own forward, equal (1e-6) to a
    separate forward_logprobs pass; its before_step hook (the trainer's sync check) sees them while no
    weight has moved; the gradients of both steps and every metric equal those of the update given the
    separate pass's old logprobs (1e-6). (The trainer-level check: tests/test_train.py's skipped sync.)"""
    r = update_worker
    for budget in (0, 16):
        assert r[f"on_policy/{budget}/steps"] == 1
        assert r[f"on_policy/{budget}/old_diff/rank0"] < 1e-6 and r[f"on_policy/{budget}/old_diff/rank1"] < 1e-6
        assert r[f"on_policy/{budget}/moved_before_step"] == 0.0 and r[f"on_policy/{budget}/moved_after"] > 1e-4
        assert r[f"on_policy/{budget}/grad"] < 1e-6 and r[f"on_policy/{budget}/metrics"] < 1e-6


def test_a_row_of_two_sequences_scores_each_as_its_own_row():
    """A rewritten agent history (rlcore.batch position_ids): rows 0 and 1 laid one after the other in one row,
    positions restarting at the second, score every token as the two padded rows do (1e-5), through the
    padded forward (mask None, rlcore.train.forward.per_token) and packed with the row's own positions; without the
    restart (a negative control) the second sequence reads the first and scores differently."""
    model = tiny_model()
    ids, mask = batch()
    n0, n1 = LENGTHS[0], LENGTHS[1]
    row = torch.cat([ids[0, :n0], ids[1, :n1]])[None]  # [1, n0 + n1]
    positions = torch.cat([torch.arange(n0), torch.arange(n1)])[None]
    with torch.no_grad():
        ref, _ = logprobs(model, ids, mask)
        both = models.token_logprobs(model, row, None, 0.8, position_ids=positions)  # [1, n0 + n1 - 1]
        p = packing.pack(row, torch.ones_like(row), position_ids=positions)
        packed = p.unpack(models.token_logprobs(model, p.input_ids, None, 0.8, position_ids=p.position_ids))
        plain = models.token_logprobs(model, row, torch.ones_like(row), 0.8)
        # the trainer's forwards (rlcore.train.forward.per_token) on a Batch holding that row, padded and packed
        from types import SimpleNamespace
        from rlcore.batch import Batch
        from rlcore.train.forward import per_token
        b = Batch(row, torch.ones_like(row), torch.ones(1, n0 + n1 - 1), torch.zeros(1, n0 + n1 - 1), torch.zeros(1), 1,
                  position_ids=positions)
        trained = [per_token(SimpleNamespace(cfg=SimpleNamespace(
            train=SimpleNamespace(max_tokens_per_micro_batch=budget), model=SimpleNamespace(attn_implementation="sdpa"))),
            b, lambda i, m, pos: models.token_logprobs(model, i, m, 0.8, position_ids=pos)) for budget in (0, 64)]
    for out in (both, packed, *trained):
        assert (out[0, :n0 - 1] - ref[0, :n0 - 1]).abs().max() < 1e-5
        assert (out[0, n0:n0 + n1 - 1] - ref[1, :n1 - 1]).abs().max() < 1e-5
    assert (plain[0, n0:n0 + n1 - 1] - ref[1, :n1 - 1]).abs().max() > 1e-2
