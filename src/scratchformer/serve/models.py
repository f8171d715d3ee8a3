"""Deprecated: moved to :mod:`scratchformer.serve.served` in 0.12 (the name ``models`` was the
``scratchformer.models`` package's); this path goes in 0.13. It imports as the very module of its
new path, with a DeprecationWarning, as the paths ``models/`` and ``tools/`` gave up do."""

import sys
import warnings

import scratchformer.serve.served as served

warnings.warn(
    f"{__name__} moved to {served.__name__}; the old path goes in 0.13",
    DeprecationWarning,
    stacklevel=2,  # the line that imports the old path (the import machinery's frames are skipped)
)
sys.modules[__name__] = served
