"""Tasks end to end (data, model, training, evaluation): classification, masked-LM pretraining,
translation, captioning, sentence embedding and the demo. A task imports anything below it
(core/, fast/, generation/, models/, formats/, data/, files/, viz/, training/) but never another
task: what two share is in the package :mod:`scratchformer.tasks.shared` (``tasks/common.py``: its
deprecated old path, until 0.13). A task that is a package (translation/, captioning/) imports its
own modules."""
