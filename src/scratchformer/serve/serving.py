"""What a route does with a request, once its body is read: an :class:`Ask` (its inputs, parameters
and the model it names) is checked in a worker thread (the model, each input and its length in
tokens, the parameters against the server's limits), queued to its model's micro-batcher
(:mod:`~scratchformer.serve.batcher`) as a job, and waited for: :func:`answer` returns every
input's answer, :func:`stream` sends them as server-sent events. The event loop only routes, queues
and waits; every request is admitted (at most ``max_concurrency`` in flight) for as long as it runs,
its stream included."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from scratchformer.serve.batcher import Job
from scratchformer.serve.errors import RequestError
from scratchformer.serve.parameters import GenerationParameters, check_text
from scratchformer.serve.served import Options, ServedModel
from scratchformer.serve.state import ServerState

__all__ = ["Answered", "Ask", "answer", "rendered", "server_state", "sse", "stream"]


@dataclass(frozen=True)
class Ask:
    """What a request asks of a model: ``endpoint``, the route's kind (the models that answer it:
    :attr:`ServedModel.endpoints`); ``items``, its inputs (texts, or uploaded images); ``model``,
    the name it gives (None: the one model that answers the endpoint); ``method``, the model's
    method that answers ("run"; "attention" for the page's figures); ``layer``, the one layer of
    attention weights asked for (None: every layer)."""

    endpoint: str
    items: list[Any]
    parameters: GenerationParameters = dataclasses.field(default_factory=GenerationParameters)
    model: str | None = None
    method: str = "run"
    layer: int | None = None


@dataclass(frozen=True)
class Answered:
    """A request's answers, one per input (``"truncated": true`` where the model cut the input),
    the model that gave them, and each input's length in tokens."""

    answers: list[dict[str, Any]]
    model: ServedModel
    lengths: list[int]


def server_state(request: Request) -> ServerState:
    """The running server's state, which :func:`~scratchformer.serve.app.create_app` keeps in
    ``app.state.serve``."""
    return request.app.state.serve


async def answer(request: Request, ask: Ask) -> Answered:
    """Queue a request's inputs and wait for all their answers (or its deadline, or its client
    leaving)."""
    state = server_state(request)
    async with state.admitted():
        job = await _prepare(request, ask)
        model = state.models[request.state.model]
        state.batchers[model.name].submit(job)
        answers = await _wait(job, request)
        answers = [model.with_truncated(a, n) for a, n in zip(answers, job.lengths)]
        return Answered(answers, model, job.lengths)


async def stream(request: Request, ask: Ask) -> StreamingResponse:
    """Server-sent events: for greedy search and sampling ``event: token`` with ``{"index": i,
    "sequence": j, "token": {"id", "text", "special"}}`` as each token of output j of input i is
    chosen (``text``: what it adds to the output; ``special``: the end of the output, EOS); for every
    input ``data: {"index": i, ...answer}`` when it is done; then ``event: done`` (or ``event:
    error`` with the error's object: the deadline, a failure). The request stays admitted until its
    stream ends."""
    state = server_state(request)
    async with AsyncExitStack() as admission:
        await admission.enter_async_context(state.admitted())
        job = await _prepare(request, ask)
        model = state.models[request.state.model]
        events: asyncio.Queue = asyncio.Queue()
        job.on_answer = lambda i, answer: events.put_nowait(
            (None, {"index": i, **model.with_truncated(answer, job.lengths[i])})
        )
        job.on_token = lambda i, token: events.put_nowait(("token", {"index": i, **token}))
        state.batchers[model.name].submit(job)
        held = admission.pop_all()  # the stream holds the admission from here
    body = _events(job, events, held)
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _events(job: Job, events: asyncio.Queue, admission: AsyncExitStack) -> Any:
    """A stream's events, as its job's answers (and tokens) come; the admission ends with it."""
    async with admission:
        answered = 0
        try:
            while answered < len(job.items):
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
            if answered == len(job.items):
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


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def rendered(content: Any) -> JSONResponse:
    """A JSON answer, encoded in a worker thread (attention weights and embeddings are big)."""
    return await run_in_threadpool(JSONResponse, content)


async def _prepare(request: Request, ask: Ask) -> Job:
    """Check a request (in a worker thread: :func:`_check`) and make its job; nothing queued yet."""
    state = server_state(request)
    deadline = time.monotonic() + state.limits.timeout_s
    options, lengths = await run_in_threadpool(_check, state, request, ask)
    future = asyncio.get_running_loop().create_future()
    return Job(list(ask.items), lengths, options, deadline, future, ask.method)


def _check(state: ServerState, request: Request, ask: Ask) -> tuple[Options, list[int]]:
    """(a worker thread) A request's model, inputs and parameters checked, and each input's length
    in tokens: the work that a big request would otherwise hold the event loop with."""
    model = state.model_for(ask.model, ask.endpoint)
    request.state.model = model.name
    limits = state.limits
    _check_inputs(ask.items, limits.max_items)
    options = model.options(ask.parameters, limits.max_new_tokens)
    lengths = _lengths(model, ask.items)
    long = [(i, n) for i, n in enumerate(lengths) if n > limits.max_input_tokens]
    if long:
        i, n = long[0]
        raise RequestError(
            422, f"inputs[{i}] has {n} tokens, over the limit max_input_tokens={limits.max_input_tokens}"
        )
    options = model.bounded(options, lengths, limits.max_new_tokens)
    if ask.endpoint == "attention":  # (a translation's weights, by layer)
        model.check_layer(ask.layer)
        options = dataclasses.replace(options, values={**options.values, "layer": ask.layer})
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
