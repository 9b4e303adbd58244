"""Prompts: a `datasets` Dataset, tokenized once, dealt to rollout groups by a StatefulDataLoader.

Every rank of a rollout group (one vLLM engine) reads the same prompts: the sampler shards by group
index, not by rank. Other columns (e.g. `answer`) travel with each prompt to the reward functions.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Iterator

import datasets
import torch
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from rlcore.config import DataConfig

datasets.disable_progress_bars()
# torchdata 0.11 calls a deprecated torch hook on every loader start; nothing for a user to act on.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
FILE_TYPES = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_tokenizer(path: str, field: str = "model.path"):
    """The model's tokenizer, as saved. transformers 5's AutoTokenizer substitutes the model type's own class
    for a tokenizer saved as a plain `tokenizers` file (tokenizer_class TokenizersBackend): a qwen2 config
    then gets Qwen2Tokenizer, whose byte-level pre-tokenizer silently drops the characters of a
    character-level vocabulary such as rlcore.tasks.tiny's spaces (" 47=" -> "47="), so environment text with
    spaces would reach the model changed. Such a file is loaded with the generic class that wrote it."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(path) / "tokenizer_config.json"
    try:
        saved = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
        if saved in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(path)
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # missing, empty or corrupted tokenizer files
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"{field} '{path}': the tokenizer cannot be loaded ({type(e).__name__}: {first})") from e


def load_table(path: str, split: str, name: str, field: str) -> datasets.Dataset:
    """A local .json/.jsonl/.parquet file, or a hub dataset id (`field` names the config key in errors)."""
    suffix = Path(path).suffix.lower()
    if os.path.exists(path):
        if suffix not in FILE_TYPES:
            raise ValueError(f"{field} '{path}' has an unsupported type '{suffix}'; "
                             f"expected one of {', '.join(FILE_TYPES)} or a hub dataset id")
        if os.path.isdir(path) or os.path.getsize(path) == 0:
            raise ValueError(f"{field} '{path}' is {'a folder' if os.path.isdir(path) else 'empty'}; expected a "
                             f"{suffix} file of prompts")
        try:
            table = datasets.load_dataset(FILE_TYPES[suffix], data_files=path, split="train")
        except Exception as e:  # truncated or corrupted JSON / parquet, or another format under this suffix
            cause = e.__cause__ or e
            raise ValueError(f"{field} '{path}' is not a readable {suffix} file: {type(cause).__name__}: "
                             f"{' '.join(str(cause).split())[:200]}") from e
        if len(table) == 0:
            raise ValueError(f"{field} '{path}' holds no rows")
        return table
    if suffix in FILE_TYPES or path.startswith(("/", ".", "~")) or not path:
        raise ValueError(f"{field} '{path}' does not exist (expected a .json/.jsonl/.parquet file or a hub id)")
    try:
        return datasets.load_dataset(path, name or None, split=split)
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{field} '{path}' could not be loaded as a hub dataset: {first}") from None


def tokenize_prompts(table: datasets.Dataset, cfg: DataConfig, tokenizer, field: str,
                     tools: list[dict] | None = None) -> datasets.Dataset:
    """Prompt ids per row; `tools` (JSON schemas, rlcore.rollout.tools) are rendered by the chat template."""
    if cfg.prompt_column not in table.column_names:
        raise ValueError(f"data.prompt_column '{cfg.prompt_column}' is not a column of {field} "
                         f"(columns: {', '.join(table.column_names)})")

    table = table.map(lambda row: {"prompt_ids": render_prompt(tokenizer, cfg, row[cfg.prompt_column], tools)},
                      keep_in_memory=True)
    kept = table.filter(lambda row: len(row["prompt_ids"]) <= cfg.max_prompt_tokens, keep_in_memory=True)
    if len(kept) == 0:
        shortest = min(len(ids) for ids in table["prompt_ids"])
        raise ValueError(f"no prompt of {field} fits data.max_prompt_tokens={cfg.max_prompt_tokens} (the shortest "
                         f"has {shortest} tokens)")
    return kept


def render_prompt(tokenizer, cfg: DataConfig, text: str, tools: list[dict] | None = None) -> list[int]:
    """One prompt's ids: `text` as the user turn of the chat template (after data.system_prompt, with the
    tools' schemas), or tokenized as it is without data.chat_template."""
    if not cfg.chat_template:
        return list(tokenizer(text).input_ids)
    turns = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else [])
    turns.append({"role": "user", "content": text})
    ids = tokenizer.apply_chat_template(turns, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in transformers 5


class PromptStream:
    """Endless batches of this rollout group's prompts; a new shuffle every epoch."""

    def __init__(self, table: datasets.Dataset, batch_size: int, groups: int, group: int, seed: int,
                 num_workers: int = 0):
        if len(table) < batch_size * groups:
            raise ValueError(f"data.path has {len(table)} usable prompts, fewer than one step needs "
                             f"({batch_size * groups} = rollout.prompts_per_step)")
        self.sampler = DistributedSampler(table, num_replicas=groups, rank=group, shuffle=True, seed=seed,
                                          drop_last=True)
        # Its own generator: a new epoch's iterator draws a seed from it, never from the global RNG
        # (a resumed run starts its iterator at another moment, and must not shift the global stream).
        self.loader = StatefulDataLoader(table, batch_size=batch_size, sampler=self.sampler, drop_last=True,
                                         collate_fn=list, num_workers=num_workers,
                                         generator=torch.Generator().manual_seed(seed))
        self.groups = groups
        self.epoch = 0
        self._it: Iterator | None = None

    def next_batch(self) -> list[dict]:
        while True:
            if self._it is None:
                self.sampler.set_epoch(self.epoch)
                self._it = iter(self.loader)
            try:
                return next(self._it)
            except StopIteration:
                self.epoch += 1
                self._it = None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "loader": self.loader.state_dict(), "batches": self.batches_this_epoch()}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state_dict()` was taken (same number of rollout groups)."""
        self.epoch = state["epoch"]
        self.loader.load_state_dict(state["loader"])
        self._it = None

    def skip_to(self, epoch: int, batches: int) -> None:
        """Continue at batch `batches` of `epoch`, for a stream sharded over a different number of groups.

        Every epoch is one shuffle of the whole table, dealt round-robin to the groups, so batch b of
        every group together is always positions [b * prompts_per_step, (b + 1) * prompts_per_step) of
        that shuffle: the same prompts per step, only dealt to other groups."""
        self.epoch, self._it = epoch, None
        for _ in range(batches):
            self.next_batch()

    def batches_this_epoch(self) -> int:
        return self.loader.state_dict().get("_num_yielded", 0) if self._it is not None else 0
