"""Data: tokenization, length-bucketed batching, labelled texts, parallel texts, captions, caption
corpora of real photographs (Flickr8k, Karpathy JSON), image feature files and the rendered shape
scenes. Imports nothing else of the package."""
