"""Deprecated: moved to :mod:`scratchformer.formats.onnx_export` in 0.11; this path goes in 0.12."""

import scratchformer.formats.onnx_export as onnx_export
from scratchformer.models._moved import moved

moved(__name__, onnx_export)
