"""The converters that left ``models/`` for ``formats/`` in 0.11: each old path still imports, as
the very module of its new one, with a DeprecationWarning; they go in 0.12."""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

MOVED = {  # old module of scratchformer.models -> its module of scratchformer.formats
    "ctranslate2_export": "ctranslate2_export",
    "hf_files": "hf_files",
    "hf_generation": "hf_generation",
    "marian": "marian",
    "marian_layout": "marian_layout",
    "onnx_export": "onnx_export",
    "onnx_translator": "onnx_translator",
    "pretrained": "hf_bert",
}
GONE_IN = (0, 12)  # the release without these paths


def moved(old: str, new: ModuleType) -> None:
    """Warn that the module ``old`` (being imported) is now ``new``, and make ``old`` that module:
    the same objects, and a monkeypatch through the old path reaches the code that runs."""
    assert new.__name__ == f"scratchformer.formats.{MOVED[old.rsplit('.', 1)[1]]}", (old, new.__name__)
    warnings.warn(
        f"{old} moved to {new.__name__}; the old path goes in {'.'.join(map(str, GONE_IN))}",
        DeprecationWarning,
        stacklevel=3,  # the line that imports the old path (the import machinery's frames are skipped)
    )
    sys.modules[old] = new
