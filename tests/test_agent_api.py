"""What agent frameworks send to the endpoint (rlcore/rollout/fields.py, sse.py): stop strings of any length, forced
tool calls, streamed answers and the fields that change nothing, on the scripted engine of tests/test_endpoint.py
(the real engine: tests/workers/agent_worker.py). Each checks the answer the agent reads and the tokens recorded."""
import json

import openai
import pytest

from rlcore.rollout.endpoint import MODEL
from rlcore.rollout.wire import Chunks
from test_endpoint import FORCED, ROWS, TOOLS, run, tok, tool_agent  # noqa: F401  (tok: the fixture)


def user(row) -> list[dict]:
    return [{"role": "user", "content": row["prompt"]}]


def recorded(trajs) -> list[tuple]:
    return [(x.prompt_ids, x.tokens, x.sampled, x.logprobs) for x in trajs]


def test_a_stop_string_of_several_tokens_cuts_the_text_and_keeps_the_tokens(tok):
    """The engine stops at the token that completes the string; the answer's text ends before it, as OpenAI cuts
    it; the trajectory keeps every sampled token, the string's included (the trainer scores what was sampled)."""
    answers = {}

    async def agent(client, row):
        r = await client.chat.completions.create(model=MODEL, messages=user(row), tools=TOOLS,
                                                 stop=['"b"', "Observation:"])
        answers[row["prompt"]] = r.choices[0]
        return 1.0
    trajs, stats, engine, _ = run(tok, agent, ROWS)
    assert stats.failed == 0 and [c[5] for c in engine.calls] == [['"b"', "Observation:"]] * 2
    for x in trajs:
        a = x.row["prompt"].split("+")[0]
        choice = answers[x.row["prompt"]]
        assert choice.finish_reason == "stop" and choice.message.tool_calls is None
        assert choice.message.content == '<tool_call>\n{"name": "add", "arguments": {"a": ' + a + ", "
        # the token that completed the stop string (', "b": ') is the trajectory's last, sampled
        assert tok.decode(x.tokens).endswith(', "b": ') and x.sampled == [1] * len(x.tokens)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_forced_call_writes_the_opener_as_prompt_tokens_and_the_model_writes_the_rest(tok, choice):
    """tool_choice "required" (or the function named) appends the hermes call opener (with the name) to the
    prompt: tokens the model did not sample, no loss on them. The model's own tokens carry the rest of the call,
    with the logprobs the engine recorded; the answer is the whole call."""
    opener = FORCED[1] if choice == "required" else FORCED[0]

    async def agent(client, row):
        r = await client.chat.completions.create(model=MODEL, messages=user(row), tools=TOOLS, tool_choice=choice)
        (call,) = r.choices[0].message.tool_calls
        a, b = (int(v) for v in row["prompt"].rstrip("=").split("+"))
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": a, "b": b}
        assert r.choices[0].finish_reason == "tool_calls"
        return 1.0
    trajs, stats, _, endpoint = run(tok, agent, ROWS)
    assert stats.failed == 0
    from rlcore.tasks import tooladd
    for x in trajs:
        rendered = tooladd.prompt_ids(tok, x.row["prompt"])
        forced = tok.encode(opener.replace("{{", "{"), add_special_tokens=False)
        assert x.prompt_ids == rendered + forced  # the opener: prompt, not sampled
        text = tok.decode(x.prompt_ids[len(rendered):] + x.tokens)
        assert text.startswith("<tool_call>\n{\"name\": \"add\"") and text.endswith("</tool_call><|im_end|>")
        assert x.sampled == [1] * len(x.tokens) and len(x.logprobs) == len(x.tokens)


def test_streamed_answers_are_the_plain_answers_in_chunks(tok):
    """stream=true through the handed client (in process) and over HTTP (the agent's own client): the chunks
    rebuild the plain answer (content, tool call id, name and arguments, finish reason, usage), and the recorded
    tokens are the plain run's."""
    async def streamed(client, row, own=False):
        c = openai.AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0) if own else client
        messages = user(row)
        for _ in range(2):
            stream = await c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True,
                                                     stream_options={"include_usage": True})
            # the handed client answers in process with the openai client's own stream type, without its SSE parsing
            assert isinstance(stream, openai.AsyncStream) and isinstance(stream, Chunks) != own
            content, calls, finish, usage, first = "", {}, None, None, True
            async for chunk in stream:
                if chunk.usage is not None:
                    assert chunk.choices == []
                    usage = chunk.usage
                    continue
                (ch,) = chunk.choices
                assert chunk.object == "chat.completion.chunk" and (ch.delta.role == "assistant") == first
                first = False
                content += ch.delta.content or ""
                for tc in ch.delta.tool_calls or []:
                    calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
                    calls[tc.index]["arguments"] += tc.function.arguments
                finish = ch.finish_reason or finish
            assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            if not calls:
                assert finish == "stop"
                return float(content == row["answer"])
            assert finish == "tool_calls" and list(calls) == [0]
            args = json.loads(calls[0]["arguments"])
            messages = messages + [{"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0]["id"], "type": "function", "function": {"name": "add", "arguments": calls[0]["arguments"]}}]},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": str(args["a"] + args["b"])}]
        return 0.0

    async def over_http(client, row):
        return await streamed(client, row, own=True)
    plain, *_ = run(tok, tool_agent, ROWS)
    for agent in (streamed, over_http):
        trajs, stats, _, endpoint = run(tok, agent, ROWS)
        assert stats.failed == 0 and [x.env_reward for x in trajs] == [1.0, 1.0]
        assert recorded(trajs) == recorded(plain)


def test_a_streamed_completion_and_its_usage(tok):
    from rlcore.tasks import tooladd

    async def agent(client, row):
        ids = tooladd.prompt_ids(tok, row["prompt"])
        plain = await client.completions.create(model=MODEL, prompt=ids, max_tokens=4)
        stream = await client.completions.create(model=MODEL, prompt=ids, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
        return 1.0
    trajs, stats, *_ = run(tok, agent, ROWS[:1])
    assert stats.failed == 0


def test_fields_that_change_nothing_are_accepted_and_change_nothing(tok):
    """Labels, storage and routing hints (each in rlcore.rollout.fields.IGNORED), reasoning_effort (passed to the
    chat template, which here ignores it) and response_format text: the same calls, the same tokens."""
    extra = {"store": True, "metadata": {"run": "x"}, "user": "u1", "service_tier": "auto", "safety_identifier": "s",
             "prompt_cache_key": "k", "parallel_tool_calls": True, "reasoning_effort": "low", "seed": 7,
             "response_format": {"type": "text"}, "stream": False}

    async def agent(client, row):
        messages = user(row)
        r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, **extra)
        call = r.choices[0].message.tool_calls[0]
        args = json.loads(call.function.arguments)
        messages += [r.choices[0].message.model_dump(),
                     {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
        r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, **extra)
        return float(r.choices[0].message.content == row["answer"])
    plain, *_ = run(tok, tool_agent, ROWS)
    trajs, stats, *_ = run(tok, agent, ROWS)
    assert stats.failed == 0 and [x.env_reward for x in trajs] == [1.0, 1.0]
    assert recorded(trajs) == recorded(plain)


FLAT = [{"type": "function"} | t["function"] for t in TOOLS]  # the Responses API's function tools


def responses_agent(how: str):
    """The tool agent on the Responses API: the call, then its output with previous_response_id ("previous"), or the
    whole history sent again as the Agents SDK does ("history"); streamed or not."""
    async def agent(client, row):
        async def create(**kw):
            if how != "stream":
                return await client.responses.create(model=MODEL, tools=FLAT, **kw)
            events = [e async for e in await client.responses.create(model=MODEL, tools=FLAT, stream=True, **kw)]
            kinds = [e.type for e in events]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            return events[-1].response
        r = await create(input=row["prompt"])
        (call,) = [o for o in r.output if o.type == "function_call"]
        args = json.loads(call.arguments)
        result = {"type": "function_call_output", "call_id": call.call_id, "output": str(args["a"] + args["b"])}
        if how == "history":
            r = await create(input=[{"role": "user", "content": row["prompt"]},
                                    *[o.model_dump(exclude_unset=True) for o in r.output], result])
        else:
            r = await create(input=[result], previous_response_id=r.id)
        assert r.status == "completed" and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
        return float(r.output_text == row["answer"])
    return agent


@pytest.mark.parametrize("how", ["previous", "history", "stream"])
def test_the_responses_api_records_what_the_chat_route_records(tok, how):
    """POST /v1/responses (the Agents SDK's default model): a string input, function tools, the function_call
    output item, its function_call_output with previous_response_id or the whole history sent again, streamed or
    not: the agent reads the same answers and the trajectory records the same tokens as with chat completions."""
    plain, *_ = run(tok, tool_agent, ROWS)
    trajs, stats, *_ = run(tok, responses_agent(how), ROWS)
    assert stats.failed == 0 and [x.env_reward for x in trajs] == [1.0, 1.0]
    assert recorded(trajs) == recorded(plain)


def test_the_responses_api_refuses_in_its_own_shape(tok):
    """An unknown previous_response_id, one of another trajectory, an item type not served and a JSON text format:
    a 400 each naming the parameter; each trajectory fails alone."""
    ids, seen = {}, {}

    async def agent(client, row):
        r = await client.responses.create(model=MODEL, input=row["prompt"], tools=FLAT)
        ids[row["case"]] = r.id
        while len(ids) < 4:  # every trajectory has its own response to point at
            await asyncio.sleep(0.01)
        bad = [{"previous_response_id": "resp_nope", "input": "x"},
               {"previous_response_id": ids[(row["case"] + 1) % 4], "input": "x"},
               {"input": [{"type": "reasoning", "summary": []}]},
               {"input": "x", "text": {"format": {"type": "json_object"}}}][row["case"]]
        with pytest.raises(openai.BadRequestError) as e:
            await client.responses.create(model=MODEL, **bad)
        seen[row["case"]] = (e.value.body["param"], e.value.body["message"])
        return 1.0
    import asyncio
    trajs, stats, *_ = run(tok, agent, [{"prompt": "1+2=", "case": k} for k in range(4)])
    assert stats.failed == 4
    assert seen[0] == ("previous_response_id", 'previous_response_id "resp_nope" is not a response of this trajectory')
    assert seen[1][0] == "previous_response_id" and "is not a response of this trajectory" in seen[1][1]
    assert seen[2] == ("input", 'input item of type "reasoning" is not served (message, function_call and '
                                "function_call_output are)")
    assert seen[3][0] == "text" and "needs constrained decoding" in seen[3][1]


def test_the_docs_list_every_field_and_route():
    """docs/agents.md's contract names every field the endpoint knows, for both APIs, and every route."""
    from rlcore.rollout import fields, responses
    from rlcore.rollout.endpoint import ROUTES
    from conftest import ROOT

    doc = (ROOT / "docs" / "agents.md").read_text()
    contract = doc[doc.index("### The contract"):]
    missing = [f for f in sorted(fields.CHAT_FIELDS | fields.COMPLETION_FIELDS | responses.FIELDS)
               if f"`{f}`" not in contract and f"`{f}." not in contract]
    assert missing == []
    assert all(f"`POST /v1{route}`" in contract for route in ROUTES) and "`GET /v1/models`" in contract
