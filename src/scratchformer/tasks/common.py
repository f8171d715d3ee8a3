"""Deprecated: ``tasks/common.py`` became the package :mod:`scratchformer.tasks.shared` (one concern a
module) in 0.12; this path still imports, with a DeprecationWarning, until 0.13."""

from __future__ import annotations

import warnings

from scratchformer.tasks.shared import *  # noqa: F403
from scratchformer.tasks.shared import __all__  # noqa: F401

warnings.warn(
    "scratchformer.tasks.common moved to scratchformer.tasks.shared; the old path goes in 0.13",
    DeprecationWarning,
    stacklevel=2,
)
