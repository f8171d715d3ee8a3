"""What stands between a client and the models: the API key (Bearer, compared in constant time,
checked from the request's head before its body is read), the body-size limit (413, counted as the
body arrives, so a lying or missing Content-Length does not get past it), the content type a route
reads (415; a JSON body parsed off the event loop), and the one shape of every error, from any
route or middleware: ``{"error": "...", "error_type": ...}``."""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from scratchformer.serve.parameters import RequestError

__all__ = [
    "BodyLimit",
    "CheckedRoute",
    "RequireKey",
    "add_error_handlers",
    "error_response",
    "require_media_type",
    "route_path",
]

ERROR_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    422: "validation",
    429: "overloaded",
    499: "client_closed",
    500: "internal",
    503: "unavailable",
    504: "timeout",
}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": message, "error_type": ERROR_TYPES.get(status, "error")},
        status_code=status,
        headers=headers,
    )


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


def one_line(errors: list[dict[str, Any]]) -> str:
    """Pydantic's validation errors as one line naming the fields: "inputs: Field required; ..."."""
    parts = []
    for e in errors[:3]:
        if e.get("type") == "json_invalid":  # FastAPI's loc: ("body", the character)
            problem = (e.get("ctx") or {}).get("error", "invalid")
            parts.append(f"body: not valid JSON ({problem} at character {e['loc'][-1]})")
            continue
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def add_error_handlers(app: FastAPI) -> None:
    """Every error in one shape, ``{"error": "...", "error_type": "..."}``: the routes' own, a
    route or method that does not exist, a body that fails validation, and any failure."""
    from scratchformer.serve.batcher import Overloaded

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return error_response(e.status, str(e))

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, e: Overloaded) -> JSONResponse:
        return error_response(429, str(e), {"Retry-After": str(e.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(422, one_line(list(e.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if e.status_code == 404:
            message = f"not found: {where} (GET /docs lists the routes)"
        elif e.status_code == 405:
            message = f"method not allowed: {where}; allowed: {(e.headers or {}).get('Allow', '')}"
        else:
            message = f"{where}: {e.detail}"
        return error_response(e.status_code, message, e.headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:  # (a bug: logged, then this answer)
        return error_response(500, f"internal error: {type(e).__name__}")
