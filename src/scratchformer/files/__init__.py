"""Care for the files the package writes, shared by the layers that write them (data/, training/,
tasks/): :mod:`scratchformer.files.locks`. Imports nothing else of the package."""
