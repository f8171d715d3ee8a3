"""Image features on disk: one safetensors file per image set, made once by a frozen encoder::

    regions  (N, R, D_img) float16   e.g. R = 49 (7 x 7) regions of D_img = 1280 for EfficientNet-Lite0
    pooled   (N, D_img)    float16   the regions' mean
    metadata: the format, the image names (JSON), and what made them: encoder, weights,
              preprocessing, layer (the encoder's ``description``); and the photos they came from:
              the resolved image folder and each photo's (size, mtime_ns, content digest)

:func:`extract_image_features` runs an encoder over a folder of photographs in batches with a progress
bar. It is resumable: finished chunks are kept beside the output (``FILE.parts/``) until the file is
written, and images already in FILE are skipped, so a killed run or a folder that grew costs only the
new images. Features made by another encoder or preprocessing, or from another image folder or a
photo changed since, are refused, never mixed (files written before photos were recorded are trusted).
A photo is the same when its size and modification time are; where only the time differs (a copy, a
checkout, a restored backup) its content digest decides, so touched photos are not extracted again.
Photos are named relative to their folder: a folder moved or renamed since is recognised by its
photos. Files of the folder that are not images (macOS's ``._x.jpg``) are skipped with a count, or
refused (``strict``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scratchformer.files import locks

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageFeatures",
    "extract_image_features",
    "list_images",
    "load_image_features",
    "load_photo",
    "photo_rgb",
    "read_photo",
    "save_image_features",
]

FORMAT = "scratchformer-image-features/1"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def photo_rgb(image: Any) -> Any:
    """An opened Pillow image as the 8-bit RGB picture a viewer shows: turned upright by its EXIF
    orientation (phone photos); 16-bit greyscale scaled to 8 bits (Pillow's own conversion clips it:
    a white image); CMYK, palette and greyscale converted; transparent pixels (an alpha channel or a
    palette's transparent colour) shown over white. Float images are refused (their range is unknown)."""
    from PIL import Image, ImageOps

    image = ImageOps.exif_transpose(image)
    if image.mode == "F":
        raise ValueError(f"a 32-bit float image (mode {image.mode}): convert it to 8 or 16 bits per channel")
    if image.mode == "I" or image.mode.startswith("I;16"):
        values = np.asarray(image, dtype=np.int64)
        if values.min() < 0 or values.max() > 65535:
            raise ValueError(
                f"a 32-bit integer image (values {values.min()}..{values.max()}), not 8 or 16 bits"
            )
        image = Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def load_photo(path: str | Path, size: int = 224) -> Tensor:
    """Any image file Pillow reads -> (3, size, size) uint8 RGB (:func:`photo_rgb`: upright, 8 bits,
    transparency over white), the shorter side resized to ``size`` (bilinear, antialiased), then the
    centre ``size`` x ``size`` crop. Errors name the file."""
    from PIL import Image

    rgb = read_photo(path)
    w, h = rgb.size
    scale = size / min(w, h)
    new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
    if (new_w, new_h) != (w, h):
        rgb = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
    left, top = (new_w - size) // 2, (new_h - size) // 2
    rgb = rgb.crop((left, top, left + size, top + size))
    return torch.from_numpy(np.array(rgb)).permute(2, 0, 1).contiguous()


def read_photo(path: str | Path) -> Any:
    """An image file as a Pillow RGB image (:func:`photo_rgb`); errors name the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as file:
            return photo_rgb(file)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: not an image Pillow can read ({e})") from None


@dataclass
class ImageFeatures:
    """Features of named images (see the module docstring)."""

    names: list[str]
    regions: Tensor
    pooled: Tensor
    description: dict[str, str]
    image_dir: str | None = None  # the resolved folder of the photos, where known
    # name -> [size, mtime_ns, digest], where known ([size, mtime_ns] in files of 0.5.1 to 0.11.0)
    stamps: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.regions) == len(self.pooled)):
            raise ValueError(
                f"{len(self.names)} names, {len(self.regions)} region rows, {len(self.pooled)} pooled rows"
            )
        self.row = {name: i for i, name in enumerate(self.names)}

    def select(self, names: Sequence[str], memory: str = "regions") -> Tensor:
        """The ``memory`` ("regions" (N, R, D_img) or "pooled" (N, D_img)) rows of ``names``, as stored
        (float16)."""
        missing = [n for n in names if n not in self.row]
        if missing:
            raise KeyError(
                f"{len(missing)} of {len(names)} images have no features (first: {missing[:3]}); "
                "extract features for them first"
            )
        if memory not in ("regions", "pooled"):
            raise ValueError(f"memory: expected 'regions' or 'pooled', got {memory!r}")
        source = self.regions if memory == "regions" else self.pooled
        return source[torch.tensor([self.row[n] for n in names], dtype=torch.long)]


def check_same_encoder(found: dict[str, str], expected: dict[str, str], where: str) -> None:
    """Refuse features from another encoder, weights or preprocessing than ``expected``."""
    if found != expected:
        diff = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
        raise ValueError(
            f"{where}: features made by another encoder or preprocessing ({', '.join(diff)} differ: "
            f"{ {k: found.get(k) for k in diff} } vs { {k: expected.get(k) for k in diff} }); "
            "features from different encoders are never mixed: use another output file"
        )


def photo_digest(path: Path) -> str:
    """The BLAKE2b digest (16 bytes, hex) of a photo's bytes."""
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def photo_stamp(path: Path) -> list[Any]:
    """[size in bytes, modification time in ns, :func:`photo_digest`] of a photo: what tells that it
    changed."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, photo_digest(path)]


def same_photo(path: Path, stamp: Sequence[Any]) -> bool:
    """Whether the file at ``path`` is the photo ``stamp`` recorded: the same size, and the same
    modification time or (where the stamp has one) the same content digest."""
    if not path.is_file():
        return False
    stat = path.stat()
    if stat.st_size != stamp[0]:
        return False
    if stat.st_mtime_ns == stamp[1]:
        return True
    return len(stamp) > 2 and photo_digest(path) == stamp[2]


def check_same_photos(found: ImageFeatures, image_dir: str, names: Sequence[str], where: str) -> None:
    """Refuse features of photos (of ``names``, in ``image_dir``) changed since they were made, or of
    another image folder. Photos are named relative to their folder, so a moved (or renamed) folder is
    the same photos if every one ``found`` recorded is there, the same (:func:`same_photo`)."""
    folder = Path(image_dir)
    moved = found.image_dir is not None and found.image_dir != image_dir
    # a moved folder must hold every photo the file recorded; the same folder, those of ``names``
    checked = found.stamps if moved else {n: found.stamps[n] for n in names if n in found.stamps}
    changed = [n for n, stamp in checked.items() if not same_photo(folder / n, stamp)]  # each read once
    if moved and (changed or not found.stamps):
        raise ValueError(
            f"{where}: features of the photos in {found.image_dir}, not {image_dir}; "
            f"{len(changed)} of its {len(found.stamps)} photos are not in {image_dir} with the same "
            f"size and content (first: {changed[:3]}); a moved folder is recognised, but "
            "features of different image folders are never mixed: use another output file"
        )
    if changed:
        raise ValueError(
            f"{where}: {len(changed)} photos changed (size, or modification time and content) since "
            f"their features were made (first: {changed[:3]}); delete {where} to extract them again"
        )


def load_image_features(path: str | Path) -> ImageFeatures:
    """Read a features file (see the module docstring); errors name the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"not a scratchformer image-features file (format {meta.get('format')!r})")
            regions, pooled = f.get_tensor("regions"), f.get_tensor("pooled")
        photos = json.loads(meta.get("photos", '{"folder": null, "stamps": {}}'))  # absent in older files
        return ImageFeatures(
            json.loads(meta["names"]),
            regions,
            pooled,
            json.loads(meta["description"]),
            photos["folder"],
            photos["stamps"],
        )
    except (OSError, SafetensorError, KeyError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: cannot read image features ({type(e).__name__}: {e})") from None


def save_image_features(path: str | Path, features: ImageFeatures) -> None:
    """Write atomically: a temporary file, flushed to disk, then renamed over ``path`` (a crash
    leaves the old file or the new one; the chunks :func:`extract_image_features` deletes after
    this write are never the only copy of features that have not reached the disk)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two writers never share a temporary
    meta = {
        "format": FORMAT,
        "names": json.dumps(features.names),
        "description": json.dumps(features.description),
        "photos": json.dumps({"folder": features.image_dir, "stamps": features.stamps}),
    }
    save_file(
        {"regions": features.regions.half().contiguous(), "pooled": features.pooled.half().contiguous()},
        str(tmp),
        metadata=meta,
    )
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    locks.widen_to_umask(tmp)  # safetensors writes 0600: a shared folder could not read the features
    os.replace(tmp, path)


def list_images(folder: str | Path) -> list[str]:
    """The image files in ``folder`` and its subfolders (by suffix), as sorted relative paths
    ("x.jpg", "val2014/y.jpg": the names the caption loaders give)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such image folder")
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )


# The first bytes of the image formats of IMAGE_SUFFIXES (WebP: RIFF....WEBP, checked as RIFF).
_SIGNATURES = (b"\xff\xd8", b"\x89PNG", b"GIF8", b"BM", b"RIFF", b"II*\x00", b"MM\x00*")


def is_image(path: Path) -> bool:
    """Whether Pillow reads ``path`` as an image (its header only: cheap). A file that starts like an
    image (JPEG, PNG, GIF, BMP, WebP, TIFF) but cannot be read is a damaged photo: a ValueError naming
    it; anything else (macOS's ``._x.jpg``, a text file named ``x.png``) is not an image: False."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):
            return True
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        with open(path, "rb") as f:
            start = f.read(8)
        if start.startswith(_SIGNATURES):
            raise ValueError(
                f"{path}: not an image Pillow can read, though it starts like one ({e})"
            ) from None
        return False


def photos_to_extract(folder: Path, names: Sequence[str] | None, out: Path, strict: bool) -> list[str]:
    """The photos :func:`extract_image_features` encodes: ``names`` (each must be an image), or every
    image file of ``folder``, where files that are not images (:func:`is_image`) are skipped with a count
    on stderr (``strict``: refused). Refused too: no photos, missing or damaged ones, and an ``out`` that
    is one of them."""
    listed = names is None
    names = list_images(folder) if names is None else list(dict.fromkeys(names))
    if not names:
        raise ValueError(
            f"{folder}: no images to extract features from (suffixes {', '.join(IMAGE_SUFFIXES)})"
        )
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} images not found in {folder} (first: {missing[:3]})")
    if out.exists() and any(out.samefile(folder / n) for n in names):
        raise ValueError(f"{out}: the features file would overwrite one of the photos; choose another file")
    unreadable = [n for n in names if not is_image(folder / n)]
    if unreadable and (strict or not listed):
        raise ValueError(f"{len(unreadable)} files in {folder} are not images (first: {unreadable[:3]})")
    if unreadable:
        print(
            f"{folder}: skipped {len(unreadable)} files that are not images "
            f"(first: {unreadable[:3]}); strict refuses them",
            file=sys.stderr,
        )
    skipped = set(unreadable)
    return [n for n in names if n not in skipped]


def _holding_lock(extract: Callable[..., ImageFeatures]) -> Callable[..., ImageFeatures]:
    """``extract`` with its ``out`` locked while it runs (``OUT.lock``, see :mod:`scratchformer.data.locks`):
    a second extraction into the same file is refused at once, naming the first."""

    @functools.wraps(extract)
    def locked(*args: Any, **kwargs: Any) -> ImageFeatures:
        out = Path(inspect.signature(extract).bind(*args, **kwargs).arguments["out"])
        made = not out.parent.exists()
        try:
            with locks.held(out.with_name(out.name + ".lock"), f"features file {out}"):
                return extract(*args, **kwargs)
        except BaseException:
            if made and out.parent.is_dir() and not any(out.parent.iterdir()):
                out.parent.rmdir()  # a refused extraction leaves no folder behind (the lock made it)
            raise

    return locked


@_holding_lock
def extract_image_features(
    folder: str | Path,
    out: str | Path,
    encoder: Callable[[Tensor], tuple[Tensor, Tensor]],
    names: Sequence[str] | None = None,
    batch_size: int = 32,
    chunk_size: int = 512,
    device: str | torch.device = "cpu",
    progress: bool = True,
    strict: bool = False,
) -> ImageFeatures:
    """Run ``encoder`` (photos (B, 3, H, W) uint8 -> (regions (B, R, D_img), pooled (B, D_img)); it has
    ``describe()`` and ``image_size``; on ``device``) over ``names`` (default: every image in ``folder``)
    and write them to ``out`` together with the images ``out`` already holds. Returns all of ``out``'s
    features. Files of ``folder`` that are not images (e.g. macOS's ``._x.jpg``) are skipped with a
    count (``strict``: refused); ``names`` must all be images."""
    from tqdm import tqdm

    folder, out = Path(folder), Path(out)
    description = dict(encoder.describe())  # type: ignore[attr-defined]
    names = photos_to_extract(folder, names, out, strict)
    image_dir = str(folder.resolve())
    parts_dir = out.with_name(out.name + ".parts")
    done: list[ImageFeatures] = []
    earlier = ([out] if out.exists() else []) + (
        sorted(parts_dir.glob("*.safetensors")) if parts_dir.is_dir() else []
    )
    for path in earlier:  # the file, then a killed run's chunks: made as this run would make them, or refused
        done.append(load_image_features(path))
        check_same_encoder(done[-1].description, description, str(path))
        check_same_photos(done[-1], image_dir, names, str(path))
    seen = {n for f in done for n in f.names}
    todo = [n for n in names if n not in seen]
    with tqdm(total=len(todo), desc="image features", unit="img", disable=not progress) as bar:
        for start in range(0, len(todo), chunk_size):
            chunk = todo[start : start + chunk_size]
            regions, pooled = _encode_photos(folder, chunk, encoder, batch_size, device, bar)
            part = ImageFeatures(
                chunk, regions, pooled, description, image_dir, {n: photo_stamp(folder / n) for n in chunk}
            )
            parts_dir.mkdir(parents=True, exist_ok=True)
            number = (
                max((int(p.stem) for p in parts_dir.glob("*.safetensors") if p.stem.isdigit()), default=-1)
                + 1
            )
            save_image_features(parts_dir / f"{number:05d}.safetensors", part)
            done.append(part)
    if todo or len(done) > 1 or not out.exists():
        merged = _merge(done, description, image_dir)
        save_image_features(out, merged)
        if parts_dir.is_dir():
            shutil.rmtree(parts_dir)
        return merged
    return done[0]


def _encode_photos(
    folder: Path,
    names: Sequence[str],
    encoder: Callable[[Tensor], tuple[Tensor, Tensor]],
    batch_size: int,
    device: str | torch.device,
    bar: Any,
) -> tuple[Tensor, Tensor]:
    """The encoder's (regions (N, R, D_img), pooled (N, D_img)) of the photos ``names``, in float16."""
    regions, pooled = [], []
    for b in range(0, len(names), batch_size):
        photos = torch.stack(
            [load_photo(folder / n, encoder.image_size) for n in names[b : b + batch_size]]  # type: ignore[attr-defined]
        )
        r, p = encoder(photos.to(device))
        regions.append(r.half().cpu())
        pooled.append(p.half().cpu())
        bar.update(len(photos))
    return torch.cat(regions), torch.cat(pooled)


def _merge(done: Sequence[ImageFeatures], description: dict[str, Any], image_dir: str) -> ImageFeatures:
    """One file's features from several, sorted by name; a name in the file and in a leftover chunk
    (a kill before the clean-up) counts once."""
    rows: dict[str, tuple[ImageFeatures, int]] = {}
    for f in done:
        for i, n in enumerate(f.names):
            rows.setdefault(n, (f, i))
    order = sorted(rows)
    return ImageFeatures(
        order,
        torch.stack([rows[n][0].regions[rows[n][1]] for n in order]),
        torch.stack([rows[n][0].pooled[rows[n][1]] for n in order]),
        description,
        image_dir,
        {n: rows[n][0].stamps[n] for n in order if n in rows[n][0].stamps},
    )
