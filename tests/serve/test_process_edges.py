"""The server process at its edges, as users (and attackers) meet it: clients that are slow, dead or
send too much (through raw sockets to 127.0.0.1), a port in use, a second SIGTERM, a damaged
checkpoint and config values of the wrong type. Timeouts are set to 1 s here to keep the tests fast."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import CLASSIFIER, free_port, serve_process

TIMEOUTS = ["--limit", "head_timeout_s=1", "--limit", "body_timeout_s=1"]
HEAD = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """The port of a running ``scratchformer serve`` with 1 s head and body timeouts."""
    with serve_process("--checkpoint", str(CLASSIFIER), *TIMEOUTS) as (_, url, _):
        yield int(url.rsplit(":", 1)[1])


def exchange(port: int, *pieces: bytes, pause: float = 0.0, wait: float = 5.0) -> tuple[bytes, float]:
    """Send ``pieces`` on a new connection, ``pause`` seconds apart, then read until the server closes
    it: (all it sent, seconds from the last piece to the close). Still open after ``wait`` s: a failure."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(wait)
        for i, piece in enumerate(pieces):
            time.sleep(pause if i else 0)
            s.sendall(piece)
        sent, answer = time.monotonic(), b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except TimeoutError:
            pytest.fail(f"the connection was still open {wait} s later; the server sent {answer[:200]!r}")
        return answer, time.monotonic() - sent


def test_a_head_over_max_head_bytes_is_answered_431_and_closed(port: int) -> None:
    """100 KB of header lines (the limit: 64 KiB), whole or never ended, and 2 MB of them (sent on
    after the answer: the server reads and drops them rather than resetting the connection): 431."""
    lines = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 40) for i in range(2000))
    for head in (HEAD + lines + b"Content-Length: 2\r\n\r\n{}", HEAD + lines, HEAD + lines * 20):
        answer, _ = exchange(port, head)
        assert answer.startswith(b"HTTP/1.1 431 ") and b"max_head_bytes=65536" in answer, answer[:300]


def test_a_head_that_stops_arriving_is_answered_408_and_closed(port: int) -> None:
    answer, seconds = exchange(port, HEAD + b"Content-Le")
    assert answer.startswith(b"HTTP/1.1 408 ") and b"head_timeout_s=1" in answer, answer[:300]
    assert seconds < 3


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    answer, seconds = exchange(port)
    assert answer == b"" and seconds < 3


def test_a_body_that_stops_arriving_is_answered_408_and_closed(port: int) -> None:
    answer, seconds = exchange(port, HEAD + b"Content-Length: 40\r\n\r\n", b'{"inputs": ')
    assert answer.startswith(b"HTTP/1.1 408 ") and b"body_timeout_s=1" in answer, answer[:300]
    assert seconds < 3


def test_slow_but_steady_bodies_and_pipelined_requests_are_still_answered(port: int) -> None:
    """A body in pieces 0.6 s apart (1.2 s in all: the timeout bounds each pause, not the whole), then
    two requests sent at once on one connection: three answers, in order."""
    body = b'{"inputs": "a fine day"}'
    first = HEAD + b"Content-Length: %d\r\n\r\n" % len(body)
    pipelined = (
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    answer, _ = exchange(port, first, body[:10], body[10:] + pipelined, pause=0.6)
    assert answer.count(b"HTTP/1.1 200 OK") == 3 and b'"label"' in answer and b'"ready"' in answer, answer


def test_a_port_in_use_is_one_line_naming_it(port: int) -> None:
    done = _serve("--checkpoint", str(CLASSIFIER), "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        == f"error: cannot listen on 127.0.0.1:{port}: Address already in use (--host, --port)"
    )


def test_a_second_sigterm_stops_the_draining_server_at_once() -> None:
    with serve_process("--checkpoint", str(CLASSIFIER), "--drain", "30") as (process, url, _):
        process.send_signal(signal.SIGTERM)
        while httpx.get(url + "/ready").status_code == 200:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert process.wait(10) == 0
        assert time.monotonic() - start < 3


def test_a_damaged_checkpoint_ends_the_server_in_one_line_naming_the_model(tmp_path: Path) -> None:
    folder = shutil.copytree(CLASSIFIER, tmp_path / "imdb")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    done = _serve("--checkpoint", f"imdb={folder}", "--port", str(free_port()))
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "model 'imdb': SafetensorError" in errors[0], (
        done.stderr
    )
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("config", "flags", "message"),
    [
        ("port: eighty", [], "port must be an integer, got 'eighty'"),
        ("port: true", [], "port must be an integer, got True"),
        ("threads: two", [], "threads must be an integer or null, got 'two'"),
        ("threads: 2.5", [], "threads must be an integer or null, got 2.5"),
        ("drain_s: soon", [], "drain_s must be a finite number, got 'soon'"),
        ("drain_s: .nan", [], "drain_s must be a finite number, got nan"),
        ("drain_s: -1", [], "drain_s must be 0 to 86400 seconds, got -1"),
        ("api_key: 12345", [], "api_key must be a string or null, got 12345"),
        ("host: ''", [], "host must be an address"),
        ("cors_origins: http://x", [], "cors_origins must be a list (a string each), got 'http://x'"),
        ("limits: {timeout_s: .inf}", [], "limits.timeout_s must be a finite number, got inf"),
        ("limits: {max_queue: false}", [], "limits.max_queue must be an integer, got False"),
        ("limits: {head_timeout_s: 0}", [], "limits.head_timeout_s must be a positive number, got 0"),
        ("", ["--limit", "timeout_s=inf"], "limits.timeout_s must be a finite number, got inf"),
        ("", ["--limit", "body_timeout_s=1e9"], "limits.body_timeout_s must be at most a day"),
        ("", ["--drain", "inf"], "drain_s must be a finite number, got inf"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_one_line_naming_the_field(
    tmp_path: Path, config: str, flags: list[str], message: str
) -> None:
    (tmp_path / "serve.yaml").write_text(f"models: [{{name: m, path: {CLASSIFIER}}}]\n{config}\n")
    done = _serve("--config", str(tmp_path / "serve.yaml"), *flags, "--port", str(free_port()))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and f"error: {message}" in lines[0], done.stderr


def _serve(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "scratchformer", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)
