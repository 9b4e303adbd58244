"""Token-budget micro-batches: whole sequences packed into rows of at most `max_tokens` real tokens.

A rollout batch is right-padded ([B, L], attention_mask 1 on each row's prefix of real tokens; a multi-turn
row has holes in its loss_mask, never in its attention_mask). With train.max_tokens_per_micro_batch set,
each forward/backward pass strips that padding and runs one packed row instead of a fixed number of padded
rows:

1. `first_fit_decreasing` assigns rows to micro-batches whose real tokens sum to at most max_tokens (a hard
   cap; a sequence longer than the cap gets a micro-batch of its own).
2. `pack` concatenates a micro-batch's sequences into input_ids [1, N] with position_ids restarting at 0 per
   sequence and no attention mask. transformers then keeps each sequence's attention inside itself (sdpa /
   eager build a block-diagonal mask from the position_ids, flash-attention runs varlen), provided the
   model is called with use_cache=False: with a cache, sdpa and eager silently drop the packing mask.
   The update (rlcore.train.forward.per_token) packs with split=True under sdpa / eager: the micro-batch's sequences
   go into several rows as wide as its longest sequence instead, so attention costs ~N x longest, not N^2
   (those kernels compute every block of the block-diagonal mask).
3. `Packed.unpack` puts every per-token output of the packed row (logprobs, entropy, values; position p
   scores token p + 1) back into the rows' [b, T] layout through one saved index, so losses read the
   original rows unchanged. The position before each sequence boundary scores the next sequence's first
   token: it is dropped, as are the rows' pad positions (0 in the output, outside every mask).

Example, max_tokens 8, real lengths [5, 3, 7, 2]: longest first, 7 opens a row, 5 opens a second, 3 joins
the 5, 2 fits nowhere and opens a third -> micro-batches [[2], [0, 1], [3]]. Rows 0 (a) and 1 (b) run as
    input_ids     a0 a1 a2 a3 a4 b0 b1 b2
    position_ids   0  1  2  3  4  0  1  2
and packed output positions 0-3 go to row 0's t = 0-3, 5-6 to row 1's t = 0-1 (4 is a boundary).

Every rank must run as many forward/backward passes as the others (FSDP2's per-layer collectives would
wait forever): the trainer takes the largest count over ranks and fills up with `dummy` rows, whose
outputs it multiplies by 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore.distributed.collectives import all_max


def first_fit_decreasing(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices per micro-batch: each takes rows, longest first, into the first micro-batch with room.
    Example: lengths [5, 3, 7, 2], max_tokens 8 -> [[2], [0, 1], [3]] (see the module docstring)."""
    bins: list[list[int]] = []
    room: list[int] = []  # tokens each micro-batch can still take
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fit = next((b for b, r in enumerate(room) if lengths[i] <= r), None)
        if fit is None:  # also a sequence longer than the cap: a micro-batch of its own
            bins.append([i])
            room.append(max_tokens - lengths[i])
        else:
            bins[fit].append(i)
            room[fit] -= lengths[i]
    return [sorted(b) for b in bins]


def micro_batches(lengths: list[int], micro_batch_size: int, max_tokens: int) -> list[torch.Tensor | None]:
    """This rank's micro-batches of rows with `lengths` real tokens, as row indices: slices of
    micro_batch_size rows when max_tokens is 0, else first-fit-decreasing packs then None (a dummy) up to
    the largest count over ranks (a collective: every rank calls it at the same point)."""
    if not max_tokens:
        n = len(lengths)
        return [torch.arange(i, min(i + micro_batch_size, n)) for i in range(0, n, micro_batch_size)]
    packs = first_fit_decreasing(lengths, max_tokens)
    return [torch.tensor(rows) for rows in packs] + [None] * (int(all_max(len(packs))) - len(packs))


@dataclass
class Packed:
    """One packed row of b sequences, and the index that puts its per-token outputs back into [b, T]."""
    input_ids: torch.Tensor  # [1, N] the sequences' real tokens, one after another ([r, W] when split)
    position_ids: torch.Tensor  # [1, N] 0, 1, ... restarting at each sequence
    source: torch.Tensor  # [n] positions of the flattened packed per-token outputs [1, N - 1] that belong to a row
    dest: torch.Tensor  # [n] where each goes in the flattened [b, T]: row * T + t
    last: torch.Tensor  # [b] flattened packed position of each sequence's last token (a reward model's score)
    rows: int  # b
    width: int  # T = L - 1 of the padded rows

    def unpack(self, per_token):
        """Packed per-token outputs [1, N - 1] or [r, W - 1] (or a tuple of them) -> [b, T], 0 where nothing was
        scored."""
        if isinstance(per_token, tuple):
            return tuple(self.unpack(x) for x in per_token)
        out = per_token.new_zeros(self.rows * self.width)
        return out.index_put((self.dest,), per_token.reshape(-1)[self.source]).view(self.rows, self.width)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, split: bool = False,
         position_ids: torch.Tensor | None = None) -> Packed:
    """Right-padded rows input_ids / attention_mask [b, L] -> one packed row (see the module docstring).

    split: several packed rows [r, W] instead, W = the longest sequence, filled first-fit-decreasing and each
    ended by a pad segment (token 0, positions restarting at 0; its outputs are dropped). sdpa and eager
    attention compute every block of the [N, N] packing mask, so one long row costs ~N^2 attention; rows of
    width W cost ~N * W. Not for flash-attention: its varlen path reads packed position_ids of one row only.

    position_ids [b, L]: the rows' own positions, kept in the packed row (a row of several sequences restarts
    them: rlcore.batch); default 0, 1, ... per row."""
    lengths = attention_mask.sum(-1).tolist()  # [b] real tokens per row
    b, L = input_ids.shape
    T, dev = L - 1, input_ids.device
    if split:
        width = max(lengths, default=1)
        packed_rows = first_fit_decreasing(lengths, width)
    else:
        width, packed_rows = sum(lengths), [list(range(b))]
    ids, positions, source, dest, last = [], [], [], [], [0] * b
    for r, members in enumerate(packed_rows):
        offset = 0
        for row in members:
            n = lengths[row]
            ids.append(input_ids[row, :n])
            positions.append(torch.arange(n, device=dev) if position_ids is None else position_ids[row, :n])
            start = r * (width - 1) + offset  # outputs are [r, W - 1]: position p of row r is r * (W - 1) + p
            source.append(torch.arange(start, start + n - 1, device=dev))  # the next token is in this sequence
            dest.append(torch.arange(row * T, row * T + n - 1, device=dev))
            last[row] = r * width + offset + n - 1  # into the flattened [r, W] input
            offset += n
        if offset < width:  # a pad segment of its own (positions restart: outside every sequence)
            ids.append(input_ids.new_zeros(width - offset))
            positions.append(torch.arange(width - offset, device=dev))
    return Packed(torch.cat(ids).view(len(packed_rows), width), torch.cat(positions).view(len(packed_rows), width),
                  torch.cat(source), torch.cat(dest), torch.tensor(last, dtype=torch.long, device=dev), b, T)


def dummy(device) -> Packed:
    """A stand-in micro-batch for a rank that has run out of its own: one 2-token sequence of token 0,
    unpacking to no rows. The caller multiplies what it computes by 0."""
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return Packed(torch.zeros(1, 2, dtype=torch.long, device=device), torch.arange(2, device=device)[None],
                  empty, empty, empty, 0, 1)
