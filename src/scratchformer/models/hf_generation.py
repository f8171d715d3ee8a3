"""Deprecated: moved to :mod:`scratchformer.formats.hf_generation` in 0.11; this path goes in 0.12."""

import scratchformer.formats.hf_generation as hf_generation
from scratchformer.models._moved import moved

moved(__name__, hf_generation)
