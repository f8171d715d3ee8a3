"""Int8 inference on the CPU: every linear map y = x W^T + b keeps W in int8 (one scale per output
row) and quantizes its input x to 8 bits on the fly, per call (PyTorch's dynamic quantization,
``torch.ao.quantization.quantize_dynamic``; the int8 x int8 -> int32 products run in FBGEMM/oneDNN).
Everything else (embeddings, LayerNorm, softmax, the KV cache) stays fp32::

    int8 = quantize_int8(model)     # a copy: ``model`` is unchanged

Cross-attention reads the rows of the stacked [W^Q; W^K; W^V] it needs (the query's from the
target, the keys' and values' from the memory), and a quantized weight cannot be sliced: before
quantizing, each attention layer gets its W^Q rows and its [W^K; W^V] rows as two more linear maps
(:class:`QuantizedMultiHeadAttention`), quantized like the rest.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.fast.attention import FastMultiHeadAttention

__all__ = ["QuantizedMultiHeadAttention", "model_precision", "quantize_int8", "split_query_rows"]

_PRECISIONS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class QuantizedMultiHeadAttention(FastMultiHeadAttention):
    """:class:`FastMultiHeadAttention` whose W^Q rows (``q_proj``, D -> D) and [W^K; W^V] rows
    (``kv_proj``, D -> 2D) are linear maps of their own, so that cross-attention works once every
    linear map is quantized. Self-attention still projects with the whole ``qkv_proj``."""

    q_proj: nn.Module
    kv_proj: nn.Module

    def project(self, x: Tensor, first: int, count: int) -> Tensor:
        """x (B, L, D) times ``count`` blocks of [W^Q; W^K; W^V] from block ``first``: (B, L, count * D)."""
        D = self.d_model
        if (first, count) == (0, 1):
            return self.q_proj(x)
        if (first, count) == (0, 3):
            return self.qkv_proj(x)
        if first >= 1 and first + count <= 3:  # W^K and/or W^V: the memory's keys and values
            kv = self.kv_proj(x)  # (B, L, 2D)
            return kv if count == 2 else kv[..., (first - 1) * D : first * D]
        raise ValueError(f"project: blocks {first}..{first + count - 1} are not a block of [W^Q; W^K; W^V]")


def _linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """A float nn.Linear holding copies of ``weight`` (out, in) and ``bias`` (out,)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def split_query_rows(attn: MultiHeadAttention) -> QuantizedMultiHeadAttention:
    """Give ``attn`` (in place) its W^Q rows and its [W^K; W^V] rows of ``qkv_proj`` (3D, D) as linear
    maps of their own (copies) and switch it to :class:`QuantizedMultiHeadAttention`."""
    D, weight, bias = attn.d_model, attn.qkv_proj.weight.detach(), attn.qkv_proj.bias
    bias = None if bias is None else bias.detach()
    attn.q_proj = _linear(weight[:D], None if bias is None else bias[:D])
    attn.kv_proj = _linear(weight[D:], None if bias is None else bias[D:])
    attn.__class__ = QuantizedMultiHeadAttention
    return attn  # type: ignore[return-value]


def _check_cpu(model: nn.Module) -> None:
    """Dynamic quantization has CPU kernels only: refuse a model elsewhere, before any work."""
    devices = {t.device for t in [*model.parameters(), *model.buffers()]}
    other = sorted(str(d) for d in devices if d.type != "cpu")
    if other:
        raise ValueError(
            f"int8: dynamic quantization runs on the CPU only, the model is on {', '.join(other)} "
            "(load it with device='cpu')"
        )


def quantize_int8(model: nn.Module, *, per_channel: bool = True) -> nn.Module:
    """A copy of ``model`` (fp32, eval mode) with every ``nn.Linear`` (the attention projections,
    the feed-forward maps, the output projection, tied or not) dynamically quantized to int8.

    ``per_channel``: one scale per output row of each weight (default), else one per matrix.
    Raises ``ValueError`` if the model is not on the CPU or is int8 already. ``model`` itself is not
    changed.
    """
    _check_cpu(model)
    if model_precision(model) == "int8":
        raise ValueError("int8: the model is quantized already (quantize its fp32 original)")
    quantized = copy.deepcopy(model).float().eval()
    for module in quantized.modules():
        if isinstance(module, MultiHeadAttention):
            split_query_rows(module)
    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.filterwarnings("ignore", r"torch\.ao\.quantization is deprecated", DeprecationWarning)
        warnings.filterwarnings("ignore", r".*quantized tensor creation functions", UserWarning)
        quantize_dynamic(quantized, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    return quantized


def model_precision(model: nn.Module) -> str:
    """ "int8" if ``model`` has dynamically quantized linear maps, else the dtype of its floating
    point parameters: "fp32", "bf16" or "fp16" ("mixed" if they differ)."""
    if any(isinstance(m, DynamicQuantizedLinear) for m in model.modules()):
        return "int8"
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        return "mixed" if dtypes else "fp32"
    (dtype,) = dtypes
    return _PRECISIONS.get(dtype, str(dtype))
