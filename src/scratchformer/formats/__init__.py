"""The outside formats our models go in and out of, one module per format: Hugging Face checkpoint
directories (``hf_files``: config.json, safetensors, atomic export directories; ``hf_bert``: the
BERT family; ``hf_classifier``: ``BertForSequenceClassification``; ``hf_generation``: a
translator's generation config and model card), Marian and its pre-LN sibling Pegasus (``marian``,
with ``marian_layout``), CTranslate2 (``ctranslate2_export``) and ONNX (``onnx_export``: the
encoder models; ``onnx_translator``: the encoder-decoder). It sits beside ``models/``, above it:
a format knows the models it converts, a model knows no format. Imports core/, files/ and models/."""
