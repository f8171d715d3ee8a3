"""scratchformer: the Transformer of "Attention Is All You Need", from scratch in PyTorch.

The package is layered (see docs/design.md): core/ is the paper; fast/ and generation/ build on
it; models/ (with formats/, their outside formats, beside it), data/, tasks/, viz/ and training/
sit above, serve/ and cli/ on top. This module re-exports the public API only.

Mask convention everywhere: bool tensors, True = may attend (see :mod:`scratchformer.core.masks`).
Shape letters: B batch, S source length, T target length, D model width, H heads, V vocabulary.
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time, _EXPORTS below imports on first use
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

__version__ = "0.11.0"

# Each public name -> the module that defines it, imported when the name is first used (PEP 562), so
# that `import scratchformer` (and the command line's --help, --version and refusals of bad arguments)
# reads no torch. tests/test_public_api.py checks this table against the imports above and __all__.
_EXPORTS = {
    "scratchformer.core.attention": ("MultiHeadAttention", "scaled_dot_product_attention"),
    "scratchformer.core.config": ("ModelConfig",),
    "scratchformer.core.decoder": ("Decoder", "DecoderLayer"),
    "scratchformer.core.embedding": (
        "LearnedPositionalEmbedding",
        "SinusoidalPositionalEncoding",
        "TokenEmbedding",
        "sinusoidal_table",
    ),
    "scratchformer.core.encoder": ("Encoder", "EncoderLayer"),
    "scratchformer.core.feedforward": ("PositionwiseFeedForward",),
    "scratchformer.core.layer_norm": ("LayerNorm",),
    "scratchformer.core.masks": ("causal_mask", "combine_masks", "padding_mask"),
    "scratchformer.core.transformer": ("Transformer", "TransformerConfig"),
    "scratchformer.data.tokenization": ("TextTokenizer", "TokenBatch"),
    "scratchformer.fast": ("optimize",),
    "scratchformer.formats.hf_bert": ("CheckpointError", "load_bert_encoder"),
    "scratchformer.formats.marian": ("load_marian",),
    "scratchformer.generation": (
        "DecoderCache",
        "DecoderLayerCache",
        "GenerationConfig",
        "KVCache",
        "beam_search",
        "generate",
        "greedy_decode",
    ),
    "scratchformer.models.captioning": ("CaptioningConfig", "CaptioningTransformer"),
    "scratchformer.models.classifier": ("ClassifierConfig", "TextClassifier"),
    "scratchformer.models.contextual": ("ContextualEncoder", "EncoderConfig", "EncoderEmbedding"),
    "scratchformer.models.masked_lm": ("MaskedLanguageModel", "MaskedLMHead"),
    "scratchformer.models.patch_embedding": ("PatchEmbedding",),
    "scratchformer.models.pooling": ("masked_mean", "pool"),
    "scratchformer.tasks.sentence_embedding": ("SentenceEncoder",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

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


def __getattr__(name: str) -> Any:
    """A public name (``sf.Transformer``), imported from its module on first use and kept; a
    subpackage (``sf.training``), imported as ``import scratchformer.training`` would."""
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # the next use is a plain attribute
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
