"""Scaled dot-product and multi-head attention (paper, sections 3.2.1 and 3.2.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The per-head projections W_i^Q of all h heads together form one full D x D matrix W^Q (likewise
for K, V and the output W^O): four D x D projections, not one shared d_k-sized map.

Masks follow the convention of :mod:`scratchformer.core.masks`: bool, True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.core.masks import causal_mask, combine_masks, expand_attention_mask
from scratchformer.fast.packing import Packing
from scratchformer.core.checks import check_features, check_last_dim

__all__ = ["KVCache", "MultiHeadAttention", "scaled_dot_product_attention"]


def _check_kernel_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected shape (B, H, L, d) (4 dims), got {tuple(t.shape)}")
    if k.shape[:-1] != v.shape[:-1] or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q, k, v: expected (B, H, T, d_k), (B, H, S, d_k), (B, H, S, d_v), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask: expected dtype torch.bool (True = may attend), got {mask.dtype}")
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if mask.dim() != 4 or any(m not in (1, t) for m, t in zip(mask.shape, target)):
            raise ValueError(f"mask: expected a shape broadcastable to (B, H, T, S)={target}, got {tuple(mask.shape)}")


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    scale: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T * scale) v over the heads, with one of two kernels.

    Args:
        q: (B, H, T, d_k) queries.
        k: (B, H, S, d_k) keys.
        v: (B, H, S, d_v) values.
        mask: bool, broadcastable to (B, H, T, S); True = may attend.
        is_causal: also forbid query i to see keys after its own position (bottom-right aligned
            when S > T, so the T queries are the last T positions).
        dropout_p: dropout on the attention probabilities.
        need_weights: if True use the explicit kernel and return the probabilities.
        scale: defaults to 1 / sqrt(d_k).

    Returns:
        (B, H, T, d_v) output and, if ``need_weights``, (B, H, T, S) probabilities (before dropout).

    Kernels: ``torch.nn.functional.scaled_dot_product_attention`` (fused, fast) when the weights
    are not needed, the explicit formula when they are. A query row that may attend to no key at
    all returns zeros (and zero weights) with zero gradient, in every dtype: such rows are let
    attend everywhere, then their result is zeroed. This avoids both failure modes of the usual
    tricks: -inf everywhere gives softmax 0/0 = NaN, and -1e9 overflows to -inf in fp16.
    """
    _check_kernel_inputs(q, k, v, mask)
    T, S = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if is_causal and (mask is not None or need_weights or T != S):
        mask = combine_masks(mask, causal_mask(T, S, device=q.device))
        is_causal = False

    row_has_key = None
    if mask is not None:
        row_has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
        mask = mask | ~row_has_key

    if need_weights:
        scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, T, S); scale first: no fp16 overflow
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        half = scores.dtype in (torch.float16, torch.bfloat16)
        weights = torch.softmax(scores.float() if half else scores, dim=-1).to(q.dtype)  # fp16/bf16: in fp32
        out = torch.matmul(F.dropout(weights, dropout_p) if dropout_p > 0 else weights, v)
    else:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        weights = None

    if row_has_key is not None:
        out = out.masked_fill(~row_has_key, 0.0)
        if weights is not None:
            weights = weights.masked_fill(~row_has_key, 0.0)
    return out, weights


@dataclass
class KVCache:
    """Projected keys and values of one attention layer, split into heads: (B, H, S, d_k).

    Self-attention appends the new positions' keys/values at each decoding step; cross-attention
    computes the encoder memory's keys/values once and reuses them ("static").

    Appending without autograd writes into a buffer that doubles its length when full, so a step
    copies only the new position, not the whole prefix as ``torch.cat`` would; ``k`` and ``v`` are
    then views of the buffer's first S positions.
    """

    k: Tensor | None = None
    v: Tensor | None = None
    _buffers: tuple[Tensor, Tensor] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys/values (B, H, S_new, d_k) of new positions; returns all of them (B, H, S, d_k)."""
        if self.k is None or self.v is None:
            self.k, self.v, self._buffers = k, v, None
            return k, v
        if torch.is_grad_enabled() and (k.requires_grad or self.k.requires_grad):
            self.k, self.v, self._buffers = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2), None
            return self.k, self.v
        old, new = self.k.shape[2], self.k.shape[2] + k.shape[2]
        buffers = self._buffers
        if buffers is None or buffers[0].shape[2] < new or not _is_prefix_view(self.k, buffers[0]):
            size = (*k.shape[:2], max(2 * new, 16), k.shape[3])
            buffers = (k.new_empty(size), v.new_empty(size[:3] + v.shape[3:]))
            buffers[0][:, :, :old] = self.k
            buffers[1][:, :, :old] = self.v
            self._buffers = buffers
        buffers[0][:, :, old:new] = k
        buffers[1][:, :, old:new] = v
        self.k, self.v = buffers[0][:, :, :new], buffers[1][:, :, :new]
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) in that order (beam search reshuffles hypotheses)."""
        if self.k is None or self.v is None:
            return
        length, buffers = self.k.shape[2], self._buffers
        if buffers is not None and _is_prefix_view(self.k, buffers[0]) and _is_prefix_view(self.v, buffers[1]):
            k_buffer, v_buffer = buffers[0].index_select(0, index), buffers[1].index_select(0, index)
            self._buffers = (k_buffer, v_buffer)  # keeps its spare room for the next appends
            self.k, self.v = k_buffer[:, :, :length], v_buffer[:, :, :length]
        else:
            self.k, self.v, self._buffers = self.k.index_select(0, index), self.v.index_select(0, index), None


def _is_prefix_view(t: Tensor, buffer: Tensor) -> bool:
    """Whether ``t`` is still the first positions of ``buffer`` (nobody replaced the cache's k/v)."""
    return t.data_ptr() == buffer.data_ptr() and t.stride() == buffer.stride() and t.shape[:2] == buffer.shape[:2]


class MultiHeadAttention(nn.Module):
    """h attention heads in parallel, each of width d_k = D / h.

    Args:
        d_model: D, the model width.
        num_heads: H, the number of heads; must divide D.
        dropout: dropout on the attention probabilities.
        bias: whether the four projections have biases.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if num_heads <= 0 or d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} must be divisible by num_heads={num_heads} (d_k = D / H)"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.scale = self.d_k**-0.5  # 1 / sqrt(d_k)
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q for all heads
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W^K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W^V
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.record_weights = False  # set by scratchformer.tools.attention_maps.record_attention
        self.recorded: list[Tensor] = []
        self._stacked_qkv: tuple[tuple[object, ...], Tensor, Tensor | None] | None = None  # inference cache
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform, W^Q, W^K, W^V with gain 1/sqrt(2) (the std torch.nn gets from its packed
        3D x D in_proj, and what fairseq uses); zero biases, as torch.nn.MultiheadAttention."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=2**-0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, d_k)."""
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.d_k).transpose(1, 2)

    def _stacked_qkv_weights(self) -> tuple[Tensor, Tensor | None]:
        """[W^Q; W^K; W^V] as one (3D, D) matrix (and the biases as one 3D vector), rebuilt only when
        a weight changes (a new storage or an in-place update bumps ``_version``)."""
        params = [p for proj in (self.q_proj, self.k_proj, self.v_proj) for p in (proj.weight, proj.bias)
                  if p is not None]
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if self._stacked_qkv is None or self._stacked_qkv[0] != key:
            weight, bias = self._stack_qkv()
            self._stacked_qkv = (key, weight.detach(), None if bias is None else bias.detach())
        return self._stacked_qkv[1], self._stacked_qkv[2]

    def _stack_qkv(self) -> tuple[Tensor, Tensor | None]:
        """[W^Q; W^K; W^V] (3D, D) and [b^Q; b^K; b^V] (3D,) (None without biases), through autograd."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight for p in projs])
        bias = torch.cat([p.bias for p in projs]) if self.q_proj.bias is not None else None
        return weight, bias

    def _project_self(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The Q, K, V projections of self-attention input x (..., D): three (..., D).

        One matmul with the stacked (3D, D) weight [W^Q; W^K; W^V] replaces three: the same
        arithmetic, one pass over x and larger matrix products. With autograd the stack is built
        anew each call (its backward hands each block its gradient); in inference it is cached.
        """
        if torch.compiler.is_compiling():  # the compiler fuses on its own
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        weight, bias = self._stack_qkv() if torch.is_grad_enabled() else self._stacked_qkv_weights()
        q, k, v = F.linear(x, weight, bias).chunk(3, dim=-1)
        return q, k, v

    def _keys_values(
        self,
        key: Tensor | None,
        value: Tensor | None,
        batch: int,
        cache: KVCache | None,
        static_kv: bool,
        projected: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Project key/value (B, S_new, D) (unless ``projected`` holds them already) to heads
        (B, H, S, d_k), reading and updating the cache."""
        if cache is not None and cache.k is not None and cache.k.shape[0] != batch:
            raise ValueError(
                f"cache: holds keys for batch size {cache.k.shape[0]}, but the input has batch size "
                f"{batch} (reorder the cache and its inputs together)"
            )
        if cache is not None and static_kv and cache.k is not None and cache.v is not None:
            if key is not None and key.shape[1] != cache.k.shape[2]:
                raise ValueError(
                    f"memory: the cache holds keys/values of a memory of length {cache.k.shape[2]}, got "
                    f"length {key.shape[1]}; use a new cache for a new memory"
                )
            return cache.k, cache.v  # cross-attention: the memory was projected on the first step
        if projected is None:
            assert key is not None and value is not None
            projected = self.k_proj(key), self.v_proj(value)
        k, v = self._split_heads(projected[0]), self._split_heads(projected[1])
        if cache is not None:
            if static_kv:
                cache.k, cache.v = k, v
            else:
                k, v = cache.append(k, v)  # self-attention: append the new positions
        return k, v

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
        static_kv: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, T, D).
            key, value: (B, S, D); default to ``query`` (self-attention). S may differ from T.
            key_padding_mask: (B, S) bool, True at real keys. With a cache, S counts the cached
                positions too.
            attn_mask: (T, S), (B, T, S) or (B, H, T, S) bool, True = may attend.
            is_causal: add the causal mask (query i sees keys up to its own position).
            need_weights: also return the (B, H, T, S) attention probabilities.
            cache: incremental decoding state, updated in place. Without ``static_kv`` the new
                keys/values are appended to it; with ``static_kv`` (cross-attention) they are
                computed on the first call and reused afterwards: pass the same memory (or None)
                on later calls, and a new cache for a new memory.

        Returns:
            (B, T, D) output and the (B, H, T, S) weights or None.
        """
        check_features("query", query, "(B, T, D)", self.d_model)
        B, T = query.shape[0], query.shape[1]
        reuse = cache is not None and static_kv and cache.k is not None
        if key is None and not reuse:
            if static_kv:
                raise ValueError("key: cross-attention (static_kv) needs the memory (B, S, D) on its first call")
            key = query  # self-attention
        value = key if value is None else value
        if key is not None and value is not None:
            check_features("key", key, "(B, S, D)", self.d_model, batch=B)
            check_features("value", value, "(B, S, D)", self.d_model, batch=B)
            if value.shape[1] != key.shape[1]:
                raise ValueError(
                    f"value: expected the key's shape (B, S, D)={tuple(key.shape)}, got {tuple(value.shape)}"
                )

        if key is query and value is query and not static_kv:  # self-attention
            q_new, k_new, v_new = self._project_self(query)
            q = self._split_heads(q_new)  # (B, H, T, d_k)
            k, v = self._keys_values(key, value, B, cache, static_kv, (k_new, v_new))  # (B, H, S, d_k)
        else:
            q = self._split_heads(self.q_proj(query))
            k, v = self._keys_values(key, value, B, cache, static_kv)
        S = k.shape[2]

        mask = expand_attention_mask(key_padding_mask, attn_mask, B, self.num_heads, T, S)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights or self.record_weights,
            scale=self.scale,
        )
        if self.record_weights and weights is not None:
            self.recorded.append(weights.detach())
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # concat heads: (B, T, D)
        return self.out_proj(out), weights

    def packed_self_attention(self, x: Tensor, packing: Packing, attn_mask: Tensor | None = None) -> Tensor:
        """Self-attention of packed real tokens (see :mod:`scratchformer.fast.packing`).

        Args:
            x: (N, D) the real tokens of a (B, T) batch, packed by ``packing``.
            packing: where they sit; its key-padding mask hides the padding from every query.
            attn_mask: (T, T), (B, T, T) or (B, H, T, T) bool, True = may attend.

        Returns:
            (N, D). The projections run on the N tokens only; attention itself on (B, H, T, T).
        """
        check_last_dim("x", x, self.d_model, "(N, D)")
        B, T = packing.batch, packing.length
        q, k, v = (self._split_heads(packing.unpack(t)) for t in self._project_self(x))  # (B, H, T, d_k)
        mask = expand_attention_mask(packing.key_padding_mask, attn_mask, B, self.num_heads, T, T)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, dropout_p=self.dropout if self.training else 0.0, need_weights=self.record_weights,
            scale=self.scale,
        )
        if self.record_weights and weights is not None:
            self.recorded.append(weights.detach())
        return self.out_proj(packing.pack(out.transpose(1, 2).reshape(B, T, self.d_model)))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"
