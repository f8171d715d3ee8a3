"""Scaled dot-product and multi-head attention (paper, sections 3.2.1 and 3.2.2)::

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The per-head maps W_i^Q of all h heads side by side form one D x D matrix W^Q (likewise W^K, W^V
and W^O): four D x D projections, not one shared d_k-sized map. W^Q, W^K and W^V are stored
stacked as one (3D, D) matrix, as torch.nn's ``in_proj_weight`` and nanoGPT's ``c_attn``:
self-attention projects with one matmul and splits; cross-attention takes the rows it needs.
Masks are bool, True = may attend (:mod:`scratchformer.core.masks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.core.checks import check_attention_inputs, check_kernel_inputs
from scratchformer.core.masks import expand_attention_mask, fold_causal

__all__ = ["HALF", "MultiHeadAttention", "fuse_qkv", "scaled_dot_product_attention"]

HALF = (torch.float16, torch.bfloat16)  # the softmax of these runs in fp32


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
    """softmax(q k^T * scale) v for every head: q (B, H, T, d_k), k (B, H, S, d_k), v (B, H, S, d_v)
    -> (B, H, T, d_v), and the (B, H, T, S) probabilities (before dropout) if ``need_weights``.

    ``mask``: bool, broadcastable to (B, H, T, S), True = may attend. ``is_causal``: also hide from
    query i the keys after it (bottom-right aligned when S > T). ``scale``: default 1 / sqrt(d_k).

    Two kernels, one formula: the fused ``F.scaled_dot_product_attention``, or the formula written
    out when the weights are needed. A query that may attend to no key gets zeros (and zero weights
    and gradient) in every dtype: it attends everywhere, then is zeroed. (-inf everywhere gives
    softmax 0/0 = NaN; -1e9 overflows to -inf in fp16.)
    """
    check_kernel_inputs(q, k, v, mask)
    T, S = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask, is_causal = fold_causal(mask, is_causal, T, S, q.device, force=need_weights)
    row_has_key = None
    if mask is not None:
        row_has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
        mask = mask | ~row_has_key

    if need_weights:
        scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, T, S); scaled first: no fp16 overflow
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        dtype = torch.float32 if scores.dtype in HALF else None  # the softmax of half precision in fp32
        weights = torch.softmax(scores, dim=-1, dtype=dtype).to(q.dtype)
        out = torch.matmul(F.dropout(weights, dropout_p) if dropout_p > 0 else weights, v)
    else:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        weights = None

    if row_has_key is not None:
        out = out.masked_fill(~row_has_key, 0.0)
        weights = None if weights is None else weights.masked_fill(~row_has_key, 0.0)
    return out, weights


def fuse_qkv(state: dict[str, Tensor], prefix: str = "") -> None:
    """Stack, in place, 0.1 checkpoints' separate ``q_proj``, ``k_proj``, ``v_proj`` into ``qkv_proj``."""
    for name in [n for n in state if n.startswith(prefix) and n.split(".")[-2:-1] == ["q_proj"]]:
        stem, kind = name.rsplit("q_proj.", 1)
        parts = [f"{stem}{x}_proj.{kind}" for x in "qkv"]
        if (
            all(p in state for p in parts)
            and f"{stem}qkv_proj.{kind}" not in state
            and len({state[p].shape for p in parts}) == 1
        ):  # else left for the caller's error report
            state[f"{stem}qkv_proj.{kind}"] = torch.cat([state.pop(p) for p in parts])


class MultiHeadAttention(nn.Module):
    """H attention heads in parallel, each of width d_k = D / H (``dropout``: on the probabilities)."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if num_heads <= 0 or d_model % num_heads != 0:
            raise ValueError(
                f"num_heads must be positive, got {num_heads}"
                if num_heads <= 0
                else f"d_model={d_model} must be divisible by num_heads={num_heads} (d_k = D / H)"
            )
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.d_k = d_model // num_heads
        self.scale = self.d_k**-0.5  # 1 / sqrt(d_k)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # [W^Q; W^K; W^V], all heads
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.reset_parameters()

    def _load_from_state_dict(self, state: dict[str, Tensor], prefix: str, *args: Any) -> None:
        fuse_qkv(state, prefix)  # checkpoints of 0.1 hold W^Q, W^K, W^V separately
        super()._load_from_state_dict(state, prefix, *args)

    def reset_parameters(self) -> None:
        """Xavier-uniform, W^Q, W^K, W^V with gain 1/sqrt(2) (the std of torch.nn's packed (3D, D)
        init, and fairseq's); zero biases, as torch.nn.MultiheadAttention."""
        for w in self.qkv_proj.weight.data.chunk(3):
            nn.init.xavier_uniform_(w, gain=2**-0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for bias in (b for b in (self.qkv_proj.bias, self.out_proj.bias) if b is not None):
            nn.init.zeros_(bias)

    def project(self, x: Tensor, first: int, count: int) -> Tensor:
        """x (B, L, D) times ``count`` blocks of [W^Q; W^K; W^V] from block ``first`` (0: W^Q, 1: W^K,
        2: W^V), biases added: (B, L, count * D)."""
        rows, bias = slice(first * self.d_model, (first + count) * self.d_model), self.qkv_proj.bias
        return F.linear(x, self.qkv_proj.weight[rows], None if bias is None else bias[rows])

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, d_k): head i is features [i * d_k, (i + 1) * d_k)."""
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.d_k).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """The heads' attention as :meth:`forward` computes it (a subclass's kernel too): q (B, H, T,
        d_k), k, v (B, H, S, d_k), ``mask`` bool (B|1, H|1, T|1, S), True = may attend -> (B, H, T, d_k)."""
        return self._attend(q, k, v, mask, False, False)[0]

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
        cache: Any = None,
        static_kv: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, T, D) to ``key``/``value`` (B, S, D), default ``query``: returns
        (B, T, D) and the (B, H, T, S) weights if ``need_weights`` (else None).

        Masks: ``key_padding_mask`` (B, S), True at real keys (cached ones counted); ``attn_mask``
        (T, S), (B, T, S) or (B, H, T, S) (B, H, T may be 1), True = may attend; ``is_causal``.
        ``cache`` (:class:`~scratchformer.generation.KVCache`), updated in place: self-attention
        appends; with ``static_kv`` (cross-attention) the memory's keys/values are made on the first
        call and reused (pass the same memory or None later, a new cache for a new memory).
        """
        B, T, D = check_attention_inputs(query, key, value, self.d_model, cache, static_kv)
        reuse = cache is not None and static_kv and cache.k is not None
        self_attention = not static_kv and (key is None or key is query) and (value is None or value is query)
        key = query if key is None and not static_kv else key
        value = key if value is None else value
        if self_attention:
            q, k, v = self.qkv_proj(query).split(D, dim=-1)  # one matmul: (B, T, D) each
        else:
            q = self.project(query, 0, 1)
            if not reuse:  # keys and values of the memory: one matmul when key is value
                k, v = (
                    self.project(key, 1, 2).split(D, dim=-1)
                    if value is key
                    else (self.project(key, 1, 1), self.project(value, 2, 1))
                )
        q = self.split_heads(q)  # (B, H, T, d_k)
        if reuse:  # cross-attention: the memory was projected on the first step
            k, v = cache.k, cache.v
        else:
            k, v = self.split_heads(k), self.split_heads(v)  # (B, H, S, d_k)
            if cache is not None and static_kv:
                cache.k, cache.v = k, v
            elif cache is not None:
                k, v = cache.append(k, v)

        mask = expand_attention_mask(key_padding_mask, attn_mask, B, self.num_heads, T, k.shape[2])
        out, weights = self._attend(q, k, v, mask, is_causal, need_weights)
        out = out.transpose(1, 2).reshape(B, T, D)  # concatenate the heads: (B, T, D)
        return self.out_proj(out), weights

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the heads q (B, H, T, d_k) to k, v (B, H, S, d_k) (a speed path may override)."""
        p = self.dropout if self.training else 0.0  # dropout on the probabilities
        return scaled_dot_product_attention(
            q, k, v, mask, is_causal=is_causal, need_weights=need_weights, dropout_p=p, scale=self.scale
        )
