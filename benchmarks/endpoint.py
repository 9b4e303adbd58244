"""The agent endpoint's overhead: the tool task as an openai-client agent through the endpoint
(recipes/tooladd_agent.py) vs the same task as an rlcore environment (recipes/tooladd.py, continuous schedule),
rollout time per step.

    python benchmarks/endpoint.py                      # 3 rounds of 10 steps each, alternating, 2 ranks colocated

Five contenders: the task as an environment; the openai-client agent through the endpoint; the same agent with
stream=True (the answers as server-sent events); the same agent written with LangChain (tests/framework_agents.py:
LangChain's message objects and parsing) on the handed client, and with a client of its own over the rank's
loopback HTTP server.

The agents' own cost is measured apart, in this process: the CPU seconds one rank's trajectories of a step (128)
spend in each agent's code when a canned endpoint answers at once (a tool call, then the answer), through the
handed client's direct path. On the run's ranks it runs on the core the engine runs on, so it adds to the rollout
time; the framework's own cost is LangChain's minus the bare agent's.

Both start from the same warm start with the same seeds (a trajectory's call k is seeded like an environment's
turn k), the same tool latency (2-20 ms by call) and the same budgets; eval is off. Reported: per run the median
of time/rollout_s over steps 2.. (step 1 warms the engine), then the median over rounds of each contender and
their ratio; also the generated tokens per step, so that a difference in what was sampled shows.

Two workloads: "tool task" as the recipes are (~5 tokens per call, ~1.1 calls per trajectory), and "long calls":
the same from a random start (the warm start's tokenizer, chat template and config, fresh weights): it samples its
end of turn about once in 128 tokens, so nearly every call runs to its 64-token cap (rollout.max_new_tokens), and
with rollout.max_turns=1 both contenders make exactly one call per trajectory: the endpoint's cost per call
against ~10x more engine work per call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CONTENDERS = {"environment": ["recipe=tooladd", "rollout.schedule=continuous"],
              "endpoint": ["recipe=tooladd_agent"],
              # the same agent with stream=True, and written with LangChain (its own client, loopback HTTP)
              "endpoint streamed": ["recipe=tests/framework_agents.py", "AGENT=openai_streamed"],
              "langchain": ["recipe=tests/framework_agents.py", "AGENT=langchain_ainvoke"],
              "langchain http": ["recipe=tests/framework_agents.py", "AGENT=langchain_http"]}
WORKLOADS = {"tool task": [],
             "long calls": ["model.path={random}", "rollout.max_new_tokens=64", "rollout.max_total_tokens=64",
                            "rollout.max_turns=1"]}


def random_start(out: Path) -> Path:
    """The tool task's warm start folder (tokenizer, chat template, config) with freshly initialised weights."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcore.tasks import tooladd
    tooladd.prepare()
    shutil.copytree(tooladd.model_dir(), out)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).save_pretrained(out)
    return out


def run(name: str, workload: str, steps: int, out: Path, random: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(common.ROOT / "launch" / "train.py"), *(o for o in CONTENDERS[name] if not o.startswith("AGENT=")),
           *(o.format(random=random) for o in WORKLOADS[workload]), f"output_dir={out}", f"train.steps={steps}",
           f"train.eval_every={steps + 1}"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(common.ROOT)} | \
        dict(o.split("=", 1) for o in CONTENDERS[name] if o.startswith("AGENT="))
    proc = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]  # the run's folder, named by its recipe's config
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/rollout_s" in r][1:]
    return {"rollout_s": common.median(r["time/rollout_s"] for r in rows),
            "tokens": common.median(r["tokens/generated"] for r in rows),
            "reward": common.median(r["reward/mean"] for r in rows)}


CALL = {"id": "c", "object": "chat.completion", "created": 0, "model": "policy", "usage": {
    "prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}, "choices": [{"index": 0, "finish_reason":
    "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type":
    "function", "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'}}]}}]}
ANSWER = CALL | {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "42"}}]}


class Canned:
    """An endpoint that answers at once: a tool call to the first call of a trajectory, then the answer (as
    server-sent events when asked to stream)."""
    base_url = "http://127.0.0.1:9/v1"

    async def ahandle(self, method: str, path: str, auth: str, body: bytes):
        from rlcore.rollout.sse import Events
        req = json.loads(body)
        answer = CALL if len(req["messages"]) == 1 else ANSWER
        if not req.get("stream"):
            return 200, answer
        message = answer["choices"][0]["message"]
        delta = {"role": "assistant", "content": message["content"]} | (
            {"tool_calls": [{"index": 0} | message["tool_calls"][0]]} if "tool_calls" in message else {})
        chunk = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        return 200, Events([("", chunk | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
                            ("", chunk | {"choices": [{"index": 0, "delta": {},
                                                       "finish_reason": answer["choices"][0]["finish_reason"]}]})])


def own_cost(name: str, trajectories: int = 128, rounds: int = 7) -> float:
    """CPU seconds of one rank's step of trajectories of contender `name`'s agent, against Canned (median of
    rounds, after one to warm up); each trajectory gets a client of its own, made as a run makes them."""
    import asyncio
    import time

    from rlcore.rollout.wire import Clients
    sys.path.insert(0, str(common.ROOT / "tests"))
    import framework_agents
    agent = {"endpoint": framework_agents.recipe.agent, "endpoint streamed": framework_agents.openai_streamed,
             "langchain": framework_agents.langchain_ainvoke}[name]
    made = Clients(Canned())

    async def step() -> float:
        start = time.process_time()
        clients = [made.client(f"t{i}", 60.0) for i in range(trajectories)]
        await asyncio.gather(*(agent(c, {"prompt": "17+25=", "answer": "42"}) for c in clients))
        return time.process_time() - start

    async def steps() -> list[float]:
        return [await step() for _ in range(rounds + 1)][1:]
    return common.median(asyncio.run(steps()))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    args = p.parse_args()
    workloads = args.workloads.split(",")
    results = {(w, name): [] for w in workloads for name in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        random = random_start(Path(tmp) / "random") if "long calls" in workloads else None
        for k in range(args.rounds):
            for w in workloads:
                order = list(CONTENDERS) if k % 2 == 0 else list(CONTENDERS)[::-1]  # alternate who goes first
                for name in order:
                    results[w, name].append(run(name, w, args.steps, Path(tmp) / f"{w[0]}{name}{k}", random))
                    print(w, name, k, results[w, name][-1], flush=True)
    med = {key: {m: common.median(r[m] for r in rs) for m in rs[0]} for key, rs in results.items()}
    lines = ["tooladd, 2 ranks colocated, 32 prompts x 8 per step; medians over rounds of each run's median "
             "step (steps 2..). long calls: a random start, 64-token calls, one per trajectory.", "",
             "| workload | contender | rollout s/step | tokens generated/step | reward/mean | runs (rollout s) |",
             "|---|---|---:|---:|---:|---|"]
    for (w, name), m in med.items():
        runs = ", ".join(f"{r['rollout_s']:.2f}" for r in results[w, name])
        lines.append(f"| {w} | {name} | {m['rollout_s']:.3f} | {m['tokens']:.0f} | {m['reward']:.3f} | {runs} |")
    lines.append("")
    goals = {("endpoint", "environment"): 1.15, ("endpoint streamed", "endpoint"): 1.2, ("langchain", "endpoint"): 1.3,
             ("langchain http", "endpoint"): None}
    for w in workloads:
        for (a, b), goal in goals.items():
            ratio = med[w, a]["rollout_s"] / med[w, b]["rollout_s"]
            lines.append(f"{w}: {a} / {b} rollout time **{ratio:.2f}x**" + (f" (goal <= {goal}x)  " if goal else "  "))
    own = {name: own_cost(name) for name in ("endpoint", "endpoint streamed", "langchain")}
    framework = own["langchain"] - own["endpoint"]
    lines += ["", "The agents' own CPU, one rank's step of 128 trajectories against a canned endpoint (medians of 7): "
              + ", ".join(f"{name} {s:.3f} s" for name, s in own.items())
              + f"; LangChain's own cost {framework:.3f} s a step a rank "
              f"({framework / 128 * 1e3:.2f} ms a trajectory)."]
    for w in workloads:  # the rest of the difference is the path's (the ranks' other core may overlap some)
        more = med[w, "langchain"]["rollout_s"] - med[w, "endpoint"]["rollout_s"]
        net = max(more - framework, 0.0) / med[w, "endpoint"]["rollout_s"]
        lines.append(f"{w}: langchain - endpoint {more:.3f} s a step, of which LangChain's own code up to "
                     f"{min(framework, more):.3f} s; without it **{1 + net:.2f}x** (goal <= 1.3x)  ")
    common.write_section("Agent endpoint overhead (benchmarks/endpoint.py)",
                         f"python benchmarks/endpoint.py --rounds {args.rounds} --steps {args.steps}"
                         + (f" --workloads '{args.workloads}'" if workloads != list(WORKLOADS) else ""), lines)


if __name__ == "__main__":
    main()
