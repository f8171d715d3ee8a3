"""Data: tokenization, length-bucketed batching, labelled texts, parallel texts, captions and the
rendered shape scenes. Imports nothing else of the package."""
