"""Generation: the key/value cache, the step rules (repetition, n-grams, prefix, length), greedy
decoding, beam search (the readable one and ``fast_beam_search`` with its decoder step) and
sampling, and :func:`generate` over all of them by a :class:`GenerationConfig`; :class:`Ensemble`
(several models decoding as one) and ``scoring`` (a hypothesis scored as the beam ranks it; two
engines' outputs compared up to ties). Imports core/ only."""

from scratchformer.generation.beam import Hypothesis, beam_search
from scratchformer.generation.cache import DecoderCache, DecoderLayerCache, KVCache
from scratchformer.generation.config import GenerationConfig
from scratchformer.generation.ensemble import Ensemble
from scratchformer.generation.generate import generate
from scratchformer.generation.greedy import greedy_decode
from scratchformer.generation.interface import EncoderDecoder, max_decode_length
from scratchformer.generation.rules import StepRules
from scratchformer.generation.sampling import sample_decode
from scratchformer.generation.stepwise import warp

__all__ = [
    "DecoderCache",
    "DecoderLayerCache",
    "EncoderDecoder",
    "Ensemble",
    "GenerationConfig",
    "Hypothesis",
    "KVCache",
    "StepRules",
    "beam_search",
    "generate",
    "greedy_decode",
    "max_decode_length",
    "sample_decode",
    "warp",
]
