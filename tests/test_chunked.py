"""Chunked logprobs (models.token_logprobs with chunk_tokens > 0) equal the unchunked ones: values, entropy and
gradients, on the tiny Qwen2 in fp32. The two-rank FSDP2 case is in tests/test_fsdp.py."""
import pytest
import torch

from conftest import FP32_EPS
from rlcore.models import build as models
from rlcore.tasks import tiny

B, L = 3, 11  # 3 x 10 = 30 predicted tokens
H = 128  # the tiny model's hidden size
# Chunked and unchunked take different formulas and GEMM shapes. Values: a K = H head sum (its order may change with
# the GEMM's row count) and a V-term logsumexp in another formula, on |logp| <= 4.5 (log 32 = 3.47 at T = 1):
# (V + H) * eps * 4.5 = 8.6e-5. Gradients, relative to max(1, max|g|): the head's gradient sum over the B * (L - 1)
# = 30 tokens regrouped by chunk besides: (30 + V + H) * eps = 2.3e-5. fp64: the same formulas at fp64's eps stay
# under 1e-12.
TOL_VALUES = (tiny.VOCAB_SIZE + H) * FP32_EPS * 4.5
TOL_GRADS = (B * (L - 1) + tiny.VOCAB_SIZE + H) * FP32_EPS


def tiny_lm(tied: bool = False, dtype=torch.float32, vocab: int = tiny.VOCAB_SIZE) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = tiny.tiny_config("qwen2")
    config.tie_word_embeddings, config.vocab_size = tied, vocab
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, tiny.VOCAB_SIZE, (B, L), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # a right-padded row
    weights = torch.randn(B, L - 1, generator=g, dtype=torch.float64)  # a loss weighing every token differently
    return ids, mask, weights


def run(model, chunk: int, temperature: float):
    """logprobs, entropy and the gradient of a weighted sum of both w.r.t. every parameter."""
    ids, mask, w = inputs()
    model.zero_grad(set_to_none=True)
    logprobs, entropy = models.token_logprobs(model, ids, mask, temperature, with_entropy=True, chunk_tokens=chunk)
    ((logprobs * w.to(logprobs.dtype)).sum() + (entropy * w.flip(-1).to(logprobs.dtype)).sum()).backward()
    return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_equals_unchunked_with_gradients(tied, dtype):
    """Within TOL_VALUES / TOL_GRADS in fp32 (gradients relative to their largest entry, ~8 here); to 1e-12 in fp64,
    which shows the difference is rounding alone."""
    tol, tol_g = (TOL_VALUES, TOL_GRADS) if dtype == torch.float32 else (1e-12, 1e-12)
    model = tiny_lm(tied, dtype)
    for temperature in (1.0, 0.7):
        ref_lp, ref_ent, ref_grads = run(model, 0, temperature)
        assert ref_lp.shape == ref_ent.shape == (B, L - 1)
        assert ref_grads["model.embed_tokens.weight"].abs().max() > 1  # a real gradient, so errors would show
        for chunk in (1, 5, 7, 30, 1000):  # 7 does not divide the 30 tokens; 1000 is one chunk
            lp, ent, grads = run(model, chunk, temperature)
            assert (lp - ref_lp).abs().max() < tol, (chunk, temperature)
            assert (ent - ref_ent).abs().max() < tol, (chunk, temperature)
            for name, g in ref_grads.items():
                err = ((grads[name] - g).abs().max() / g.abs().max().clamp(min=1)).item()
                assert err < tol_g, (chunk, temperature, name, err)


def test_entropy_as_a_metric_only():
    """The update returns entropy for its metric but its loss does not use it: the fused head then gets no
    entropy gradient (None, not zeros), and the logprob gradients still equal the unchunked ones."""
    model = tiny_lm()
    ids, mask, w = inputs()
    grads = []
    for chunk in (0, 7):
        model.zero_grad(set_to_none=True)
        logprobs, _ = models.token_logprobs(model, ids, mask, 0.9, with_entropy=True, chunk_tokens=chunk)
        (logprobs * w.float()).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert ((grads[1][name] - g).abs().max() / g.abs().max().clamp(min=1)).item() < TOL_GRADS, name


def test_temperature_changes_the_values():
    """The check above compares like with like; this one makes sure the temperature reaches both paths."""
    model = tiny_lm()
    hot, cold = run(model, 7, 1.0)[0], run(model, 7, 0.5)[0]
    assert (hot - cold).abs().max() > 1e-2


def test_no_grad_chunked_matches_and_keeps_no_graph():
    model = tiny_lm()
    ids, mask, _ = inputs()
    with torch.no_grad():
        ref = models.token_logprobs(model, ids, mask, 0.9)
        out = models.token_logprobs(model, ids, mask, 0.9, chunk_tokens=4)
    assert not out.requires_grad
    assert (out - ref).abs().max() < TOL_VALUES


def test_chunked_holds_one_chunk_of_logits():
    """No tensor with the vocabulary as its last dimension is ever bigger than one chunk (plus the forward's
    single last position), in forward or in the recomputing backward: no [B, T, V] logits exist. Every op's
    output is watched, so a full-size intermediate anywhere would show."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Widest(TorchDispatchMode):
        rows = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view:  # new memory only: e.g. the head weight's transposed view [H, V]
                return out
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == VOCAB:
                    self.rows = max(self.rows, t.numel() // VOCAB)
            return out

    VOCAB = 97  # a size no other dimension of the tiny model has (head_dim is 32, the tiny vocabulary's size)
    model = tiny_lm(vocab=VOCAB)
    ids, mask, w = inputs()
    with Widest() as forward:
        lp, ent = models.token_logprobs(model, ids, mask, 0.8, with_entropy=True, chunk_tokens=8)
    with Widest() as backward:
        ((lp * w).sum() + ent.sum()).backward()
    assert forward.rows == 8 and backward.rows == 8  # 30 tokens in chunks of 8
    with Widest() as unchunked:
        models.token_logprobs(model, ids, mask, 0.8, with_entropy=True)
    assert unchunked.rows >= B * (L - 1)  # the watcher sees the full logits when they exist


def test_chunk_size_is_validated():
    from conftest import ROOT
    from rlcore.config import validate
    from rlcore.config.cli import load_recipe
    from rlcore.distributed.parallel import ParallelDims

    cfg = load_recipe("demo", ROOT / "recipes")
    assert cfg.train.logprob_chunk_tokens == 1024  # the default: chunked
    cfg.train.logprob_chunk_tokens = 0  # 0 = unchunked, valid
    validate(cfg, ParallelDims(2, 1))
    cfg.train.logprob_chunk_tokens = -1
    with pytest.raises(ValueError, match="train.logprob_chunk_tokens must be >= 0"):
        validate(cfg, ParallelDims(2, 1))
