"""Look at the built documentation in a real browser, offline: serve the site on localhost, take
headless-Chromium screenshots of pages, and check that MathJax typeset every formula (no raw TeX
left in the rendered page) and that every image loaded.

    sphinx-build -W --keep-going docs docs/_build/html
    python scripts/figures/docs_screenshots.py                # index and paper -> docs/_build/screenshots/
    python scripts/figures/docs_screenshots.py --pages paper getting-started --out /tmp/shots
    python scripts/figures/docs_screenshots.py --layout 1280  # ... and every page's layout at 1280 px

Needs Chromium (Debian: ``apt-get install chromium``). Exits 1 if a page shows raw TeX or a broken image,
or (``--layout WIDTH``) if, in a window WIDTH px wide, a page scrolls sideways, a table on any page is
wider than the text column, or code included from the source (a captioned block: ``literalinclude``)
needs a horizontal scrollbar.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
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
# Every page of the site in a WIDTH px wide frame, one Chromium run for all: each table's width against
# its column (the article's content box) and against its scrolling wrapper, and each code block's
# scrollWidth against its clientWidth (more means a horizontal scrollbar), written into the DOM.
LAYOUT = """<!doctype html><meta charset="utf-8"><body style="margin:0"><script>
const pages = %s, width = %d, report = {};
const name = (element) => (element.innerText || '').trim().split('\\n')[0].slice(0, 60);
function measure(page, win) {
  const doc = win.document, article = doc.querySelector('article') || doc.body;
  const box = win.getComputedStyle(article);
  const column = article.clientWidth - parseFloat(box.paddingLeft) - parseFloat(box.paddingRight);
  const tables = [...article.querySelectorAll('table')], code = [...article.querySelectorAll('pre')];
  const cut = (t) => { const w = t.closest('.table-wrapper'); return w && w.scrollWidth > w.clientWidth + 1 };
  const wide = tables.filter(t => t.getBoundingClientRect().width > column + 1 || cut(t));
  const scrolls = code.filter(p => p.scrollWidth > p.clientWidth + 1);
  const included = (p) => p.closest('.literal-block-wrapper') !== null;
  report[page] = {page: doc.documentElement.scrollWidth, column: Math.round(column), tables: tables.length,
    wide_tables: wide.map(t => [name(t), Math.round(t.getBoundingClientRect().width)]),
    code: code.length, included: code.filter(included).length,
    scrolling_code: scrolls.map(p => [name(p.closest('.literal-block-wrapper') || p), p.scrollWidth,
      p.clientWidth]),
    scrolling_included: scrolls.filter(included).map(p => name(p.closest('.literal-block-wrapper')))};
}
function done() {
  const pre = document.createElement('pre'); pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(report); document.body.appendChild(pre);
}
let left = pages.length;
for (const page of pages) {
  const frame = document.createElement('iframe');
  frame.style.cssText = `width:${width}px;height:1200px;border:0;display:block`;
  frame.onload = () => setTimeout(() => {
    const win = frame.contentWindow, go = () => { measure(page, win); if (--left === 0) done(); };
    (win.MathJax && win.MathJax.startup) ? win.MathJax.startup.promise.then(go) : go();
  }, 100);
  frame.src = page + '.html'; document.body.appendChild(frame);
}
</script>"""


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


def check_layout(browser: str, profile: list[str], port: int, site: Path, width: int) -> bool:
    """Every page of the site at WIDTH px (one Chromium run): prints a line a page, False if one fails."""
    pages = sorted(
        path.relative_to(site).with_suffix("").as_posix()
        for path in site.rglob("*.html")
        if not any(part.startswith("_") for part in path.relative_to(site).parts)
        and not path.name.endswith(".probe.html")
    )
    (site / "_layout.probe.html").write_text(LAYOUT % (json.dumps(pages), width), encoding="utf-8")
    dom = subprocess.run(
        [browser, *FLAGS, *profile, f"--window-size={width + 40},1200", "--dump-dom"]
        + [f"http://127.0.0.1:{port}/_layout.probe.html"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, flags=re.S)
    report = json.loads(html.unescape(found.group(1))) if found else {}
    fits = True
    for page in pages:
        measured = report.get(page, {"error": "the probe did not measure this page"})
        ok = not measured.get("error") and not measured["wide_tables"] and not measured["scrolling_included"]
        ok = ok and measured["page"] <= width  # nor does the page itself scroll sideways
        fits &= ok
        print(f"{'ok  ' if ok else 'FAIL'} layout {page}: {json.dumps(measured)}")
    return fits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--site", default="docs/_build/html", help="the built site (default: docs/_build/html)"
    )
    parser.add_argument("--pages", nargs="+", default=["index", "paper"], help="pages, without .html")
    parser.add_argument("--out", default="docs/_build/screenshots", help="folder for the PNGs")
    parser.add_argument("--size", default="1280,2000", help="window size WIDTH,HEIGHT")
    parser.add_argument(
        "--layout",
        type=int,
        metavar="WIDTH",
        help="also check every page at this window width: no table wider than its column, "
        "no included code scrolling sideways",
    )
    args = parser.parse_args()
    if args.layout is not None and args.layout < 320:
        parser.error(f"--layout: a window width of at least 320 px, got {args.layout}")
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
            if args.layout:
                profile = ["--user-data-dir=" + str(Path(tmp) / "layout-profile")]
                failed |= not check_layout(browser, profile, port, copy, args.layout)
        finally:
            server.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
