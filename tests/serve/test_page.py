"""The web page in a real browser (headless Chromium, every host but 127.0.0.1 unreachable: the page
needs no network), through scripts/figures/serve_page.py: each kind of model's tab does what it shows,
also behind a proxy that serves it under a path prefix; and the page's panels are the kinds served."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import CAPTIONING, CLASSIFIER, TRANSLATION, bert_encoder, png, serve_process

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "figures" / "serve_page.py"


@pytest.fixture(scope="module")
def browser_tools() -> None:
    """Without Chromium and chromedriver the test skips, except in CI (CI set), where .ci/run
    installs them: there it fails, so that a CI which could not install them is red."""
    missing = [tool for tool in ("chromium", "chromedriver") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"CI is set but {missing} missing (.ci/run installs chromium and chromium-driver)")
        pytest.skip(f"needs {missing} (apt-get install chromium chromium-driver)")


def test_every_tab_works_offline_in_a_browser(browser_tools, tmp_path: Path) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(png(120, 90, (200, 60, 40)))
    encoder = bert_encoder(tmp_path / "minilm")
    out = tmp_path / "shots" / "page.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--photo", str(photo),
         "--checkpoint", f"de-en={TRANSLATION}", "--checkpoint", f"imdb={CLASSIFIER}",
         "--checkpoint", f"shapes={CAPTIONING}", "--checkpoint", f"minilm={encoder}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    tabs = json.loads(done.stdout.strip().splitlines()[-1])["tabs"]
    de_en = tabs["de-en"]
    assert de_en["translation"] and de_en["grid_rows"] == 1 and de_en["grid_heads"] == 2  # 1 layer x 2 heads
    assert de_en["head_view_lines"] > 0 and "/v1/translate" in de_en["curl"]
    assert [b.split()[0] for b in tabs["imdb"]["bars"]] in (
        ["positive", "negative"],
        ["negative", "positive"],
    )
    assert tabs["shapes"]["caption"] and tabs["shapes"]["words"] == len(tabs["shapes"]["caption"].split()) + 1
    assert tabs["minilm"]["similarity_cells"] == 9  # 3 x 3 (the page's three example sentences)
    assert all(Path(t["screenshot"]).stat().st_size > 10_000 for t in tabs.values())


def test_the_pages_panels_are_the_kinds_the_server_serves() -> None:
    """app.js has a panel (and index.html its template) for each kind of served model, and for
    nothing else: the registry of served kinds (what /v1/models reports) is the page's list."""
    from scratchformer.serve.served import SERVED

    static = ROOT / "src" / "scratchformer" / "serve" / "static"
    script = (static / "app.js").read_text(encoding="utf-8")
    panels = re.search(r"^const PANELS = \{([^}]*)\};", script, re.MULTILINE)
    assert panels is not None, "app.js has no `const PANELS = {...};` line"
    kinds = {entry.split(":")[0].strip() for entry in panels.group(1).split(",")}
    assert kinds == set(SERVED) and all(SERVED[k].kind == k for k in SERVED), (kinds, set(SERVED))
    templates = set(re.findall(r'<template id="([a-z_]+)-panel">', (static / "index.html").read_text()))
    assert templates == kinds


def test_the_page_uses_no_absolute_path() -> None:
    """Every path the page asks for is relative to it, so that a proxy may serve it under a prefix."""
    static = ROOT / "src" / "scratchformer" / "serve" / "static"
    page = (static / "index.html").read_text(encoding="utf-8")
    script = (static / "app.js").read_text(encoding="utf-8")
    assert not re.findall(r'(?:href|src)="/', page)
    assert not re.findall(r'(?:api|fetch)\(\s*["`]/', script)
    assert re.findall(r'api\("v1/', script) and 'fetch("ready")' in script


class PrefixProxy:
    """A reverse proxy on 127.0.0.1 that serves ``upstream`` under ``prefix``, as nginx's ``location
    /prefix/ { proxy_pass http://upstream/; }`` does: /prefix/PATH is forwarded as /PATH. Every
    path it was asked for is kept in ``paths``; one outside the prefix is a 404."""

    def __init__(self, upstream: int, prefix: str):
        import http.server
        import threading

        proxy = self
        self.paths: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                proxy.forward(self, upstream, prefix)

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, handler, upstream: int, prefix: str) -> None:
        import http.client

        self.paths.append(handler.path)
        if not handler.path.startswith(prefix + "/"):
            handler.send_error(404, "outside the proxy's prefix")
            return
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "connection")}
        connection = http.client.HTTPConnection("127.0.0.1", upstream, timeout=120)
        connection.request(handler.command, handler.path[len(prefix) :], body, headers)
        answer = connection.getresponse()
        content = answer.read()
        handler.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)
        connection.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_page_works_behind_a_proxy_under_a_path_prefix(browser_tools, tmp_path: Path) -> None:
    """``serve --root-path /scratchformer`` behind a proxy that forwards /scratchformer/... to it:
    the page, its files and every request it makes go through the prefix (none outside it), it
    translates and draws the attention, and its curl box and /docs name the prefixed URLs."""
    import importlib.util

    import httpx

    spec = importlib.util.spec_from_file_location("serve_page", SCRIPT)
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    with serve_process("--checkpoint", f"de-en={TRANSLATION}", "--root-path", "/scratchformer") as (
        _,
        url,
        _,
    ):
        proxy = PrefixProxy(int(url.rsplit(":", 1)[1]), "/scratchformer")
        try:
            base = f"http://127.0.0.1:{proxy.port}/scratchformer/"
            assert httpx.get(base + "ready").json()["status"] == "ready"
            assert "/scratchformer/openapi.json" in httpx.get(base + "docs").text
            args = argparse.Namespace(width=1000, height=900, sentence="Ein Mann fährt Fahrrad.", photo=None)
            report = page.visit(base, tmp_path / "page.png", args)
        finally:
            proxy.close()
    shown = report["tabs"]["de-en"]
    assert shown["translation"] and shown["grid_rows"] == 1 and shown["grid_heads"] == 2, shown
    assert f"{base}v1/translate" in shown["curl"]
    assert not report["console_errors"], report["console_errors"]
    assert all(p.startswith("/scratchformer/") for p in proxy.paths), proxy.paths
    assert {"/scratchformer/", "/scratchformer/static/app.js", "/scratchformer/v1/models"} <= set(proxy.paths)
    assert any(p == "/scratchformer/v1/attention" for p in proxy.paths)
