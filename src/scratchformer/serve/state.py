"""What a running server knows: its models (loaded in a thread, so that /health answers at once and
/ready turns 200 only when every model is loaded and has run a warm-up batch), one micro-batcher per
model, the requests in flight, and whether it is draining."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from scratchformer.serve.batcher import MicroBatcher
from scratchformer.serve.config import ServeConfig
from scratchformer.serve.errors import Overloaded, RequestError
from scratchformer.serve.metrics import Metrics
from scratchformer.serve.served import ServedModel, load_served

__all__ = ["ServerState"]


class ServerState:
    """``status``: "loading", "ready", "draining" or "failed" (``error`` says why)."""

    def __init__(self, config: ServeConfig, models: list[ServedModel] | None = None):
        self.config, self.limits, self.metrics = config, config.limits, Metrics()
        self.models: dict[str, ServedModel] = {}
        self.batchers: dict[str, MicroBatcher] = {}
        self.status, self.error = "loading", ""
        self.exception: Exception | None = None  # what failed the loading
        self.in_flight = 0
        self._given = models  # already loaded (tests, the Python API): served as they are
        self.done_loading = threading.Event()

    def load(self) -> None:
        """(a thread) Load and warm up every model, then start its batcher; any failure: "failed"."""
        name = ""
        try:
            if self.config.threads:
                import torch

                torch.set_num_threads(self.config.threads)  # once, before any model runs
            for model in self._given or []:
                name = model.name
                self._add(model)
            for spec in [] if self._given else self.config.models:
                name = spec.name
                self._add(load_served(spec, self.config.device))
            self.status = "ready"
        except Exception as e:  # noqa: BLE001 - /ready and the command line say what failed
            problem = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
            problem = problem.removeprefix(f"model {name!r}: ")  # named once
            self.status, self.error = "failed", f"model {name!r}: {type(e).__name__}: {problem}"
            self.exception = e  # (its traceback: the command line's --debug)
        finally:
            self.done_loading.set()

    def _add(self, model: ServedModel) -> None:
        model.warm_up()
        continuous = self.config.batching == "continuous"
        batcher = MicroBatcher(model, self.limits, self.metrics, continuous)
        batcher.start()
        self.models[model.name], self.batchers[model.name] = model, batcher

    def stop(self) -> None:
        for batcher in self.batchers.values():
            batcher.stop()

    def model_for(self, name: str | None, endpoint: str) -> ServedModel:
        """The model a request names, or the one model that answers ``endpoint``; errors: 503 while
        loading, 404 for an unknown name, 400 when the name is needed or names the wrong kind."""
        if self.status in ("loading", "failed"):
            raise RequestError(503, f"models are not loaded yet ({self.status})")
        if name is not None:
            model = self.models.get(name)
            if model is None:
                raise RequestError(404, f"model: no model named {name!r}; loaded: {sorted(self.models)}")
            if endpoint not in model.endpoints:
                raise RequestError(
                    400,
                    f"model {name!r} is a {model.kind} model: it answers {model.endpoints}, not {endpoint}",
                )
            return model
        fit = [m for m in self.models.values() if endpoint in m.endpoints]
        if len(fit) != 1:
            which = "no loaded model answers it" if not fit else f"name one of {[m.name for m in fit]}"
            raise RequestError(400 if fit else 404, f"model: {which} ({endpoint})")
        return fit[0]

    def label(self, name: object, endpoint: str) -> str | None:
        """The model a request is for, as the metrics label it, or None if it names none that fits:
        what :meth:`model_for` would answer, without its errors (for a request refused before)."""
        try:
            return self.model_for(name if isinstance(name, str) else None, endpoint).name
        except RequestError:
            return None

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """A request in flight, for as long as the block runs: 429 (:class:`Overloaded`) over
        ``max_concurrency`` requests in flight."""
        if self.in_flight >= self.limits.max_concurrency:
            raise Overloaded(
                f"{self.in_flight} requests in flight (max_concurrency {self.limits.max_concurrency})"
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
