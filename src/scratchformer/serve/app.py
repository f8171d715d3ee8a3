"""The HTTP API (FastAPI): requests in TGI/TEI's shape, ``{"inputs": "text" | ["text", ...],
"parameters": {...}}``, answered by a list with one object per input holding the command line's JSON
Lines fields. The event loop only routes, queues and waits: bodies are parsed, inputs tokenized and
images identified in worker threads, answers rendered there too, and models run in their
micro-batchers' threads (:mod:`~scratchformer.serve.batcher`).

    POST /v1/translate /v1/classify /v1/embed    {"inputs", "parameters", "model", "stream"}
    POST /v1/caption                             multipart: images, parameters (JSON), model, stream
    POST /v1/embeddings                          OpenAI's {"input", "model", "encoding_format"}
    POST /v1/attention /v1/caption/attention     what the web page draws
    GET  /v1/models /health /ready /metrics /docs /openapi.json, and the web page at /
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from scratchformer.serve.batcher import Job
from scratchformer.serve.config import ServeConfig
from scratchformer.serve.guards import BodyLimit, CheckedRoute, RequireKey, add_error_handlers, sse
from scratchformer.serve.images import check_images
from scratchformer.serve.metrics import MeasureRequests
from scratchformer.serve.models import Options, ServedModel
from scratchformer.serve.parameters import RequestError, check_text
from scratchformer.serve.state import ServerState

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"


class TextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: str | list[str] = Field(description="one text, or a list of texts")
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="decoding options (GenerationConfig)"
    )
    model: str | None = Field(default=None, description="a loaded model's name (needed if several fit)")
    stream: bool = Field(
        default=False, description="server-sent events: the tokens (greedy, sampling), each input's answer"
    )


class AttentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    layer: int | None = Field(default=None, description="one layer's weights (None: every layer)")


class ErrorBody(BaseModel):
    """Every error's body: one line naming the problem, and its kind."""

    error: str
    error_type: str


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "the request names no model where several fit, or one of another kind",
        401: "no or a wrong API key (with --api-key)",
        404: "no model of that name, or none that answers this route",
        413: "the body or an image over its limit (max_body_bytes, max_image_pixels)",
        415: "a body that is not the route's content type (JSON; multipart/form-data for uploads)",
        422: "an input or parameter that is wrong, or over its limit (max_items, max_input_tokens, ...)",
        429: "the queue or the requests in flight are full (Retry-After says when to come back)",
        503: "models not loaded yet (GET /ready)",
        504: "no answer within timeout_s; the request's queued inputs were dropped",
    }.items()
}


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (its other fields, as ``user``, are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")
    input: str | list[str]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = Field(default=None, description="must be the model's width: no truncation")


def create_app(config: ServeConfig, models: list[ServedModel] | None = None) -> FastAPI:
    """The server's app. ``models``: already loaded models to serve (else ``config.models`` are loaded
    in a thread when the app starts)."""
    state = ServerState(config, models)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=state.load, name="load-models", daemon=True).start()
        yield
        await asyncio.to_thread(state.stop)

    app = FastAPI(title="scratchformer", version=_version(), lifespan=lifespan)
    app.router.route_class = CheckedRoute
    app.state.serve = state
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
    _add_status_routes(app, state)
    _add_model_routes(app, state)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scratchformer")
    except PackageNotFoundError:  # pragma: no cover - a source tree not installed
        return "0"


def _add_status_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", tags=["status"])
    async def health() -> dict[str, str]:
        """Alive (the process answers), whatever the models' state."""
        return {"status": "alive"}

    @app.get("/ready", tags=["status"])
    async def ready() -> JSONResponse:
        """200 once every model is loaded and warmed up; 503 while loading, draining, or failed."""
        body = {"status": state.status, "models": sorted(state.models)}
        if state.error:
            body["error"] = state.error
        return JSONResponse(body, status_code=200 if state.status == "ready" else 503)

    @app.get("/metrics", tags=["status"])
    async def metrics() -> Response:
        """Prometheus text format."""
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")


def _add_model_routes(app: FastAPI, state: ServerState) -> None:
    """The /v1/ routes (with an API key, :class:`~scratchformer.serve.guards.RequireKey` guards them)."""

    @app.get("/v1/models", tags=["models"])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [m.describe() for m in state.models.values()]}

    for endpoint in ("translate", "classify", "embed"):
        route = _text_route(state, endpoint)
        app.post(f"/v1/{endpoint}", tags=["models"], name=endpoint, responses=ERRORS)(route)

    @app.post("/v1/embeddings", responses=ERRORS, tags=["models"])
    async def embeddings(body: EmbeddingsRequest, request: Request) -> Any:
        """OpenAI's shape: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}]}."""
        if body.encoding_format not in ("float", "base64"):
            raise RequestError(422, f"encoding_format: 'float' or 'base64', got {body.encoding_format!r}")
        width = state.model_for(body.model, "embeddings").task.dim
        if body.dimensions not in (None, width):
            raise RequestError(
                422, f"dimensions: this model's embeddings have {width}, got {body.dimensions}"
            )
        texts = [body.input] if isinstance(body.input, str) else body.input
        answers, model, lengths = await _answer(state, request, "embeddings", texts, {}, body.model)
        return await _rendered(_openai_embeddings(answers, model.name, sum(lengths), body.encoding_format))

    @app.post("/v1/attention", responses=ERRORS, tags=["page"])
    async def attention(body: AttentionRequest, request: Request) -> Any:
        """A translation's attention weights: encoder, decoder and cross-attention, per layer and head."""
        answers, _, _ = await _answer(
            state,
            request,
            "attention",
            [body.inputs],
            body.parameters,
            body.model,
            "attention",
            {"layer": body.layer},
        )
        return await _rendered(answers[0])

    @app.post("/v1/caption", responses=ERRORS, tags=["models"])
    async def caption(
        request: Request,
        images: Annotated[list[UploadFile], File(description="image files (any format Pillow reads)")],
        parameters: Annotated[str, Form(description="decoding options, a JSON object")] = "{}",
        model: Annotated[str | None, Form()] = None,
        stream: Annotated[bool, Form()] = False,
    ) -> Any:
        items = await check_images(images, state.limits)
        params = await run_in_threadpool(_json_object, parameters)
        if stream:
            return await _stream(state, request, "caption", items, params, model)
        answers, _, _ = await _answer(state, request, "caption", items, params, model)
        return await _rendered([{"image": f.filename, **a} for f, a in zip(images, answers)])

    @app.post("/v1/caption/attention", responses=ERRORS, tags=["page"])
    async def caption_attention(
        request: Request,
        image: Annotated[UploadFile, File()],
        parameters: Annotated[str, Form()] = "{}",
        model: Annotated[str | None, Form()] = None,
    ) -> Any:
        """Each word's attention over the photo (a grid of regions), with the photo as the model saw it."""
        items = await check_images([image], state.limits, "image")
        params = await run_in_threadpool(_json_object, parameters)
        answers, _, _ = await _answer(state, request, "caption", items, params, model, "attention")
        return await _rendered(answers[0])


def _text_route(state: ServerState, endpoint: str) -> Any:
    async def route(body: TextRequest, request: Request) -> Any:
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        if body.stream:
            return await _stream(state, request, endpoint, texts, body.parameters, body.model)
        answers, _, _ = await _answer(state, request, endpoint, texts, body.parameters, body.model)
        return await _rendered(answers)

    route.__doc__ = f"One answer per input ({endpoint}); ``stream``: server-sent events (see the guide)."
    return route


def _json_object(text: str) -> dict[str, Any]:
    """A form's ``parameters`` field: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise RequestError(422, f"parameters: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise RequestError(422, "parameters: expected a JSON object")
    return value


async def _prepare(
    state: ServerState,
    request: Request,
    endpoint: str,
    items: list[Any],
    parameters: dict,
    name: str | None,
    method: str = "run",
    extra: dict[str, Any] | None = None,
) -> Job:
    """Check a request (in a worker thread: :func:`_check`) and make its job; nothing queued yet.
    ``extra``: values of the route's own beside the checked parameters (the attention's layer)."""
    deadline = time.monotonic() + state.limits.timeout_s
    options, lengths = await run_in_threadpool(
        _check, state, request, endpoint, items, parameters, name, extra
    )
    future = asyncio.get_running_loop().create_future()
    return Job(list(items), lengths, options, deadline, future, method)


def _check(
    state: ServerState,
    request: Request,
    endpoint: str,
    items: list[Any],
    parameters: dict,
    name: str | None,
    extra: dict[str, Any] | None,
) -> tuple[Options, list[int]]:
    """(a worker thread) A request's model, inputs and parameters checked, and each input's length
    in tokens: the work that a big request would otherwise hold the event loop with."""
    model = state.model_for(name, endpoint)
    request.state.model = model.name
    limits = state.limits
    _check_inputs(items, limits.max_items)
    options = model.options(parameters, limits.max_new_tokens)
    lengths = _lengths(model, items)
    long = [(i, n) for i, n in enumerate(lengths) if n > limits.max_input_tokens]
    if long:
        i, n = long[0]
        raise RequestError(
            422, f"inputs[{i}] has {n} tokens, over the limit max_input_tokens={limits.max_input_tokens}"
        )
    options = model.bounded(options, lengths, limits.max_new_tokens)
    if extra:
        if "layer" in extra:
            model.check_layer(extra["layer"])
        options = dataclasses.replace(options, values={**options.values, **extra})
    return options, lengths


def _lengths(model: ServedModel, items: list[Any], chunk: int = 8) -> list[int]:
    """Each input's tokens, counted ``chunk`` inputs at a time: the tokenizers library holds the GIL
    while it hands a batch's encodings back (0.4 s for 64 texts of 150 kB, the event loop stalled)."""
    return [n for start in range(0, len(items), chunk) for n in model.lengths(items[start : start + chunk])]


def _check_inputs(items: list[Any], max_items: int) -> None:
    """422 for no inputs, too many, or a text that is empty or not valid Unicode."""
    if not items:
        raise RequestError(422, "inputs: empty; give one input or a list of them")
    if len(items) > max_items:
        raise RequestError(422, f"inputs: {len(items)} inputs, over the limit max_items={max_items}")
    for i, text in enumerate(items):
        if isinstance(text, str):
            if not text.strip():
                raise RequestError(422, f"inputs[{i}] is empty")
            check_text(text, f"inputs[{i}]")


async def _answer(
    state: ServerState,
    request: Request,
    endpoint: str,
    items: list[Any],
    parameters: dict,
    name: str | None,
    method: str = "run",
    extra: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], ServedModel, list[int]]:
    """Queue a request's inputs and wait for all their answers (or its deadline, or its client
    leaving); each answer says ``"truncated": true`` if the model cut its input."""
    state.enter()
    try:
        job = await _prepare(state, request, endpoint, items, parameters, name, method, extra)
        model = state.models[request.state.model]
        state.batchers[model.name].submit(job)
        answers = await _wait(job, request)
        return [model.with_truncated(a, n) for a, n in zip(answers, job.lengths)], model, job.lengths
    finally:
        state.leave()


async def _rendered(content: Any) -> JSONResponse:
    """A JSON answer, encoded in a worker thread (attention weights and embeddings are big)."""
    return await run_in_threadpool(JSONResponse, content)


async def _wait(job: Job, request: Request) -> list[dict[str, Any]]:
    """The job's answers; 504 at its deadline, 499 (nginx's "client closed request", for the metrics:
    nobody reads it) if the client disconnects. Either way its queued inputs are dropped, never
    computed. Nothing polls: the wait ends on the answer, the deadline, or the disconnect message."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        left = max(0.0, job.deadline - time.monotonic())
        done, _ = await asyncio.wait({job.future, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself was cancelled (shutdown, an in-process client)
        job.cancelled = True
        raise
    finally:
        gone.cancel()
    if job.future in done:
        return _result(job)
    job.cancelled = True
    if gone in done:
        raise RequestError(499, "the client closed the connection")
    raise RequestError(504, "no answer within the server's timeout_s; its queued inputs were dropped")


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _result(job: Job) -> list[dict[str, Any]]:
    error = job.future.exception()
    if error is None:
        return job.future.result()
    if isinstance(error, TimeoutError):
        raise RequestError(504, str(error))
    if isinstance(error, ValueError):  # a bad input found by the model's own checks
        raise RequestError(422, str(error).splitlines()[0])
    raise RequestError(
        500, f"inference failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    )


async def _stream(
    state: ServerState, request: Request, endpoint: str, items: list[Any], parameters: dict, name: str | None
) -> StreamingResponse:
    """Server-sent events: for greedy search and sampling ``event: token`` with ``{"index": i,
    "sequence": j, "token": {"id", "text", "special"}}`` as each token of output j of input i is
    chosen (``text``: what it adds to the output; ``special``: the end of the output, EOS); for every
    input ``data: {"index": i, ...answer}`` when it is done; then ``event: done`` (or ``event:
    error`` with the error's object: the deadline, a failure)."""
    state.enter()
    try:
        job = await _prepare(state, request, endpoint, items, parameters, name)
        model = state.models[request.state.model]
        events: asyncio.Queue = asyncio.Queue()
        job.on_answer = lambda i, answer: events.put_nowait(
            (None, {"index": i, **model.with_truncated(answer, job.lengths[i])})
        )
        job.on_token = lambda i, token: events.put_nowait(("token", {"index": i, **token}))
        state.batchers[model.name].submit(job)
    except BaseException:
        state.leave()
        raise

    async def stream():
        answered = 0
        try:
            while answered < len(items):
                if events.empty():
                    get = asyncio.ensure_future(events.get())
                    left = max(0.0, job.deadline - time.monotonic())
                    await asyncio.wait({get, job.future}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():
                        get.cancel()
                        if job.future.done() and job.future.exception() is None:
                            continue  # (the answers are queued)
                        break  # a failure, or the deadline
                    event, data = get.result()
                else:
                    event, data = events.get_nowait()
                answered += event is None
                yield sse(data, event)
            if answered == len(items):
                yield sse({}, "done")
                return
            job.cancelled = True
            error = (
                job.future.exception() if job.future.done() else TimeoutError("no answer within timeout_s")
            )
            yield sse({"error": str(error), "error_type": type(error).__name__}, "error")
        except (asyncio.CancelledError, GeneratorExit):  # the client went away: drop what is queued
            job.cancelled = True
            raise
        finally:
            state.leave()

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _openai_embeddings(answers: list[dict], model: str, tokens: int, encoding: str) -> dict[str, Any]:
    import base64
    import struct

    def vector(v: list[float]) -> Any:
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if encoding == "base64" else v

    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": vector(a["embedding"]),
            **({"truncated": True} if a.get("truncated") else {}),
        }
        for i, a in enumerate(answers)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
