"""The documentation cannot rot: the site builds with warnings as errors, the walkthrough's code is
included by object name (a renamed object is found), every page fits a 1280 px browser window (headless
Chromium: no table wider than its column, no included code scrolling sideways), the README's Python
runs as written, and the command blocks of Getting started run verbatim (at toy scale: a tiny IMDB and
a shrunken recipe in a scratch folder laid out like the repository)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEMO_COMMAND

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def fenced_blocks(path: Path, language: str) -> list[str]:
    """The bodies of the ```language fenced blocks of a Markdown file."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """The shell commands of a bash block: comments dropped, backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [
        line.split("  #")[0].strip()
        for line in joined.splitlines()
        if line.strip() and not line.startswith("#")
    ]


# ------------------------------------------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, f"sphinx-build -W failed:\n{result.stderr[-5000:]}"
    return out


def test_the_site_builds_with_offline_math_and_the_walkthroughs_code(site: Path) -> None:
    paper = (site / "paper.html").read_text(encoding="utf-8")
    assert (site / "_static" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000  # MathJax 3 shipped
    assert 'src="_static/mathjax/tex-svg.js' in paper and "cdn.jsdelivr.net" not in paper
    assert paper.count('class="math') >= 10  # the equations, left for MathJax to typeset
    for source in (
        "attention.py",
        "masks.py",
        "embedding.py",
        "feedforward.py",
        "layer_norm.py",
        "encoder.py",
        "decoder.py",
    ):
        assert f"core/{source}" in paper, source
    included = re.sub(r"<[^>]+>", "", paper)
    for definition in (
        "def scaled_dot_product_attention(",
        "def causal_mask(",
        "def sinusoidal_table(",
        "class PositionwiseFeedForward(",
        "class TokenEmbedding(",
    ):
        assert definition in included, definition
    for figure in re.findall(r'<img[^>]+src="([^"]+)"', paper):
        assert (site / figure).is_file(), figure


def test_every_subcommand_is_in_the_cli_reference(site: Path) -> None:
    import argparse

    from scratchformer.cli import build_parser

    def names(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += [f"{prefix}-{name}", *names(sub, f"{prefix}-{name}")]
        return found

    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    expected = names(build_parser(), "scratchformer")
    assert "scratchformer-train-classifier" in expected and len(expected) >= 16
    missing = [name for name in expected if f'id="{name}"' not in cli]
    assert not missing, missing


@pytest.fixture(scope="module")
def chromium() -> str:
    """Without Chromium the browser tests skip, except in CI (CI set), where .ci/run installs it: there
    they fail, so that a CI which could not install it is red, not silently green."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("CI is set but Chromium is missing (.ci/run installs it: apt-get install chromium)")
        pytest.skip("needs Chromium (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def browser(chromium: str, site: Path, tmp_path_factory) -> str:
    """scripts/figures/docs_screenshots.py over the built site, headless Chromium, offline: screenshots and
    typeset math of three pages, then every page's layout in a 1280 px window."""
    out = tmp_path_factory.mktemp("screenshots")
    pages = ["index", "paper", "pitfalls"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "figures" / "docs_screenshots.py"), "--site", str(site)]
        + ["--pages", *pages, "--out", str(out), "--layout", "1280"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode in (0, 1) and "layout paper:" in result.stdout, (
        result.stdout + result.stderr[-2000:]
    )
    assert all((out / f"{page}.png").stat().st_size > 50_000 for page in pages)
    return result.stdout


def test_a_browser_shows_typeset_math_and_every_figure(browser: str) -> None:
    """The script fails a page on raw TeX or a broken image."""
    lines = {
        page: re.search(rf"^(ok  |FAIL) {page}: \S+  (\{{.*\}})$", browser, flags=re.M)
        for page in ("index", "paper", "pitfalls")
    }
    assert all(line and line.group(1) == "ok  " for line in lines.values()), browser
    paper = json.loads(lines["paper"].group(2))
    assert paper["math"] >= 50 and paper["raw_tex"] == 0 and paper["images"] >= 4 and not paper["broken"]


def test_every_page_fits_a_1280_px_window(site: Path, browser: str) -> None:
    """On every page at 1280 px: the page does not scroll sideways, no table is wider than the text
    column (the Deploy guide's 7-column engine table once showed 4 columns), and no code included from
    the source scrolls sideways (the walkthrough's 110-column lines fit its code blocks)."""
    layout = {
        page: json.loads(measured)
        for page, measured in re.findall(r"^(?:ok  |FAIL) layout (\S+): (\{.*\})$", browser, flags=re.M)
    }
    pages = {
        path.relative_to(site).with_suffix("").as_posix()
        for path in site.rglob("*.html")
        if not any(part.startswith("_") for part in path.relative_to(site).parts)
    }
    assert set(layout) == pages and len(pages) >= 20, sorted(pages ^ set(layout))
    assert layout["guides/deploy"]["tables"] >= 1 and layout["paper"]["included"] >= 20
    problems = {}
    for page, m in layout.items():  # the walkthrough: all its code; elsewhere: what is included
        code = [c[0] for c in m["scrolling_code"]] if page == "paper" else m["scrolling_included"]
        found = [f"the page is {m['page']} px wide"] if m["page"] > 1280 else []
        found += [f"table {name!r}: {px} px in a {m['column']} px column" for name, px in m["wide_tables"]]
        found += [f"code scrolls sideways: {name!r}" for name in code]
        if found:
            problems[page] = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    assert not problems, "\n".join(f"{page}: {found}" for page, found in sorted(problems.items()))


def _build_walkthrough(tmp_path: Path, rename: tuple[str, str] | None) -> str:
    """Build paper.md alone against a copy of src/ (with one name replaced): the warnings it gives."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    if rename:
        path = tmp_path / "src" / "scratchformer" / "core" / "attention.py"
        path.write_text(path.read_text().replace(*rename), encoding="utf-8")
    (tmp_path / "docs").mkdir()
    shutil.copy(DOCS / "paper.md", tmp_path / "docs" / "index.md")
    (tmp_path / "docs" / "conf.py").write_text(
        'extensions = ["myst_parser"]\nmyst_enable_extensions = ["dollarmath"]\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(tmp_path / "docs"), str(tmp_path / "html")],
        capture_output=True,
        text=True,
    )
    return result.stderr


def test_renaming_an_included_object_breaks_the_walkthrough(tmp_path: Path) -> None:
    assert "not found in include file" not in _build_walkthrough(tmp_path / "same", None)
    warnings = _build_walkthrough(tmp_path / "renamed", ("class MultiHeadAttention(", "class MultiHeadAttn("))
    assert "Object named 'MultiHeadAttention.__init__' not found in include file" in warnings, warnings


# ------------------------------------------------------------------------------------------------ README


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "<!-- main-command -->" in readme and "<!-- test-command -->" in readme
    for target in re.findall(
        r"\]\((?!https?://|#)([^)\s]+)\)", readme
    ):  # every local link and picture exists
        assert (ROOT / target.split("#")[0]).exists(), target
    assert "Changes in " not in readme  # they live in CHANGELOG.md


@pytest.mark.parametrize("index", range(len(fenced_blocks(ROOT / "README.md", "python"))))
def test_the_readmes_python_runs_as_written(index: int, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = fenced_blocks(ROOT / "README.md", "python")[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})


# -------------------------------------------------------------------------------------------- Getting started


def _tiny_imdb(folder: Path) -> None:
    """Reviews in the shared data's layout: ../shared/data/imdb/{train,test}.jsonl.gz."""
    words = {1: "wonderful moving brilliant superb touching great", 0: "dull boring awful tedious weak bad"}
    folder.mkdir(parents=True)
    for split, count in (("train", 48), ("test", 16)):
        with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            for i in range(count):
                label = i % 2
                text = f"A {words[label].split()[i % 6]} film, {words[label]} and <br />then {i} more."
                f.write(json.dumps({"id": f"{split}/{i}", "label": label, "text": text}) + "\n")


def _toy_recipe(path: Path) -> None:
    """recipes/imdb.json with every size shrunk; its keys and paths stay the real recipe's."""
    recipe = json.loads((ROOT / "recipes" / "imdb.json").read_text())
    recipe.update(valid_size=8, vocab_size=120, max_length=32, head_length=8, batch_size=8, average_last=2)
    recipe["model"].update(d_model=16, num_heads=2, num_layers=1, d_ff=32)
    recipe["train"].update(epochs=1, eval_every=2, log_every=1)
    recipe["train"]["precision"] = "fp32"  # the same run on every CPU (auto: bf16 where it is native)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(recipe))


def test_getting_started_commands_run_verbatim(tmp_path: Path, demo_verbatim) -> None:
    """Every bash block of Getting Started, in a clone-like folder with a toy IMDB; the demo's run
    is the session's (conftest.demo_verbatim: the same command, run once)."""
    work = tmp_path / "scratchformer"  # the clone: recipes/ here, the data at ../shared/data
    _tiny_imdb(tmp_path / "shared" / "data" / "imdb")
    _toy_recipe(work / "recipes" / "imdb.json")
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHFORMER_DATA"}
    env["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this environment's scratchformer
    )
    ran, skipped = [], []
    for block in fenced_blocks(DOCS / "getting-started.md", "bash"):
        for command in commands(block):
            if command.startswith("pip install"):  # CI installs with the README's command itself
                skipped.append(command)
                continue
            if command == DEMO_COMMAND:
                result, _ = demo_verbatim
            else:
                result = subprocess.run(
                    ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=300
                )
            assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
            ran.append((command, result.stdout))
    assert skipped and all(c.startswith("pip install") and ("-e ." in c or '-e ".[' in c) for c in skipped), (
        skipped
    )
    outputs = dict(ran)
    assert any(c.startswith("scratchformer demo") for c in outputs), list(outputs)
    demo = next(out for c, out in ran if c.startswith("scratchformer demo"))
    assert "exact-match accuracy" in demo and "attention map:" in demo
    train = next(out for c, out in ran if c.startswith("scratchformer train classifier"))
    assert json.loads(train)["test"]["n"] == 16
    evaluate = next(out for c, out in ran if c.startswith("scratchformer evaluate"))
    assert "accuracy" in evaluate and "(16 examples)" in evaluate
    classify = next(out for c, out in ran if c.startswith("scratchformer classify"))
    assert len(classify.splitlines()) == 2 and all(
        line.split()[0] in ("positive", "negative") for line in classify.splitlines()
    )


def _tiny_translator(work: Path) -> None:
    """A tiny translation checkpoint where the Deploy page expects the Multi30k recipe's."""
    from tasks.test_translation import tiny_recipe

    from scratchformer.tasks.translation import train_translation

    (work / "mt").mkdir(parents=True)
    recipe = tiny_recipe(work / "mt", max_steps=40, eval_every=40)
    recipe.model["final_norm"], recipe.average_last = True, 0  # pre-LN with final norms, as the recipe
    report = train_translation(recipe)
    shutil.copytree(work / "mt" / "run" / report["test_checkpoint"], work / "runs" / "multi30k" / "best")


def _two_at_a_time(argvs: list[list[str]], **run) -> list[subprocess.CompletedProcess]:
    """``subprocess.run(argv, **run)`` for each, two at once (independent commands that spend
    most of their time importing torch and the engines, one core each)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda argv: subprocess.run(argv, **run), argvs))


def test_deploy_commands_and_code_run_verbatim(tmp_path: Path) -> None:
    """Every bash and Python block of the Deploy page, at toy scale: the exports, then each engine
    (transformers, CTranslate2, ONNX Runtime) running them (the benchmark command excepted: it
    needs the real test set)."""
    work = tmp_path / "scratchformer"
    _tiny_imdb(tmp_path / "shared" / "data" / "imdb")
    _toy_recipe(work / "recipes" / "imdb.json")
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHFORMER_DATA"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    train = subprocess.Popen(  # the classifier trains in a process while the translator trains here
        ["scratchformer", "train", "classifier", "--config", "recipes/imdb.json"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _tiny_translator(work)
    _, err = train.communicate(timeout=300)
    assert train.returncode == 0, err[-3000:]
    page = DOCS / "guides" / "deploy.md"
    ran = [
        command
        for block in fenced_blocks(page, "bash")
        for command in commands(block)
        if not command.startswith("python -m benchmarks")
    ]
    run = dict(cwd=work, env=env, capture_output=True, text=True, timeout=300)
    for command, result in zip(ran, _two_at_a_time([["bash", "-c", c] for c in ran], **run)):
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    assert len(ran) == 4 and all((work / c.split("--out ")[1].split()[0]).is_dir() for c in ran), ran
    blocks = fenced_blocks(page, "python")
    assert len(blocks) == 4, len(blocks)
    for code, result in zip(blocks, _two_at_a_time([[sys.executable, "-c", code] for code in blocks], **run)):
        assert result.returncode == 0 and result.stdout.strip(), f"{code}\n{result.stderr[-3000:]}"
