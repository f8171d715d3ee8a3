"""Deprecated: moved to :mod:`scratchformer.formats.marian_layout` in 0.11; this path goes in 0.12."""

import scratchformer.formats.marian_layout as marian_layout
from scratchformer.models._moved import moved

moved(__name__, marian_layout)
