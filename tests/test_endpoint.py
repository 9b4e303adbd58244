"""The agent endpoint (rlcore/rollout/endpoint.py) and the agent rollout (rlcore/rollout/agents.py) without vLLM:
a real HTTP server on 127.0.0.1, the real `openai` client, the tool task's real tokenizer and chat template, and
a scripted step-by-step engine. tests/workers/agent_worker.py drives the real engine at TP=2."""
import asyncio
import json
import random
import re
import threading

import openai
import pytest
import torch

from rlcore.engine.rollout_engine import Sample
from rlcore.rollout import agents, chat
from rlcore.rollout.endpoint import MODEL, Endpoint
from rlcore.rollout.loop import post
from rlcore.rollout.sessions import Call, sequences
from rlcore.rollout.turns import Trajectory, to_batch
from rlcore.rollout.wire import Clients, InProcess
from rlcore.tasks import tooladd

TOOLS = tooladd.AddEnv.toolbox.schemas


@pytest.fixture(scope="module")
def tok():
    return tooladd.build_tokenizer()


# What tool_choice "required" and {"function": {"name": "add"}} write after the generation prompt (hermes)
FORCED = ('<tool_call>\n{{"name": "add", "arguments": ', "<tool_call>\n")


def numbers(text: str) -> list[str]:
    """The task's two numbers: the last "a+b=" in the text (a framework wraps the task in its own words)."""
    found = re.findall(r"(\d+)\+(\d+)=", text)
    return list(found[-1]) if found else ["0", "0"]


class StepEngine:
    """submit / step / busy / abort as RolloutEngine has them. It answers a conversation ending in a user turn
    with a Hermes call of `add` on the problem's numbers, one ending in a tool answer with that answer; a request
    finishes after `latency` steps. Logprobs are -0.01 * (position + 1)."""

    def __init__(self, tok, latency=2, answer=None):
        self.tok, self.latency, self.answer, self.live, self.calls = tok, latency, answer, {}, []

    def submit(self, rid, prompt, max_tokens, temperature, seed, stop_token_ids=None, stop=None):
        self.calls.append(("add", rid, list(prompt), max_tokens, seed) + ((list(stop),) if stop else ()))
        text = self.tok.decode(prompt, skip_special_tokens=False)
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            reply = (self.answer or text.split("<tool_response>\n")[-1].split("\n")[0]) + "<|im_end|>"
        else:
            a, b = numbers(text)
            reply = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call><|im_end|>'
        for opener in FORCED:  # a forced call's opener ends the prompt: the model writes the rest of the call
            if text.endswith("<|im_start|>assistant\n" + opener.format(**dict(zip("ab", numbers(text))))):
                reply = reply.removeprefix(opener.format(**dict(zip("ab", numbers(text)))))
                break
        ids = self.tok.encode(reply, add_special_tokens=False)[:max_tokens]
        for k in range(1, len(ids) + 1) if stop else ():  # vLLM's stop strings: up to the token completing one
            if any(x in self.tok.decode(ids[:k]) for x in stop):
                ids = ids[:k]
                break
        self.live[rid] = [Sample(ids, [-0.01 * (j + 1) for j in range(len(ids))], "stop"), self.latency]

    def step(self):
        out = []
        for rid in list(self.live):
            self.live[rid][1] -= 1
            if self.live[rid][1] <= 0:
                out.append((rid, self.live.pop(rid)[0]))
        return out

    def busy(self):
        return bool(self.live)

    def abort(self, rids):
        if rids:
            self.calls.append(("abort", list(rids)))
        for rid in rids:
            self.live.pop(rid, None)


async def tool_agent(client, row):
    """The recipe's kind of agent: read tool_calls, run the tool, send the tool message, read the answer."""
    messages = [{"role": "user", "content": row["prompt"]}]
    r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    msg = r.choices[0].message
    if msg.tool_calls:
        call = msg.tool_calls[0]
        args = json.loads(call.function.arguments)
        messages += [msg.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
        r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    return float(r.choices[0].message.content == row["answer"])


def run(tok, agent, rows, engine=None, max_calls=4, timeout_s=10.0, workers=8, max_len=96, **kw):
    """Rows through agents.rollout on one rank; -> (trajectories, stats, engine, endpoint)."""
    engine = engine or StepEngine(tok)
    endpoint = Endpoint(tok, 1.0, 16, max_len, max_calls, **kw)
    trajs = [Trajectory(tooladd.prompt_ids(tok, r["prompt"]), r, seed=100 + i, owner=0) for i, r in enumerate(rows)]
    try:
        stats = agents.rollout(engine, endpoint, agent, trajs, 1.0, timeout_s, workers, 0, None)
    finally:
        endpoint.shutdown()
    return trajs, stats, engine, endpoint


ROWS = [{"prompt": "47+38=", "answer": "85"}, {"prompt": "12+30=", "answer": "42"}]


def test_a_tool_call_and_its_answer_are_one_sequence_token_for_token(tok):
    """Call 2's prompt is call 1's prompt + the sampled call (as sampled) + the tool message rendered after an
    end of turn; the trajectory is that one sequence, only the model's tokens flagged, the engine's logprobs."""
    trajs, stats, engine, _ = run(tok, tool_agent, ROWS)
    adds = [c for c in engine.calls if c[0] == "add"]
    assert len(adds) == 4 and stats.calls == 4 and stats.failed == 0 and stats.rewritten == 0
    for x, row in zip(trajs, ROWS):
        a, b = row["prompt"][:-1].split("+")
        p1 = tooladd.prompt_ids(tok, row["prompt"])  # the endpoint renders exactly what data.chat_template does
        call = tok.encode(f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
                          f'<|im_end|>', add_special_tokens=False)
        obs = chat.observation_ids(tok, [{"role": "tool", "content": row["answer"]}])
        answer = tok.encode(row["answer"] + "<|im_end|>", add_special_tokens=False)
        assert x.env_reward == 1.0 and x.error is None
        assert x.prompt_ids == p1 and x.tokens == call + obs + answer
        assert x.sampled == [1] * len(call) + [0] * len(obs) + [1] * len(answer)
        assert x.logprobs == [-0.01 * (j + 1) for j in range(len(call))] + [0.0] * len(obs) + \
            [-0.01 * (j + 1) for j in range(len(answer))]
        assert x.turns == [call, answer] and x.starts == []
    assert to_batch(trajs, 0, 2, 32).position_ids is None  # one sequence per row: the batch of environments
    # seeds: call k of the trajectory seeded s uses turn_seed(s, k), as an environment's turn k does
    from rlcore.rollout.turns import turn_seed
    assert sorted(c[4] for c in adds) == sorted(turn_seed(100 + i, k) for i in range(2) for k in range(2))


def test_a_rewritten_history_trains_both_sequences(tok):
    """The agent drops the call and asks again with the answer in the user turn: a fresh render, a second
    sequence. Both are trained: they lie one after another in the trajectory's row, the second restarting its
    positions, only the model's tokens in the loss mask, the engine's logprobs beside them."""
    async def rewriter(client, row):
        r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": row["prompt"]}],
                                                 tools=TOOLS)
        args = json.loads(r.choices[0].message.tool_calls[0].function.arguments)
        hint = f"{row['prompt']} (the tool says {args['a'] + args['b']})"
        r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": hint}])
        return 1.0
    trajs, stats, engine, _ = run(tok, rewriter, ROWS[:1])
    x = trajs[0]
    assert stats.rewritten == 1 and stats.failed == 0 and len(x.turns) == 2
    (_, _, first, _, _), (_, _, second, _, _) = [c for c in engine.calls if c[0] == "add"]
    rendered = tok.apply_chat_template([{"role": "user", "content": "47+38= (the tool says 85)"}],
                                       add_generation_prompt=True, tokenize=True)
    assert second == list(rendered["input_ids"]) and first == tooladd.prompt_ids(tok, "47+38=")
    call, answer = x.turns
    assert x.prompt_ids == first and x.tokens == call + second + answer and x.starts == [len(first) + len(call)]
    assert x.sampled == [1] * len(call) + [0] * len(second) + [1] * len(answer)
    lp = [-0.01 * (j + 1) for j in range(len(call))] + [0.0] * len(second) + [-0.01 * (j + 1) for j in range(len(answer))]
    assert x.logprobs == lp
    b = to_batch(trajs, 0, 1, 32)
    n, s = len(first) + len(call), len(second) + len(answer)
    assert b.position_ids[0].tolist() == list(range(n)) + list(range(s))
    assert b.loss_mask[0].tolist() == [0.0] * (len(first) - 1) + x.sampled
    assert b.rollout_logprobs[0].tolist() == pytest.approx([0.0] * (len(first) - 1) + lp)


def test_rewritten_rows_take_their_trajectory_advantage_and_count_once():
    """A group of 3 (rewards 1, 0, 0): A rewrote its history (2 model tokens, then 1 in a second sequence), B
    answered in one call (1 token), C extended its history (2 + 1 tokens, one sequence). GRPO's group advantage
    (mean 1/3, std sqrt(1/3)): A +1.1547 on all 3 of its model tokens, B and C -0.5774. The step's counts: 7 tokens,
    3 sequences (A's row is one). token-mean of the policy loss at ratio 1 (-A per token): -(3 * 1.1547 - 4 *
    0.5774) / 7 = -0.16496; seq-mean-token-mean of l = 1, 2, ... over each row's model tokens: A (1 + 2 + 3) / 3,
    B 1, C (1 + 2 + 3) / 3 -> (2 + 1 + 2) / 3 = 1.6667."""
    from rlcore.algorithms.grpo import GRPO
    from rlcore.algorithms.objectives import aggregate, local_normaliser
    from rlcore.batch import Normaliser
    from rlcore.rollout.sessions import Session

    calls = {"A": [Call([5, 6], [7, 8], [-0.1, -0.2], "stop"), Call([9], [10], [-0.3], "stop")],
             "B": [Call([5, 6], [7], [-0.1], "stop")],
             "C": [Call([5, 6], [7, 8], [-0.1, -0.2], "stop"), Call([5, 6, 7, 8, 13], [14], [-0.4], "stop")]}
    trajs = []
    for name, reward in (("A", 1.0), ("B", 0.0), ("C", 0.0)):
        x, s = Trajectory([5, 6], {}, seed=0, owner=0), Session(0)
        s.calls = calls[name]
        assert agents.fill(x, s) == (name == "A")
        trajs.append(x)
    b = to_batch(trajs, 0, 3, 32)
    b.rewards = torch.tensor([1.0, 0.0, 0.0])
    assert b.input_ids[0].tolist() == [5, 6, 7, 8, 9, 10] and b.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1]
    assert b.position_ids[2].tolist() == [0, 1, 2, 3, 4, 5]  # C: one sequence
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 1], [0, 1, 0, 0, 0], [0, 1, 1, 0, 1]]
    adv, _ = GRPO().advantages(b)
    a = 2 / 3 / (1 / 3) ** 0.5
    assert torch.allclose(adv, torch.tensor([[0, a, a, 0, a], [0, -a / 2, 0, 0, 0], [0, -a / 2, -a / 2, 0, -a / 2]]),
                          atol=1e-4)
    local = local_normaliser(b.loss_mask)
    assert (local.tokens, local.sequences) == (7.0, 3.0)
    norm = Normaliser(7.0, 3.0, max_len=b.max_model_tokens)
    b.advantages, b.old_logprobs = adv, b.rollout_logprobs.clone()
    loss, _ = GRPO(loss_agg="token-mean").loss(b, b.rollout_logprobs.clone(), norm)
    assert loss.item() == pytest.approx(-(3 * a - 4 * a / 2) / 7, abs=1e-5) == pytest.approx(-0.16496, abs=1e-4)
    ranks = b.loss_mask.cumsum(-1) * b.loss_mask  # 1, 2, ... over each row's model tokens
    assert aggregate(ranks, b.loss_mask, "seq-mean-token-mean", norm).item() == pytest.approx(5 / 3)


def test_sequences_join_extending_calls_and_split_rewrites():
    calls = [Call([1, 2, 3], [4, 5], [-0.1, -0.2], "stop"), Call([1, 2, 3, 4, 5, 6, 7], [8], [-0.3], "stop"),
             Call([1, 9], [10], [-0.4], "stop"), Call([1, 9, 10], [11], [], "stop")]
    a, b = sequences(calls)
    assert (a.prompt_ids, a.tokens, a.sampled, a.logprobs) == ([1, 2, 3], [4, 5, 6, 7, 8], [1, 1, 0, 0, 1],
                                                                [-0.1, -0.2, 0.0, 0.0, -0.3])
    assert (b.prompt_ids, b.tokens, b.sampled, b.logprobs) == ([1, 9], [10, 11], [1, 1], [-0.4, 0.0])


def test_refused_parameters_answer_400_once_and_fail_the_trajectory(tok):
    """Each refused parameter is a 400 naming it and why, not retried (x-should-retry: false, default client
    retries on); the trajectory fails (reward 0, nothing trained), the rollout goes on."""
    cases = [({"temperature": 0.5}, "temperature is pinned to the run's 1 (rollout.temperature)"),
             ({"top_p": 0.9}, "top_p=0.9 is refused: it changes the sampled distribution"),
             ({"n": 2}, "n=2 is refused: one sample per call"),
             ({"logit_bias": {"5": 10}}, "logit_bias={\"5\": 10} is refused"),
             ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 is refused"),
             ({"tool_choice": {"type": "function", "function": {"name": "mul"}}, "tools": TOOLS},
              "tool_choice names the function 'mul', which is not in tools (add)"),
             ({"tool_choice": "required"}, 'tool_choice="required" needs tools'),
             ({"model": "gpt-4o"}, "unknown model 'gpt-4o'; this endpoint serves 'policy'"),
             ({"extra_body": {"best_of": 3}}, "unsupported parameter 'best_of'"),
             ({"stop": [f"s{k}" for k in range(17)]}, "stop holds 17 strings; this endpoint takes at most 16"),
             ({"stream": True, "n": 2}, "n=2 is refused: one sample per call"),
             ({"stream_options": {"include_usage": True}}, "stream_options is only allowed when stream is true"),
             ({"response_format": {"type": "json_object"}}, "response_format={\"type\": \"json_object\"} is refused: "
                                                            "a JSON format needs constrained decoding")]
    seen = []

    async def agent(client, row):
        kw = dict(cases[row["case"]][0])
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(**{"model": MODEL} | kw,
                                                 messages=[{"role": "user", "content": "1+2="}])
        seen.append((row["case"], e.value.status_code, e.value.body["message"], e.value.body["param"]))
        return 1.0  # caught: still failed, by the refusal
    rows = [{"prompt": "1+2=", "case": k} for k in range(len(cases))]
    trajs, stats, engine, endpoint = run(tok, agent, rows)
    assert stats.failed == len(cases) and not engine.calls
    for k, status, message, param in sorted(seen):
        assert status == 400 and cases[k][1] in message, (message, cases[k][1])
    assert all(x.error and x.tokens == [] for x in trajs)
    assert endpoint.answered == len(cases)  # one request each: no retries


def test_a_client_of_the_agents_own_reaches_the_same_session_over_http(tok, monkeypatch):
    """The handed client goes in process (Endpoint.ahandle); a client the agent builds from its base_url and
    api_key goes over loopback HTTP (a server thread, Endpoint.handle): the same trajectories, token for token."""
    async def own(client, row):
        async with openai.AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0) as c:
            return await tool_agent(c, row)
    in_process = []
    ahandle = Endpoint.ahandle

    async def counted(self, *args):
        in_process.append(args[1])
        return await ahandle(self, *args)
    monkeypatch.setattr(Endpoint, "ahandle", counted)
    handed, *_ = run(tok, tool_agent, ROWS)
    assert len(in_process) == 4
    over_http, stats, _, endpoint = run(tok, own, ROWS)
    assert len(in_process) == 4 and endpoint.answered == 4 and stats.failed == 0
    assert [(x.prompt_ids, x.tokens, x.sampled, x.logprobs, x.env_reward) for x in handed] == \
        [(x.prompt_ids, x.tokens, x.sampled, x.logprobs, x.env_reward) for x in over_http]


def test_the_handed_client_answers_as_the_openai_client_does(tok, monkeypatch):
    """The handed client sends a plain call straight to the endpoint (no transport), and what it returns or raises
    equals what the openai client's own path (taken for a call with extra_headers, through the InProcess
    transport) returns or raises: the same objects, the same trajectories token for token, the same error class,
    status and body. A reply message appended as the pydantic object it is stays on the direct path, and so does a
    call through with_raw_response (LangChain's), whose parse() and http_response answer as the openai client's."""
    transported = []
    handle = InProcess.handle_async_request

    async def counted(self, request):
        transported.append(request.url.path)
        return await handle(self, request)
    monkeypatch.setattr(InProcess, "handle_async_request", counted)
    replies = {}

    def agent_of(way):
        async def create(resource, **kwargs):
            if way != "raw":
                return await resource.create(**kwargs, **({"extra_headers": {"x-way": way}} if way == "openai" else {}))
            raw = await resource.with_raw_response.create(**kwargs)
            assert raw.http_response.json() == raw.parse().model_dump(mode="json", exclude_unset=True)
            return raw.parse()

        async def agent(client, row):
            messages = [{"role": "user", "content": row["prompt"]}]
            if row.get("refused"):  # a 400, 3 calls (the budget), then its 429
                for n in (2, 1, 1, 1, 1):
                    try:
                        await create(client.chat.completions, model=MODEL, messages=messages, n=n)
                    except openai.APIStatusError as e:
                        replies.setdefault(way, []).append(
                            (type(e), e.status_code, e.body, e.response.headers["x-should-retry"]))
                return 1.0
            r1 = await create(client.chat.completions, model=MODEL, messages=messages, tools=TOOLS)
            call = r1.choices[0].message.tool_calls[0]
            args = json.loads(call.function.arguments)
            messages += [r1.choices[0].message if way == "object" else r1.choices[0].message.model_dump(),
                         {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
            r2 = await create(client.chat.completions, model=MODEL, messages=messages, tools=TOOLS)
            text = await create(client.completions, model=MODEL, prompt=row["prompt"], max_tokens=4)
            replies[way, row["prompt"]] = [r.model_dump(exclude={"created"}) for r in (r1, r2, text)]
            return float(r2.choices[0].message.content == row["answer"])
        return agent
    runs = {}
    for way in ("direct", "object", "raw", "openai"):
        transported.clear()
        trajs, stats, _, endpoint = run(tok, agent_of(way), ROWS + [{"prompt": "1+2=", "refused": True}], max_calls=3)
        runs[way] = [(x.prompt_ids, x.tokens, x.sampled, x.logprobs, x.env_reward, x.starts) for x in trajs]
        assert stats.failed == 1 and stats.rewritten == 2 and endpoint.answered == 11  # 3 calls a row, then 5
        assert len(transported) == (11 if way == "openai" else 0)
    assert runs["direct"] == runs["object"] == runs["raw"] == runs["openai"]
    assert [r[4] for r in runs["direct"]] == [1.0, 1.0, 0.0] and all(len(r[1]) > 10 for r in runs["direct"][:2])
    for row in ROWS:
        assert replies["direct", row["prompt"]] == replies["object", row["prompt"]] == \
            replies["raw", row["prompt"]] == replies["openai", row["prompt"]]
        assert replies["direct", row["prompt"]][1]["choices"][0]["message"]["content"] == row["answer"]
    assert replies["direct"] == replies["object"] == replies["raw"] == replies["openai"]
    assert [e[:2] + e[3:] for e in replies["direct"]] == [(openai.BadRequestError, 400, "false"),
                                                          (openai.RateLimitError, 429, "false")]
    assert "n=2 is refused" in replies["direct"][0][2]["message"] and replies["direct"][1][2]["code"] == \
        "budget_exceeded"


def test_copies_of_the_handed_client_keep_its_session(tok, monkeypatch):
    """client.with_options(...) (the openai client's copy) keeps the trajectory's token and endpoint: a copy that
    changes only client options (timeout, retries) stays on the direct path, one that changes the default
    headers takes the openai client's own path; both reach the same session, token for token."""
    transported = []
    handle = InProcess.handle_async_request

    async def counted(self, request):
        transported.append(request.headers.get("x-copy"))
        return await handle(self, request)
    monkeypatch.setattr(InProcess, "handle_async_request", counted)

    def agent_of(options):
        async def agent(client, row):
            copy = client.with_options(**options)
            assert type(copy) is type(client) and copy.api_key == client.api_key
            return await tool_agent(copy, row)
        return agent
    runs = {}
    for name, options in (("plain", {}), ("options", {"timeout": 5.0, "max_retries": 1}),
                          ("headers", {"default_headers": {"x-copy": "1"}})):
        transported.clear()
        trajs, stats, _, _ = run(tok, agent_of(options), ROWS)
        assert stats.failed == 0 and stats.calls == 4
        assert transported == (["1"] * 4 if name == "headers" else [])
        runs[name] = [(x.prompt_ids, x.tokens, x.sampled, x.logprobs, x.env_reward) for x in trajs]
    assert runs["plain"] == runs["options"] == runs["headers"] and [r[4] for r in runs["plain"]] == [1.0, 1.0]


def test_tool_answers_that_differ_only_in_their_ids_share_one_render(tok, monkeypatch):
    """ChatML does not write a tool message's tool_call_id, so a group's trajectories that get the same tool
    answer (under their own call ids) share its render; a template that writes the id renders each apart."""
    import copy
    writes_ids = copy.copy(tok)
    writes_ids.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.tool_call_id "
                                "%} [{{ m.tool_call_id }}]{% endif %}<|im_end|>\n{% endfor %}"
                                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert not chat.renders_tool_call_ids(tok) and chat.renders_tool_call_ids(writes_ids)
    renders = []
    observation_ids = chat.observation_ids

    def counted(tokenizer, messages):
        renders.append(messages[0]["tool_call_id"])
        return observation_ids(tokenizer, messages)
    monkeypatch.setattr(chat, "observation_ids", counted)
    trajs, stats, _, _ = run(tok, tool_agent, [ROWS[0]] * 3)
    assert stats.calls == 6 and [x.env_reward for x in trajs] == [1.0] * 3
    assert len(renders) == 1 and len({tuple(x.tokens) for x in trajs}) == 1  # 3 call ids, one render


def test_the_token_is_required_and_per_trajectory(tok):
    """No token or a wrong token: 401; another trajectory's token reaches only that trajectory."""
    endpoint = Endpoint(tok, 1.0, 16, 96, 4)
    try:
        s = endpoint.open(0)

        async def main():
            near = s.token[:-1] + ("y" if s.token.endswith("x") else "x")  # one character off (never the token)
            for key in ("", "not-a-token", near):
                clients = [openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=key or "unused", max_retries=0,
                                              timeout=10, http_client=http)
                           for http in (None, openai.DefaultAsyncHttpxClient(transport=InProcess(endpoint)))]
                for c in clients + [Clients(endpoint).client(key or "unused", 10)]:  # HTTP, in process, handed
                    with pytest.raises(openai.AuthenticationError) as e:
                        await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "1+2="}])
                    assert e.value.status_code == 401 and "bearer token" in e.value.body["message"]
                    assert e.value.response.headers["x-should-retry"] == "false"
            import httpx
            async with httpx.AsyncClient() as h:
                r = await h.post(endpoint.base_url + "/chat/completions", json={"model": MODEL, "messages": []})
                assert r.status_code == 401 and r.headers["x-should-retry"] == "false"
                r = await h.get(endpoint.base_url + "/models", headers={"Authorization": f"Bearer {s.token}"})
                assert r.json()["data"][0]["id"] == MODEL
        asyncio.run(main())
        assert endpoint.httpd.server_address[0] == "127.0.0.1" and s.failed is None
    finally:
        endpoint.shutdown()


def test_agent_failures_are_per_trajectory_and_the_budget_is_a_429(tok, monkeypatch):
    """An agent that raises, one that runs past its time, one past its call budget: each fails only its own
    trajectory (aborting its request in flight); the others score. (3 s for agents that need ~0.1 s, so a loaded
    machine's do not time out too; no gathering of first calls, which the slow agent would hold for GATHER_S.)"""
    monkeypatch.setattr(agents, "GATHER_S", 0.0)
    async def agent(client, row):
        if row["kind"] == "raise":
            raise KeyError("answer")
        if row["kind"] == "slow":
            await asyncio.sleep(30)
        if row["kind"] == "greedy":
            for _ in range(3):  # the budget is 2 calls
                await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": row["prompt"]}])
        return await tool_agent(client, row)
    rows = [dict(ROWS[0], kind=k) for k in ("ok", "raise", "slow", "greedy", "ok")]
    trajs, stats, _, _ = run(tok, agent, rows, max_calls=2, timeout_s=3.0)
    assert [x.env_reward for x in trajs] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert stats.failed == 2 and stats.timeouts == 1
    assert "the agent raised KeyError: 'answer'" in trajs[1].error and trajs[2].timed_out
    assert "call budget spent: 2 calls per trajectory (rollout.max_turns)" in trajs[3].error
    assert all(x.tokens == [] for x in trajs[1:4]) and trajs[0].model_tokens > 0


def test_synchronous_agents_in_threads_all_run_at_once(tok):
    """A synchronous framework's agent runs in asyncio.to_thread (smolagents'): 16 of them on a rank must all be
    running at once, as async agents are. Each waits at a barrier of 16 before its calls; asyncio's default pool
    (cores + 4 threads) would hold the 7th back, the barrier would break after 10 s and every agent fail (in
    streaming's lockstep the engine waited for the held-back agents' calls: all timed out)."""
    barrier = threading.Barrier(16, timeout=10)

    async def agent(client, row):
        await asyncio.to_thread(barrier.wait)
        return await tool_agent(client, row)
    rows = [{"prompt": f"{10 + i}+{20 + i}=", "answer": str(30 + 2 * i)} for i in range(16)]
    trajs, stats, _, _ = run(tok, agent, rows, workers=16, timeout_s=30.0)
    assert stats.failed == 0 and [x.env_reward for x in trajs] == [1.0] * 16


def test_a_burst_of_answers_wakes_the_agents_loop_once():
    """rlcore.rollout.loop.post, how answers and agent starts reach the event loop from the engine's thread: what is
    posted while the loop is busy runs in order after one wake-up of the loop (call_soon_threadsafe, a system
    call) for the whole burst, not one each; a callback that raises is reported and the rest still run; the next
    burst wakes the loop again, once."""
    loop, wakes, ran, errors = asyncio.new_event_loop(), [], [], []
    wake = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: wakes.append(a) or wake(*a)
    loop.set_exception_handler(lambda _, context: errors.append(str(context["exception"])))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    busy, go = threading.Event(), threading.Event()
    post(loop, lambda: (busy.set(), go.wait(10)))  # the loop runs this callback until `go`
    assert busy.wait(10)
    for i in range(100):
        post(loop, ran.append, i)
        if i == 50:
            post(loop, lambda: 1 / 0)
    done = threading.Event()
    post(loop, done.set)
    go.set()
    assert done.wait(10)
    assert ran == list(range(100)) and errors == ["division by zero"] and len(wakes) == 2
    busy.clear()
    go.clear()
    post(loop, lambda: (busy.set(), go.wait(10)))  # the next burst, posted while the loop is busy again
    assert busy.wait(10)
    post(loop, ran.append, 100)
    post(loop, done.clear)
    go.set()
    for _ in range(1000):
        if not done.is_set():
            break
        threading.Event().wait(0.01)
    assert ran[-1] == 100 and not done.is_set() and len(wakes) == 4
    wake(loop.stop)
    thread.join(10)
    loop.close()


def test_many_agents_of_random_latency_connect_at_once_and_all_finish(tok):
    """128 agents, 128 at once: each opens its connection in the same instant (the server's listen backlog)."""
    async def agent(client, row):
        await asyncio.sleep(random.Random(row["i"]).random() * 0.05)
        return await tool_agent(client, row)
    rows = [{"prompt": f"{10 + i % 80}+{20 + i % 70}=", "answer": str(30 + i % 80 + i % 70), "i": i}
            for i in range(128)]
    trajs, stats, engine, _ = run(tok, agent, rows, workers=128)
    assert [x.env_reward for x in trajs] == [1.0] * 128 and stats.calls == 256 and not any(
        c[0] == "abort" for c in engine.calls)


def test_an_agent_must_be_an_async_function():
    def agent(client, row):
        return 1.0
    with pytest.raises(ValueError, match=r"^rollout.agent 'x:agent' is a plain function, not an async function"):
        agents.check_agent(agent, "x:agent")
    agents.check_agent(tool_agent, "x")


def test_completions_take_text_or_token_ids_and_ids_extend_the_sequence(tok):
    """/v1/completions: a text prompt is encoded once; a token-id prompt is used as is, so an agent that sends
    the previous prompt + completion ids + its own ids continues one sequence (TITO by hand)."""
    seen = {}

    async def agent(client, row):
        p1 = tooladd.prompt_ids(tok, row["prompt"])
        r1 = await client.completions.create(model=MODEL, prompt=p1, max_tokens=16)
        seen["text"] = r1.choices[0].text
        ids = p1 + engine_out[0] + tok.encode("\n<|im_start|>user\n<tool_response>\n85\n</tool_response><|im_end|>\n"
                                              "<|im_start|>assistant\n", add_special_tokens=False)
        await client.completions.create(model=MODEL, prompt=ids, max_tokens=16)
        r3 = await client.completions.create(model=MODEL, prompt="47+38=", max_tokens=4)
        seen["usage"] = r3.usage.prompt_tokens
        return 1.0

    class Recording(StepEngine):
        def submit(self, rid, prompt, *a, **kw):
            super().submit(rid, prompt, *a, **kw)
            engine_out.append(self.live[rid][0].token_ids)
    engine_out = []
    trajs, stats, engine, _ = run(tok, agent, ROWS[:1], engine=Recording(tok))
    x = trajs[0]
    assert stats.calls == 3 and stats.failed == 0 and stats.rewritten == 1  # the text call: a new sequence
    text = tok.encode("47+38=", add_special_tokens=False)
    assert seen["text"] == tok.decode(engine_out[0]) and seen["usage"] == len(text)
    adds = [c for c in engine.calls if c[0] == "add"]
    first = adds[1][2] + engine_out[1]  # calls 1 and 2: one sequence; then the text call's
    assert x.prompt_ids + x.tokens == first + text + engine_out[2] and x.starts == [len(first)]
    assert adds[1][2][:len(adds[0][2]) + len(engine_out[0])] == adds[0][2] + engine_out[0]


def test_a_rollouts_first_calls_are_gathered_into_one_engine_step(tok, monkeypatch):
    """Agents that start at different moments (0-30 ms) make their first calls one by one: the rollout holds
    them until every agent has called (agents.GATHER_S at most), so the first engine step runs all of them
    together instead of a sliver of the batch; an agent still busy past GATHER_S does not hold the rest.
    GATHER_S is 2 s here so that a loaded machine's slow first calls still arrive within it; the busy agent
    waits for the first engine step, so the test does not depend on how long anything takes."""
    monkeypatch.setattr(agents, "GATHER_S", 2.0)
    stepped = threading.Event()

    class Logged(StepEngine):
        def step(self):
            self.calls.append(("step",))
            stepped.set()
            return super().step()

    async def late(client, row):
        if row["prompt"] == "slow":
            await asyncio.to_thread(stepped.wait, 30.0)
        else:
            await asyncio.sleep(random.Random(row["prompt"]).random() * 0.03)
        return await tool_agent(client, row | {"prompt": row["prompt"].replace("slow", "11+11=")})
    rows = [{"prompt": f"{10 + i}+{20 + i}=", "answer": str(30 + 2 * i)} for i in range(8)]
    for extra in ([], [{"prompt": "slow", "answer": "22"}]):
        stepped.clear()
        trajs, stats, engine, _ = run(tok, late, rows + extra, engine=Logged(tok), workers=16)
        assert stats.failed == 0 and all(x.env_reward == 1.0 for x in trajs)
        kinds = [c[0] for c in engine.calls]
        # the 8 first calls, then the first step; the busy agent calls only after it (had the rollout waited for
        # it, its call would come before the first step, at 30 s)
        assert kinds.index("step") == 8


# ---- agents in streaming (rlcore/modes/stream/agents.py) ---------------------------------------------------------

def stream_agents(tok, schedule: str, latency: float, rows: list[dict], cap: int | None = None) -> tuple[list, list]:
    """Two trajectories per row through AgentTurns on the scripted engine (each request finishes 2 engine steps
    after it joins; its tokens tagged with the number of that step, as versions), the recipe's agent
    sleeping 0-`latency` s before each call: (each request's (engine step it joined at, id), trajectories).
    Beside it, a TP rank 1 mirror (its own AgentTurns and engine, no agents) applies the lead's events: both
    engines must get the same calls (ids, prompts, caps, seeds) and aborts, in the same order. `cap`
    (rollout.max_waiting): at most that many requests in the engine, asserted at each call."""
    from types import SimpleNamespace

    from rlcore.modes.stream.agents import AgentTurns
    from rlcore.run import Envs
    from test_stream import run_to_end

    class Tagged(StepEngine):
        def step(self):
            out = super().step()
            for _, sample in out:
                sample.versions = [self.turns.tick + 1] * len(sample.token_ids)
            return out

    async def slow_agent(client, row):
        create = client.chat.completions.create

        async def late(**kw):
            await asyncio.sleep(random.uniform(0, latency))
            return await create(**kw)
        client.chat.completions.create = late
        return await tool_agent(client, row)

    logged, ended, sides = SimpleNamespace(lines=[]), [], []
    endpoint = Endpoint(tok, 1.0, 16, 96, 2)
    rollout = SimpleNamespace(max_new_tokens=16, max_total_tokens=32, temperature=1.0, join_steps=2, group_size=2,
                              schedule=schedule, trajectory_timeout_s=0.0)
    for tp_rank in (0, 1):
        engine, added = Tagged(tok), []
        envs = Envs(None, "slow_agent", 2, [], 10.0, 8, None, tok.decode, agent=slow_agent,
                    endpoint=endpoint if tp_rank == 0 else None)
        run = SimpleNamespace(cfg=SimpleNamespace(rollout=rollout), rollout=SimpleNamespace(envs=envs, tp_rank=tp_rank),
                              engine=engine, logger=SimpleNamespace(print=logged.lines.append))
        engine.turns = turns = AgentTurns(run, cap)
        turns.scored = (lambda trajs: ended.extend(trajs) or {}) if tp_rank == 0 else None  # only the lead scores
        def submit(rid, *a, t=turns, e=engine, log=added, **kw):
            assert cap is None or len(e.live) < cap, (rid, sorted(e.live))
            log.append((t.tick, rid))
            Tagged.submit(e, rid, *a, **kw)
        engine.submit = submit
        sides.append((turns, engine, added))
    (turns, engine, added), (mirror, mirror_engine, mirrored) = sides
    try:
        for g, row in enumerate(rows):
            for t, _, _ in sides:
                for j in range(2):
                    t.admit(g, j, row | {"prompt_ids": tooladd.prompt_ids(tok, row["prompt"])}, 100 * g)
        run_to_end(turns, engine, (mirror, mirror_engine))
    finally:
        turns.close()
        mirror.close()
        endpoint.shutdown()
    assert not logged.lines
    assert mirrored == added and mirror_engine.calls == engine.calls
    return added, sorted(ended, key=lambda x: x.seed)


def test_streaming_agents_join_at_fixed_engine_steps_with_versions():
    """lockstep, rollout.join_steps=2, agents 0-20 ms late before each call: every agent's first call joins after
    engine step 2 (admitted at 0), comes back after step 4, its second call joins after 6 and comes back after 8,
    whatever the latency (the engine waits for late agents there). Each trajectory is its two calls as one
    sequence; each sampled token carries the step that sampled it (4, then 8). continuous: same trajectories."""
    tok = tooladd.build_tokenizer()
    added, trajs = stream_agents(tok, "lockstep", 0.02, ROWS)
    assert sorted(added) == [(2, f"s{g}.{j}.0") for g in (0, 1) for j in (0, 1)] + \
        [(6, f"s{g}.{j}.1") for g in (0, 1) for j in (0, 1)]
    assert stream_agents(tok, "lockstep", 0.02, ROWS)[0] == added
    for x in trajs:
        first, second = x.turns
        assert x.env_reward == 1.0 and x.error is None and x.starts == [] and sum(x.sampled) == len(x.versions)
        assert x.versions == [4] * len(first) + [8] * len(second)
    other = stream_agents(tok, "continuous", 0.02, ROWS)[1]
    assert [(x.tokens, x.sampled, x.env_reward) for x in other] == [(x.tokens, x.sampled, x.env_reward) for x in trajs]


def test_streaming_agents_calls_beyond_the_engines_requests_queue():
    """rollout.max_waiting: at most 2 requests in the engine (AgentTurns' cap), 4 agents (2 rows x 2), lockstep.
    The first calls join after step 2: row 0's run, row 1's queue and start at 4 as row 0's come back; row 0's
    second calls join at 6, row 1's at 8. By hand: row 0's calls at 2 and 6 (versions 4, 8), row 1's at 4 and 8
    (versions 6, 10); the same with other latencies, and the same trajectories as without the cap."""
    tok = tooladd.build_tokenizer()
    added, trajs = stream_agents(tok, "lockstep", 0.02, ROWS, cap=2)
    assert sorted(added) == sorted([(2, f"s0.{j}.0") for j in (0, 1)] + [(4, f"s1.{j}.0") for j in (0, 1)]
                                   + [(6, f"s0.{j}.1") for j in (0, 1)] + [(8, f"s1.{j}.1") for j in (0, 1)])
    assert stream_agents(tok, "lockstep", 0.02, ROWS, cap=2)[0] == added
    free = stream_agents(tok, "lockstep", 0.0, ROWS)[1]
    assert [(x.tokens, x.sampled) for x in trajs] == [(x.tokens, x.sampled) for x in free]
    for x in trajs:
        first, second = x.turns
        v = 4 if x.seed < 100 else 6  # row g's seeds are 100 g + j
        assert x.env_reward == 1.0 and x.versions == [v] * len(first) + [v + 4] * len(second)


def test_closing_a_session_whose_agent_was_cancelled_does_not_raise(tok):
    """A timed out or stopped agent is cancelled on the agents' event loop, which cancels the call future it
    awaits; the rollout then closes its session (or the engine delivers the call): neither may raise."""
    import concurrent.futures as cf

    from rlcore.rollout.sessions import Request

    endpoint = Endpoint(tok, 1.0, 16, 96, 4)
    try:
        s = endpoint.open(0)
        s.pending = {0: cf.Future(), 1: cf.Future()}
        s.pending[0].cancel()
        endpoint.deliver(s, Request(0, 1, [1, 2], 4, []), Sample([5], [-0.5], "stop"))  # call 1 answered
        s.pending[1] = cf.Future()
        s.pending[1].cancel()
        endpoint.deliver(s, Request(0, 1, [1, 2], 4, []), Sample([5], [-0.5], "stop"))  # cancelled: recorded only
        endpoint.close(s, "the run stopped")
        assert s.closed and s.pending == {} and len(s.calls) == 2 and s.failed == "the run stopped"
    finally:
        endpoint.shutdown()
