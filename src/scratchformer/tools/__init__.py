"""Tools that look at a model from outside (forward hooks): attention maps. Imports core/ only."""
