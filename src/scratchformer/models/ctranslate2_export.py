"""Deprecated: moved to :mod:`scratchformer.formats.ctranslate2_export` in 0.11; this path goes in 0.12."""

import scratchformer.formats.ctranslate2_export as ctranslate2_export
from scratchformer.models._moved import moved

moved(__name__, ctranslate2_export)
