"""Models built from core/: the contextual (BERT-family) encoder, the text classifier, the image
captioning Transformer with its patch embedding, the frozen pretrained image encoder, and the
pretrained-weight maps."""
