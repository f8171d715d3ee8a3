"""Opt-in speed paths. Each is a subclass of a core/ module with the same parameters (so the same
``state_dict``) and the same values, proven equal to core/ in tests/fast/test_fast.py. One call
switches them on, in place::

    model = optimize(model)                      # the tasks and benchmarks do this
    model = optimize(model, skip_padding=True)   # encoders also skip padded positions

    LayerNorm                -> FastLayerNorm     ATen's fused layer_norm kernel
    PositionwiseFeedForward  -> FastFeedForward   ReLU in place
    EncoderLayer             -> FastEncoderLayer  residuals in place, the stack's prepared mask
    MultiHeadAttention       -> FastMultiHeadAttention  a single bf16/fp16 query (decoding) in fp32,
                                                  by the explicit formula
    Encoder                  -> FastEncoder       mask merged once; drops an all-real padding mask;
                                                  packs real tokens (attention per sequence
                                                  on CPU); hooks anywhere: the readable path

Beside them, ``quantized``: int8 copies of a model for CPU serving, close to core/ rather than equal
(tests/fast/test_quantized.py). The KV cache's growing buffer, the other speed path, lives with
decoding in ``generation/``. Imports core/ only.
"""

from __future__ import annotations

from torch import nn

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.fast.attention import FastMultiHeadAttention, StackMask
from scratchformer.fast.encoder import FastEncoder, FastEncoderLayer
from scratchformer.fast.feedforward import FastFeedForward
from scratchformer.fast.layer_norm import FastLayerNorm
from scratchformer.fast.packing import Packing

__all__ = [
    "FastEncoder",
    "FastEncoderLayer",
    "FastFeedForward",
    "FastLayerNorm",
    "FastMultiHeadAttention",
    "Packing",
    "StackMask",
    "optimize",
]

_FAST: dict[type[nn.Module], type[nn.Module]] = {
    LayerNorm: FastLayerNorm,
    PositionwiseFeedForward: FastFeedForward,
    Encoder: FastEncoder,
    EncoderLayer: FastEncoderLayer,
    MultiHeadAttention: FastMultiHeadAttention,
}


def optimize(model: nn.Module, *, skip_padding: bool = False) -> nn.Module:
    """Switch every core module of ``model`` that has a fast version to it, in place (its class
    changes; its parameters, buffers and state_dict do not). Returns ``model``.

    ``skip_padding``: encoders compute real tokens only and return zeros at padded positions (for
    inference and pooling; real positions are unchanged).
    """
    for module in model.modules():
        fast = _FAST.get(type(module))
        if fast is not None:
            module.__class__ = fast
        if isinstance(module, FastEncoder):
            module.skip_padding = skip_padding
    return model
