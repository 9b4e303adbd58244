"""The engine's lifecycle (rlcore/engine/lifecycle.py): every transition a mode makes is allowed, every other one
is refused with a line naming the caller. The engine-backed checks (a real level-2 sleep poisoning a CPU engine, a
skipped sync refused) are in tests/test_weight_sync.py and tests/test_train.py."""
import pytest

from rlcore.engine.lifecycle import EngineStateError, Lifecycle


def walk(state: Lifecycle, steps: str) -> Lifecycle:
    for step in steps.split():
        name, _, arg = step.partition(":")
        getattr(state, name)(*([int(arg)] if arg else []))
    return state


@pytest.mark.parametrize("path", [
    "sleep:2 wake_weights loaded wake_kv",  # colocated full sync: wake the weights, reload, then the KV cache
    "sleep:1 wake",  # LoRA adapters: the base comes back from host memory
    "loaded",  # a ready engine reloaded in place (split and streaming engines, a resume's first sync)
    "sleep:2 wake_weights loaded wake_kv sleep:2 wake_weights loaded wake_kv",  # step after step
])
def test_the_modes_paths_end_ready(path):
    state = walk(Lifecycle(), path)
    assert state.ready and state.describe() == "ready"
    state.require_ready("generate")


def caller_of_this_test() -> str:
    return f"{__name__}.test_wrong_transitions_are_refused_naming_the_caller"


@pytest.mark.parametrize("start, step, message", [
    ("sleep:2", "require_ready:generate", "engine generate called by {who} on an engine that is asleep at level 2 "
                                          "(weights discarded, KV cache freed); a sync_weights (or wake) must come first"),
    ("sleep:1", "require_ready:step", "engine step called by {who} on an engine that is asleep at level 1 "
                                      "(weights in host memory, KV cache freed); a sync_weights (or wake) must come first"),
    ("sleep:2 wake_weights", "require_ready:submit", "engine submit called by {who} on an engine that is woken "
                                                     "without weights (a reload must fill them); a sync_weights"),
    ("sleep:2 wake_weights loaded", "require_ready:generate", "on an engine that is weights loaded, no KV cache"),
    ("sleep:2", "loaded", "engine reload_weights called by {who} on an engine that is asleep at level 2"),  # TRL #5312
    ("sleep:1", "loaded", "engine reload_weights called by {who} on an engine that is asleep at level 1"),
    ("sleep:2", "wake", "engine wake called by {who} on an engine that is asleep at level 2"),  # nothing to restore
    ("sleep:1", "sleep:1", "engine sleep(level=1) called by {who} on an engine that is asleep at level 1"),
    ("", "wake_kv", "engine wake_kv called by {who} on an engine that is ready"),
])
def test_wrong_transitions_are_refused_naming_the_caller(start, step, message):
    state = walk(Lifecycle(), start) if start else Lifecycle()
    name, _, arg = step.partition(":")
    with pytest.raises(EngineStateError) as e:
        getattr(state, name)(*([arg] if name == "require_ready" else [int(arg)] if arg else []))
    before, _, after = message.partition("{who}")
    assert before in str(e.value) and after in str(e.value), str(e.value)
    assert f"called by {caller_of_this_test()} (line " in str(e.value)


def test_a_dormant_engine_never_generates():
    for kv in (False, True):  # CUDA: asleep with its KV freed; CPU: it keeps its KV cache
        state = Lifecycle("dummy", kv=kv)
        with pytest.raises(EngineStateError, match="dormant .a trainer rank's engine of a split mesh"):
            state.require_ready("generate")
        with pytest.raises(EngineStateError):
            state.loaded()
