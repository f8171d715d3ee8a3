"""The server's Prometheus metrics (GET /metrics, the text format): requests by model, endpoint and
status code; latency from arrival to answer; each input's time in the queue; each batch's inference
time and size; the queue depth; tokens in and out; inputs dropped unanswered. One registry per app,
so that several servers (tests) do not share counters."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from scratchformer.serve.guards import route_path

__all__ = ["MeasureRequests", "Metrics", "route_template"]

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "scratchformer_"
        self.requests = Counter(
            p + "requests", "HTTP requests answered", ["model", "endpoint", "code"], registry=r
        )
        self.latency = Histogram(
            p + "request_seconds", "arrival to answer", ["model", "endpoint"], buckets=SECONDS, registry=r
        )
        self.queue_time = Histogram(
            p + "queue_seconds", "an input's wait for its batch", ["model"], buckets=SECONDS, registry=r
        )
        self.inference = Histogram(
            p + "inference_seconds", "one batch's model call", ["model"], buckets=SECONDS, registry=r
        )
        self.batch_size = Histogram(
            p + "batch_size", "inputs per batch", ["model"], buckets=SIZES, registry=r
        )
        self.queue_depth = Gauge(p + "queue_depth", "inputs waiting", ["model"], registry=r)
        self.tokens = Counter(
            p + "tokens", "tokens read (input) and written (output)", ["model", "direction"], registry=r
        )
        self.dropped = Counter(
            p + "dropped_inputs",
            "queued inputs never computed: deadline passed, client gone, or its request failed",
            ["model", "reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MeasureRequests:
    """ASGI middleware: each /v1/ request counted by model, route and status code, and timed from
    arrival to its last byte (a stream's end). The route names its model in ``request.state.model``.
    Requests are labelled by their route's template, never by the path a client sent: every path no
    route has shares the label "unmatched", so that no client can grow the metrics without bound."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not route_path(scope).startswith("/v1/"):
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), ["500"]

        async def watched(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            model = (scope.get("state") or {}).get("model") or "-"  # (request.state's dict)
            endpoint = route_template(scope)
            self.metrics.requests.labels(model, endpoint, status[0]).inc()
            self.metrics.latency.labels(model, endpoint).observe(time.monotonic() - start)


def route_template(scope: dict) -> str:
    """The template of the app's route that matches the request's path ("/v1/translate"; a wrong
    method still names its route), or "unmatched"."""
    return _template(scope["app"].router.routes, scope)


def _template(routes: list, scope: dict) -> str:
    from starlette.routing import Match

    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            included = getattr(
                route, "original_router", None
            )  # (recent FastAPI keeps an included router whole)
            return _template(included.routes, scope) if included else getattr(route, "path", "unmatched")
    return "unmatched"
