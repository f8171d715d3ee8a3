"""Every refusal of the server in one place: the exceptions a route raises (:class:`RequestError`,
:class:`Overloaded`), the one table of error statuses (:data:`ERRORS`: each status's ``error_type``
and when it is answered), which makes both the error bodies and the responses the OpenAPI document
lists for each route, and the handlers that answer every error (a route's, a middleware's, a body
that fails validation, a route or method that does not exist, a bug) in one shape::

    {"error": "one line naming the problem", "error_type": "validation"}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

__all__ = [
    "ERRORS",
    "MODEL_ROUTE_ERRORS",
    "ErrorBody",
    "ErrorStatus",
    "Overloaded",
    "RequestError",
    "add_error_handlers",
    "error_body",
    "error_response",
    "one_line",
    "responses",
]


@dataclass(frozen=True)
class ErrorStatus:
    """An error status: the ``error_type`` its bodies say, and when the server answers it."""

    error_type: str
    when: str


ERRORS: dict[int, ErrorStatus] = {
    400: ErrorStatus("bad_request", "the request names no model where several fit, or one of another kind"),
    401: ErrorStatus("unauthorized", "no or a wrong API key (with --api-key)"),
    404: ErrorStatus("not_found", "no model of that name, or none that answers this route"),
    405: ErrorStatus("method_not_allowed", "a method the route does not take (Allow says which)"),
    408: ErrorStatus(
        "timeout", "the request's head or body stopped arriving (head_timeout_s, body_timeout_s)"
    ),
    413: ErrorStatus("too_large", "the body or an image over its limit (max_body_bytes, max_image_pixels)"),
    415: ErrorStatus(
        "unsupported_media_type",
        "a body that is not the route's content type (JSON; multipart/form-data for uploads)",
    ),
    422: ErrorStatus(
        "validation",
        "an input or parameter that is wrong, or over its limit (max_items, max_input_tokens, ...)",
    ),
    429: ErrorStatus(
        "overloaded", "the queue or the requests in flight are full (Retry-After says when to come back)"
    ),
    431: ErrorStatus("too_large", "the request's line and headers over max_head_bytes"),
    499: ErrorStatus("client_closed", "the client closed the connection (for the metrics: nobody reads it)"),
    500: ErrorStatus("internal", "a bug"),
    503: ErrorStatus("unavailable", "models not loaded yet (GET /ready)"),
    504: ErrorStatus("timeout", "no answer within timeout_s; the request's queued inputs were dropped"),
}
"""Every status the server answers with an error body. A route documents those it can answer
(:func:`responses`); 405, 408, 431, 499 and 500 come from below the routes, or from none."""

MODEL_ROUTE_ERRORS = (400, 401, 404, 413, 415, 422, 429, 503, 504)  # what a /v1/ route with a body answers


class ErrorBody(BaseModel):
    """Every error's body: one line naming the problem, and its kind."""

    error: str
    error_type: str


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses=``: each status of :data:`ERRORS` with its body and description."""
    return {status: {"model": ErrorBody, "description": ERRORS[status].when} for status in statuses}


class RequestError(ValueError):
    """A request the server refuses: its HTTP ``status`` (400 to 504), a one-line message and the
    answer's extra ``headers``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


class Overloaded(RequestError):
    """The queue or the requests in flight are full: 429, and the client is asked to come back in
    ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(429, message, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


def error_body(status: int, message: str) -> dict[str, str]:
    return {"error": message, "error_type": ERRORS[status].error_type if status in ERRORS else "error"}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def one_line(errors: Sequence[dict[str, Any]], prefix: tuple[str, ...] = ()) -> str:
    """Pydantic's validation errors as one line naming the fields: "inputs: Field required; ...".
    An error whose type is ``must_be`` reads "parameters.top_p must be ...". ``prefix``:
    where the validated value sits in the request (a form's ``parameters``)."""
    parts = []
    for e in errors[:3]:
        if e.get("type") == "json_invalid":  # FastAPI's loc: ("body", the character)
            problem = (e.get("ctx") or {}).get("error", "invalid")
            parts.append(f"body: not valid JSON ({problem} at character {e['loc'][-1]})")
            continue
        where = ".".join(str(p) for p in (*prefix, *e.get("loc", ())) if p != "body") or "body"
        joint = " " if e.get("type") == "must_be" else ": "
        parts.append(f"{where}{joint}{e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def add_error_handlers(app: FastAPI) -> None:
    """Every error in one shape, ``{"error": "...", "error_type": "..."}``: the routes' own, a
    route or method that does not exist, a body that fails validation, and any failure."""

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return error_response(e.status, str(e), e.headers)

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
