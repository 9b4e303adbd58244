"""The engine's lifecycle as a checked state machine, the same on every device.

A colocated engine gives its GPU memory to the trainer between rollouts and takes it back for the next one:

    ready --sleep(1)--> weights in host memory, no KV --wake()-----------------------------> ready
    ready --sleep(2)--> weights discarded, no KV --wake_weights()--> empty --loaded()--wake_kv()--> ready
    dormant (a split mesh's trainer-rank engine: dummy weights, asleep for good)

Level 1 (LoRA adapter sync: the base never moves) keeps the weights in host memory and restores them on
wake-up; level 2 (full sync) drops them, so only a reload makes the engine whole again. Every transition is
checked, and generating on an engine that is not `ready` raises EngineStateError naming the caller.

vLLM's sleep mode exists on CUDA only; on CPU the engine walks the same states (RolloutEngine) and a level-2
sleep poisons the weights it would have dropped (the embedding is filled with NaN), so a path that
generates without reloading fails here, in the CPU suite, as it would on a GPU: the state check stops it, and
a path around the check gets NaN logprobs, which the drift check stops.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass


class EngineStateError(RuntimeError):
    pass


@dataclass
class Lifecycle:
    weights: str = "loaded"  # loaded | offloaded (level 1) | discarded (level 2) | empty (woken, not loaded) | dummy
    kv: bool = True  # the KV cache is allocated

    @property
    def ready(self) -> bool:
        return self.weights == "loaded" and self.kv

    @property
    def asleep(self) -> bool:
        return self.weights in ("offloaded", "discarded")

    def describe(self) -> str:
        return {"loaded": "ready" if self.kv else "weights loaded, no KV cache",
                "offloaded": "asleep at level 1 (weights in host memory, KV cache freed)",
                "discarded": "asleep at level 2 (weights discarded, KV cache freed)",
                "empty": "woken without weights (a reload must fill them)",
                "dummy": "dormant (a trainer rank's engine of a split mesh: dummy weights, never generates)",
                }[self.weights]

    def _expect(self, allowed: tuple[str, ...], action: str, kv: bool | None = None) -> None:
        if self.weights not in allowed or (kv is not None and self.kv != kv):
            raise EngineStateError(f"rlcore: engine {action} called by {caller()} on an engine that is "
                                   f"{self.describe()}")

    def require_ready(self, action: str) -> None:
        """Before generate / prompt_logprobs / submit / step."""
        if not self.ready:
            hint = "; a sync_weights (or wake) must come first" if self.asleep or self.weights == "empty" else ""
            raise EngineStateError(f"rlcore: engine {action} called by {caller()} on an engine that is "
                                   f"{self.describe()}{hint}")

    def sleep(self, level: int) -> None:
        self._expect(("loaded",), f"sleep(level={level})", kv=True)
        self.weights, self.kv = ("offloaded" if level == 1 else "discarded"), False

    def wake(self) -> None:
        """Level 1 only: the weights come back from host memory with the KV cache."""
        self._expect(("offloaded",), "wake")
        self.weights, self.kv = "loaded", True

    def wake_weights(self) -> None:
        """Before a reload: a level-2 engine gets its weight memory back, empty."""
        self._expect(("discarded",), "wake_weights")
        self.weights = "empty"

    def loaded(self) -> None:
        """A full reload landed (ready engine, or woken and empty). Never into a sleeping engine."""
        self._expect(("loaded", "empty"), "reload_weights")
        self.weights = "loaded"

    def wake_kv(self) -> None:
        self._expect(("loaded",), "wake_kv", kv=False)
        self.kv = True


def caller() -> str:
    """The first frame outside rlcore/engine/: who asked the engine for this."""
    frame = sys._getframe(1)
    while frame is not None and "/rlcore/engine/" in frame.f_code.co_filename.replace("\\", "/"):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname} (line {frame.f_lineno})"
