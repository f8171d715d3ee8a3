"""The encoder-decoder Transformer (paper, section 3 and figure 1).

    logits = Generator(Decoder(Embed(tgt), Encoder(Embed(src))))

The model returns logits (B, T, V); the softmax belongs to the loss or the decoding algorithm,
never to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from scratchformer.core.decoder import Decoder, DecoderCache, DecoderLayer
from scratchformer.core.embedding import TokenEmbedding
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.core.masks import padding_mask
from scratchformer.core.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from scratchformer.core.checks import DictConfig, check_features, check_mask, check_model_config, check_tokens

__all__ = ["Transformer", "TransformerConfig"]


@dataclass
class TransformerConfig(DictConfig):
    """Hyper-parameters of :class:`Transformer`; the defaults are the paper's base model.

    Attributes:
        src_vocab_size, tgt_vocab_size: V of each side.
        d_model: D.  num_heads: H.  d_ff: feed-forward inner width.
        num_encoder_layers, num_decoder_layers: N of each stack.
        dropout: P_drop, everywhere (embeddings, sub-layers, attention, FFN).
        attention_dropout: on the attention probabilities; None = ``dropout``.
        activation: "relu" (paper) or "gelu".
        norm_first: False = post-LN (paper), True = pre-LN.
        final_norm: LayerNorm after each stack; None means "if norm_first" (the usual choice;
            ``torch.nn.Transformer`` always has one).
        layer_norm_eps: LayerNorm epsilon.  bias: biases in the linear maps.
        max_len: longest sequence accepted; longer input is a ValueError.
        positional: "sinusoidal" (paper) or "learned".
        share_embeddings: one embedding matrix for source and target (needs equal vocabularies).
        tie_output: the output projection reuses the target embedding matrix (paper, 3.4).
        pad_id: padding token id, used to build padding masks automatically (None: no padding).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float | None = None
    activation: str = "relu"
    norm_first: bool = False
    final_norm: bool | None = None
    layer_norm_eps: float = 1e-5
    bias: bool = True
    max_len: int = 1024
    positional: str = "sinusoidal"
    share_embeddings: bool = False
    tie_output: bool = False
    pad_id: int | None = 0

    def __post_init__(self) -> None:
        check_model_config(
            self,
            ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff", "max_len", "layer_norm_eps"),
            (self.src_vocab_size, self.tgt_vocab_size),
        )
        for name in ("num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )


def _positional(config: TransformerConfig) -> nn.Module:
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.max_len, config.d_model)
    return SinusoidalPositionalEncoding(config.d_model, config.max_len)


class Transformer(nn.Module):
    """Encoder-decoder Transformer returning next-token logits.

    Example:
        >>> cfg = TransformerConfig(src_vocab_size=100, tgt_vocab_size=100, d_model=32,
        ...                         num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2)
        >>> model = Transformer(cfg)
        >>> logits = model(src, tgt)  # src (B, S), tgt (B, T) -> (B, T, V)
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = c = config
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else TokenEmbedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        )
        self.src_pos = _positional(c)
        self.tgt_pos = _positional(c)
        self.dropout = nn.Dropout(c.dropout)

        layer_args = (c.d_model, c.num_heads, c.d_ff, c.dropout, c.activation, c.norm_first, c.layer_norm_eps, c.bias,
                      c.attention_dropout)
        final_norm = c.norm_first if c.final_norm is None else c.final_norm
        self.encoder = Encoder(
            [EncoderLayer(*layer_args) for _ in range(c.num_encoder_layers)],
            LayerNorm(c.d_model, c.layer_norm_eps) if final_norm else None,
        )
        self.decoder = Decoder(
            [DecoderLayer(*layer_args) for _ in range(c.num_decoder_layers)],
            LayerNorm(c.d_model, c.layer_norm_eps) if final_norm else None,
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=not c.tie_output)
        if c.tie_output:
            self.generator.weight = self.tgt_embed.weight
        else:
            nn.init.xavier_uniform_(self.generator.weight)

    def num_parameters(self) -> int:
        """Trainable parameters, shared matrices counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def source_padding_mask(self, src: Tensor) -> Tensor | None:
        """(B, S) bool, True at real source tokens; None if the config has no pad_id."""
        return None if self.config.pad_id is None else padding_mask(src, self.config.pad_id)

    def _check_padding_mask(self, name: str, mask: Tensor | None, tokens: Tensor) -> None:
        if mask is not None:
            check_mask(name, mask, [tuple(tokens.shape)], ["(B, L)"])

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """src (B, S) token ids -> memory (B, S, D).

        ``src_padding_mask`` (B, S) bool (True at real tokens) defaults to ``src != pad_id``.
        """
        check_tokens("src", src, self.config.src_vocab_size, self.config.max_len)
        self._check_padding_mask("src_padding_mask", src_padding_mask, src)
        if src_padding_mask is None:
            src_padding_mask = self.source_padding_mask(src)
        x = self.dropout(self.src_pos(self.src_embed(src)))
        return self.encoder(x, key_padding_mask=src_padding_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Next-token logits for target prefix ``tgt``.

        Args:
            tgt: (B, T) token ids; with a ``cache``, only the new tokens.
            memory: (B, S, D) from :meth:`encode`.
            src_padding_mask: (B, S) bool, True at real source tokens (None: no source padding).
            tgt_padding_mask: (B, T) bool, True at real target tokens. Not needed for right-padded
                targets: the causal mask already hides every later (padding) position from the
                real ones, so by default no target padding mask is applied.
            cache: incremental state from ``model.decoder.new_cache()``, updated in place.

        Returns:
            (B, T, V_tgt) logits.
        """
        offset = len(cache) if cache is not None else 0
        check_tokens("tgt", tgt, self.config.tgt_vocab_size)
        if offset + tgt.shape[1] > self.config.max_len:
            raise ValueError(
                f"tgt: sequence length {offset + tgt.shape[1]} exceeds the configured maximum "
                f"max_len={self.config.max_len}"
            )
        check_features("memory", memory, "(B, S, D)", self.config.d_model, batch=tgt.shape[0])
        if src_padding_mask is not None:
            check_mask("src_padding_mask", src_padding_mask, [tuple(memory.shape[:2])], ["(B, S)"])
        self._check_padding_mask("tgt_padding_mask", tgt_padding_mask, tgt)
        if cache is not None and tgt_padding_mask is not None:
            raise ValueError("tgt_padding_mask is not supported with a cache (incremental decoding)")
        x = self.dropout(self.tgt_pos(self.tgt_embed(tgt), offset=offset))
        h = self.decoder(
            x,
            memory,
            tgt_key_padding_mask=tgt_padding_mask,
            memory_key_padding_mask=src_padding_mask,
            cache=cache,
        )
        return self.generator(h)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """src (B, S), tgt (B, T) token ids -> (B, T, V_tgt) logits (teacher forcing).

        ``src_padding_mask`` (B, S) bool, True at real tokens, defaults to ``src != pad_id``;
        ``tgt_padding_mask`` (B, T) is optional (see :meth:`decode`); the decoder's
        self-attention is always causal.
        """
        memory = self.encode(src, src_padding_mask)
        if src_padding_mask is None:
            src_padding_mask = self.source_padding_mask(src)
        return self.decode(tgt, memory, src_padding_mask, tgt_padding_mask)
