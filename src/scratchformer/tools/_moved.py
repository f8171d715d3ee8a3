"""The modules that left ``tools/`` in 0.12: the attention maps for ``viz/``, the caption figures
for the captioning task. Each old path still imports, as the very module of its new one, with a
DeprecationWarning; they go in 0.13 (as ``models/_moved.py`` does for the converters)."""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

MOVED = {  # old module of scratchformer.tools -> its new module
    "attention_maps": "scratchformer.viz.attention_maps",
    "caption_figures": "scratchformer.tasks.captioning.figures",
}
GONE_IN = (0, 13)  # the release without these paths


def moved(old: str, new: ModuleType) -> None:
    """Warn that the module ``old`` (being imported) is now ``new``, and make ``old`` that module:
    the same objects, and a monkeypatch through the old path reaches the code that runs."""
    assert new.__name__ == MOVED[old.rsplit(".", 1)[1]], (old, new.__name__)
    warnings.warn(
        f"{old} moved to {new.__name__}; the old path goes in {'.'.join(map(str, GONE_IN))}",
        DeprecationWarning,
        stacklevel=3,  # the line that imports the old path (the import machinery's frames are skipped)
    )
    sys.modules[old] = new
