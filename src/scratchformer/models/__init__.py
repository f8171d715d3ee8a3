"""Models built from core/: the contextual (BERT-family) encoder, the text classifier, the masked
language model, the image captioning Transformer with its patch embedding, the pooling, and the
frozen pretrained image encoder. Their outside formats (Hugging Face, Marian, CTranslate2, ONNX)
live in :mod:`scratchformer.formats`: a model knows no format. Imports core/, fast/ and files/
(and, until 0.12, each deprecated old path of ``_moved.py`` its one module of formats/)."""
