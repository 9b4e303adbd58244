"""The rollout batch: one dataclass of tensors that every stage of a step reads and fills.

Layout (one rank's share of a step, B sequences):
    input_ids       [B, L]  prompt + response, right-padded with the pad id; a multi-turn response
                            interleaves the model's turns with environment observations
    attention_mask  [B, L]  1 on real tokens
    loss_mask       [B, T]  T = L - 1; position t scores token input_ids[:, t + 1],
                            1 where that token was sampled by the model (0 on prompt, observations, pad)
    rollout_logprobs[B, T]  log p(token) seen by the inference engine while sampling
    old_logprobs    [B, T]  the trainer's log p(token) before this step's update
    ref_logprobs    [B, T]  the frozen reference model's log p(token) (None without one)
    values          [B, T]  the critic's value estimates before this step's update (None without a critic)
    rewards         [B]     scalar reward per sequence
    advantages      [B, T]  per-token advantage, written by the algorithm
    returns         [B, T]  value targets, written by algorithms with a critic
    versions        [B]     the policy version (optimizer steps) of the weights that sampled each sequence;
                            set in a split mesh (rlcore/modes/split.py), None when colocated (always current);
                            streaming (rlcore/modes/stream/): the oldest version among the sequence's tokens
    token_versions  [B, T]  streaming: the version that sampled each response token (0 where loss_mask is 0)
    position_ids    [B, L]  only when a row holds several sequences (an agent that rewrote its history,
                            rlcore.rollout.agents): positions restart at each sequence, and the trainer's
                            forwards pass them without the attention mask, so each sequence attends only to
                            itself (transformers' packed-sequence mask, as rlcore.train.packing); None otherwise

Sequences come in prompt groups: rows [g * group_size, (g + 1) * group_size) share a prompt.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_size: int
    max_model_tokens: int = 0  # model tokens a sequence can hold at most (all turns): the generation budget
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    token_versions: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device) -> "Batch":
        return Batch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()})

    def rows(self, start: int, stop: int) -> "Batch":
        """Rows [start, stop) of every tensor field, e.g. one micro-batch."""
        fields = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            fields[f.name] = v[start:stop] if isinstance(v, torch.Tensor) else v
        return Batch(**fields)

    def select(self, index: torch.Tensor) -> "Batch":
        """The rows listed in `index` (e.g. the prompt groups dynamic sampling keeps)."""
        return Batch(**{k: v[index] if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()})

    @staticmethod
    def cat(batches: list["Batch"], pad_id: int) -> "Batch":
        """Rows of every batch in order, right-padded to the longest (per-token fields padded with 0)."""
        L = max(b.input_ids.shape[1] for b in batches)
        fields = {}
        for f in dataclasses.fields(Batch):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "position_ids" and any(v is not None for v in values):  # rows of one sequence: 0, 1, ...
                values = [torch.arange(b.input_ids.shape[1]).repeat(len(b), 1) if v is None else v
                          for b, v in zip(batches, values)]
            if not isinstance(values[0], torch.Tensor):
                fields[f.name] = values[0]
                continue
            padded = []
            for b, v in zip(batches, values):
                grow = (L - b.input_ids.shape[1]) if v.dim() == 2 else 0
                fill = pad_id if f.name == "input_ids" else 0
                padded.append(torch.nn.functional.pad(v, (0, grow), value=fill) if grow else v)
            fields[f.name] = torch.cat(padded)
        return Batch(**fields)


@dataclass
class Normaliser:
    """Global counts over one optimizer step: summed over every micro-batch and every rank.

    Losses divide by these, never by a micro-batch's own count, so the gradient does not depend on
    how the batch was split (see rlcore.algorithms.objectives.aggregate)."""
    tokens: float  # response tokens (sum of loss_mask)
    sequences: float  # sequences with at least one response token
    max_len: int = 0  # model-token budget per sequence (Batch.max_model_tokens): seq-mean-token-sum-norm's divisor
