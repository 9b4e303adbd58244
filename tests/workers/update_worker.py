"""torchrun worker: update.py's micro-batching and old logprobs on 2 FSDP2 ranks whose sequences differ widely
in length (rank 0: 8-30 tokens, rank 1: 3-6).

    torchrun --nproc-per-node 2 tests/workers/update_worker.py MODEL_DIR OUT_JSON

1. Token-budget packed micro-batches give the padded path's results; rank 1 packs fewer micro-batches and
   has to run dummies.
   For every loss aggregation mode and the budgets in BUDGETS, from the same weights: update.update (PPO:
   the clipped policy loss with TIS weights, and the critic; 2 mini-batches, so 2 SGD steps, no clipping,
   each step's gradients recorded) and forward.forward_logprobs / forward_values. Records the largest
   difference from the padded path (budget 0) and each rank's count of policy forwards.
2. On-policy (1 mini-batch), an update that fills in the old logprobs itself gives the same gradients and
   metrics as one given them by a separate forward_logprobs pass, padded and packed; its before_step hook
   sees those old logprobs before any weight has changed.
"""
import dataclasses
import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from rlcore.algorithms.objectives import AGG_MODES
from rlcore.algorithms.ppo import PPO
from rlcore.batch import Batch
from rlcore.config import Config, CriticConfig, ModelConfig, OptimConfig, RolloutConfig, TrainConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.models import build as models
from rlcore.run import Trainer
from rlcore.train import forward, packing, update

BUDGETS = (0, 16, 40)  # 16: rank 0's 30- and 25-token sequences exceed it and run alone
LENGTHS = [[30, 12, 25, 8], [5, 4, 6, 3]]  # real tokens per row, by rank

model_dir, out = sys.argv[1], sys.argv[2]
init_distributed()
rank = dist.get_rank()
fsdp_mesh, _ = build_meshes(ParallelDims(dist.get_world_size(), 1))
mcfg = ModelConfig(path=model_dir)
policy = models.shard(models.load_causal_lm(mcfg), fsdp_mesh, mcfg)
critic = models.load_critic(CriticConfig(path="policy"), mcfg)
torch.manual_seed(0)  # the same value head on both ranks, not zero: the critic's backbone gets a gradient
torch.nn.init.normal_(critic.score.weight, std=critic.config.hidden_size ** -0.5)  # |v| < 4.5: 1e-5 is 20-40 ulps
critic = models.shard(critic, fsdp_mesh, mcfg)

g = torch.Generator().manual_seed(10 + rank)  # each rank its own rows, padded to its own longest
lengths = torch.tensor(LENGTHS[rank])
B, L = len(lengths), int(lengths.max())
attention_mask = (torch.arange(L)[None] < lengths[:, None]).long()
input_ids = torch.randint(3, 32, (B, L), generator=g) * attention_mask
loss_mask = (attention_mask[:, 1:] * (torch.arange(L - 1)[None] >= 1)).float()  # 2 prompt tokens
if rank == 0:
    loss_mask[0, 10:14] = 0  # an environment observation between two turns
noise = lambda scale: scale * torch.randn(B, L - 1, generator=g) * loss_mask  # noqa: E731


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a full copy of every gradient it applies."""
    def __init__(self, params):
        super().__init__(params, lr=0.01)
        self.grads = []

    def step(self, closure=None):
        self.grads += [p.grad.full_tensor().clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def new_run(budget: int, agg: str, mini_batches: int = 2) -> SimpleNamespace:
    cfg = Config(algorithm=PPO(clip_low=0.1, clip_high=0.1, loss_agg=agg, tis_cap=1.5),
                 rollout=RolloutConfig(temperature=0.9), optim=OptimConfig(max_grad_norm=0.0),
                 critic=CriticConfig(path="policy", optim=OptimConfig(max_grad_norm=0.0)),
                 train=TrainConfig(mini_batches=mini_batches, micro_batch_size=2, max_tokens_per_micro_batch=budget,
                                   logprob_chunk_tokens=7))
    optimizer, critic_optimizer = RecordingSGD(policy.parameters()), RecordingSGD(critic.parameters())
    constant = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)  # noqa: E731
    return SimpleNamespace(cfg=cfg, trainer=Trainer(policy, optimizer, constant(optimizer), critic=critic,
                                                    critic_optimizer=critic_optimizer,
                                                    critic_scheduler=constant(critic_optimizer)))


run = new_run(0, "token-mean")
batch = Batch(input_ids, attention_mask, loss_mask, rollout_logprobs=-torch.rand(B, L - 1, generator=g),
              rewards=torch.zeros(B), group_size=1, max_model_tokens=32)
# Old logprobs and values near the current ones (some ratios clip), random advantages and returns.
batch.old_logprobs = forward.forward_logprobs(run, policy, batch) * loss_mask + noise(0.2)
batch.values = forward.forward_values(run, batch) + noise(0.3)
batch.advantages, batch.returns = noise(1.0), noise(1.0)

forwards = [0]
policy.register_forward_pre_hook(lambda *args: forwards.__setitem__(0, forwards[0] + 1))
scored = attention_mask[:, 1:].bool()  # positions whose next token is real
result = {}
padded = None
for budget in BUDGETS:  # the no-grad passes (old logprobs, values), before any weight changes
    run = new_run(budget, "token-mean")
    forwards[0] = 0
    outputs = forward.forward_logprobs(run, policy, batch), forward.forward_values(run, batch)
    result[f"{budget}/forward_passes/rank{rank}"] = forwards[0]
    padded = padded or outputs
    result[f"{budget}/forward_diff/rank{rank}"] = max((x - y)[scored].abs().max().item()
                                                      for x, y in zip(outputs, padded))

for m in (policy, critic):
    m.reshard()  # the root unit stays gathered after a forward without backward: snapshot the shards
start = {m: {n: p.detach().clone() for n, p in m.named_parameters()} for m in (policy, critic)}


def restore():
    with torch.no_grad():
        for m in (policy, critic):
            for n, p in m.named_parameters():
                p.copy_(start[m][n])


for agg in AGG_MODES:
    grads, metrics = {}, {}
    for budget in BUDGETS:
        restore()
        run = new_run(budget, agg)
        forwards[0] = 0
        metrics[budget] = update.update(run, batch)
        result[f"{agg}/{budget}/update_passes/rank{rank}"] = forwards[0]
        for name, opt in (("policy", run.trainer.optimizer), ("critic", run.trainer.critic_optimizer)):
            grads[name, budget] = opt.grads
            result[f"{agg}/{budget}/{name}_grad"] = max(
                ((x - y).abs().max() / y.abs().max().clamp(min=1e-3)).item() for x, y in zip(opt.grads, grads[name, 0]))
        # relative to max(|v|, 1): the metrics are O(1) quantities (losses, fractions, ratios, norms) summed from O(1)
        # terms, so a small one (a signed pg_loss near 0) carries the rounding of its terms, not of itself
        result[f"{agg}/{budget}/metrics"] = max(abs(metrics[budget][k] - v) / max(abs(v), 1.0)
                                                for k, v in metrics[0].items())
    for name in ("policy", "critic"):
        result[f"{agg}/{name}_grad_scale"] = max(x.abs().max().item() for x in grads[name, 0])
    result[f"{agg}/steps"] = metrics[0]["optim/steps_applied"]
for budget in BUDGETS[1:]:  # this rank's own packs: of the whole batch, and per mini-batch of 2 rows
    result[f"{budget}/packs/rank{rank}"] = len(packing.first_fit_decreasing(lengths.tolist(), budget))
    result[f"{budget}/mini_packs/rank{rank}"] = [
        len(packing.first_fit_decreasing(lengths[i:i + 2].tolist(), budget)) for i in (0, 2)]

for budget in BUDGETS[:2]:  # on-policy: old logprobs from a separate pass vs from the update's own forward
    runs, seen = {}, {}
    for separate in (True, False):
        restore()
        runs[separate] = new_run(budget, "token-mean", mini_batches=1)
        own = dataclasses.replace(batch, old_logprobs=None)
        if separate:
            own.old_logprobs = forward.forward_logprobs(runs[separate], policy, own)
            for m in (policy, critic):
                m.reshard()

        def before_step(own=own):
            seen["old"] = own.old_logprobs.clone()
            seen["moved"] = max((p.detach() - start[policy][n]).abs().max().full_tensor().item()
                                for n, p in policy.named_parameters())

        runs[separate].metrics = update.update(runs[separate], own, before_step=before_step)
        runs[separate].old, runs[separate].moved = seen["old"], seen["moved"]
        runs[separate].moved_after = max((p.detach() - start[policy][n]).abs().max().full_tensor().item()
                                         for n, p in policy.named_parameters())
    result[f"on_policy/{budget}/old_diff/rank{rank}"] = (runs[True].old - runs[False].old)[scored].abs().max().item()
    result[f"on_policy/{budget}/moved_before_step"] = max(runs[True].moved, runs[False].moved)
    result[f"on_policy/{budget}/moved_after"] = min(runs[True].moved_after, runs[False].moved_after)
    result[f"on_policy/{budget}/grad"] = max((x - y).abs().max().item() for name in ("optimizer", "critic_optimizer")
                                             for x, y in zip(getattr(runs[True].trainer, name).grads,
                                                             getattr(runs[False].trainer, name).grads))
    result[f"on_policy/{budget}/metrics"] = max(abs(runs[False].metrics[k] - v) for k, v in runs[True].metrics.items())
    result[f"on_policy/{budget}/steps"] = runs[False].metrics["optim/steps_applied"]

gathered = [None, None]
dist.all_gather_object(gathered, result)
if rank == 0:
    json.dump(gathered[0] | gathered[1], open(out, "w"), indent=1)
dist.barrier()  # neither rank leaves while the other still talks to it (gloo aborts on a vanished peer)
dist.destroy_process_group()
