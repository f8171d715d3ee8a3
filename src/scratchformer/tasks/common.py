"""Deprecated: ``tasks/common.py`` became the package :mod:`scratchformer.tasks.shared` (one concern a
module) in 0.12; this path goes in 0.13. It imports as the very module of its new path, with a
DeprecationWarning, as the paths ``models/``, ``tools/`` and ``serve/models.py`` gave up do."""

import sys
import warnings

import scratchformer.tasks.shared as shared

warnings.warn(
    f"{__name__} moved to {shared.__name__}; the old path goes in 0.13",
    DeprecationWarning,
    stacklevel=2,  # the line that imports the old path (the import machinery's frames are skipped)
)
sys.modules[__name__] = shared
