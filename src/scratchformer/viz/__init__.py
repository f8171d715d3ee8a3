"""Looking at a model from outside, by forward hooks: attention maps
(:mod:`scratchformer.viz.attention_maps`: record the probabilities every ``MultiHeadAttention``
computes, and draw them). Imports core/ only.

Before 0.12 this room was ``tools/`` (and held the caption figures too, now the captioning task's
:mod:`scratchformer.tasks.captioning.figures`); the old paths import until 0.13, with a
DeprecationWarning (``scratchformer/tools/_moved.py``)."""
