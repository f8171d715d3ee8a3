"""Tasks end to end (data, model, training, evaluation): classification, translation, captioning,
sentence embedding and the demo. A task never imports another; what two share is in common.py."""
