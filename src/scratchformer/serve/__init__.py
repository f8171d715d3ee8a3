"""``scratchformer serve``: trained models behind HTTP, with continuous batching, limits, metrics and a
web page that shows their attention. A room above the tasks' Python API, which it calls and never
bypasses: of the package it imports tasks/ and generation/ only.

    from scratchformer.serve import ServeConfig, ModelSpec, create_app
    app = create_app(ServeConfig([ModelSpec("de-en", "runs/multi30k/best")]))   # then uvicorn.run(app)

The names load on first use: the command line checks its flags (serve.config, the standard library
only) before torch and FastAPI are imported.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Limits", "ModelSpec", "ServeConfig", "ServedModel", "create_app", "load_served"]

_WHERE = {
    "Limits": "config",
    "ModelSpec": "config",
    "ServeConfig": "config",
    "ServedModel": "served",
    "load_served": "served",
    "create_app": "app",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'scratchformer.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f"scratchformer.serve.{_WHERE[name]}"), name)
