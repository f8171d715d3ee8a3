"""Uploaded images, checked before anything is queued: each must be an image Pillow can identify (its
header is read, not its pixels, in a worker thread: never on the event loop) of at most
``max_image_pixels``. Their bytes are decoded later, in the inference thread, as :class:`Upload` objects
whose errors name the upload ("images[1] (cat.png)"); nothing is written to disk."""

from __future__ import annotations

import io
from dataclasses import dataclass

from fastapi import UploadFile
from starlette.concurrency import run_in_threadpool

from scratchformer.serve.config import Limits
from scratchformer.serve.errors import RequestError

__all__ = ["Upload", "check_images"]


@dataclass(frozen=True)
class Upload:
    """An uploaded image: its bytes, and the ``label`` that errors name it by."""

    label: str
    data: bytes

    def open(self) -> io.BytesIO:
        """The bytes as a file (a new one each time) whose name in any error is the label."""
        return _Labelled(self.data, self.label)


class _Labelled(io.BytesIO):
    """Bytes that Pillow and our image readers name by a label instead of ``<_io.BytesIO ...>``."""

    def __init__(self, data: bytes, label: str):
        super().__init__(data)
        self.label = label

    def __str__(self) -> str:
        return self.label

    __repr__ = __str__


async def check_images(files: list[UploadFile], limits: Limits, field: str = "images") -> list[Upload]:
    """The files as uploads; 422 for one that is not an image, 413 for one over the pixel limit."""
    if len(files) > limits.max_items:
        raise RequestError(422, f"{field}: {len(files)} files, over the limit max_items={limits.max_items}")
    out = []
    for i, upload in enumerate(files):
        label = f"{field}[{i}] ({upload.filename})"
        out.append(Upload(label, await upload.read()))
    for upload in out:
        await run_in_threadpool(check_header, upload, limits.max_image_pixels)
    return out


def check_header(upload: Upload, max_pixels: int) -> None:
    """Read an upload's header (not its pixels): 422 if Pillow cannot identify it, 413 if it has
    more than ``max_pixels`` (or more than Pillow opens at all: its decompression-bomb bound)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(upload.open()) as image:
            width, height = image.size
    except Image.DecompressionBombError:
        bound = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise RequestError(
            413,
            f"{upload.label}: more than {bound} pixels, more than Pillow opens; "
            f"the limit is max_image_pixels={max_pixels}",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise RequestError(422, f"{upload.label}: not an image Pillow can read") from None
    if width * height > max_pixels:
        raise RequestError(
            413, f"{upload.label}: {width}x{height} pixels, over the limit max_image_pixels={max_pixels}"
        )
