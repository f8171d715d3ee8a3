"""The web page in a real browser (headless Chromium, every host but 127.0.0.1 unreachable: the page
needs no network), through scripts/serve_page.py: each kind of model's tab does what it shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import CAPTIONING, CLASSIFIER, TRANSLATION, bert_encoder, png

ROOT = Path(__file__).resolve().parents[2]


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
        [sys.executable, str(ROOT / "scripts" / "serve_page.py"), "--out", str(out), "--photo", str(photo),
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
