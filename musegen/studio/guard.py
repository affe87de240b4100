"""What the studio checks of every request before a route sees it (ASGI middleware): the Host
header names the address the studio listens on (so a page whose DNS name was rebound to this
machine cannot reach it), a request that changes something comes from the studio's own page
(not a cross-site form or fetch), and a body stays within its route's limit, counted from
Content-Length before it is read and again while it streams in (a chunked body has no length).
Each refusal is {"error": one line}."""

from __future__ import annotations

import ipaddress
from typing import Callable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, QueryParams
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .store import RequestError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("", "0.0.0.0", "::")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

# a route's body limit and the line that refuses a body past it, from the request's path and query
Limits = Callable[[str, QueryParams], tuple[int, str]]


class BodyTooLarge(RequestError):
    """A request body past its route's limit, found while it streamed in."""

    status = 413


class Guard:
    def __init__(self, app: ASGIApp, host: str, limits: Limits):
        self.app, self.host, self.limits = app, host.strip("[]").lower(), limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            return await JSONResponse({"error": refusal[1]}, status_code=refusal[0])(scope, receive, send)
        limit, too_big = self.limits(scope["path"], QueryParams(scope["query_string"]))
        length = headers.get("content-length", "")
        if length and not length.isdigit():
            return await JSONResponse({"error": "not a valid Content-Length"}, status_code=400)(scope, receive, send)
        if length and int(length) > limit:  # refused before a byte of it is read
            return await JSONResponse({"error": too_big}, status_code=413)(scope, receive, send)
        await self.app(scope, _limited(receive, limit, too_big), send)

    def refusal(self, scope: Scope, headers: Headers) -> tuple[int, str] | None:
        """(status, line) for a request from somewhere the studio does not serve; None if it may go on."""
        host = headers.get("host", "")
        if not self.host_allowed(host, scope.get("server")):
            return 403, f"this studio answers only at the address it printed, not at {host[:80]!r}"
        if scope["method"] in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if headers.get("sec-fetch-site") == "cross-site" or (
            origin is not None and origin.lower() != f"http://{host}".lower()
        ):
            return 403, "refused: this request was sent by another site, not by the studio's page"
        return None

    def host_allowed(self, host: str, server: tuple[str, int] | None) -> bool:
        """The Host header names this studio: a loopback name, the --host given, or, listening on
        every address, any IP address (a rebound DNS name is never an IP literal); and the port
        the request came in on."""
        try:
            parts = urlsplit(f"//{host}")
            name, port = (parts.hostname or ""), parts.port or 80
        except ValueError:
            return False
        if server is not None and port != server[1]:
            return False
        if name in LOOPBACK or name == self.host:
            return True
        return self.host in WILDCARDS and _is_ip(name)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _limited(receive: Receive, limit: int, too_big: str) -> Receive:
    """`receive` that counts the body's bytes and stops past `limit` (BodyTooLarge: one line, 413)."""
    seen = 0

    async def receive_within_limit() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(too_big)
        return message

    return receive_within_limit
