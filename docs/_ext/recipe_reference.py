"""Placeholder: the recipe reference directive (being written)."""


def setup(app):
    return {"parallel_read_safe": True}
