"""Unknown keys in a config, a recipe or a request: one check, one message with the closest known
names. No torch: the server's config is checked with it before anything heavy loads."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["reject_unknown", "unknown_keys"]


def reject_unknown(data: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """Every key of ``data`` is one of ``known``, or a ValueError names ``where`` the keys were, the
    unknown ones and the closest known names: "model: unknown key 'd_modle'; did you mean d_model?"."""
    problem = unknown_keys(data, known)
    if problem:
        raise ValueError(f"{where}: {problem}")


def unknown_keys(data: Mapping[str, Any], known: Iterable[str]) -> str:
    """:func:`reject_unknown`'s message without its place ("" when every key is known), for a caller
    that raises its own kind of error (the server's request validation)."""
    known = list(known)
    unknown = sorted(set(data) - set(known), key=str)
    if not unknown:
        return ""
    close = [c for name in unknown for c in difflib.get_close_matches(str(name), known, n=3)]
    hint = f"did you mean {' or '.join(dict.fromkeys(close))}?" if close else f"known: {', '.join(known)}"
    return f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; {hint}"
