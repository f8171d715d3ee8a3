"""scratchformer: the Transformer of "Attention Is All You Need", from scratch in PyTorch.

The package is layered (see docs/design.md): core/ is the paper; fast/ and generation/ build on
it; models/ (with formats/, their outside formats, beside it), data/, tasks/, tools/ and training/
sit above. This module re-exports the public API only.

Mask convention everywhere: bool tensors, True = may attend (see :mod:`scratchformer.core.masks`).
Shape letters: B batch, S source length, T target length, D model width, H heads, V vocabulary.
"""

from scratchformer.core.attention import MultiHeadAttention, scaled_dot_product_attention
from scratchformer.core.config import ModelConfig
from scratchformer.core.decoder import Decoder, DecoderLayer
from scratchformer.core.embedding import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    sinusoidal_table,
)
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.core.masks import causal_mask, combine_masks, padding_mask
from scratchformer.core.transformer import Transformer, TransformerConfig
from scratchformer.data.tokenization import TextTokenizer, TokenBatch
from scratchformer.fast import optimize
from scratchformer.formats.hf_bert import CheckpointError, load_bert_encoder
from scratchformer.formats.marian import load_marian
from scratchformer.generation import (
    DecoderCache,
    DecoderLayerCache,
    GenerationConfig,
    KVCache,
    beam_search,
    generate,
    greedy_decode,
)
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.models.classifier import ClassifierConfig, TextClassifier
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig, EncoderEmbedding
from scratchformer.models.masked_lm import MaskedLanguageModel, MaskedLMHead
from scratchformer.models.patch_embedding import PatchEmbedding
from scratchformer.models.pooling import masked_mean, pool
from scratchformer.tasks.sentence_embedding import SentenceEncoder

__version__ = "0.10.0"

__all__ = [
    "CaptioningConfig",
    "CaptioningTransformer",
    "CheckpointError",
    "ClassifierConfig",
    "ContextualEncoder",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "DecoderLayerCache",
    "Encoder",
    "EncoderConfig",
    "EncoderEmbedding",
    "EncoderLayer",
    "GenerationConfig",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MaskedLMHead",
    "MaskedLanguageModel",
    "ModelConfig",
    "MultiHeadAttention",
    "PatchEmbedding",
    "PositionwiseFeedForward",
    "SentenceEncoder",
    "SinusoidalPositionalEncoding",
    "TextTokenizer",
    "TokenBatch",
    "TextClassifier",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "beam_search",
    "causal_mask",
    "combine_masks",
    "generate",
    "greedy_decode",
    "load_bert_encoder",
    "load_marian",
    "masked_mean",
    "optimize",
    "padding_mask",
    "pool",
    "scaled_dot_product_attention",
    "sinusoidal_table",
]
