"""Uploaded images, checked on the event loop before anything is queued: each must be an image
Pillow can identify (its header is read, not its pixels) of at most ``max_image_pixels``. Their bytes
are decoded later, in the inference thread; nothing is written to disk."""

from __future__ import annotations

import io

from fastapi import UploadFile

from scratchformer.serve.config import Limits
from scratchformer.serve.models import RequestError

__all__ = ["check_images"]


async def check_images(files: list[UploadFile], limits: Limits) -> list[bytes]:
    """The files' bytes; 422 for one that is not an image, 413 for one over the pixel limit."""
    from PIL import Image, UnidentifiedImageError

    if len(files) > limits.max_items:
        raise RequestError(422, f"images: {len(files)} files, over the limit max_items={limits.max_items}")
    out = []
    for i, upload in enumerate(files):
        data = await upload.read()
        name = f"images[{i}] ({upload.filename})"
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            raise RequestError(422, f"{name}: not an image Pillow can read") from None
        if width * height > limits.max_image_pixels:
            raise RequestError(
                413,
                f"{name}: {width}x{height} pixels, over the limit max_image_pixels={limits.max_image_pixels}",
            )
        out.append(data)
    return out
