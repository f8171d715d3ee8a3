"""One validator of unknown keys (:func:`~scratchformer.core.keys.reject_unknown`), with one message
shape and a closest-key hint, behind every section a user writes: a recipe and its ``train``,
``model``, ``decoding``, ``scst``, ``finetune`` and ``augment`` sections, ``--set``, a config.json, a
server config."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import scratchformer
from scratchformer.core.keys import reject_unknown, unknown_keys

PACKAGE = Path(scratchformer.__file__).parent


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"d_modle": 1}, "model: unknown key 'd_modle'; did you mean d_model?"),
        ({"qq": 1, "zz": 2}, "model: unknown keys 'qq', 'zz'; known: d_model, dropout"),
        (
            {"d_model": 1, "dropuot": 2, "d_mdel": 3},
            "model: unknown keys 'd_mdel', 'dropuot'; did you mean d_model or dropout?",
        ),
    ],
)
def test_the_message_names_the_place_the_keys_and_the_closest(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        reject_unknown(data, ["d_model", "dropout"], "model")
    assert str(caught.value) == message


def test_the_message_without_its_place_is_the_same() -> None:
    """unknown_keys (for a caller with its own error type, the server's 422) words it the same way."""
    assert unknown_keys({"d_modle": 1}, ["d_model"]) == "unknown key 'd_modle'; did you mean d_model?"
    assert unknown_keys({"d_model": 1}, ["d_model"]) == ""


def test_known_keys_pass() -> None:
    reject_unknown({"d_model": 1}, ("d_model", "dropout"), "model")
    reject_unknown({}, (), "nothing")


def messages(source: str) -> list[str]:
    """The string literals of ``source`` (f-strings' fixed parts too) that are not docstrings."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    literals = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]
    formatted = [  # an f-string whole, "{}" for each value: f"unknown {x}; expected ..." -> "unknown {}; ..."
        "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
    ]
    return literals + formatted


def second_validator(source: str) -> bool:
    """Whether ``source`` finds close keys itself (difflib) or words an unknown-key message."""
    return "get_close_matches" in source or any(
        re.search(r"unknown (key|field)s?\b|unknown \{\}[^{}]*\b(expected|known|did you mean)\b", text)
        for text in messages(source)
    )


def test_no_second_validator_in_the_package() -> None:
    """Only core/keys.py finds close keys or words the message: a hand-written check elsewhere
    ("unknown fields ...", difflib) is a second validator."""
    found = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if second_validator(path.read_text(encoding="utf-8"))
    ]
    assert found == ["core/keys.py"], found


def test_a_second_validator_is_caught() -> None:
    """Yesterday's classifier config check is reported; a docstring that mentions unknown keys is not."""
    old = '''
def from_dict(data):
    """An unknown field is an error."""
    unknown = sorted(set(data) - {"encoder", "num_classes"})
    if unknown:
        raise ValueError(f"ClassifierConfig: unknown fields {unknown}")
'''
    assert second_validator(old)
    assert not second_validator(old.replace("unknown fields", "bad"))
    server = 'raise RequestError(422, f"parameters: unknown {shown(name)}; expected some of {known}")'
    assert second_validator(server)  # (yesterday's request check, which named no "key")
