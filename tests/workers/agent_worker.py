"""torchrun worker: agents through the endpoint over one real vLLM engine at TP=2 (tests/test_agents.py).

    torchrun --nproc-per-node 2 tests/workers/agent_worker.py OUT_JSON

One rollout of 16 prompts x 2 samples on the tool task's warm start (rlcore.tasks.tooladd), each rank running
the agents of the trajectories it owns, with a random (unseeded, so different on each rank) pause before every
call. The agents differ by trajectory: i % 4 == 0 the recipe's tool agent, 1 the same after rewriting its
history (the second call drops the first), 2 one that raises after its first call, 3 one that asks for
temperature 0.3 (refused). Then two rollouts of an agent that keeps one HTTP client per process, as LangChain does.
Each rank records every engine call it makes; rank 0 writes what every rank saw, with
each rank's largest |engine - trainer| logprob over its trajectories' model tokens.
"""
import asyncio
import importlib.util
import json
import random
import sys

import httpx
import openai
import torch
import torch.distributed as dist

from rlcore.config import Config, DataConfig, ModelConfig, RolloutConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.engine import RolloutEngine
from rlcore.models import build as models
from rlcore.rollout import agents
from rlcore.rollout.endpoint import MODEL, Endpoint
from rlcore.rollout.turns import Trajectory, to_batch
from rlcore.tasks import tooladd

spec = importlib.util.spec_from_file_location("recipe", tooladd.Path(__file__).parents[2] / "recipes" /
                                              "tooladd_agent.py")
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)


class Recorder:
    """The engine's request-by-request calls, passed through and written down."""

    def __init__(self, engine):
        self.engine, self.log = engine, []

    def submit(self, rid, prompt, max_tokens, temperature, seed, stop_token_ids=None, stop=None):
        self.log.append(["add", rid, list(prompt), max_tokens, seed] + ([list(stop)] if stop else []))
        self.engine.submit(rid, prompt, max_tokens, temperature, seed, stop_token_ids, stop)

    def step(self):
        out = self.engine.step()
        self.log.append(["step", [rid for rid, _ in out]])
        return out

    def busy(self):
        return self.engine.busy()

    def abort(self, rids):
        if rids:
            self.log.append(["abort", list(rids)])
        self.engine.abort(rids)


async def agent(client, row):
    kind = row["i"] % 4
    await asyncio.sleep(random.random() * 0.03)
    if kind == 0:
        return await recipe.agent(client, row)
    user = [{"role": "user", "content": row["prompt"]}]
    if kind == 3:
        await client.chat.completions.create(model=MODEL, messages=user, tools=recipe.TOOLS, temperature=0.3)
    r = await client.chat.completions.create(model=MODEL, messages=user, tools=recipe.TOOLS)
    if kind == 2:
        raise RuntimeError("the agent's own bug")
    await asyncio.sleep(random.random() * 0.03)
    text = r.choices[0].message.content or "?"
    r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": row["prompt"] + text}])
    return 0.5


out = sys.argv[1]
init_distributed()
if dist.get_rank() == 0:  # the warm start's cache, built once (transformers saves model files on rank 0 only)
    tooladd.prepare()
dist.barrier()
cfg = Config(model=ModelConfig(path=str(tooladd.model_dir())), data=DataConfig(max_prompt_tokens=32),
             rollout=RolloutConfig(tensor_parallel=2, cpu_kv_cache_gb=0.25, max_new_tokens=16, max_total_tokens=32))
dims = ParallelDims(dist.get_world_size(), 2)
fsdp_mesh, rollout_mesh = build_meshes(dims)
tp_rank, tp_group = rollout_mesh.get_local_rank("tp"), rollout_mesh.get_group("tp")
engine = RolloutEngine(cfg, max_model_len=64)
policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
from transformers import AutoTokenizer  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(str(tooladd.model_dir()))
endpoint = Endpoint(tokenizer, 1.0, 16, 64, 3)
rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in zip(range(17, 97, 5), range(38, 98, 4))]
trajs = [Trajectory(tooladd.prompt_ids(tokenizer, r["prompt"]), r | {"i": 2 * i + j}, seed=1000 * i + j,
                    owner=i // 8) for i, r in enumerate(rows) for j in range(2)]
rec = Recorder(engine)
stats = agents.rollout(rec, endpoint, agent, trajs, 1.0, 60.0, 64, tp_rank, tp_group)

# A library's habit (LangChain's ChatOpenAI keeps one async HTTP client per process, made on the loop of its first
# call): an agent with its own openai client over one process-wide httpx client, through the endpoint's real
# loopback server, in two rollouts. The second finds its pool's connections alive only if both ran on one loop.
shared = {}


async def library_agent(client, row):
    if "http" not in shared:
        shared["http"] = httpx.AsyncClient()
    own = openai.AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, http_client=shared["http"],
                             max_retries=0)
    await own.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0


library = []
for k in range(2):
    again = [Trajectory(tooladd.prompt_ids(tokenizer, r["prompt"]), r | {"i": i}, seed=7000 * k + i, owner=i % 2)
             for i, r in enumerate(rows[:4])]
    st = agents.rollout(engine, endpoint, library_agent, again, 1.0, 60.0, 64, tp_rank, tp_group)
    library.append([st.failed, st.first_error])


# What agent frameworks send, on the real engine: a stop string of several tokens, a forced call, a streamed answer.
# The engine's own stop (vLLM's detokenizer) ends the call; the endpoint records the tokens as sampled.
api = {}


async def api_agent(client, row):
    user = [{"role": "user", "content": row["prompt"]}]
    kind = ("stop", "required", "stream")[row["i"] % 3]
    if kind == "stream":
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=user, tools=recipe.TOOLS, stream=True, stream_options={"include_usage": True})]
        calls = [t.function.name for c in chunks for ch in c.choices for t in ch.delta.tool_calls or []]
        api[row["i"]] = [kind, calls, chunks[-1].usage.completion_tokens]
    else:
        # every digit stops it: an answer starts with one, a tool call holds one after several tokens
        extra = {"stop": list("0123456789")} if kind == "stop" else {"tool_choice": "required"}
        r = await client.chat.completions.create(model=MODEL, messages=user, tools=recipe.TOOLS, **extra)
        api[row["i"]] = [kind, [t.function.name for t in r.choices[0].message.tool_calls or []],
                         r.choices[0].message.content, r.choices[0].finish_reason]
    return 1.0


api_trajs = [Trajectory(tooladd.prompt_ids(tokenizer, r["prompt"]), r | {"i": i}, seed=9000 + i, owner=i % 2)
             for i, r in enumerate(rows[:6])]
api_rec = Recorder(engine)
api_stats = agents.rollout(api_rec, endpoint, api_agent, api_trajs, 1.0, 60.0, 64, tp_rank, tp_group)
endpoint.shutdown()
mine = [x for x in trajs if x.owner == tp_rank]
batch = to_batch(mine + [x for x in api_trajs if x.owner == tp_rank], tokenizer.pad_token_id, 1, 32)
with torch.no_grad():
    # rows of two sequences (the rewriters') carry restarting positions, as the trainer's forwards pass them
    mask = batch.attention_mask if batch.position_ids is None else None
    trainer = models.token_logprobs(policy, batch.input_ids, mask, 1.0, position_ids=batch.position_ids)
result = {"calls": rec.log, "diff": ((trainer - batch.rollout_logprobs).abs() * batch.loss_mask).max().item(),
          "model_tokens": batch.loss_mask.sum().item(), "rewards": [x.env_reward for x in trajs],
          "errors": {x.row["i"]: x.error for x in mine if x.error}, "timed_out": [x.timed_out for x in trajs],
          "rewritten": stats.rewritten, "failed": stats.failed, "calls_n": stats.calls,
          "starts": {x.row["i"]: x.starts for x in mine}, "turn_lens": {x.row["i"]: [len(t) for t in x.turns] for x in mine},
          "sampled": {x.row["i"]: x.sampled for x in mine}, "turns": {x.row["i"]: len(x.turns) for x in mine},
          "library": library, "api_calls": api_rec.log, "api_failed": api_stats.failed, "api": api,
          "api_tokens": {x.row["i"]: [tokenizer.decode(x.tokens), x.sampled, x.prompt_ids[-2:]] for x in api_trajs},
          "opener": tokenizer.encode("<tool_call>\n", add_special_tokens=False)}
everything = [None] * dist.get_world_size()
dist.all_gather_object(everything, result)
if dist.get_rank() == 0:
    json.dump(everything, open(out, "w"))
print(f"rank {dist.get_rank()}: {stats.calls} calls, {stats.failed} failed, diff {result['diff']:.2e}", flush=True)
