"""Real captioning corpora as people download them: image files named by the captions.

1. The Flickr8k layout: ``Images/`` (the photographs), ``captions.txt`` (CSV, header
   ``image,caption``, five rows per image; the original ``Flickr8k.token.txt``,
   ``image.jpg#n<TAB>caption``, is read too) and the split lists ``Flickr_8k.trainImages.txt``,
   ``Flickr_8k.devImages.txt``, ``Flickr_8k.testImages.txt`` (one image name per line).
2. Karpathy's split JSON (``dataset_flickr8k.json``, ``dataset_flickr30k.json``,
   ``dataset_coco.json``): ``{"images": [{"filename", "filepath"?, "split", "sentences": [{"raw"}]}]}``;
   split "train" also takes COCO's "restval" images, as is customary.

Both give a :class:`CaptionCorpus`: image names (relative to its image folder) with all their captions.
Bad rows are never dropped silently: each kind is counted in ``problems`` and reported.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from scratchformer.data.labelled_texts import open_text

__all__ = ["CaptionCorpus", "load_flickr8k", "load_karpathy_json"]

FLICKR8K_SPLITS = {
    "train": "Flickr_8k.trainImages.txt",
    "dev": "Flickr_8k.devImages.txt",
    "test": "Flickr_8k.testImages.txt",
}


@dataclass
class CaptionCorpus:
    """One split: ``names[i]`` (a file in ``image_dir``) has the captions ``references[i]``.

    ``problems`` counts what was left out and why, e.g. {"image file missing": 2, "empty caption": 1}.
    """

    image_dir: Path
    names: list[str]
    references: list[list[str]]
    problems: Counter[str] = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.names)

    def report(self) -> str:
        """One line: images, captions and every problem with its count."""
        left_out = ", ".join(f"{k}: {v}" for k, v in sorted(self.problems.items())) or "none"
        return f"{len(self.names)} images, {sum(map(len, self.references))} captions; left out: {left_out}"


def _collect(image_dir: Path, rows: list[tuple[str, str]], wanted: list[str] | None) -> CaptionCorpus:
    """Group (image, caption) rows by image, keeping ``wanted`` images (None: all, in first-seen
    order); count empty captions, captions repeated for their image (kept once), images without
    captions and image files that do not exist."""
    problems: Counter[str] = Counter()
    captions: dict[str, list[str]] = {}
    for image, caption in rows:
        if not caption.strip():
            problems["empty caption"] += 1
        elif caption.strip() in captions.setdefault(image, []):
            problems["caption repeated for its image"] += 1
        else:
            captions[image].append(caption.strip())
    names = list(captions) if wanted is None else wanted
    kept_names, kept_refs = [], []
    for name in names:
        if name not in captions:
            problems["image in the split list without captions"] += 1
        elif not (image_dir / name).is_file():
            problems["image file missing"] += 1
        else:
            kept_names.append(name)
            kept_refs.append(captions[name])
    if not kept_names:
        raise ValueError(f"{image_dir}: no image with captions left ({dict(problems) or 'no rows'})")
    return CaptionCorpus(image_dir, kept_names, kept_refs, problems)


def _read_flickr_captions(path: Path) -> list[tuple[str, str]]:
    """(image, caption) rows of ``captions.txt`` (CSV) or ``Flickr8k.token.txt`` (``name#n<TAB>caption``)."""
    with open_text(path) as f:
        token_file = path.suffix == ".txt" and path.name != "captions.txt"  # Flickr8k.token.txt
        if token_file or "\t" in f.readline():
            f.seek(0)
            rows = [line.rstrip("\n").split("\t", 1) for line in f if line.strip()]
            return [(re.sub(r"#\d+$", "", r[0].strip()), r[1] if len(r) > 1 else "") for r in rows]
        f.seek(0)
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip().lower() for h in header[:2]] != ["image", "caption"]:
            raise ValueError(f"{path}: expected the CSV header 'image,caption', got {header}")
        return [(r[0].strip(), ",".join(r[1:])) for r in reader if r]


def load_flickr8k(root: str | Path, split: str = "train", images: str = "Images") -> CaptionCorpus:
    """The Flickr8k layout under ``root`` (see the module docstring); ``split``: "train", "dev",
    "test" (its list file must be there) or "all" (every captioned image)."""
    root = Path(root)
    if split not in (*FLICKR8K_SPLITS, "all"):
        raise ValueError(f"split: expected one of {[*FLICKR8K_SPLITS, 'all']}, got {split!r}")
    captions = next((root / n for n in ("captions.txt", "Flickr8k.token.txt") if (root / n).is_file()), None)
    if captions is None:
        raise FileNotFoundError(f"{root}: no captions.txt (or Flickr8k.token.txt): not a Flickr8k folder")
    image_dir = root / images
    if not image_dir.is_dir():
        raise FileNotFoundError(f"{image_dir}: no image folder")
    wanted = None
    if split != "all":
        listing = root / FLICKR8K_SPLITS[split]
        if not listing.is_file():
            raise FileNotFoundError(f"{listing}: the {split} split list is not there")
        wanted = list(
            dict.fromkeys(
                n.strip() for n in listing.read_text(encoding="utf-8-sig").splitlines() if n.strip()
            )
        )
    return _collect(image_dir, _read_flickr_captions(captions), wanted)


def load_karpathy_json(path: str | Path, image_dir: str | Path, split: str = "train") -> CaptionCorpus:
    """Karpathy's split JSON (see the module docstring); image names are ``filepath/filename``
    (just ``filename`` where there is no filepath) under ``image_dir``."""
    path = Path(path)
    try:
        data = json.loads(open_text(path).read())
        images = data["images"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a Karpathy split JSON ({type(e).__name__}: {e})") from None
    splits = {"train": ("train", "restval")}.get(split, (split,))
    if not isinstance(images, list) or not all(isinstance(im, dict) for im in images):
        raise ValueError(f"{path}: not a Karpathy split JSON ('images' must be a list of objects)")
    known = {im.get("split") for im in images}
    if not known & set(splits):
        raise ValueError(f"{path}: no images of split {split!r} (it has {sorted(map(str, known))})")
    rows = []
    try:
        for im in images:
            if im.get("split") in splits:
                name = "/".join(p for p in (im.get("filepath"), im["filename"]) if p)
                rows += [(name, s.get("raw", "")) for s in im.get("sentences", [])] or [(name, "")]
    except (KeyError, AttributeError, TypeError) as e:
        raise ValueError(
            f"{path}: an image entry without filename/sentences ({type(e).__name__}: {e})"
        ) from None
    return _collect(Path(image_dir), rows, None)
