"""Deprecated: moved to :mod:`scratchformer.formats.marian` in 0.11; this path goes in 0.12."""

import scratchformer.formats.marian as marian
from scratchformer.models._moved import moved

moved(__name__, marian)
