"""The routes, on one module-level router (:data:`router`), as vLLM's and LitServe's servers lay theirs
out: each handler reads the running server from ``request.app.state`` (the model a request is for
is looked up by its ``model`` field, or is the one loaded model that answers the route), turns the
typed body (:mod:`~scratchformer.serve.protocol`) into an :class:`~scratchformer.serve.serving.Ask`
and answers what :mod:`~scratchformer.serve.serving` returns. Each route documents the error
statuses it answers, from the one table (:data:`~scratchformer.serve.errors.ERRORS`).

    POST /v1/translate /v1/classify /v1/embed    {"inputs", "parameters", "model", "stream"}
    POST /v1/caption                             multipart: images, parameters (JSON), model, stream
    POST /v1/embeddings                          OpenAI's {"input", "model", "encoding_format"}
    POST /v1/attention /v1/caption/attention     what the web page draws
    GET  /v1/models /health /ready /metrics, and the web page at /
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from scratchformer.serve import serving
from scratchformer.serve.errors import MODEL_ROUTE_ERRORS, RequestError, responses
from scratchformer.serve.guards import CheckedRoute
from scratchformer.serve.images import check_images
from scratchformer.serve.protocol import AttentionRequest, EmbeddingsRequest, TextRequest, form_parameters
from scratchformer.serve.serving import Ask, server_state

__all__ = ["STATIC", "router"]

STATIC = Path(__file__).parent / "static"


class ModelRoute(CheckedRoute):
    """A route of the API (:class:`~scratchformer.serve.guards.CheckedRoute`'s checks) whose
    requests refused before their handler runs (a body that fails validation) are still counted
    under the model they are for in the metrics."""

    def get_route_handler(self) -> Any:
        handle = super().get_route_handler()
        endpoint = self.path.removeprefix("/v1/").split("/")[0]  # (/v1/caption/attention: "caption")

        async def labelled(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as e:
                body = e.body if isinstance(e.body, Mapping) else {}
                name = server_state(request).label(body.get("model"), endpoint)
                if name is not None:
                    request.state.model = name
                raise

        return labelled


router = APIRouter(route_class=ModelRoute)
MODEL_ERRORS = responses(*MODEL_ROUTE_ERRORS)


@router.get("/health", tags=["status"])
async def health() -> dict[str, str]:
    """Alive (the process answers), whatever the models' state."""
    return {"status": "alive"}


@router.get("/ready", tags=["status"])
async def ready(request: Request) -> JSONResponse:
    """200 once every model is loaded and warmed up; 503 while loading, draining, or failed."""
    state = server_state(request)
    body = {"status": state.status, "models": sorted(state.models)}
    if state.error:
        body["error"] = state.error
    return JSONResponse(body, status_code=200 if state.status == "ready" else 503)


@router.get("/metrics", tags=["status"])
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    measured = server_state(request).metrics
    return Response(measured.render(), media_type=measured.content_type)


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html")


@router.get("/v1/models", tags=["models"], responses=responses(401))
async def models(request: Request) -> dict[str, Any]:
    """The loaded models: each one's name (``id``), ``kind`` and the routes it answers."""
    return {"object": "list", "data": [m.describe() for m in server_state(request).models.values()]}


@router.post("/v1/translate", tags=["models"], responses=MODEL_ERRORS)
async def translate(body: TextRequest, request: Request) -> Any:
    """One translation per input; ``stream``: server-sent events (see the guide)."""
    return await _texts(request, "translate", body)


@router.post("/v1/classify", tags=["models"], responses=MODEL_ERRORS)
async def classify(body: TextRequest, request: Request) -> Any:
    """Each input's label and every class's probability; ``stream``: server-sent events."""
    return await _texts(request, "classify", body)


@router.post("/v1/embed", tags=["models"], responses=MODEL_ERRORS)
async def embed(body: TextRequest, request: Request) -> Any:
    """Each input's embedding; ``stream``: server-sent events."""
    return await _texts(request, "embed", body)


async def _texts(request: Request, endpoint: str, body: TextRequest) -> Any:
    """One answer per text of ``inputs`` (one text: a list of one answer), or their stream."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    ask = Ask(endpoint, texts, body.parameters, body.model)
    if body.stream:
        return await serving.stream(request, ask)
    return await serving.rendered((await serving.answer(request, ask)).answers)


@router.post("/v1/embeddings", tags=["models"], responses=MODEL_ERRORS)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Any:
    """OpenAI's shape: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}]}."""
    if body.encoding_format not in ("float", "base64"):
        raise RequestError(422, f"encoding_format: 'float' or 'base64', got {body.encoding_format!r}")
    width = server_state(request).model_for(body.model, "embeddings").task.dim
    if body.dimensions not in (None, width):
        raise RequestError(422, f"dimensions: this model's embeddings have {width}, got {body.dimensions}")
    texts = [body.input] if isinstance(body.input, str) else body.input
    done = await serving.answer(request, Ask("embeddings", texts, model=body.model))
    return await serving.rendered(
        _openai_embeddings(done.answers, done.model.name, sum(done.lengths), body.encoding_format)
    )


@router.post("/v1/attention", tags=["page"], responses=MODEL_ERRORS)
async def attention(body: AttentionRequest, request: Request) -> Any:
    """A translation's attention weights: encoder, decoder and cross-attention, per layer and head."""
    ask = Ask("attention", [body.inputs], body.parameters, body.model, "attention", body.layer)
    return await serving.rendered((await serving.answer(request, ask)).answers[0])


@router.post("/v1/caption", tags=["models"], responses=MODEL_ERRORS)
async def caption(
    request: Request,
    images: Annotated[list[UploadFile], File(description="image files (any format Pillow reads)")],
    parameters: Annotated[str, Form(description="decoding options, a JSON GenerationParameters")] = "{}",
    model: Annotated[str | None, Form()] = None,
    stream: Annotated[bool, Form()] = False,
) -> Any:
    """One caption per image; ``stream``: server-sent events (see the guide)."""
    ask = await _uploads(request, images, parameters, model, "images")
    if stream:
        return await serving.stream(request, ask)
    done = await serving.answer(request, ask)
    return await serving.rendered([{"image": f.filename, **a} for f, a in zip(images, done.answers)])


@router.post("/v1/caption/attention", tags=["page"], responses=MODEL_ERRORS)
async def caption_attention(
    request: Request,
    image: Annotated[UploadFile, File()],
    parameters: Annotated[str, Form()] = "{}",
    model: Annotated[str | None, Form()] = None,
) -> Any:
    """Each word's attention over the photo (a grid of regions), with the photo as the model saw it."""
    ask = await _uploads(request, [image], parameters, model, "image", "attention")
    return await serving.rendered((await serving.answer(request, ask)).answers[0])


async def _uploads(
    request: Request,
    files: list[UploadFile],
    parameters: str,
    model: str | None,
    field: str,
    method: str = "run",
) -> Ask:
    """An upload route's ask: its images checked (422, 413) and its ``parameters`` field read."""
    items = await check_images(files, server_state(request).limits, field)
    label = server_state(request).label(model, "caption")
    if label is not None:
        request.state.model = label  # (a refused parameter is counted under its model)
    return Ask("caption", items, await run_in_threadpool(form_parameters, parameters), model, method)


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
