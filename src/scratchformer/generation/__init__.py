"""Generation: the key/value cache, greedy decoding, beam search and sampling. Imports core/ only."""

from scratchformer.generation.beam import Hypothesis, beam_search
from scratchformer.generation.cache import DecoderCache, DecoderLayerCache, KVCache
from scratchformer.generation.greedy import greedy_decode
from scratchformer.generation.interface import EncoderDecoder, max_decode_length
from scratchformer.generation.sampling import sample_decode

__all__ = ["DecoderCache", "DecoderLayerCache", "EncoderDecoder", "Hypothesis", "KVCache", "beam_search",
           "greedy_decode", "max_decode_length", "sample_decode"]
