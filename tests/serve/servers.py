"""What the serve tests share: the fixture checkpoints (a translator, a classifier, a captioner of
tests/fixtures/v0.1.0), a random BERT encoder saved as Hugging Face does, a slow model whose calls
the test controls, a running app, and a real ``scratchformer serve`` process (:func:`spawn`)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serve_load import free_port, spawn  # (one copy: the benchmark's)
from scratchformer.serve import Limits, ModelSpec, ServeConfig, create_app
from scratchformer.serve.errors import ERRORS
from scratchformer.serve.served import Options, ServedModel

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"
TRANSLATION, CLASSIFIER, CAPTIONING = (FIXTURES / k for k in ("translation", "text_classifier", "captioning"))
SOURCES = [
    "ein Mann",
    "zwei Hunde laufen im Schnee",
    "eine Frau",
    "ein Kind spielt",
    "Hunde",
    "ein Mann und eine Frau",
]


def bert_encoder(directory: Path) -> Path:
    """A random ``BertModel`` (transformers' own init) with the fixture classifier's tokenizer."""
    import torch
    import transformers

    from scratchformer.data.tokenization import save_hf_tokenizer
    from scratchformer.tasks.classification import load_classifier

    tokenizer = load_classifier(CLASSIFIER, device="cpu").tokenizer
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(directory)
    save_hf_tokenizer(tokenizer.tokenizer, directory, max_length=tokenizer.max_length)
    return directory


def png(width: int = 80, height: int = 60, colour: tuple[int, int, int] = (10, 200, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, format="PNG")
    return out.getvalue()


class SlowModel(ServedModel):
    """A model the test drives: each batch waits for ``gate`` (set: no wait), then answers each text
    with its length; ``batches`` records what it ran."""

    kind, endpoints = "text_classifier", ("classify",)

    def __init__(self, name: str, path: Path):
        super().__init__(ModelSpec(name, str(path)), None)
        self.gate, self.batches = threading.Event(), []
        self.gate.set()

    def lengths(self, items: list[str]) -> list[int]:
        return [len(t.split()) for t in items]

    def run(self, items: list[str], options: Options, on_step: Any = None) -> list[dict[str, Any]]:
        self.gate.wait(30)
        self.batches.append(list(items))
        return [{"text": t, "label": str(len(t)), "score": 1.0} for t in items]

    def warm_up(self) -> None:
        pass


@contextmanager
def client_for(config: ServeConfig, models: list[ServedModel] | None = None) -> Iterator[Any]:
    """A TestClient of a started app, once /ready answers 200."""
    from fastapi.testclient import TestClient

    with TestClient(create_app(config, models)) as client:
        wait_ready(client.get)
        yield client


def wait_ready(get: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            answer = get("/ready")
            if answer.status_code == 200:
                return
            assert "error" not in answer.json(), answer.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError("not ready")


async def concurrently(app: Any, requests: list[tuple[str, dict]]) -> list[httpx.Response]:
    """Requests sent at once to a running ``app`` (in this event loop: its batchers see them together)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))


@contextmanager
def serve_process(*args: str) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """``scratchformer serve ARGS --port P`` in a process of its own (one compute thread, its
    output to a file: a pipe nobody reads would fill and stop it): (the process, its URL, the
    output file) once ready."""
    import tempfile

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as folder, open(Path(folder) / "server.log", "w") as log:
        process = spawn(args, port, 120, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            yield process, f"http://127.0.0.1:{port}", Path(log.name)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(30)


def refused(response: httpx.Response, status: int, *words: str) -> dict:
    """The body of an error answer: ``status``, the one-line error shape with the status's type (the
    table of errors), naming each of ``words``."""
    body = response.json()
    assert response.status_code == status, body
    assert set(body) == {"error", "error_type"} and "\n" not in body["error"], body
    assert body["error_type"] == ERRORS[status].error_type, body
    assert all(w in body["error"] for w in words), body
    return body


def config(*specs: ModelSpec, **limits: Any) -> ServeConfig:
    return ServeConfig(list(specs), limits=Limits(**limits))


@contextmanager
def client_for_app(app: Any) -> Iterator[Any]:
    """A TestClient of a started app, once its models have loaded (or failed to)."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        app.state.serve.done_loading.wait(30)
        yield client
