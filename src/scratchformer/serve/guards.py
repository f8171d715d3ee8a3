"""What stands between a client and the models: the body-size limit (413, counted as the body
arrives, so a lying or missing Content-Length does not get past it), the optional API key (Bearer,
compared in constant time), and the one shape of every error: ``{"error": "...", "error_type": ...}``."""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

__all__ = ["BodyLimit", "error_response", "require_key"]

ERROR_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    413: "too_large",
    422: "validation",
    429: "overloaded",
    499: "client_closed",
    500: "inference",
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


def require_key(key: str | None):
    """A dependency: with a key, requests need ``Authorization: Bearer KEY`` (else 401)."""
    expected = (key or "").encode()

    async def check(request: Request) -> None:
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise KeyRefused

    return check


class KeyRefused(Exception):
    """No or a wrong API key: 401 with ``WWW-Authenticate: Bearer``."""


def one_line(errors: list[dict[str, Any]]) -> str:
    """Pydantic's validation errors as one line naming the fields: "inputs: Field required; ..."."""
    parts = []
    for e in errors[:3]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"
