"""The server's app (FastAPI), assembled as vLLM's ``api_server`` assembles its own: the running
server's state in ``app.state.serve`` (:class:`~scratchformer.serve.state.ServerState`, its models
loaded in a thread when the app starts), the guards and metrics as middleware, one handler for each
kind of error (:mod:`~scratchformer.serve.errors`), the routes of one module-level router
(:mod:`~scratchformer.serve.routes`), and the web page's files under ``static/``.

Requests are in TGI/TEI's shape, ``{"inputs": "text" | ["text", ...], "parameters": {...}}``, and
answered by a list with one object per input holding the command line's JSON Lines fields. The
event loop only routes, queues and waits: bodies are parsed, inputs tokenized and images identified
in worker threads, answers rendered there too, and models run in their micro-batchers' threads
(:mod:`~scratchformer.serve.batcher`)."""

from __future__ import annotations

import asyncio
import functools
import threading
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from scratchformer.serve.config import ServeConfig
from scratchformer.serve.errors import add_error_handlers
from scratchformer.serve.guards import BodyLimit, RequireKey
from scratchformer.serve.metrics import MeasureRequests
from scratchformer.serve.parameters import GenerationParameters
from scratchformer.serve.routes import STATIC, router
from scratchformer.serve.served import ServedModel
from scratchformer.serve.state import ServerState

__all__ = ["create_app"]


@asynccontextmanager
async def lifespan(app: FastAPI):
    """The models load in a thread as the app starts (/health answers meanwhile); the batchers
    finish what is queued as it stops."""
    state: ServerState = app.state.serve
    threading.Thread(target=state.load, name="load-models", daemon=True).start()
    yield
    await asyncio.to_thread(state.stop)


def create_app(config: ServeConfig, models: list[ServedModel] | None = None) -> FastAPI:
    """The server's app. ``models``: already loaded models to serve (else ``config.models`` are loaded
    in a thread when the app starts)."""
    app = FastAPI(title="scratchformer", version=_version(), lifespan=lifespan)
    app.state.serve = state = ServerState(config, models)
    app.add_middleware(BodyLimit, limit=config.limits.max_body_bytes)  # (the innermost)
    app.add_middleware(RequireKey, key=config.api_key)  # the key before the body is read
    app.add_middleware(MeasureRequests, metrics=state.metrics)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    add_error_handlers(app)
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's OpenAPI document, with the bounds of the decoding parameters as pydantic writes
    them: FastAPI's model of the document holds every bound as a float, and the seed's, 2**63 - 1,
    is no float (it would read 2**63)."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)
        exact = GenerationParameters.model_json_schema()["properties"]
        for name, prop in document["components"]["schemas"]["GenerationParameters"]["properties"].items():
            for option, given in zip(prop.get("anyOf", [prop]), exact[name].get("anyOf", [exact[name]])):
                option.update(
                    {k: v for k, v in given.items() if k in ("minimum", "exclusiveMinimum", "maximum")}
                )
    return app.openapi_schema


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scratchformer")
    except PackageNotFoundError:  # pragma: no cover - a source tree not installed
        return "0"
