"""Captioning data: a word vocabulary (cs231n's), and loaders for the two common layouts.

1. cs231n's COCO files: ``coco2014_captions.h5`` (``{split}_captions`` (N, L) word ids starting
   with ``<START>``, ``{split}_image_idxs`` (N,)), ``{split}2014_vgg16_fc7[_pca].h5`` (``features``
   (M, D_img)) and ``coco2014_vocab.json`` (``idx_to_word``, ``word_to_idx``). The same arrays in
   ``.npz`` files work too (no h5py needed).
2. A folder of per-image files (``.npy`` features, or ``.png``/``.jpg`` images) and a captions TSV,
   ``image_id<TAB>caption`` per line, several lines per image (the Flickr8k/COCO layout;
   Flickr8k's ``image.jpg#2`` ids are understood).

Both give :class:`CaptionExamples`: one input per image and all its reference captions.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scratchformer.data.image_features import read_photo
from scratchformer.data.labelled_texts import open_text

__all__ = [
    "CaptionExamples",
    "Vocabulary",
    "load_caption_folder",
    "load_cs231n_captions",
    "load_image",
    "read_captions_tsv",
    "caption_words",
    "save_caption_folder",
    "tokenize_caption",
]

NULL, START, END, UNK = "<NULL>", "<START>", "<END>", "<UNK>"  # ids 0, 1, 2, 3, as in cs231n


def tokenize_caption(text: str) -> list[str]:
    """Lower-case words, punctuation as separate tokens, hyphenated words and ``<unk>`` whole (as the
    metrics' :func:`caption_words` and COCO's PTB tokenizer keep them):
    "A dog, in a T-shirt." -> a dog , in a t-shirt ."""
    return re.findall(r"<unk>|[a-z0-9']+(?:-[a-z0-9']+)*|[^\sa-z0-9']", text.lower())


# The punctuation tokens COCO's evaluation removes after tokenising (pycocoevalcap's PTBTokenizer),
# with the characters that its tokenizer turns into removed tokens (" -> `` or '', ( -> -LRB-, ...).
PTB_PUNCTUATION = frozenset(
    [
        "''",
        "'",
        "``",
        "`",
        "-LRB-",
        "-RRB-",
        "-LCB-",
        "-RCB-",
        ".",
        "?",
        "!",
        ",",
        ":",
        "-",
        "--",
        "...",
        ";",
        '"',
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
    ]
)
_WORD = re.compile(r"<unk>|[a-z0-9]+(?:[-'][a-z0-9]+)*|[^\sa-z0-9]")


def caption_words(text: str) -> list[str]:
    """The words captioning metrics compare, COCO's evaluation without its Java tokenizer: lower case,
    punctuation split off and the PTB punctuation tokens removed; hyphenated words, words with an
    apostrophe and ``<unk>`` (the vocabulary's unknown word, one token to PTB too) stay whole.
    "A dog, running." -> a dog running; "T-shirt" -> t-shirt."""
    return [w for w in _WORD.findall(text.lower()) if w not in PTB_PUNCTUATION]


@dataclass
class CaptionExamples:
    """Images (or image features) with their reference captions.

    Attributes:
        inputs: (N, C, H, W) uint8 or float images, (N, D_img) feature vectors or (N, R, D_img)
            region features.
        references: for each image, its reference captions (at least one).
        photos: the image files the features were made from, where known (for figures).
    """

    inputs: Tensor
    references: list[list[str]]
    photos: list[Path] | None = None  # the image files the features came from, where known

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.references):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.references)} caption lists")
        if self.photos is not None and len(self.photos) != len(self.inputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.photos)} photo paths")
        empty = [i for i, refs in enumerate(self.references) if not refs]
        if empty:
            raise ValueError(f"images without any caption: indices {empty[:5]}")

    def __len__(self) -> int:
        return len(self.references)

    def subset(self, index: Sequence[int]) -> CaptionExamples:
        photos = None if self.photos is None else [self.photos[i] for i in index]
        return CaptionExamples(self.inputs[list(index)], [self.references[i] for i in index], photos)


class Vocabulary:
    """Word <-> id, with cs231n's special words: <NULL> 0 (padding), <START> 1, <END> 2, <UNK> 3."""

    def __init__(self, words: Sequence[str]):
        if list(words[:4]) != [NULL, START, END, UNK]:
            raise ValueError(f"a vocabulary must start with {[NULL, START, END, UNK]}, got {list(words[:4])}")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("the vocabulary has repeated words")

    pad_id, start_id, end_id, unk_id = 0, 1, 2, 3

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> Vocabulary:
        """Every word seen at least ``min_count`` times, most frequent first (ties: alphabetical)."""
        counts = Counter(w for c in captions for w in tokenize_caption(c))
        kept = sorted(
            (w for w, n in counts.items() if n >= min_count and w != UNK.lower()),
            key=lambda w: (-counts[w], w),
        )
        return cls([NULL, START, END, UNK] + kept)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, caption: str) -> list[int]:
        """Word ids of ``caption`` (no <START>/<END>); unknown words, and <UNK> written in the text
        (as :meth:`decode` writes it), become <UNK>."""
        return [self.index.get(w, self.unk_id) for w in tokenize_caption(caption)]

    def decode(self, ids: Iterable[int]) -> str:
        """Words up to the first <END>, without <NULL>/<START>."""
        words = []
        for i in ids:
            if i == self.end_id:
                break
            if i not in (self.pad_id, self.start_id):
                words.append(self.words[i])
        return " ".join(words)

    def to_json(self) -> dict[str, Any]:
        return {"idx_to_word": self.words, "word_to_idx": self.index}  # cs231n's coco2014_vocab.json

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Vocabulary:
        return cls(data["idx_to_word"])


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an .h5 or .npz file (or of the one of the two that exists)."""
    candidates = [path] if path.suffix else [path.with_suffix(".h5"), path.with_suffix(".npz")]
    for p in candidates:
        if p.exists():
            if p.suffix == ".npz":
                with np.load(p) as f:
                    return {k: f[k] for k in f.files}
            try:
                import h5py
            except ImportError as e:
                raise ImportError(
                    f"{p}: reading HDF5 needs h5py (pip install 'scratchformer[captioning]')"
                ) from e
            with h5py.File(p, "r") as f:
                return {k: np.asarray(v) for k, v in f.items()}
    raise FileNotFoundError(f"none of {[str(p) for p in candidates]} exists")


def load_cs231n_captions(
    base_dir: str | Path, split: str = "train", pca_features: bool = True, max_images: int | None = None
) -> tuple[CaptionExamples, Vocabulary]:
    """cs231n's COCO captioning data (see the module docstring): features (N, D_img) and, per image,
    all its captions as text; with the vocabulary the captions were encoded with."""
    base = Path(base_dir)
    if split not in ("train", "val"):
        raise ValueError(f"split: expected 'train' or 'val', got {split!r}")
    vocab_file = base / "coco2014_vocab.json"
    if not vocab_file.exists():
        raise FileNotFoundError(f"{vocab_file} not found (cs231n's vocabulary file)")
    vocab = Vocabulary.from_json(json.loads(vocab_file.read_text()))
    captions = _read_arrays(base / "coco2014_captions")
    for key in (f"{split}_captions", f"{split}_image_idxs"):
        if key not in captions:
            raise KeyError(f"{base / 'coco2014_captions'}: no array {key!r} (has {sorted(captions)})")
    features = _read_arrays(base / f"{split}2014_vgg16_fc7{'_pca' if pca_features else ''}")["features"]
    references: dict[int, list[str]] = {}
    for ids, image in zip(captions[f"{split}_captions"].tolist(), captions[f"{split}_image_idxs"].tolist()):
        if not 0 <= image < len(features):
            raise ValueError(
                f"{split}_image_idxs: image index {image} outside the {len(features)} feature rows"
            )
        references.setdefault(image, []).append(vocab.decode(ids))
    images = sorted(references)[:max_images]
    inputs = torch.from_numpy(np.ascontiguousarray(features[images])).float()
    return CaptionExamples(inputs, [references[i] for i in images]), vocab


def load_image(path: str | Path, image_size: int | None = None) -> Tensor:
    """An image file as (3, H, W) uint8 RGB (upright, 8 bits, transparency over white: see
    :func:`~scratchformer.data.image_features.photo_rgb`); resized to ``image_size`` x ``image_size``
    if given. Errors name the file."""
    from PIL import Image

    rgb = read_photo(path)
    if image_size is not None and rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(rgb)).permute(2, 0, 1).contiguous()


_FEATURE_SUFFIXES = (".npy",)
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def find_caption_file(folder: Path, image_id: str) -> Path:
    """The file of ``image_id`` in ``folder``: the name itself, or with .npy, .png, .jpg, .jpeg added."""
    for candidate in [folder / image_id] + [
        folder / f"{image_id}{s}" for s in _FEATURE_SUFFIXES + _IMAGE_SUFFIXES
    ]:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no file for image id {image_id!r} in {folder} (tried the name, .npy, .png, .jpg)"
    )


def read_captions_tsv(captions_tsv: str | Path) -> dict[str, list[str]]:
    """``image_id<TAB>caption`` lines -> each image id's captions, in order of first appearance.
    Refused: a line without a tab, an image id outside the folder, an empty caption, no captions at
    all; a caption repeated for the same image counts once (how many is printed on stderr)."""
    references: dict[str, list[str]] = {}
    with open_text(captions_tsv) as f:
        lines = f.read().splitlines()
    duplicates = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise ValueError(f"{captions_tsv}:{number}: expected 'image_id<TAB>caption', got {line[:80]!r}")
        image_id, caption = line.split("\t", 1)
        image_id = re.sub(r"#\d+$", "", image_id.strip())  # Flickr8k: 1000268201_693b08cb0e.jpg#0
        if not image_id or Path(image_id).is_absolute() or ".." in Path(image_id).parts or "\\" in image_id:
            raise ValueError(
                f"{captions_tsv}:{number}: image id {image_id!r} is not a file name inside the images "
                "folder (no absolute paths, no '..')"
            )
        if not caption.strip():
            raise ValueError(f"{captions_tsv}:{number}: empty caption for image {image_id!r}")
        captions = references.setdefault(image_id, [])
        if caption.strip() in captions:
            duplicates += 1
        else:
            captions.append(caption.strip())
    if not references:
        raise ValueError(f"{captions_tsv}: no captions")
    if duplicates:
        print(
            f"{captions_tsv}: {duplicates} captions repeated for the same image, each counted once",
            file=sys.stderr,
        )
    return references


def load_caption_folder(
    captions_tsv: str | Path, folder: str | Path, image_size: int | None = None
) -> tuple[CaptionExamples, list[str]]:
    """Per-image files in ``folder`` with captions from ``captions_tsv`` (``image_id<TAB>caption``,
    read by :func:`read_captions_tsv`).

    Returns the examples (images (N, 3, H, W) uint8, resized to ``image_size`` if given, or
    features (N, D_img) / (N, R, D_img) float) and the image ids, in order of first appearance.
    """
    references = read_captions_tsv(captions_tsv)
    files = {i: find_caption_file(Path(folder), i) for i in references}
    kinds = {p.suffix.lower() in _FEATURE_SUFFIXES for p in files.values()}
    if len(kinds) > 1:
        raise ValueError(f"{folder}: a mix of feature files (.npy) and images; use one kind")
    if kinds.pop():
        items = [torch.from_numpy(np.load(p)).float() for p in files.values()]
    else:
        items = [load_image(p, image_size) for p in files.values()]
    shapes = {tuple(t.shape) for t in items}
    if len(shapes) > 1:
        raise ValueError(
            f"{folder}: the files have different shapes {sorted(shapes)[:4]}; "
            "pass image_size to resize images, or store features of one shape"
        )
    return CaptionExamples(torch.stack(items), list(references.values())), list(references)


def save_caption_folder(examples: CaptionExamples, folder: str | Path, prefix: str = "image") -> Path:
    """Write (N, 3, H, W) uint8 images as ``folder/{prefix}-0000.png``... and their references as
    ``folder/captions.tsv``: the layout :func:`load_caption_folder` reads. Returns the TSV's path."""
    from PIL import Image

    if examples.inputs.dim() != 4 or examples.inputs.dtype != torch.uint8:
        raise ValueError(
            f"expected (N, 3, H, W) uint8 images, got {tuple(examples.inputs.shape)} {examples.inputs.dtype}"
        )
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (image, refs) in enumerate(zip(examples.inputs, examples.references)):
        name = f"{prefix}-{i:04d}.png"
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(out / name)
        lines += [f"{name}\t{r}" for r in refs]
    (out / "captions.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "captions.tsv"
