"""Deprecated: moved to :mod:`scratchformer.formats.onnx_translator` in 0.11; this path goes in 0.12."""

import scratchformer.formats.onnx_translator as onnx_translator
from scratchformer.models._moved import moved

moved(__name__, onnx_translator)
