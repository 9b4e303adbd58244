"""Two gloo ranks x two micro-batches reproduce the single-process full-batch gradient.

The trainer shards parameters with FSDP2 and reduces gradients across ranks with SUM (gradient divide factor
1), so the comparison is: sum over ranks of each rank's accumulated gradient == full-batch gradient. That
holds because every micro-batch divides by the *global* Normaliser (counts summed over micro-batches, then
all-reduced with SUM over ranks), never by its own count.
"""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlcore.algorithms.objectives import aggregate, clipped_surrogate, local_normaliser
from rlcore.batch import Normaliser

pytestmark = pytest.mark.slow  # two gloo processes: `make test-fast` leaves them out

WORLD, MICRO = 2, 2
B, T, D, V = 8, 5, 4, 7  # sequences, scored positions, feature size, vocabulary
MODES = ("token-mean", "seq-mean-token-mean")


def _data():
    """A fixed batch, identical on every rank: features, sampled tokens, old logprobs, advantages, mask."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)  # [B, T, D]
    tokens = torch.randint(V, (B, T), generator=gen)  # [B, T]
    old_logprobs = -torch.rand(B, T, generator=gen, dtype=torch.float64)  # [B, T]
    advantages = torch.randn(B, T, generator=gen, dtype=torch.float64)  # [B, T]
    mask = torch.zeros(B, T, dtype=torch.float64)  # [B, T]; response lengths differ, row 6 has none
    for row, length in enumerate([1, 5, 2, 4, 3, 5, 0, 2]):
        mask[row, T - length :] = 1
    return x, tokens, old_logprobs, advantages, mask


def _policy():
    """A linear 'policy': logits = x @ W."""
    return torch.nn.Linear(D, V, bias=False, dtype=torch.float64).requires_grad_()


def _loss(policy, x, tokens, old_logprobs, advantages, mask, mode, norm):
    logits = policy(x)  # [b, T, V]
    logprobs = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)  # [b, T]
    per_token, _ = clipped_surrogate(logprobs, old_logprobs, advantages, 0.2, 0.2)  # [b, T]
    return aggregate(per_token, mask, mode, norm)


def _worker(rank, init_file, mode):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        data = _data()
        torch.manual_seed(0)
        policy = _policy()
        w0 = policy.weight.detach().clone()

        # Single process, full batch.
        _loss(policy, *data, mode, local_normaliser(data[-1])).backward()
        full_grad = policy.weight.grad.clone()
        policy.weight.grad = None

        # This rank's rows, in MICRO micro-batches; the Normaliser summed over micro-batches, then ranks.
        per_rank = B // WORLD
        rows = range(rank * per_rank, (rank + 1) * per_rank)
        micro = [(lo, lo + per_rank // MICRO) for lo in rows[:: per_rank // MICRO]]
        counts = torch.zeros(2, dtype=torch.float64)
        for lo, hi in micro:
            n = local_normaliser(data[-1][lo:hi])
            counts += torch.tensor([n.tokens, n.sequences], dtype=torch.float64)
        dist.all_reduce(counts)
        norm = Normaliser(tokens=counts[0].item(), sequences=counts[1].item())
        assert norm == local_normaliser(data[-1])
        for lo, hi in micro:
            _loss(policy, *(t[lo:hi] for t in data), mode, norm).backward()
        grad = policy.weight.grad.clone()
        assert torch.equal(policy.weight.detach(), w0)
        dist.all_reduce(grad)  # what FSDP2's reduce-scatter does with divide factor 1
        torch.testing.assert_close(grad, full_grad, atol=1e-6, rtol=0)
        assert full_grad.abs().sum() > 0
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_two_micro_batches_match_full_batch(tmp_path, mode):
    mp.spawn(_worker, args=(str(tmp_path / "store"), mode), nprocs=WORLD, join=True)
