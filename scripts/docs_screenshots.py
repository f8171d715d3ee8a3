"""Look at the built documentation in a real browser, offline: serve the site on localhost, take
headless-Chromium screenshots of pages, and check that MathJax typeset every formula (no raw TeX
left in the rendered page) and that every image loaded.

    sphinx-build -W --keep-going docs docs/_build/html
    python scripts/docs_screenshots.py                       # index and paper -> docs/_build/screenshots/
    python scripts/docs_screenshots.py --pages paper getting-started --out /tmp/shots

Needs Chromium (Debian: ``apt-get install chromium``). Exits 1 if a page shows raw TeX or a broken image.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",
]
# After MathJax ran, write what the page shows into the DOM, where --dump-dom can read it.
PROBE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const done = () => {
    const text = document.querySelector('article') ? document.querySelector('article').innerText : '';
    const broken = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src);
    const pre = document.createElement('pre'); pre.id = 'docs-probe';
    pre.textContent = JSON.stringify({math: document.querySelectorAll('mjx-container').length,
      raw_tex: (text.match(/\\\\\\(|\\\\\\[|\\$\\$/g) || []).length, images: document.images.length, broken});
    document.body.appendChild(pre);
  };
  (window.MathJax && MathJax.startup) ? MathJax.startup.promise.then(done) : done();
}, 100));</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("error: Chromium not found (Debian: apt-get install chromium)")


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--site", default="docs/_build/html", help="the built site (default: docs/_build/html)"
    )
    parser.add_argument("--pages", nargs="+", default=["index", "paper"], help="pages, without .html")
    parser.add_argument("--out", default="docs/_build/screenshots", help="folder for the PNGs")
    parser.add_argument("--size", default="1280,2000", help="window size WIDTH,HEIGHT")
    args = parser.parse_args()
    site, out = Path(args.site), Path(args.out)
    if not (site / "index.html").is_file():
        sys.exit(f"error: {site}/index.html not found: build the site first (sphinx-build docs {site})")
    out.mkdir(parents=True, exist_ok=True)
    browser, failed = chromium(), False
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "site"
        shutil.copytree(site, copy)  # probe pages next to the real ones, so relative links still resolve
        server, port = serve(copy)
        try:
            for page in args.pages:
                url = f"http://127.0.0.1:{port}/{page}.html"
                png = out / f"{page.replace('/', '-')}.png"
                profile = ["--user-data-dir=" + str(Path(tmp) / "profile")]
                subprocess.run(
                    [browser, *FLAGS, *profile, f"--window-size={args.size}", f"--screenshot={png}", url],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                probe = copy / f"{page}.probe.html"
                probe.write_text(
                    (copy / f"{page}.html").read_text(encoding="utf-8").replace("</body>", PROBE + "</body>")
                )
                dom = subprocess.run(
                    [browser, *FLAGS, *profile, "--dump-dom", f"http://127.0.0.1:{port}/{page}.probe.html"],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=120,
                ).stdout
                found = re.search(r'<pre id="docs-probe">(.*?)</pre>', dom, flags=re.S)
                report = (
                    found.group(1).replace("&quot;", '"') if found else '{"error": "the probe did not run"}'
                )
                ok = found is not None and '"raw_tex":0' in report and '"broken":[]' in report
                failed |= not ok
                print(f"{'ok  ' if ok else 'FAIL'} {page}: {png}  {report}")
        finally:
            server.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
