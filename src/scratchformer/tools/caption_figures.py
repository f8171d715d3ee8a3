"""Deprecated: moved to :mod:`scratchformer.tasks.captioning.figures` in 0.12; this path goes in 0.13."""

import scratchformer.tasks.captioning.figures as figures
from scratchformer.tools._moved import moved

moved(__name__, figures)
