"""The agent endpoint's ways in (rlcore.rollout.endpoint): the loopback HTTP server, one per rank, for any client;
and the clients rlcore hands its agents (Client), which call the endpoint in process, straight or through an
httpx transport (InProcess). All carry the same body, bearer token and answer; the endpoint does the rest.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2  # the openai client's HTTP library
import pydantic
from openai import AsyncOpenAI, AsyncStream, NotGiven, Omit
from openai._compat import cached_property
from openai._constants import RAW_RESPONSE_HEADER
from openai._legacy_response import LegacyAPIResponse
from openai._models import FinalRequestOptions
from openai.resources.chat import AsyncChat
from openai.resources.chat.completions import AsyncCompletions as AsyncChatCompletions
from openai.resources.completions import AsyncCompletions
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from rlcore.rollout.sse import Events


def serve(endpoint) -> ThreadingHTTPServer:
    """The HTTP server of `endpoint` (a rlcore.rollout.endpoint.Endpoint) on 127.0.0.1, a random port, answering
    from a daemon thread."""
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.endpoint = endpoint
    threading.Thread(target=httpd.serve_forever, args=(0.05,), name="rlcore-endpoint", daemon=True).start()
    return httpd


class InProcess(httpx2.AsyncBaseTransport):
    """The transport of the clients rlcore hands its agents: each request goes to Endpoint.ahandle on the agent's
    own event loop, with the same headers (the bearer token is checked as on the wire), body and answer as over
    HTTP, but no socket, no server thread and no HTTP parsing between them. An agent that builds a client of its
    own from base_url and api_key, or runs elsewhere, talks to the HTTP server instead."""

    def __init__(self, endpoint):  # rlcore.rollout.endpoint.Endpoint
        self.endpoint = endpoint

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        status, payload = await self.endpoint.ahandle(request.method, request.url.path,
                                                      request.headers.get("Authorization", ""), await request.aread())
        return response(status, payload, request)


def encoded(status: int, payload) -> tuple[dict, bytes]:
    """The endpoint's answer (a JSON body, or a streamed answer's Events) -> headers and bytes, as both ways in
    send them."""
    events = isinstance(payload, Events)
    headers = {"Content-Type": "text/event-stream" if events else "application/json"}
    if status >= 400:
        headers["x-should-retry"] = "false"  # a refusal or a spent budget: a retry gets the same answer
    return headers, payload.encode() if events else json.dumps(payload).encode()


def response(status: int, payload, request: httpx2.Request) -> httpx2.Response:
    """The endpoint's answer as an httpx response, with the HTTP server's headers."""
    headers, data = encoded(status, payload)
    return httpx2.Response(status, headers=headers, content=data, request=request)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Every agent of a rollout connects in the same instant; the stdlib's backlog of 5 refuses the rest.
    request_queue_size = 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection across calls
    # The headers and the body go out in two writes: with Nagle's algorithm the body waits for the client's
    # delayed ACK of the headers, 40 ms a call.
    disable_nagle_algorithm = True

    def log_message(self, format, *args) -> None:  # noqa: A002 (the stdlib's name); requests are not logged
        pass

    def _answer(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, payload = self.server.endpoint.handle(method, self.path, self.headers.get("Authorization", ""), body)
        headers, data = encoded(status, payload)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))  # a streamed answer too: its events are all there
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self._answer("POST")

    def do_GET(self) -> None:  # noqa: N802
        self._answer("GET")


class Clients:
    """The clients of one rank's agents, one per trajectory (its token is its session). They share one HTTP
    client (a client of its own costs ~25 ms: an SSL context) whose transport is InProcess, and the base URL,
    parsed once (otherwise each client parses it twice, ~0.025 ms)."""

    def __init__(self, endpoint):  # rlcore.rollout.endpoint.Endpoint
        from openai import DefaultAsyncHttpxClient

        self.endpoint = endpoint
        self.http = DefaultAsyncHttpxClient(transport=InProcess(endpoint))
        self.url = httpx2.URL(f"{endpoint.base_url}/")

    def client(self, token: str, timeout_s: float) -> Client:
        return Client(endpoint=self.endpoint, base_url=self.url, api_key=token, max_retries=0, timeout=timeout_s,
                      http_client=self.http)


class Client(AsyncOpenAI):
    """The client rlcore hands an agent: an `openai.AsyncOpenAI` whose chat.completions.create and
    completions.create send a plain request straight to Endpoint.ahandle (the same body, bearer token and
    answer as over the wire) and build the response object as the openai client does, status errors included.
    The openai client's own path spends ~0.8 ms of CPU a call turning typed parameters into a body, the body
    into an httpx request and the answer into objects; this one ~0.02 ms, on the core the engine runs on. So do
    their with_raw_response.create (what LangChain calls), as a raw response whose parse() is the object. A call
    that is not plain (extra_headers / extra_body / extra_query, a value that is neither JSON nor a pydantic
    object) and everything else the client does (other routes) takes the openai client's own
    path, through the InProcess transport; so does every call of a copy (with_options) that changes the base URL
    or the default headers or query. Neither path times a call out (an httpx transport of our own enforces no
    timeout): rollout.env_timeout_s bounds the whole agent."""

    def __init__(self, *, endpoint=None, **kwargs):  # endpoint: rlcore.rollout.endpoint.Endpoint
        super().__init__(**kwargs)
        self._endpoint = endpoint

    def copy(self, **kwargs) -> Client:
        copied = super().copy(**kwargs)
        same = (copied.base_url, copied._custom_headers, copied._custom_query) == \
            (self.base_url, self._custom_headers, self._custom_query)
        copied._endpoint = self._endpoint if same else None
        return copied

    with_options = copy

    @cached_property
    def chat(self) -> _Chat:
        return _Chat(self)

    @cached_property
    def completions(self) -> _TextCompletions:
        return _TextCompletions(self)

    async def _direct(self, route: str, body: bytes, cast_to: type, chunk_type: type, raw: bool):
        status, payload = await self._endpoint.ahandle("POST", f"/v1{route}", f"Bearer {self.api_key}", body)
        request = httpx2.Request("POST", f"{self.base_url}{route.lstrip('/')}")
        if status >= 400:  # the openai client's own error (BadRequestError, ...), from the same answer
            raise self._make_status_error_from_response(response(status, payload, request))
        if isinstance(payload, Events):  # stream=True: the events as the openai client's own stream of chunks
            result = Chunks([chunk_type.model_validate(data) for _, data in payload], chunk_type,
                            httpx2.Response(200, headers={"Content-Type": "text/event-stream"}, request=request), self)
        else:
            result = cast_to.model_validate(payload)  # equal to the openai client's construct_type, 13x faster
        return Raw(result, payload, request, cast_to, self) if raw else result


class Raw(LegacyAPIResponse):
    """What `with_raw_response.create` returns on the direct path (LangChain calls it so): the openai client's
    raw response, its http_response the answer as the HTTP server sends it, its parse() the object already built."""

    def __init__(self, result, payload, request: httpx2.Request, cast_to: type, client: AsyncOpenAI):
        stream = isinstance(result, Chunks)
        http_response = result.response if stream else response(200, payload, request)
        super().__init__(raw=http_response, cast_to=cast_to, client=client, stream=stream,
                         stream_cls=type(result) if stream else None,
                         options=FinalRequestOptions.construct(method="post", url=request.url.path))
        self._parsed_by_type[cast_to] = result


class Chunks(AsyncStream):
    """A streamed answer of the endpoint in process: an openai AsyncStream (async for, async with, close) of its
    events already as chunk objects, without writing and parsing server-sent events: the openai client's own
    path costs ~0.8 ms of CPU a streamed call, this one ~0.05 ms (a tool call's answer, events built included)."""

    def __init__(self, chunks: list, cast_to: type, http_response: httpx2.Response, client: AsyncOpenAI):
        self._chunks = chunks
        super().__init__(cast_to=cast_to, response=http_response, client=client)

    async def __stream__(self):
        for chunk in self._chunks:
            yield chunk


def plain(kwargs: dict, needs: str) -> bytes | None:
    """The JSON body of a create call's keyword arguments, or None when the openai client must build it: an
    option of its own (extra_headers other than with_raw_response's mark, extra_body, extra_query), a value that is
    neither JSON nor a pydantic object, or a required argument missing."""
    body = {}
    for key, value in kwargs.items():
        if isinstance(value, (Omit, NotGiven)) or key == "timeout":  # in process, as through InProcess, no call
            continue                                                  # times out: rollout.env_timeout_s cuts it
        if key == "extra_headers" and value == RAW_MARK:  # with_raw_response: answered directly too
            continue
        if key.startswith("extra_"):
            return None
        body[key] = value
    if "model" not in body or needs not in body:
        return None
    try:
        return json.dumps(body, default=_model).encode()
    except (TypeError, ValueError):  # a generator, a date, ...: the openai client transforms these
        return None


def _model(value):
    """A pydantic object in the arguments (an agent appends the reply's message to its messages) as the openai
    client sends it."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(exclude_unset=True, mode="json", exclude=getattr(value, "__api_exclude__", None))
    raise TypeError(type(value).__name__)


RAW_MARK = {RAW_RESPONSE_HEADER: "true"}  # the extra header of a with_raw_response call, and none other


async def direct_or_own(resource, own, kwargs: dict, needs: str, route: str, cast_to: type, chunk_type: type):
    """A create call of a Client's resource: direct when it is plain, else the openai client's own `own`."""
    body = plain(kwargs, needs) if resource._client._endpoint is not None else None
    if body is None:
        return await own(**kwargs)
    return await resource._client._direct(route, body, cast_to, chunk_type, kwargs.get("extra_headers") == RAW_MARK)


class _ChatCompletions(AsyncChatCompletions):
    async def create(self, **kwargs):
        return await direct_or_own(self, super().create, kwargs, "messages", "/chat/completions", ChatCompletion,
                                   ChatCompletionChunk)


class _Chat(AsyncChat):
    @cached_property
    def completions(self) -> _ChatCompletions:
        return _ChatCompletions(self._client)


class _TextCompletions(AsyncCompletions):
    async def create(self, **kwargs):
        return await direct_or_own(self, super().create, kwargs, "prompt", "/completions", Completion, Completion)
