"""Run the app under uvicorn, in this process: the models load in a thread while /health already
answers; SIGTERM (or Ctrl-C) drains: /ready answers 503 for ``drain_s`` seconds while requests are
still served (a load balancer takes the process out of rotation), then uvicorn stops accepting,
finishes the requests in flight, and the batchers finish what is queued. A second signal stops at
once. Clients that are slow or dead are bounded below the app (:mod:`~scratchformer.serve.connections`)."""

from __future__ import annotations

import functools
import logging
import socket
import sys
import threading
import traceback

import uvicorn

from scratchformer.serve.app import create_app
from scratchformer.serve.config import ServeConfig
from scratchformer.serve.connections import BodyTimeout, GuardedHttp
from scratchformer.serve.state import ServerState

__all__ = ["EXIT_BAD_MODEL", "EXIT_BUG", "run_server"]

EXIT_BAD_MODEL = 2  # a model that cannot be loaded from its checkpoint: bad input, as in every command
EXIT_BUG = 1  # a model that failed to load for another reason: a bug


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which drains on the first signal and stops at once on the second."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_s: float):
        super().__init__(config)
        self.state, self.drain_s = state, drain_s
        self.drain_timer: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: object) -> None:
        if self.should_exit or self.drain_timer is not None:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            if self.drain_timer is not None:
                self.drain_timer.cancel()
        elif self.drain_s <= 0:
            self.should_exit = True
        else:
            self.state.status = "draining"
            self.drain_timer = threading.Timer(self.drain_s, self._stop)
            self.drain_timer.daemon = True
            self.drain_timer.start()

    def _stop(self) -> None:
        self.should_exit = True


def run_server(config: ServeConfig, debug: bool = False) -> int:
    """Serve until stopped: 0; or, if a model failed to load, one line naming it and the problem
    (``debug``: the traceback too) and :data:`EXIT_BAD_MODEL` (or :data:`EXIT_BUG`). An address that
    cannot be listened on (a port in use) is an OSError naming it, before any model loads."""
    listener = listen(config.host, config.port)
    app = create_app(config)
    state: ServerState = app.state.serve
    server = DrainingServer(
        uvicorn.Config(
            BodyTimeout(app, config.limits.body_timeout_s),
            http=functools.partial(GuardedHttp, limits=config.limits),
            log_level="info",
            root_path=config.root_path,
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
    address = f"[{config.host}]" if ":" in config.host else config.host
    logging.getLogger("uvicorn.error").info("Uvicorn running on http://%s:%d", address, config.port)
    server.run(sockets=[listener])
    if state.status != "failed":
        return 0
    if debug and state.exception is not None:
        traceback.print_exception(state.exception)
    if _bad_checkpoint(state.exception):
        print(f"error: {state.error}", file=sys.stderr, flush=True)
        return EXIT_BAD_MODEL
    kind = type(state.exception).__name__
    print(f"error: {state.error} ({kind}: a bug; --debug for the traceback)", file=sys.stderr, flush=True)
    return EXIT_BUG


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it); an OSError naming the address if it
    cannot be (a port in use, an address this machine does not have)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e} (--host, --port)") from None
    return sock


def _bad_checkpoint(error: BaseException | None) -> bool:
    """Whether a model's load failed on its checkpoint (a missing, damaged or foreign file), as the
    command line reads errors: bad input, not a bug."""
    from safetensors import SafetensorError

    return isinstance(error, (ValueError, TypeError, OSError, ImportError, SafetensorError))
