"""Run the app under uvicorn, in this process: the models load in a thread while /health already
answers; SIGTERM (or Ctrl-C) drains: /ready answers 503 for ``drain_s`` seconds while requests are
still served (a load balancer takes the process out of rotation), then uvicorn stops accepting,
finishes the requests in flight, and the batchers finish what is queued. A second signal stops at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

import uvicorn

from scratchformer.serve.app import create_app
from scratchformer.serve.config import ServeConfig
from scratchformer.serve.state import ServerState

__all__ = ["free_port", "run_server", "spawn"]


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_s: float):
        super().__init__(config)
        self.state, self.drain_s = state, drain_s

    def handle_exit(self, sig: int, frame: object) -> None:
        if self.should_exit:
            self.force_exit = True  # a second signal: now
        elif self.state.status == "draining" or self.drain_s <= 0:
            self.should_exit = True
        else:
            self.state.status = "draining"
            threading.Timer(self.drain_s, self._stop).start()

    def _stop(self) -> None:
        self.should_exit = True


def run_server(config: ServeConfig) -> int:
    """Serve until stopped: 0, or 1 if a model failed to load (the error is printed)."""
    app = create_app(config)
    state: ServerState = app.state.serve
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="info",
            timeout_graceful_shutdown=int(config.limits.timeout_s) + 1,
        ),
        state,
        config.drain_s,
    )

    def watch() -> None:  # a model that fails to load ends the server, with the error
        state.done_loading.wait()
        if state.status == "failed":
            server.should_exit = True

    threading.Thread(target=watch, daemon=True).start()
    server.run()
    if state.status == "failed":
        print(f"error: {state.error}", flush=True)
        return 1
    return 0


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (for :func:`spawn`)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: Sequence[str], port: int, seconds: float = 300, **popen: object) -> subprocess.Popen:
    """``scratchformer serve ARGS --port PORT`` as a process of its own (``popen``: its
    ``subprocess.Popen`` options), returned once its /ready answers 200 (for benchmarks, scripts
    and tests). A process that exits first, or is not ready in ``seconds``, is a RuntimeError."""
    options = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True, **popen}
    command = [sys.executable, "-m", "scratchformer", "serve", *args, "--port", str(port)]
    server = subprocess.Popen(command, **options)  # type: ignore[call-overload]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pipe = server.stderr or server.stdout
            said = pipe.read() if pipe else ""
            raise RuntimeError(f"the server exited ({server.returncode}): {said[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"the server was not ready within {seconds:.0f} s")
