"""Agents through the endpoint on real engines: identical engine calls on both ranks of a TP=2 engine with agents
of random latency (tests/workers/agent_worker.py), and recipes/tooladd_agent.py learning through the real entry
point, colocated and split. The endpoint's logic without engines: tests/test_endpoint.py."""
import importlib.util
import json

import pytest

from conftest import ROOT, WORKERS, rank_exit_codes, torchrun_warm, train_warm


def recipe():
    spec = importlib.util.spec_from_file_location("tooladd_agent", ROOT / "recipes" / "tooladd_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_agent_shows_the_schema_the_warm_start_saw():
    from rlcore.tasks import tooladd
    assert recipe().TOOLS == tooladd.AddEnv.toolbox.schemas


@pytest.mark.slow
def test_agents_at_tp2_make_identical_engine_calls(tmp_path):
    """Both ranks of one TP=2 engine make exactly the same engine calls while each runs its own agents with
    random pauses; refusals and agent errors fail only their trajectories (the same on both ranks); a rewritten
    history trains both its sequences; the engine's logprobs match the trainer's over every model token (the
    rewritten rows' second sequences through their restarting positions)."""
    out = tmp_path / "agents.json"
    proc = torchrun_warm(WORKERS / "agent_worker.py", out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    a, b = json.loads(out.read_text())
    assert a["calls"] == b["calls"] and a["rewards"] == b["rewards"]
    adds = [c for c in a["calls"] if c[0] == "add"]
    assert len({c[1] for c in adds}) == len(adds) == a["calls_n"] == b["calls_n"]
    for r in (a, b):
        assert r["diff"] < 1e-3 and r["model_tokens"] > 0
        for i, error in r["errors"].items():
            kind = int(i) % 4
            assert kind in (2, 3), (i, error)
            assert ("RuntimeError: the agent's own bug" if kind == 2 else "temperature is pinned to the run's 1") \
                in error
        for i, turns in r["turns"].items():
            kind = int(i) % 4
            assert turns == {1: 2, 2: 1, 3: 0}.get(kind, turns) and (kind != 0 or turns in (1, 2))
            # failed trajectories keep no tokens; the rewriter trains both calls: two sequences in its row, the
            # second's prompt masked (and the engine's logprobs of both matched the trainer's: r["diff"])
            assert (sum(r["sampled"][i]) == 0) == (kind in (2, 3))
            if kind == 1:
                (t1, t2), start, sampled = r["turn_lens"][i], r["starts"][i], r["sampled"][i]
                assert len(start) == 1 and sampled == [1] * t1 + [0] * (len(sampled) - t1 - t2) + [1] * t2
                assert len(sampled) - t1 - t2 > 6  # the rewritten prompt, rendered afresh
    assert a["failed"] + b["failed"] == 14 and a["rewritten"] + b["rewritten"] == 8  # 15 prompts x 2: 7 + 7 failed
    # An agent whose library keeps one HTTP client per process works in every rollout: all run on one event loop
    # (each rollout on a loop of its own failed the second with "RuntimeError: Event loop is closed").
    assert a["library"] == b["library"] == [[0, ""], [0, ""]]
    # Stop strings, forced calls and streamed answers on the real engine (the diff above covers their tokens): both
    # ranks make the same calls, stop strings included; what the agent read and what was recorded agree.
    assert a["api_calls"] == b["api_calls"] and a["api_failed"] == b["api_failed"] == 0
    assert sum(c[0] == "add" and c[5:] == [list("0123456789")] for c in a["api_calls"]) == 2
    api = a["api"] | b["api"]  # each rank runs the agents of its own trajectories
    assert sorted(api) == [str(i) for i in range(6)]
    for i, found in api.items():
        text, sampled, prompt_end = (a, b)[int(i) % 2]["api_tokens"][i]  # the owner rank's trajectory
        assert sampled and all(sampled)  # the model's own tokens, every one
        if found[0] == "stop":  # the engine stopped on the token that completed a digit: kept, cut from the text
            assert text[-1].isdigit() and not any(c.isdigit() for c in found[2] or "") and found[3] == "stop"
        elif found[0] == "required":  # the opener ends the prompt: written by the endpoint, not sampled
            assert prompt_end[-len(a["opener"]):] == a["opener"]
        else:
            assert found[2] == len(sampled)  # the streamed usage counts the recorded tokens
    rewards = a["rewards"]
    assert all(rewards[i] in (0.0, 1.0) for i in range(0, 30, 4)) and [rewards[i] for i in range(1, 30, 4)] == [0.5] * 8


@pytest.mark.slow
@pytest.mark.parametrize("mode, agent", [("colocated", "openai"), ("split", "openai"), ("stream", "openai"),
                                         ("colocated", "langchain"), ("stream", "langchain")])
def test_tooladd_agent_learns(tmp_path, mode, agent):
    """The openai-client agent on the tool task: held-out greedy accuracy +30 points by the demo's bar, no agent
    failing, the model's calls parsed into tool_calls; colocated and split k=1, the engine's logprobs equal to the
    trainer's. Streaming (k=1, lockstep) on two engines (3 ranks: each engine's first rank runs its own agents and
    endpoint, each streams half of every batch): a trajectory's calls span versions, no token more than 1 version
    old, and the probe after every in-flight load within 1e-3 (the per-token logprobs differ by the staleness).
    The same agent written with LangChain (tests/framework_agents.py: ChatOpenAI.bind_tools on the handed client,
    ainvoke colocated, astream streaming) learns the same way, on the run's one event loop. (LangChain in split
    learned as well, with its own client over the loopback HTTP server, when an earlier version of this test ran it;
    the Agents SDK's test runs split.)"""
    modes = {"split": ["rollout.ranks=1"],
             "stream": ["rollout.ranks=2", "rollout.stream=true", "rollout.max_staleness=1", "algorithm.tis_cap=2"]}
    langchain = {"colocated": "langchain_ainvoke", "stream": "langchain_astream"}
    recipe = f"recipe={ROOT / 'tests' / 'framework_agents.py'}" if agent == "langchain" else "recipe=tooladd_agent"
    proc = train_warm(recipe, f"output_dir={tmp_path}", "train.steps=8", "train.eval_every=8", *modes.get(mode, []),
                      nproc=3 if mode == "stream" else 2, env={"AGENT": langchain.get(mode, "")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "tooladd_agent" / "metrics.jsonl").read_text().splitlines()]
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    assert end - start >= 0.3, (start, end)
    # a failure is rare: a call whose arguments make the tool's answer overflow the context (a 400)
    assert all(r["agent/failed"] <= 2 and 1.0 <= r["agent/calls_mean"] <= 2.0 for r in rows[1:])
    if mode != "stream":
        assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in rows[1:])
        return
    assert all(r["async/token_staleness_max"] <= 1 and r["async/probe_logprob_diff_max"] < 1e-3 for r in rows[1:])
    assert max(r["async/versions_per_sample"] for r in rows[1:]) > 1.0  # calls of one trajectory, two versions


@pytest.mark.slow
@pytest.mark.parametrize("agent, mode", [("agents_responses", "split"), ("agents_responses", "stream"),
                                         ("smolagents_tools", "colocated")])
def test_a_framework_agent_trains_with_its_own_prompts(tmp_path, agent, mode):
    """The OpenAI Agents SDK (its default Responses model, and its chat-completions model) and smolagents'
    ToolCallingAgent (tool_choice="required", stop strings, its ~4,000-token system prompt), unchanged, on the tool
    task's warm start with a longer context (tests/framework_agents.py): 3 steps (2 for smolagents, whose ~4,000-
    token system prompt makes its steps the suite's longest), every step trained, no agent failing, the engine's
    logprobs equal to the trainer's (the probe's, streaming). The Agents SDK in a split mesh and streaming,
    smolagents colocated (to keep the suite short: split's rollout ranks run agents as colocated ones do, streaming
    its own way; the bare client's agent runs in all three modes, LangChain's colocated and streaming). smolagents
    in streaming trains too (3 steps, no agent failing: `AGENT=smolagents_tools torchrun --nproc-per-node 3
    launch/train.py recipe=tests/framework_agents.py train.steps=3 rollout.ranks=2 rollout.stream=true
    rollout.max_staleness=1 algorithm.tis_cap=2`), 10 s a step, 58 s in all: not in the suite. It found that
    asyncio.to_thread ran 6 agents of a rank at once (test_endpoint.py's synchronous agents)."""
    modes = {"split": ["rollout.ranks=1"], "stream": ["rollout.ranks=2", "rollout.stream=true",
                                                       "rollout.max_staleness=1", "algorithm.tis_cap=2"]}
    steps = 2 if agent == "smolagents_tools" else 3
    proc = train_warm(f"recipe={ROOT / 'tests' / 'framework_agents.py'}", f"output_dir={tmp_path}",
                      f"train.steps={steps}", *modes.get(mode, []), nproc=3 if mode == "stream" else 2,
                      env={"AGENT": agent})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "tooladd_agent" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    # a failure is the model's: a call the framework cannot take (arguments it rejects), as with the bare client
    assert all(r["agent/failed"] <= 1 and r["agent/calls_mean"] >= 1 and r["optim/steps_applied"] == 1 for r in rows)
    drift = "async/probe_logprob_diff_max" if mode == "stream" else "rollout/logprob_diff_max"
    assert all(r[drift] < 1e-3 for r in rows)


FAILING = '''
from rlcore.config.cli import load_recipe


async def agent(client, row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    raise ConnectionError("the tool server is down")


def config():
    cfg = load_recipe("tooladd_agent")
    cfg.rollout.agent = agent
    return cfg
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["split", "stream"])
def test_a_run_whose_agents_all_fail_stops(tmp_path, mode):
    """Every agent fails (its tool server is down): the step has nothing to train on, so every rank stops with one
    line naming the first failure, exit 3, instead of training on nothing and exiting 0. In a split mesh the
    rollout ranks hand the error to the trainers waiting at the exchange; streaming, at the next load. (Colocated,
    split's check in rollout/collect.py raises on every rank at once.)"""
    (tmp_path / "failing.py").write_text(FAILING)
    modes = {"split": ["rollout.ranks=1"],
             "stream": ["rollout.ranks=2", "rollout.stream=true", "rollout.max_staleness=1", "algorithm.tis_cap=2"]}
    proc = train_warm(f"recipe={tmp_path}/failing.py", "rollout.prompts_per_step=4", "train.steps=3",
                      "data.eval_path=", f"output_dir={tmp_path}/runs", *modes[mode], nproc=3 if mode == "stream" else 2)
    assert rank_exit_codes(proc) == {3}, proc.stderr[-4000:]
    says = ("rlcore: error: 32 of 32 trajectories' agents failed at step 1 (rollout.max_failed_frac=1); the first: "
            if mode == "split" else "rlcore: error: 32 of 32 trajectories' agents failed in a batch "
                                    "(rollout.max_failed_frac=1); the first: ")
    assert says + "the agent raised ConnectionError: the tool server is down" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "runs" / "tooladd_agent" / "metrics.jsonl").exists() or \
        (tmp_path / "runs" / "tooladd_agent" / "metrics.jsonl").read_text() == ""  # no step was trained
