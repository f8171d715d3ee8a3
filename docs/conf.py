"""Sphinx configuration of the scratchformer documentation (MyST Markdown pages, furo theme).

Build: ``sphinx-build -W --keep-going docs docs/_build/html`` (``pip install -e ".[docs]"``).
The site renders its math offline: MathJax 3 (``tex-svg.js``, self-contained) is copied from the
``django-static-mathjax`` package into the build, never loaded from a CDN.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT / "src"))

import scratchformer  # noqa: E402

project = "scratchformer"
author = "the scratchformer developers"
copyright = "2026, the scratchformer developers"
release = version = scratchformer.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinxarg.ext",
    "recipe_reference",
]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]
suppress_warnings: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"scratchformer {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# MathJax 3 from the installed package, not a CDN (these machines and many readers are offline).
mathjax_path = "mathjax/tex-svg.js"
mathjax3_config = {"tex": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]]}}


def _mathjax_source() -> Path:
    import mathjax  # the django-static-mathjax package

    path = Path(mathjax.__file__).resolve().parent / "static" / "mathjax" / "es5" / "tex-svg.js"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: MathJax 3's tex-svg.js is missing (pip install django-static-mathjax)"
        )
    return path


def _copy_mathjax(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        target = Path(app.outdir) / "_static" / "mathjax"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_mathjax_source(), target / "tex-svg.js")


def _long_names_may_break(app, doctree, docname) -> None:
    """Code names longer than 12 characters in a table may break anywhere (custom.css ``.long-name``):
    wide tables fit their column, and the short names (``hf``, ``ctranslate2``) stay whole."""
    from docutils import nodes

    for table in doctree.findall(nodes.table):
        for literal in table.findall(nodes.literal):
            if len(literal.astext()) > 12:
                literal["classes"].append("long-name")


def setup(app) -> None:
    _mathjax_source()  # fail at the start of a build, not after it
    app.connect("build-finished", _copy_mathjax)
    app.connect("doctree-resolved", _long_names_may_break)
