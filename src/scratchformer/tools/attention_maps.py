"""Deprecated: moved to :mod:`scratchformer.viz.attention_maps` in 0.12; this path goes in 0.13."""

import scratchformer.viz.attention_maps as attention_maps
from scratchformer.tools._moved import moved

moved(__name__, attention_maps)
