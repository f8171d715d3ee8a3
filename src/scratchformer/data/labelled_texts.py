"""Labelled text files: JSONL or CSV (optionally .gz), or a Hugging Face ``datasets`` name; and
unlabelled texts (JSONL, CSV or plain text, one per line) for pretraining.

Bad data never passes silently: a malformed line or a label outside the classes is an error that
names the file and line (or, with ``on_error="skip"``, a counted skip); empty texts are skipped
and counted. The counts are reported in ``LabelledTexts.skipped``.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DATA_DIR",
    "LabelledTexts",
    "default_data_dir",
    "load_hf_dataset",
    "load_labelled_texts",
    "load_texts",
    "open_text",
]


DEFAULT_DATA_DIR = "../shared/data"  # the shared data directory, from the repository root: what ``{data}``
# in a recipe path means unless --data-dir or $SCRATCHFORMER_DATA says otherwise


def default_data_dir() -> Path:
    """The shared data directory: $SCRATCHFORMER_DATA, else :data:`DEFAULT_DATA_DIR` (../shared/data)."""
    import os

    return Path(os.environ.get("SCRATCHFORMER_DATA", DEFAULT_DATA_DIR))


@dataclass
class LabelledTexts:
    texts: list[str]
    labels: list[int]  # class indices into label_names
    label_names: list[str]
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: Sequence[int]) -> LabelledTexts:
        return LabelledTexts(
            [self.texts[i] for i in indices], [self.labels[i] for i in indices], self.label_names
        )


class _NamedUTF8(io.TextIOWrapper):
    """A text stream whose decoding errors past the checked start name the file (a ValueError)."""

    def __init__(self, raw: io.BufferedIOBase, path: Path):
        super().__init__(raw, encoding="utf-8-sig")
        self.path = path

    def _named(self, e: UnicodeDecodeError) -> ValueError:
        return ValueError(
            f"{self.path}: not UTF-8 text past its first 64 KiB ({e.reason}: {e.object[e.start : e.end]!r})"
        )

    def __next__(self) -> str:
        try:
            return super().__next__()
        except UnicodeDecodeError as e:
            raise self._named(e) from None

    def read(self, size: int | None = -1) -> str:
        try:
            return super().read(size)
        except UnicodeDecodeError as e:
            raise self._named(e) from None

    def readline(self, size: int | None = -1) -> str:
        try:
            return super().readline(size)
        except UnicodeDecodeError as e:
            raise self._named(e) from None


def open_text(path: str | Path) -> io.TextIOBase:
    """Open a UTF-8 text file for reading (a byte-order mark is skipped), transparently
    decompressing ``.gz``. A binary file, or one that is not UTF-8, is a ValueError naming it
    (checked on the first 64 KiB at once, on the rest as it is read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    gz = path.suffix == ".gz"
    try:
        with gzip.open(path, "rb") if gz else open(path, "rb") as f:
            head = f.read(1 << 16)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot be read as {'gzip' if gz else 'a file'} ({e})") from None
    end = head.rfind(b"\n") + 1 if len(head) == 1 << 16 else len(head)  # whole lines: no split character
    try:
        if b"\x00" in head:
            raise UnicodeError("NUL bytes")
        head[:end].decode("utf-8-sig")
    except UnicodeError as e:
        raise ValueError(f"{path}: not a UTF-8 text file ({e}); is it binary?") from None
    return _NamedUTF8(gzip.open(path, "rb") if gz else open(path, "rb"), path)


def _records(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """(line number, record or None if malformed, error message)."""
    with open_text(path) as f:
        if fmt == "csv":
            rows = csv.DictReader(f)
            for row in rows:  # a row the header does not fit is malformed, not cut or padded silently
                if None in row:
                    yield (
                        rows.line_num,
                        None,
                        f"more fields than the header's {len(row) - 1} (an unquoted comma?)",
                    )
                elif None in row.values():
                    yield rows.line_num, None, f"fewer fields than the header's {len(row)}"
                else:
                    yield rows.line_num, dict(row), ""
            return
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                yield number, None, f"malformed JSON ({e.msg})"
                continue
            if not isinstance(record, dict):
                yield number, None, "a JSON object per line is expected"
                continue
            yield number, record, ""


def _normalise_label(raw: Any) -> int | str:
    if isinstance(raw, bool):
        return int(raw)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        s = raw.strip()
        return int(s) if s.lstrip("-").isdigit() else s
    raise ValueError(f"unsupported label {raw!r}")


def load_labelled_texts(
    path: str | Path,
    text_field: str = "text",
    label_field: str = "label",
    label_names: Sequence[str] | None = None,
    fmt: str | None = None,
    on_error: str = "raise",
) -> LabelledTexts:
    """Read (text, label) pairs.

    Args:
        path: ``.jsonl``/``.json``/``.csv``, optionally ``.gz``.
        text_field, label_field: the keys (JSONL) or column names (CSV).
        label_names: the classes. Integer labels index them; string labels must be among them.
            Default: integer labels 0..max, or the sorted distinct string labels.
        fmt: "jsonl" or "csv"; default from the file name.
        on_error: "raise" (default) or "skip" (count malformed lines and bad labels).
    """
    path = Path(path)
    fmt = fmt or ("csv" if ".csv" in path.suffixes else "jsonl")
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"fmt: expected 'jsonl' or 'csv', got {fmt!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error: expected 'raise' or 'skip', got {on_error!r}")
    skipped: Counter[str] = Counter()

    def problem(number: int, message: str, kind: str) -> None:
        if on_error == "raise":
            raise ValueError(f"{path}:{number}: {message}")
        skipped[kind] += 1

    raw_rows: list[tuple[int, str, int | str]] = []
    for number, record, error in _records(path, fmt):
        if record is None:
            problem(number, error, "malformed")
            continue
        if text_field not in record or label_field not in record:
            problem(
                number, f"missing field {text_field!r} or {label_field!r} (has {sorted(record)})", "malformed"
            )
            continue
        text = record[text_field]
        if not isinstance(text, str):
            problem(number, f"{text_field!r} is not a string", "malformed")
            continue
        if not text.strip():
            skipped["empty text"] += 1
            continue
        try:
            label = _normalise_label(record[label_field])
        except ValueError as e:
            problem(number, str(e), "bad label")
            continue
        raw_rows.append((number, text, label))

    texts, labels, names = _assign_labels(raw_rows, label_names, problem)
    if not texts:
        raise ValueError(f"{path}: no usable examples (skipped: {dict(skipped)})")
    return LabelledTexts(texts, labels, names, dict(skipped))


def load_texts(path: str | Path, text_field: str = "text") -> list[str]:
    """Unlabelled texts: the ``text_field`` of each JSONL record or CSV row, or each non-empty line
    of a plain-text file (``.txt``, or any name without .jsonl/.json/.csv); ``.gz`` ok. Empty texts
    are left out; a malformed record, or one without ``text_field``, is an error naming its line."""
    path = Path(path)
    suffixes = set(path.suffixes)
    if not suffixes & {".jsonl", ".json", ".csv"}:
        with open_text(path) as f:
            texts = [line.strip() for line in f if line.strip()]
    else:
        texts = []
        for number, record, error in _records(path, "csv" if ".csv" in suffixes else "jsonl"):
            if record is None:
                raise ValueError(f"{path}:{number}: {error}")
            text = record.get(text_field)
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number}: no string field {text_field!r} (has {sorted(record)})")
            if text.strip():
                texts.append(text)
    if not texts:
        raise ValueError(f"{path}: no texts")
    return texts


def _assign_labels(
    rows: list[tuple[int, str, int | str]], label_names: Sequence[str] | None, problem: Any
) -> tuple[list[str], list[int], list[str]]:
    """(texts, class indices, class names) from (row number, text, raw label) rows: integer labels
    index the classes (default 0..max, in numeric order), string labels must be among them
    (default: the sorted distinct strings); a label outside is ``problem(number, message, kind)``."""
    if label_names is None:
        values = {label for _, _, label in rows}
        ints = [v for v in values if isinstance(v, int)]
        if len(ints) == len(values):
            label_names = [str(i) for i in range(max(ints, default=-1) + 1)]
        else:
            label_names = sorted(str(v) for v in values)
    names = list(label_names)
    index = {name: i for i, name in enumerate(names)}
    texts, labels = [], []
    for number, text, label in rows:
        if isinstance(label, int):
            if not 0 <= label < len(names):
                problem(
                    number, f"label {label} is outside the classes [0, {len(names)}) {names}", "bad label"
                )
                continue
            labels.append(label)
        elif label in index:
            labels.append(index[label])
        else:
            problem(number, f"label {label!r} is not one of the classes {names}", "bad label")
            continue
        texts.append(text)
    return texts, labels, names


def load_hf_dataset(
    name: str, split: str, text_field: str = "text", label_field: str = "label"
) -> LabelledTexts:
    """A Hugging Face ``datasets`` split (needs ``pip install datasets`` and network or a cache).
    Labels are handled as :func:`load_labelled_texts` handles them: a ClassLabel's names, integer
    labels in numeric order, string labels sorted; a label outside the classes is an error."""
    import datasets  # type: ignore[import-not-found]

    ds = datasets.load_dataset(name, split=split)
    feature = ds.features[label_field]
    where = f"{name} [{split}]"

    def problem(number: int, message: str, kind: str) -> None:
        raise ValueError(f"{where} row {number}: {message}")

    rows = []
    for number, (text, label) in enumerate(zip(ds[text_field], ds[label_field])):
        try:
            rows.append((number, text, _normalise_label(label)))
        except ValueError as e:
            problem(number, str(e), "bad label")
    texts, labels, names = _assign_labels(
        rows, list(feature.names) if hasattr(feature, "names") else None, problem
    )
    return LabelledTexts(texts, labels, names)
