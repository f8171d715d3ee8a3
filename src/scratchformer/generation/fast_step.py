"""One decoding step of the decoder stack for :func:`~scratchformer.generation.fast_beam_search`:
the computation of :class:`~scratchformer.core.decoder.DecoderLayer` (same modules, same formula),
for one new token per row, written for the fewest operations a step can take. It reads the core
through its public seams: the model's ``embed_target``
(:class:`~scratchformer.generation.interface.EmbedsTarget`), each attention's ``project``,
``split_heads`` and ``attend``, the layers' modules.

- Rows are (N, D), never (N, 1, D): a step's attention of one query per row and head is a batched
  matrix-vector product whose (N, H, d_k) output *is* the (N, D) input of W^O, with no transpose.
- The self-attention keys/values live in a buffer allocated once at the final length
  (:class:`SelfCache`); a step writes its position and reads the filled part.
- The encoder's keys/values, (B * H, S, d_k), are projected once per layer and never replicated:
  a sentence's beams are the queries of one attention ("beamable" matmul, fairseq's and
  CTranslate2's). The padding mask (bool, True = may attend) is used in its additive form, a
  (B * H, 1, S) bias of 0 where True and -inf where False, made once per search: the form a batched
  product adds in the same call (``torch.baddbmm``), no masked copy of the scores per step; a
  sentence with no real token attends to zeroed values, so gets the core's zeros.
- Each linear map multiplies by a copy of W made once per weight version, as CTranslate2 packs its
  weights: in fp32 on the CPU, W in oneDNN's packed layout for oneDNN's GEMM (CTranslate2's SGEMM
  backend on AMD CPUs; faster than MKL's at a step's 5 to 160 rows on an AVX2 EPYC), with the
  feed-forward's ReLU fused into it; elsewhere W^T laid out (in, out), up to 1.9x faster than
  against W's (out, in) rows. An int8 linear map (dynamic quantization) runs its FBGEMM operator
  directly, the ReLU fused; any other module is called as it is.
- fp32 attention is the explicit formula (ATen's fused CPU kernel takes up to 2.5x as long for 1
  to 5 queries); bf16/fp16 attend as the layer does (:meth:`MultiHeadAttention.attend`).

Torch's private names are read in four functions only, each saying why: ``_weight_version``,
``_onednn_pack`` and ``_onednn_product``, and ``_int8`` (tests/generation/test_no_private_access.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from torch.nn import functional as F

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.decoder import DecoderLayer
from scratchformer.core.feedforward import ACTIVATIONS, PositionwiseFeedForward
from scratchformer.generation.interface import EncoderDecoder, QueryMap, target_embedding

__all__ = ["DecoderStep", "SelfCache", "rows_of"]

Affine = Callable[[Tensor], Tensor]  # x (N, in) -> (N, out)
_SPANS = 4  # a cache reordered in up to 4 spans of sentences, each over its own filled positions


def _weight_version(weight: Tensor) -> int:
    """How often ``weight`` was changed in place (-2: an inference tensor, which has no count).
    Torch's version counter, what autograd checks saved tensors against: no public name gives it."""
    return -2 if weight.is_inference() else weight._version


# What a step multiplies by, made once per weight and kept by id of the weight (dropped with it),
# once per version: a weight changed in place gets new ones.
_KEPT: dict[int, tuple[int, dict[tuple, Tensor]]] = {}


def _kept(weight: Tensor, key: tuple, make: Callable[[], Tensor]) -> Tensor:
    """``make()``, made once per version of ``weight`` under ``key``."""
    version, kept = _KEPT.get(id(weight), (-1, {}))
    if id(weight) not in _KEPT:
        weakref.finalize(weight, _KEPT.pop, id(weight), None)
    now = _weight_version(weight)
    if version != now:
        version, kept = now, {}
        _KEPT[id(weight)] = (version, kept)
    if key not in kept:
        kept[key] = make()
    return kept[key]


def _onednn(weight: Tensor) -> bool:
    """Whether a step multiplies by ``weight`` with oneDNN's packed GEMM: fp32 on a CPU whose torch
    has the op, outside autocast (which would hand it bf16 rows)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


# oneDNN's packed GEMM has no public torch API: these two call the private ops torch's own CPU
# compiler (inductor) emits for a linear map with a constant weight.
def _onednn_pack(weight: Tensor, first: int, rows: int) -> Tensor:
    """W[first : first + rows] in oneDNN's layout for products of a few rows (the hint: 5)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach()[first : first + rows].contiguous(), 5)


def _onednn_product(packed: Tensor, bias: Tensor | None, relu: bool) -> Affine:
    """x (N, in) -> x W^T + b by oneDNN with W ``packed`` (``_onednn_pack``), then ReLU if ``relu``."""
    attr = "relu" if relu else "none"
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr, [], "")


def affine(linear: nn.Module, first: int = 0, rows: int | None = None, relu: bool = False) -> Affine:
    """x (N, in) -> x W[first : first + rows]^T + b[first : first + rows] (default: all rows), then
    ReLU if ``relu``, for a plain :class:`nn.Linear` or an int8 one; any other module is called.
    In fp32 on the CPU by oneDNN's GEMM with W packed once (as CTranslate2 on AMD CPUs); else by
    x @ W^T with W^T kept contiguous."""
    int8 = _int8(linear, relu) if type(linear) is DynamicQuantizedLinear else None
    if int8 is not None:
        return int8
    if type(linear) is not nn.Linear:
        return (lambda x: F.relu(linear(x))) if relu else linear
    weight, bias = linear.weight, linear.bias
    rows = weight.shape[0] - first if rows is None else rows
    b = None if bias is None else bias[first : first + rows]
    if _onednn(weight):
        packed = _kept(weight, ("oneDNN", first, rows), lambda: _onednn_pack(weight, first, rows))
        return _onednn_product(packed, b, relu)
    w_t = _kept(weight, ("T", first, rows), lambda: weight[first : first + rows].t().contiguous())
    product = (lambda x: x @ w_t) if b is None else (lambda x: torch.addmm(b, x, w_t))
    return (lambda x: F.relu(product(x))) if relu else product


def _int8(linear: DynamicQuantizedLinear, relu: bool) -> Affine | None:
    """An int8 linear map (dynamic quantization) by its operator, as its ``forward`` calls it (the
    input quantized to 7 bits from version 4 on), with the ReLU fused where asked; None for another
    dtype (fp16: its ``forward``). Its packed weight has no public name: ``forward`` reads the same."""
    params = linear._packed_params
    if params.dtype != torch.qint8:
        return None
    packed, reduce_range = params._packed_params, not (linear.version is None or linear.version < 4)
    op = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
    return lambda x: op(x, packed, reduce_range)


def _query_map(attn: MultiHeadAttention) -> Affine:
    """W^Q (and its bias) of ``attn``: the layer's own map (:class:`QueryMap`, an int8 layer's), or
    the first D rows of the core's stacked [W^Q; W^K; W^V], or else the layer's ``project``."""
    if isinstance(attn, QueryMap):
        return affine(attn.q_proj)
    if type(attn.qkv_proj) is nn.Linear:
        return affine(attn.qkv_proj, 0, attn.d_model)
    return lambda y: attn.project(y, 0, 1)


def _feed_forward(ff: nn.Module) -> Affine:
    """The position-wise feed-forward network (eval mode: no dropout), or ``ff`` itself."""
    if not isinstance(ff, PositionwiseFeedForward):
        return ff
    w2 = affine(ff.linear2)
    if ff.activation == "relu":  # fused into the first product
        w1 = affine(ff.linear1, relu=True)
        return lambda x: w2(w1(x))
    w1, act = affine(ff.linear1), ACTIVATIONS[ff.activation]
    return lambda x: w2(act(w1(x)))


class SelfCache:
    """One layer's self-attention keys/values, (R, H, L, d_k) each for R rows and L positions,
    allocated (zeroed) on the first write and grown by a copy when rows or positions are added
    (:meth:`DecoderStep.add`); row i's position t written at its step t."""

    def __init__(self, rows: int, length: int):
        self.rows, self.length = rows, length
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def write(self, t: int | Tensor, k: Tensor, v: Tensor, filled: int) -> tuple[Tensor, Tensor]:
        """k, v (N, H, d_k) at position t (``t`` (N,): each row's own) -> the first ``filled``
        positions of the N rows, (N, H, filled, d_k). Positions a row has not written yet are zeros
        or an earlier row's: finite, for its causal bias to hide."""
        N, H, d_k = k.shape
        if self.k is None or self.v is None:
            self.k = k.new_zeros(self.rows, H, self.length, d_k)
            self.v = v.new_zeros(self.rows, H, self.length, v.shape[-1])
        row = slice(None, N) if isinstance(t, int) else torch.arange(N, device=k.device)
        self.k[row, :, t] = k
        self.v[row, :, t] = v
        return self.k[:N, :, :filled], self.v[:N, :, :filled]

    def grow(self, rows: int, length: int) -> None:
        """Room for at least ``rows`` rows of ``length`` positions, what is written kept."""
        self.rows, self.length = max(self.rows, rows), max(self.length, length)
        if self.k is not None and self.v is not None and self.k.shape[::2] != (self.rows, self.length):
            self.k, self.v = (_grown(x, self.rows, self.length) for x in (self.k, self.v))

    def reorder(self, index: Tensor, filled: int, start: int = 0) -> None:
        """Row ``start + i`` becomes old row ``index[i]`` over the ``filled`` positions written so far."""
        if self.k is not None and self.v is not None:
            end = start + len(index)
            self.k[start:end, :, :filled] = self.k[:, :, :filled].index_select(0, index)
            self.v[start:end, :, :filled] = self.v[:, :, :filled].index_select(0, index)


def _grown(x: Tensor, rows: int, length: int) -> Tensor:
    """x (R, H, L, d) in a zeroed buffer of ``rows`` rows and ``length`` positions."""
    out = x.new_zeros(rows, x.shape[1], length, x.shape[3])
    out[: x.shape[0], :, : x.shape[2]] = x
    return out


class Positions(NamedTuple):
    """Where a step's rows are: ``t``, the position of every row (an int) or of each (N,);
    ``filled``, the positions the self-attention reads (one past the last); ``bias`` (N * H, 1,
    filled), 0 where a row may attend and -inf past its own position (None: every row at t)."""

    t: int | Tensor
    filled: int
    bias: Tensor | None


def _attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """softmax(q k^T * scale + bias) v for G groups of heads: q (G, T, d_k), k, v (G, S, d_k),
    ``bias`` (G, 1, S) 0 or -inf (None: every key) -> (G, T, d_k). In fp32 the formula as
    :func:`~scratchformer.core.attention.scaled_dot_product_attention` writes it (q scaled first),
    as three batched products; in bf16/fp16 as the layer attends."""
    if q.dtype not in (torch.float32, torch.float64):
        mask = None if bias is None else (bias == 0)[:, None]  # back to bool, True = may attend
        return attn.attend(q[:, None], k[:, None], v[:, None], mask)[:, 0]
    q = q * attn.scale
    k_t = k.transpose(1, 2)
    scores = torch.bmm(q, k_t) if bias is None else torch.baddbmm(bias, q, k_t)
    return torch.bmm(torch.softmax(scores, dim=-1), v)


class _Layer:
    """A :class:`DecoderLayer`'s maps, gathered once: norms, products (:func:`affine`), the feed-forward."""

    def __init__(self, layer: DecoderLayer):
        self.norm_first = layer.norm_first
        self.norm1, self.norm2, self.norm3 = layer.norm1, layer.norm2, layer.norm3
        self.self_attn, self.cross_attn = layer.self_attn, layer.cross_attn
        self.qkv = affine(layer.self_attn.qkv_proj)
        self.self_out = affine(layer.self_attn.out_proj)
        self.query = _query_map(layer.cross_attn)
        self.cross_out = affine(layer.cross_attn.out_proj)
        self.feed_forward = _feed_forward(layer.feed_forward)

    def sublayer(self, x: Tensor, f: Callable[[Tensor], Tensor], norm: nn.Module) -> Tensor:
        """x + f(norm(x)) (pre-LN) or norm(x + f(x)) (post-LN, the paper); eval mode: no dropout."""
        return x + f(norm(x)) if self.norm_first else norm(x + f(x))

    def self_attention(self, y: Tensor, cache: SelfCache, at: Positions) -> Tensor:
        """y (N, D) at its position attends to itself and the cached positions before it: (N, D)."""
        attn = self.self_attn
        N, H, d_k = y.shape[0], attn.num_heads, attn.d_k
        q, k, v = self.qkv(y).view(N, 3, H, d_k).unbind(1)  # (N, H, d_k) each
        keys, values = cache.write(at.t, k, v, at.filled)  # (N, H, filled, d_k): N * H groups of a query
        out = _attend(attn, q.reshape(N * H, 1, d_k), keys.flatten(0, 1), values.flatten(0, 1), at.bias)
        return self.self_out(out.view(N, H * d_k))

    def cross_attention(
        self, y: Tensor, memory_kv: tuple[Tensor, Tensor], bias: Tensor | None, beams: int
    ) -> Tensor:
        """y (Bs * beams, D), a sentence's beams in consecutive rows, attends to its sentence's
        memory keys/values (Bs * H, S, d_k): the beams are the queries of one attention. (N, D)."""
        attn = self.cross_attn
        N, H, d_k = y.shape[0], attn.num_heads, attn.d_k
        q = self.query(y).view(N // beams, beams, H, d_k).transpose(1, 2)  # (Bs, H, beams, d_k)
        out = _attend(attn, q.reshape(-1, beams, d_k), *memory_kv, bias)  # (Bs * H, beams, d_k)
        return self.cross_out(out.view(N // beams, H, beams, d_k).transpose(1, 2).reshape(N, H * d_k))

    def __call__(
        self,
        x: Tensor,
        cache: SelfCache,
        at: Positions,
        memory_kv: tuple[Tensor, Tensor],
        bias: Tensor | None,
        beams: int,
    ) -> Tensor:
        """The layer's three sub-layers on x (N, D) at its positions: (N, D)."""
        x = self.sublayer(x, lambda y: self.self_attention(y, cache, at), self.norm1)
        x = self.sublayer(x, lambda y: self.cross_attention(y, memory_kv, bias, beams), self.norm2)
        return self.sublayer(x, self.feed_forward, self.norm3)


def rows_of(sentences: Tensor, each: int) -> Tensor:
    """The rows (len(sentences) * each,) of ``sentences`` (B',) in a layout of ``each`` consecutive
    rows a sentence (its beams, its samples, its heads), in order."""
    return (sentences[:, None] * each + torch.arange(each, device=sentences.device)).view(-1)


def _padded(x: Tensor, S: int) -> Tensor:
    """Memory keys or values (G, S', d_k) padded with zeros to S positions."""
    return F.pad(x, (0, 0, 0, S - x.shape[1]))


def _padded_bias(bias: Tensor | None, keys: Tensor, S: int) -> Tensor:
    """The additive padding bias (G, 1, S') of memory ``keys`` (G, S', d_k) (None: zeros), -inf
    over the positions padded to S."""
    G, width = keys.shape[:2]
    bias = keys.new_zeros(G, 1, width) if bias is None else bias
    return F.pad(bias, (0, S - width), value=float("-inf"))


def _memory_kv(attn: MultiHeadAttention, memory: Tensor) -> tuple[Tensor, Tensor]:
    """The memory (B, S, D) projected to keys and values, once: (B * H, S, d_k) each, a sentence's
    H heads in consecutive groups."""
    k, v = attn.project(memory, 1, 2).split(attn.d_model, dim=-1)
    return attn.split_heads(k).flatten(0, 1).contiguous(), attn.split_heads(v).flatten(0, 1).contiguous()


class DecoderStep:
    """One decoding step of ``model``'s decoder stack (:class:`DecoderLayer` s, eval mode) for the
    live rows, on the memory (B, S, D) of B sentences and its padding mask (B, S), True = real;
    sentences may join (:meth:`add`) and leave (:meth:`keep`) between steps."""

    def __init__(self, model: EncoderDecoder, memory: Tensor, mask: Tensor | None, rows: int, length: int):
        embed = target_embedding(model)
        if embed is None:
            raise TypeError(f"DecoderStep: {type(model).__name__} has no known target embedding")
        self.embed = embed
        self.layers = [_Layer(layer) for layer in model.decoder.layers]
        self.final_norm = model.decoder.norm
        self.generator = affine(model.generator)
        self.heads = self.layers[0].cross_attn.num_heads if self.layers else 1
        self.memory_kv = [_memory_kv(layer.cross_attn, memory) for layer in self.layers]
        self.bias = self._additive(mask, self.memory_kv, memory.dtype)
        self.caches = [SelfCache(rows, length) for _ in self.layers]

    def _additive(
        self, mask: Tensor | None, memory_kv: list[tuple[Tensor, Tensor]], dtype: torch.dtype
    ) -> Tensor | None:
        """The padding mask (B, S), True = may attend, in its additive form (module docstring): a
        (B * H, 1, S) bias, 0 where True and -inf where False (None: no padding). A sentence with no
        real token attends to every key and gets zeros, as the core's rule has it (docs/masks.md):
        its bias is 0 and its memory values (in ``memory_kv``) are zeroed, so that its attention is
        exactly 0."""
        if mask is None or bool(mask.all()):
            return None
        empty = ~mask.any(dim=1)  # (B,)
        if bool(empty.any()):
            mask, groups = mask | empty[:, None], empty.repeat_interleave(self.heads)
            for _, v in memory_kv:
                v[groups] = 0.0
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        return bias.repeat_interleave(self.heads, dim=0)[:, None, :]

    def _positions(self, t: int | Tensor) -> Positions:
        """Where the step's ``rows`` are (:class:`Positions`): one position, or each row's own."""
        if isinstance(t, int) or bool((t == t[0]).all()):
            t = t if isinstance(t, int) else int(t[0])
            return Positions(t, t + 1, None)
        filled = int(t.max()) + 1
        later = torch.arange(filled, device=t.device) > t[:, None]  # (N, filled): not yet, for this row
        dtype = self.memory_kv[0][0].dtype
        bias = torch.zeros(later.shape, dtype=dtype, device=t.device).masked_fill_(later, float("-inf"))
        return Positions(t, filled, bias.repeat_interleave(self.heads, dim=0)[:, None, :])

    def __call__(self, tokens: Tensor, t: int | Tensor, beams: int) -> Tensor:
        """tokens (N, 1), the token at position t of each row (``t`` (N,): each row's own),
        ``beams`` rows per sentence -> next-token logits (N, V) in fp32."""
        at = self._positions(t)
        x = self.embed(tokens, at.t)[:, 0]  # (N, D)
        for layer, cache, memory_kv in zip(self.layers, self.caches, self.memory_kv):
            x = layer(x, cache, at, memory_kv, self.bias, beams)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.generator(x).float()

    def keep(self, rows: Tensor, sentences: Tensor | None, filled: int | Sequence[int]) -> None:
        """Continue from ``rows`` (N',) of the step's rows; ``sentences``: the live sentences kept
        (None: all of them); ``filled``: the positions written so far, of every row, or of each kept
        sentence (non-increasing: sentences in joining order, :class:`~scratchformer.generation.
        continuous.ContinuousSearch`), whose rows are then copied in spans of sentences, each over
        the positions its first sentence filled, not every row over the most any filled."""
        if isinstance(filled, int):
            spans = [(0, len(rows), filled)]
        else:
            beams, step = len(rows) // len(filled), max(1, -(-len(filled) // _SPANS))
            spans = [
                (a * beams, min(a + step, len(filled)) * beams, max(filled[a : a + step]))
                for a in range(0, len(filled), step)
            ]
        for cache in self.caches:  # (a span's rows come from rows at or after its start: in order)
            for start, end, positions in spans:
                cache.reorder(rows[start:end], positions, start)
        if sentences is not None:  # their groups of H heads
            groups = rows_of(sentences, self.heads)
            self.memory_kv = [(k[groups], v[groups]) for k, v in self.memory_kv]
            self.bias = None if self.bias is None else self.bias[groups]

    def add(self, memory: Tensor, mask: Tensor | None, rows: int, length: int) -> None:
        """B' sentences join after the live ones: their memory (B', S', D) and padding mask (B',
        S'); the caches grow to ``rows`` rows in all and ``length`` positions. The memory keys and
        values of both are padded to the longer S, the padding hidden by the bias."""
        new_kv = [_memory_kv(layer.cross_attn, memory) for layer in self.layers]
        new_bias = self._additive(mask, new_kv, memory.dtype)
        widths = self.memory_kv[0][0].shape[1], memory.shape[1]
        S = max(widths)
        if self.bias is not None or new_bias is not None or widths[0] != widths[1]:
            self.bias = torch.cat(
                [
                    _padded_bias(bias, kv[0][0], S)
                    for bias, kv in ((self.bias, self.memory_kv), (new_bias, new_kv))
                ]
            )
        self.memory_kv = [
            (torch.cat([_padded(k, S), _padded(k2, S)]), torch.cat([_padded(v, S), _padded(v2, S)]))
            for (k, v), (k2, v2) in zip(self.memory_kv, new_kv)
        ]
        for cache in self.caches:
            cache.grow(rows, length)

    def trim(self) -> None:
        """Drop the memory positions no live sentence attends to (padding for sentences that left)."""
        if self.bias is None:
            return
        used = (self.bias[:, 0] == 0).any(dim=0).nonzero()
        S = int(used.max()) + 1 if len(used) else self.bias.shape[-1]
        if S < self.bias.shape[-1]:
            self.memory_kv = [(k[:, :S], v[:, :S]) for k, v in self.memory_kv]
            self.bias = self.bias[..., :S]
        if bool((self.bias == 0).all()):
            self.bias = None
