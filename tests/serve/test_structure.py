"""How the server is built: one module-level router whose handlers read the running server from
``request.app.state`` (two apps, one router, each its own models), requests admitted by an async
context manager (none left counted in flight, whatever ends them), short functions, the old module
path ``serve.models`` still importing with a DeprecationWarning, and ``--root-path``."""

from __future__ import annotations

import ast
import asyncio
import importlib
import sys
import warnings
from pathlib import Path

import httpx
import pytest
from servers import SlowModel, client_for, client_for_app, config

import scratchformer.serve
from scratchformer.serve import ModelSpec, ServeConfig, create_app

SERVE = Path(scratchformer.serve.__file__).parent
MAX_FUNCTION_LINES = 60  # below the package's 80 (tests/test_layout.py), counted as it counts them


def test_no_function_of_the_server_is_over_60_lines() -> None:
    lengths = {}
    for path in sorted(SERVE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{path.name}:{node.name}@{node.lineno}"] = node.end_lineno - node.lineno + 1
    long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    assert len(lengths) > 100 and max(lengths.values()) > 20  # (the walk saw the server)


def test_one_router_serves_every_app_each_with_its_own_models(tmp_path: Path) -> None:
    from scratchformer.serve.routes import router

    first, second = SlowModel("a", tmp_path), SlowModel("b", tmp_path)
    with client_for(config(ModelSpec("a", str(tmp_path))), [first]) as a:
        with client_for(config(ModelSpec("b", str(tmp_path))), [second]) as b:
            assert a.get("/v1/models").json()["data"][0]["id"] == "a"
            assert b.get("/v1/models").json()["data"][0]["id"] == "b"
            assert a.post("/v1/classify", json={"inputs": "x y"}).status_code == 200
    assert first.batches == [["x y"]] and second.batches == []
    paths = {route.path for route in router.routes}
    assert {"/v1/translate", "/v1/caption/attention", "/v1/models", "/health"} <= paths


def test_no_request_stays_counted_in_flight_whatever_ends_it(tmp_path: Path) -> None:
    """Answered, refused by the server's checks, refused by validation, streamed: each request is
    admitted while it runs (one held by the model counts), and none is counted once it ended."""
    model = SlowModel("slow", tmp_path)
    app = create_app(config(ModelSpec("slow", str(tmp_path)), max_concurrency=3), [model])
    state = app.state.serve

    async def scenario() -> tuple[list[int], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            model.gate.clear()
            held = asyncio.ensure_future(http.post("/v1/classify", json={"inputs": "held", "stream": True}))
            while not state.in_flight:
                await asyncio.sleep(0.01)
            counted = state.in_flight
            model.gate.set()
            codes = [(await held).status_code]
            for body in (
                {"inputs": "fine"},
                {"inputs": " "},
                {"inputs": 3},
                {"inputs": ["a", "b"], "stream": True},
            ):
                codes.append((await http.post("/v1/classify", json=body)).status_code)
            return codes, counted

    with client_for_app(app):
        codes, counted = asyncio.run(scenario())
    assert codes == [200, 200, 422, 422, 200] and counted == 1
    assert state.in_flight == 0


def test_the_old_path_serve_models_warns_and_is_the_new_module(monkeypatch) -> None:
    from scratchformer.serve import served

    monkeypatch.delitem(sys.modules, "scratchformer.serve.models", raising=False)
    message = (
        r"scratchformer\.serve\.models moved to scratchformer\.serve\.served; the old path goes in 0\.13"
    )
    with pytest.warns(DeprecationWarning, match=message) as seen:
        module = importlib.import_module("scratchformer.serve.models")
    assert module is served and module.load_served is served.load_served
    assert {w.filename for w in seen if w.category is DeprecationWarning} == {importlib.__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scratchformer.serve.ServedModel is served.ServedModel  # (the package's names: no warning)


def test_a_root_path_is_checked_and_reaches_the_server(tmp_path: Path) -> None:
    """``root_path /sf``: behind a proxy that strips /sf (uvicorn puts the prefix in the request's
    scope, as the TestClient's ``root_path`` does), the server answers its routes and names the
    prefixed paths (its /docs page asks for /sf/openapi.json). The command line's ``--root-path``
    through a real proxy and a browser: tests/serve/test_page.py."""
    from fastapi.testclient import TestClient

    spec = ModelSpec("slow", str(tmp_path))
    for bad in ("prefix", "/prefix/", "//prefix"):
        with pytest.raises(ValueError, match="root_path must be a path such as /scratchformer"):
            ServeConfig([spec], root_path=bad)
    app = create_app(ServeConfig([spec], root_path="/sf"), [SlowModel("slow", tmp_path)])
    with TestClient(app, root_path="/sf") as c:
        assert c.post("/v1/classify", json={"inputs": "fine"}).status_code == 200
        assert "/sf/openapi.json" in c.get("/docs").text
        assert c.get("/").text.count('src="static/app.js"') == 1


def test_the_serve_config_is_read_without_torch() -> None:
    """``scratchformer serve`` checks its flags and config file before anything heavy loads: the
    config module imports no torch (a bad value is one line in a fraction of a second)."""
    import subprocess

    code = "import sys, scratchformer.serve.config; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
