"""The server's web page in a real browser, offline: start ``scratchformer serve`` with the given
checkpoints, open the page in headless Chromium (Debian's, driven by Selenium through
chromium-driver) with every host but 127.0.0.1 unreachable, and use it as a reader would: translate
a sentence and look at its attention (the layer x head grid, then the head view), classify a text,
caption a photo and hover a word, compare sentences. Screenshots of each tab; a JSON report on
stdout; exit 1 if something did not show.

    python scripts/figures/serve_page.py --checkpoint de-en=runs/multi30k/best \\
        --out docs/figures/serve_page.png
    python scripts/figures/serve_page.py --checkpoint de-en=A --checkpoint imdb=B --photo a.jpg \\
        --out /tmp/page.png

Needs the 'serve' extra, Selenium, ``chromium`` and ``chromedriver`` (Debian: apt-get install chromium
chromium-driver). The first tab's screenshot is written to --out; the others beside it (NAME-kind.png).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ beside src/
from benchmarks.serve_load import free_port, spawn  # noqa: E402

SENTENCE = "Ein Mann fährt mit dem Fahrrad durch die Stadt."


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    offline = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"  # no host but this one
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", offline):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(
        service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options
    )


def tab(driver, name: str):
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.CSS_SELECTOR, "#tabs button"):
        if button.text.startswith(name + " "):
            button.click()
    return driver.find_element(By.ID, f"panel-{name}")


def translation(driver, wait, panel, sentence: str) -> dict:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    panel.find_element(By.CSS_SELECTOR, ".source").send_keys(sentence)
    wait.until(lambda d: panel.find_element(By.CSS_SELECTOR, ".translation").text.strip())
    wait.until(lambda d: panel.find_elements(By.CSS_SELECTOR, ".grid-table tr"))
    time.sleep(1.0)  # the grid's other layers arrive one request each
    found = {
        "translation": panel.find_element(By.CSS_SELECTOR, ".translation").text,
        "grid_rows": len(panel.find_elements(By.CSS_SELECTOR, ".grid-table tr")),
        "grid_heads": len(panel.find_elements(By.CSS_SELECTOR, ".grid-table canvas")),
        "curl": driver.find_element(By.ID, "curl").text,
    }
    Select(panel.find_element(By.CSS_SELECTOR, ".view")).select_by_value("heads")
    wait.until(lambda d: panel.find_elements(By.CSS_SELECTOR, "svg line"))
    found["head_view_lines"] = len(panel.find_elements(By.CSS_SELECTOR, "svg line"))
    Select(panel.find_element(By.CSS_SELECTOR, ".view")).select_by_value("grid")
    wait.until(
        lambda d: len(panel.find_elements(By.CSS_SELECTOR, ".grid-table canvas")) == found["grid_heads"]
    )
    return found


def classifier(driver, wait, panel) -> dict:
    from selenium.webdriver.common.by import By

    panel.find_element(By.CSS_SELECTOR, ".source").send_keys("A wonderful film, I loved every minute of it.")
    wait.until(lambda d: panel.find_elements(By.CSS_SELECTOR, ".bar"))
    return {"bars": [b.text.replace("\n", " ") for b in panel.find_elements(By.CSS_SELECTOR, ".bar")]}


def captioning(driver, wait, panel, photo: Path) -> dict:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    panel.find_element(By.CSS_SELECTOR, ".file").send_keys(str(photo.resolve()))
    wait.until(lambda d: panel.find_element(By.CSS_SELECTOR, ".caption").text.strip())
    words = panel.find_elements(By.CSS_SELECTOR, ".words span")
    if words:  # hover the second word: its attention over the photo
        ActionChains(driver).move_to_element(words[min(1, len(words) - 1)]).perform()
    return {"caption": panel.find_element(By.CSS_SELECTOR, ".caption").text, "words": len(words)}


def embedding(driver, wait, panel) -> dict:
    from selenium.webdriver.common.by import By

    panel.find_element(By.CSS_SELECTOR, ".go").click()
    wait.until(lambda d: panel.find_elements(By.CSS_SELECTOR, ".figure canvas"))
    return {"similarity_cells": len(panel.find_elements(By.CSS_SELECTOR, ".figure td"))}


def visit(url: str, out: Path, args: argparse.Namespace) -> dict:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser(args.width, args.height)
    report: dict = {"tabs": {}}
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tabs button"))
        names = [b.text.split(" (") for b in driver.find_elements(By.CSS_SELECTOR, "#tabs button")]
        for i, (name, kind) in enumerate(names):
            kind = kind.rstrip(")")
            panel = tab(driver, name)
            if kind == "translation":
                found = translation(driver, wait, panel, args.sentence)
            elif kind == "text_classifier":
                found = classifier(driver, wait, panel)
            elif kind == "captioning" and args.photo:
                found = captioning(driver, wait, panel, args.photo)
            elif kind == "embedding":
                found = embedding(driver, wait, panel)
            else:
                found = {}
            shot = out if i == 0 else out.with_name(f"{out.stem}-{name}-{kind}{out.suffix}")
            driver.save_screenshot(str(shot))
            report["tabs"][name] = {"kind": kind, "screenshot": str(shot), **found}
        report["console_errors"] = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", action="append", required=True, help="NAME=DIR, as scratchformer serve"
    )
    parser.add_argument("--sentence", default=SENTENCE, help="what the translation tab translates")
    parser.add_argument("--photo", type=Path, help="what the captioning tab captions")
    parser.add_argument("--out", type=Path, default=Path("docs/figures/serve_page.png"))
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=1100)
    args = parser.parse_args(argv)
    port = free_port()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server = spawn([arg for c in args.checkpoint for arg in ("--checkpoint", c)], port, seconds=180)
    try:
        report = visit(f"http://127.0.0.1:{port}/", args.out, args)
    finally:
        server.terminate()
        server.wait(60)
    print(json.dumps(report, ensure_ascii=False))
    shown = all(
        t.get("translation")
        or t.get("bars")
        or t.get("caption")
        or t.get("similarity_cells")
        or t["kind"] == "captioning"
        for t in report["tabs"].values()
    )
    return 0 if shown and not report["console_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
