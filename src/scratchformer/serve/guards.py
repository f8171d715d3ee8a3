"""What stands between a client and the models: the API key (Bearer, compared in constant time,
checked from the request's head before its body is read), the body-size limit (413, counted as the
body arrives, so a lying or missing Content-Length does not get past it), the content type a route
reads (415; a JSON body parsed off the event loop). Their refusals have the one shape of every error
(:mod:`~scratchformer.serve.errors`)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import Request, params
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from scratchformer.serve.errors import RequestError, error_response

__all__ = ["BodyLimit", "CheckedRoute", "RequireKey", "require_media_type", "route_path"]


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 before the route sees it
    (Content-Length checked first; then the bytes counted as they arrive, the body kept and handed
    to the route once whole: the routes read whole bodies anyway)."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(scope, receive, send)
            if not message.get("more_body", False):
                break
        body, handed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal handed
            if handed:
                return await receive()  # (then the disconnect, when it comes)
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        response = error_response(413, f"the request body is over max_body_bytes={self.limit}")
        await response(scope, receive, send)


class RequireKey:
    """ASGI middleware: with a ``key``, every request to /v1/ needs ``Authorization: Bearer KEY``,
    compared in constant time. It is checked from the request's head, before the body is read or
    parsed: a client without the key gets 401 (with ``WWW-Authenticate: Bearer``), whatever it sends."""

    def __init__(self, app: Any, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.key or not route_path(scope).startswith("/v1/"):
            return await self.app(scope, receive, send)
        if self._given(scope):
            return await self.app(scope, receive, send)
        message = "this server needs an API key: Authorization: Bearer KEY"
        response = error_response(401, message, {"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _given(self, scope: dict) -> bool:
        """Whether the request's Authorization header holds the key."""
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key.encode())


def route_path(scope: dict) -> str:
    """The path the routes match: the request's path less the app's ``root_path`` (as Starlette's
    router reads it), so that a check by path sees what routing sees."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


JSON, MULTIPART = "application/json", "multipart/form-data"


def require_media_type(request: Request, expected: str) -> None:
    """415 unless the request's Content-Type is ``expected`` (JSON: also ``application/*+json``)."""
    given = request.headers.get("content-type", "")
    media = given.partition(";")[0].strip().lower()
    if expected == JSON:
        fits = media == JSON or (media.startswith("application/") and media.endswith("+json"))
    else:
        fits = media == expected
    if not fits:
        said = f"Content-Type {given!r}" if given else "no Content-Type"
        raise RequestError(415, f"{said}: this route reads {expected} ({_BODIES[expected]})")


_BODIES = {JSON: "a JSON object", MULTIPART: "a form with files, as curl -F sends"}


class CheckedRoute(APIRoute):
    """A route that refuses a body of another content type than it reads (415, before parsing it)
    and parses a JSON body in a worker thread, off the event loop."""

    def get_route_handler(self) -> Any:
        handle = super().get_route_handler()
        media = self._media_type()

        async def checked(request: Request) -> Response:
            if media is not None:
                require_media_type(request, media)
            return await handle(ThreadedJsonRequest(request.scope, request.receive))

        return checked

    def _media_type(self) -> str | None:
        """What the route's body is: JSON, a multipart form, or None (no body)."""
        if self.body_field is None:
            return None
        return MULTIPART if isinstance(self.body_field.field_info, params.Form) else JSON


class ThreadedJsonRequest(Request):
    """A request whose JSON body is parsed in a worker thread (a 10 MB body takes a while)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await run_in_threadpool(json.loads, body)
        return self._json
