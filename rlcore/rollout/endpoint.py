"""An OpenAI-compatible endpoint over the in-process engine, so an agent written against the `openai` client
trains with rlcore (rollout.agent; the loop that feeds the engine is rlcore.rollout.agents).

    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=session.token)    # one per trajectory
    r = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
    r.choices[0].message.tool_calls -> [ToolCall(function=Function(name="add", arguments='{"a": 2, "b": 40}'))]

A stdlib HTTP server on 127.0.0.1 (a random port), one per rank. Each trajectory gets its own random bearer
token: it is both the password (other users of a shared node cannot reach the engine) and the session (which
trajectory a call belongs to). Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses
(rlcore.rollout.responses), GET /v1/models.
The clients rlcore hands its agents skip the sockets (rlcore.rollout.wire.Client: the same body, bearer token
and answer, handled on the agent's event loop by `ahandle`); over HTTP a server thread blocks in `handle`. Both
run `start` (check, render, queue the engine call), wait for the engine, then `finish` (the sample -> the
answer).

Token ids, never re-rendered. The server renders a chat call to token ids itself and records, per session,
every call's exact prompt ids, the completion ids the engine sampled and their logprobs. When a call's
messages extend the previous call's messages plus the reply the server gave (the agent appended the tool's
answer, say), its prompt is the previous prompt + the sampled completion + the new messages' ids as the chat
template renders them after an end of turn (rlcore.rollout.chat.observation_ids): the model's tokens stay
exactly as sampled. Otherwise (the agent dropped or edited earlier messages) the whole conversation is
rendered afresh. rlcore.rollout.sessions.sequences then joins the calls: a call whose prompt extends the
previous sequence continues it (the new non-model tokens masked), any other call opens a new sequence.

Sampling is the run's, so the recorded logprobs are what the trainer recomputes: which fields are accepted,
ignored or refused, and why, is rlcore.rollout.fields (a refusal is an OpenAI-style 400 naming the parameter,
with `x-should-retry: false`; the trajectory is marked failed, no loss on it). Stop strings of any length end a
call where the engine finds them (vLLM's `stop`); the answer's text is cut before the string, the trajectory keeps
the tokens as sampled. A forced call (tool_choice "required" or a named function) writes the model format's call
opener after the generation prompt as prompt tokens (rlcore.rollout.toolcall.OPENERS); the model samples the rest.
`stream: true` answers with server-sent events when the call is done (rlcore.rollout.sse).

Why one file of ~340 lines: a call's way through the server (session, render, queue, answer) is in one place; the
fields it accepts are fields.py, streamed answers sse.py, the transport wire.py.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

from rlcore.rollout import chat
from rlcore.rollout import responses, sse
from rlcore.rollout.fields import CHAT_FIELDS, COMPLETION_FIELDS, MODEL, APIError, Asked, check, cut
from rlcore.rollout.loop import post
from rlcore.rollout.sessions import Call, Request, Session, normalise, template_message
from rlcore.rollout.toolcall import PARSERS, forced_opener

ROUTES = {"/chat/completions": "chat", "/completions": "complete", "/responses": "respond"}  # POST route -> method
RENDERS_KEPT = 4096  # cached chat renders (a step's distinct prompts and tool answers), dropped together when full
WAIT_S = 3600.0  # longest a request waits for the engine (a rollout always answers or closes the session first)


@dataclass
class Pending:
    """A call in the engine: its session, the future the rollout loop answers, sample -> response body, and for
    a streamed call the body -> its events."""
    session: Session
    future: cf.Future | asyncio.Future  # an HTTP thread's / an agent's on the run's event loop
    respond: Callable[[object], dict]
    stream: Callable[[dict], sse.Events] | None = None


class Endpoint:
    """This rank's server. The rollout loop takes the queued Requests (`take`), runs them through the engine and
    hands each sample back (`deliver`); the HTTP threads only render, check and wait."""

    def __init__(self, tokenizer, temperature: float, max_new_tokens: int, max_len: int, max_calls: int,
                 tool_format: str = "hermes"):
        self.tokenizer, self.temperature, self.max_new_tokens = tokenizer, temperature, max_new_tokens
        self.max_len, self.max_calls, self.parse = max_len, max_calls, PARSERS[tool_format]
        self.tool_format = tool_format
        self.turn_end = chat.end_of_turn_id(tokenizer) if getattr(tokenizer, "chat_template", None) else None
        # renders are cached by their messages, and the tool_call_ids left out of the key when the template
        # does not write them: a group's trajectories then share their tool answers' renders too
        self.ids_rendered = self.turn_end is None or chat.renders_tool_call_ids(tokenizer)
        self.ends = {i for i in (tokenizer.eos_token_id, self.turn_end) if i is not None}
        self.sessions: dict[str, Session] = {}
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()  # set when a request arrives (the rollout loop waits on it when idle)
        self.render_lock = threading.Lock()  # one tokenizer, many HTTP threads
        self.renders: dict[tuple, tuple[int, ...]] = {}  # (kind, messages as JSON) -> token ids
        self.answered = 0  # HTTP requests answered (refusals included)
        self.reported = False  # whether the run has printed an agent's failure
        from rlcore.rollout.wire import serve
        self.httpd = serve(self)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def open(self, index: int) -> Session:
        s = Session(index)
        self.sessions[s.token] = s
        return s

    def close(self, s: Session, why: str | None = None) -> None:
        """Revoke the session's token; calls still waiting get `why` as an error."""
        with s.lock:
            s.closed = True
            s.failed = s.failed or why
            for fut in s.pending.values():
                self.answer(fut, exception=APIError(400, f"the trajectory ended: {why or 'closed'}",
                                                    code="trajectory_ended"))
            s.pending.clear()
        self.sessions.pop(s.token, None)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def take(self) -> list[Request]:
        out = []
        while True:
            try:
                out.append(self.requests.get_nowait())
            except queue.Empty:
                return out

    def deliver(self, s: Session, request: Request, sample) -> None:
        """The engine finished a request: record it and answer the waiting HTTP thread."""
        with s.lock:
            s.calls.append(Call(request.prompt_ids, list(sample.token_ids), list(sample.logprobs),
                                sample.finish_reason))
            fut = s.pending.pop(request.call, None)
        if fut is not None:
            self.answer(fut, result=sample)

    def answer(self, fut: cf.Future | asyncio.Future, result=None, exception: BaseException | None = None) -> None:
        """Answer a waiting call: an HTTP thread's at once; an agent's, awaited on its event loop, on that loop,
        with one wake-up of it for a burst of answers (an engine step's: rlcore.rollout.loop.post)."""
        if isinstance(fut, cf.Future):
            settle(fut, result, exception)
        else:
            post(fut.get_loop(), settle, fut, result, exception)

    # ---- one HTTP request -----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, auth: str, body: bytes) -> tuple[int, dict]:
        """One request, answered on the calling thread (an HTTP thread): it blocks while the engine samples."""
        out = self.start(method, path, auth, body)
        if isinstance(out, Pending):
            try:
                out = self.finish(out, lambda: out.future.result(timeout=WAIT_S))
            except cf.TimeoutError:
                out = 504, APIError(504, "the engine did not answer in time").body()
        return out

    async def ahandle(self, method: str, path: str, auth: str, body: bytes) -> tuple[int, dict]:
        """The same, on an event loop (the agents' clients in process): awaits the engine instead of blocking."""
        out = self.start(method, path, auth, body)
        if isinstance(out, Pending):
            sample = await out.future  # an APIError when the trajectory ended meanwhile
            out = self.finish(out, lambda: sample)
        return out

    def start(self, method: str, path: str, auth: str, body: bytes) -> tuple[int, dict] | Pending:
        """Check and render a request and queue its engine call: a Pending, or the answer when there is no call
        to make (a refusal, GET /v1/models)."""
        self.answered += 1
        s = self.sessions.get(auth.removeprefix("Bearer ").strip()) if auth.startswith("Bearer ") else None
        try:
            if s is None:
                raise APIError(401, "missing or wrong bearer token: each trajectory's client carries its own",
                               code="invalid_api_key")
            if method == "GET" and path.rstrip("/") == "/v1/models":
                return 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "rlcore"}]}
            route = path.rstrip("/").removeprefix("/v1")
            if method != "POST" or route not in ROUTES:
                raise APIError(404, f"no route {method} {path}; this endpoint serves POST /v1/chat/completions, "
                                    f"POST /v1/completions, POST /v1/responses and GET /v1/models", code="not_found")
            try:
                req = json.loads(body or b"{}")
            except json.JSONDecodeError as e:
                raise APIError(400, f"the body is not JSON ({e.msg})") from None
            if not isinstance(req, dict):
                raise APIError(400, "the body must be a JSON object")
            return getattr(self, ROUTES[route])(s, req)
        except APIError as e:
            return self.refused(s, e)

    def finish(self, p: Pending, sample) -> tuple[int, dict]:
        """The engine's sample (`sample()` returns it or raises) -> the response body."""
        try:
            answer = p.respond(sample())
            return 200, p.stream(answer) if p.stream else answer
        except APIError as e:  # the trajectory ended while the call waited (its session says why already)
            return e.status, e.body()

    @staticmethod
    def refused(s: Session | None, e: APIError) -> tuple[int, dict]:
        if s is not None and e.status != 401 and s.failed is None:
            s.failed = str(e)  # a refused call fails its trajectory (no loss on it); the run goes on
        return e.status, e.body()

    def chat(self, s: Session, req: dict) -> Pending:
        asked = check(req, CHAT_FIELDS, self.temperature, self.max_new_tokens)
        messages, tools = req.get("messages"), req.get("tools") or None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise APIError(400, "messages must be a non-empty list of message objects", param="messages")
        opener = forced_opener(asked.tool_choice, tools, self.tool_format)
        effort = req.get("reasoning_effort")
        template = {"reasoning_effort": effort} if effort is not None else {}
        norm = [normalise(m) for m in messages]
        with self.render_lock:
            try:
                ids = self._chat_ids(s, messages, norm, tools, template)
                forced = self._cached("opener", [{"content": opener}], None,
                                      lambda: self.tokenizer.encode(opener, add_special_tokens=False)) if opener else []
            except (KeyError, TypeError, ValueError) as e:  # the template rejected the messages
                raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from None
        first_only = req.get("parallel_tool_calls") is False

        def respond(sample) -> dict:
            turn = [t for t in sample.token_ids if t not in self.ends] if sample.finish_reason == "stop" else \
                sample.token_ids
            text = cut(opener + self.tokenizer.decode(turn, skip_special_tokens=False), asked.stop)
            calls, error = self.parse(text) if asked.tool_choice != "none" else ([], None)
            if error:
                calls = []  # a malformed call comes back as text; the agent sees what the model wrote
            content = text.split("<tool_call>")[0] if calls else text
            tool_calls = [{"id": f"call_{s.index}_{len(s.calls)}_{j}", "type": "function",
                           "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                          for j, c in enumerate(calls[:1] if first_only else calls)]
            message = {"role": "assistant", "content": content or None} | ({"tool_calls": tool_calls} if calls else {})
            ended = sample.finish_reason == "stop" and sample.token_ids and sample.token_ids[-1] == self.turn_end
            s.last = (norm, normalise(message), (tools, template), ids + forced + list(sample.token_ids)) \
                if ended else None
            finish = "tool_calls" if calls else sample.finish_reason
            return {"id": f"chatcmpl-{s.index}-{len(s.calls)}", "object": "chat.completion",
                    "created": int(time.time()), "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": self.usage(ids + forced, sample)}
        return self.run(s, ids + forced, asked, respond, sse.chat_chunks)

    def respond(self, s: Session, req: dict) -> Pending:
        """POST /v1/responses: the chat call it stands for (rlcore.rollout.responses), answered as a response."""
        chat_req = responses.to_chat(req, s.responses)
        p = self.chat(s, chat_req)
        rid, chat_answer = f"resp_{secrets.token_hex(12)}", p.respond

        def respond(sample) -> dict:
            answer = chat_answer(sample)
            s.responses[rid] = chat_req["messages"] + [answer["choices"][0]["message"]]
            return responses.to_response(answer, req, rid)
        p.respond, p.stream = respond, responses.events if req.get("stream") else None
        return p

    def _chat_ids(self, s: Session, messages: list[dict], norm: list[tuple], tools, template: dict) -> list[int]:
        """The call's prompt ids: the last call's ids extended by the new messages, or a fresh render. Renders are
        cached by their messages (and tools): a group's G trajectories send the same first messages, and the
        template's output depends on nothing else."""
        if s.last is not None:
            before, reply, last_tools, last_ids = s.last
            k = len(before)
            if (tools, template) == last_tools and len(norm) > k + 1 and norm[:k] == before and norm[k] == reply:
                new = [template_message(m) for m in messages[k + 1:]]
                return last_ids + self._cached("obs", new, None, lambda: chat.observation_ids(self.tokenizer, new))
        whole = [template_message(m) for m in messages]

        def render() -> list[int]:
            ids = self.tokenizer.apply_chat_template(whole, tools=tools, add_generation_prompt=True, tokenize=True,
                                                     **template)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return self._cached("chat", whole, [tools, template] if template else tools, render)

    def _cached(self, kind: str, messages: list[dict], tools, render) -> list[int]:
        if not self.ids_rendered:
            messages = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in messages]
        key = kind, json.dumps([messages, tools], sort_keys=True)
        ids = self.renders.get(key)
        if ids is None:
            if len(self.renders) >= RENDERS_KEPT:
                self.renders.clear()
            ids = self.renders[key] = tuple(render())
        return list(ids)

    def complete(self, s: Session, req: dict) -> Pending:
        asked = check(req, COMPLETION_FIELDS, self.temperature, self.max_new_tokens)
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            with self.render_lock:
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt):  # bools are not ids
            ids = list(prompt)  # token ids in: used as they are
        else:
            raise APIError(400, "prompt must be one string or one list of token ids", param="prompt")
        if not all(0 <= i < len(self.tokenizer) for i in ids):
            raise APIError(400, f"prompt token ids must be in [0, {len(self.tokenizer)})", param="prompt")

        def respond(sample) -> dict:
            return {"id": f"cmpl-{s.index}-{len(s.calls)}", "object": "text_completion", "created": int(time.time()),
                    "model": MODEL, "choices": [{"index": 0, "text": cut(self.tokenizer.decode(sample.token_ids),
                                                                         asked.stop),
                                                 "finish_reason": sample.finish_reason, "logprobs": None}],
                    "usage": self.usage(ids, sample)}
        return self.run(s, ids, asked, respond, sse.completion_chunks)

    def run(self, s: Session, ids: list[int], asked: Asked, respond, chunks) -> Pending:
        """Queue the call for the rollout loop; the caller waits on the Pending's future for its sample."""
        room = self.max_len - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt is {len(ids)} tokens; the engine's context is {self.max_len} "
                                f"(rollout.max_model_len)", param="messages", code="context_length_exceeded")
        try:  # an agent's call in process (ahandle) waits on its event loop; an HTTP thread blocks
            fut = asyncio.get_running_loop().create_future()
        except RuntimeError:
            fut = cf.Future()
        with s.lock:
            if s.closed:
                raise APIError(400, f"the trajectory ended: {s.failed or 'closed'}", code="trajectory_ended")
            if s.started >= self.max_calls:
                raise APIError(429, f"call budget spent: {self.max_calls} calls per trajectory (rollout.max_turns)",
                               code="budget_exceeded")
            request = Request(s.index, s.started, list(ids), min(asked.max_tokens, self.max_new_tokens, room),
                              asked.stop)
            s.started += 1
            s.pending[request.call] = fut
        self.requests.put(request)
        self.wake.set()
        stream = (lambda answer: chunks(answer, asked.include_usage)) if asked.stream else None
        return Pending(s, fut, respond, stream)

    @staticmethod
    def usage(ids: list[int], sample) -> dict:
        return {"prompt_tokens": len(ids), "completion_tokens": len(sample.token_ids),
                "total_tokens": len(ids) + len(sample.token_ids)}


def settle(fut: cf.Future | asyncio.Future, result=None, exception: BaseException | None = None) -> None:
    """Answer a waiting call, unless its agent was cancelled meanwhile (a timeout, or a stopping run: cancelling
    the agent cancels the future it awaits, on the agents' event loop thread). An asyncio future only on its loop."""
    try:
        if exception is not None:
            fut.set_exception(exception)
        else:
            fut.set_result(result)
    except (cf.InvalidStateError, asyncio.InvalidStateError):
        pass
