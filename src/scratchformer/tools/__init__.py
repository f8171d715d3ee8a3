"""Deprecated: this room became :mod:`scratchformer.viz` in 0.12 (the caption figures went to
:mod:`scratchformer.tasks.captioning.figures`). Its old modules, ``attention_maps`` and
``caption_figures``, import until 0.13 as the very modules of their new paths, with a
DeprecationWarning (``_moved.py``); they import their new module and nothing else of the package."""
