"""Data: tokenization (and Marian's sentencepiece tokenizer), length-bucketed batching, masking
(BERT's 80/10/10), labelled texts, parallel texts, captions, caption corpora of real photographs
(Flickr8k, Karpathy JSON), a captioning run's splits, augmentation and metrics (BLEU, CIDEr-D),
image feature files and the rendered shape scenes. Of the package it imports only files/ (image
feature files are written under a lock)."""
