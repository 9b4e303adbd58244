"""The agent endpoint's two ways in (rlcore.rollout.endpoint): the loopback HTTP server, one per rank, and the
in-process transport of the clients rlcore hands its agents. Both carry the same request, headers (the bearer
token) and answer; the endpoint does the rest.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2  # the openai client's HTTP library


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
        headers = {"Content-Type": "application/json"} | ({"x-should-retry": "false"} if status >= 400 else {})
        return httpx2.Response(status, headers=headers, content=json.dumps(payload).encode(), request=request)


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
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status >= 400:
            self.send_header("x-should-retry", "false")  # a refusal or a spent budget: a retry gets the same answer
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self._answer("POST")

    def do_GET(self) -> None:  # noqa: N802
        self._answer("GET")
