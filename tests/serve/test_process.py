"""The server as users run it: ``scratchformer serve`` in a process of its own (real uvicorn on
127.0.0.1) under a few hundred concurrent clients, draining on SIGTERM, refusing bad flags; and a
client that hangs up through a real socket."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from servers import (
    CLASSIFIER,
    SOURCES,
    TRANSLATION,
    SlowModel,
    config,
    free_port,
    serve_process,
    wait_ready,
)

from benchmarks.serve_load import resident_mb
from scratchformer.serve import ModelSpec, create_app


async def clients(url: str, n: int, concurrent: int) -> list[int]:
    """``n`` one-sentence translation requests, ``concurrent`` at a time: their status codes."""
    limits = httpx.Limits(max_connections=concurrent)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        gate = asyncio.Semaphore(concurrent)

        async def one(i: int) -> int:
            async with gate:
                return (
                    await http.post("/v1/translate", json={"inputs": SOURCES[i % len(SOURCES)]})
                ).status_code

        return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's memory from /proc")
def test_hundreds_of_concurrent_clients_are_all_answered_in_batches_with_flat_memory() -> None:
    """200 requests at 100 at a time, twice: every one answered (200, or 429 over the queue limit),
    batches of more than one input formed, and the second round leaves the memory where the first
    did (within 40 MB: allocator noise; a leak of a kilobyte per request would be 200 KB a round,
    a leaked batch's tensors far more). The 10,000-request soak is benchmarks.serve_load's."""
    args = ["--checkpoint", f"de-en={TRANSLATION}", "--threads", "1", "--limit", "max_queue=64"]
    with serve_process(*args) as (process, url, _):
        first = asyncio.run(clients(url, 200, 100))
        memory = resident_mb(process.pid)
        second = asyncio.run(clients(url, 200, 100))
        grown = resident_mb(process.pid) - memory
        metrics = httpx.get(url + "/metrics").text
    for codes in (first, second):
        assert len(codes) == 200 and set(codes) <= {200, 429} and codes.count(200) >= 64, sorted(set(codes))
    size = float(re.search(r'^scratchformer_batch_size_sum\{model="de-en"\} (\S+)', metrics, re.M).group(1))
    count = float(
        re.search(r'^scratchformer_batch_size_count\{model="de-en"\} (\S+)', metrics, re.M).group(1)
    )
    assert size / count > 1.5, f"mean batch {size / count:.2f}: requests were not batched"
    assert grown < 40, f"the second round grew the server by {grown:.0f} MB"


def test_sigterm_drains_then_exits_cleanly() -> None:
    """After SIGTERM /ready answers 503 while requests are still served; then the process exits 0."""
    with serve_process("--checkpoint", str(CLASSIFIER), "--drain", "1.5") as (process, url, log):
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        ready = httpx.get(url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        assert httpx.post(url + "/v1/classify", json={"inputs": "fine"}).status_code == 200
        assert process.wait(30) == 0
        assert "Shutting down" in log.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no model to serve"),
        (["--checkpoint", "/no/such/dir"], "/no/such/dir is not a directory"),
        (["--checkpoint", str(CLASSIFIER), "--limit", "max_queue=x"], "'x' is not a number"),
        (["--checkpoint", str(CLASSIFIER), "--limit", "queue=3"], "expected NAME=VALUE with NAME one of"),
    ],
)
def test_bad_flags_are_one_line_errors_before_anything_loads(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scratchformer", "serve", *args], capture_output=True, text=True
    )
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
        done.stderr
    )


def test_a_model_that_fails_to_load_ends_the_server_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"kind": "masked_lm_of_another_world"}')
    command = ["serve", "--checkpoint", f"odd={tmp_path}", "--port", str(free_port())]
    done = subprocess.run(
        [sys.executable, "-m", "scratchformer", *command], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "error: model 'odd': ValueError: a 'masked_lm" in done.stderr, done.stderr


def test_a_client_that_hangs_up_is_never_computed(tmp_path: Path) -> None:
    """Through uvicorn and a real socket: the request of a client that closed its connection while
    queued is dropped (the disconnect message reaches the waiting handler)."""
    model, port = SlowModel("slow", tmp_path), free_port()
    app = create_app(config(ModelSpec("slow", str(tmp_path)), max_batch_size=1), [model])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda path: httpx.get(url + path))
        model.gate.clear()
        holder = threading.Thread(target=lambda: httpx.post(url + "/v1/classify", json={"inputs": "first"}))
        holder.start()
        time.sleep(0.3)
        body = b'{"inputs": "abandoned"}'
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.3)
        time.sleep(0.3)
        model.gate.set()
        holder.join(30)
        time.sleep(0.3)
        metrics = httpx.get(url + "/metrics").text
    finally:
        server.should_exit = True
        thread.join(30)
    assert model.batches == [["first"]]
    assert re.search(
        r'^scratchformer_dropped_inputs_total\{model="slow",reason="disconnected"\} 1\.0', metrics, re.M
    )
