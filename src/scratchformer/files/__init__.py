"""Care for the files the package writes, shared by the layers that write them (formats/, data/,
training/, tasks/): locks for output folders and files in use, permissions as the umask says
(:mod:`scratchformer.files.locks`). Imports nothing else of the package."""
