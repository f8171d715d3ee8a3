"""Photographs as a viewer shows them (16-bit, CMYK, palette transparency, EXIF orientation), folders
with files that are not photos, feature files of a moved folder, and captions TSVs with empty or
repeated captions."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchformer.data.caption_corpora import _collect
from scratchformer.data.captions import load_caption_folder, load_image, read_captions_tsv
from scratchformer.data.image_features import extract_image_features, load_image_features, load_photo


class MeanColour:
    """A cheap stand-in encoder: the mean colour of 7 x 7 cells (D_img = 3)."""

    image_size = 224
    seen = 0

    def describe(self) -> dict[str, str]:
        return {"encoder": "mean colour", "preprocessing": "load_photo 224"}

    def __call__(self, photos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen += len(photos)
        cells = torch.nn.functional.avg_pool2d(photos.float(), 32).flatten(2).transpose(1, 2)
        return cells, cells.mean(1)


def png_rgb16(path: Path, pixels: np.ndarray) -> Path:
    """A 48-bit RGB PNG (Pillow cannot write one): ``pixels`` (H, W, 3) uint16."""
    h, w, _ = pixels.shape
    raw = b"".join(b"\0" + pixels[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return path


# ---------------------------------------------------------------- photos as a viewer shows them


@pytest.mark.parametrize("loader", [lambda p: load_photo(p, 32), lambda p: load_image(p)])
def test_16_bit_photos_are_scaled_to_8_bits_not_clipped_to_white(tmp_path: Path, loader) -> None:
    from PIL import Image

    grey = np.full((32, 32), 20000, dtype=np.uint16)  # 20000 / 65535 of white: 78 in 8 bits
    Image.fromarray(grey).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode.startswith("I")
    assert torch.all(loader(tmp_path / "grey16.png") == 78)
    rgb = np.zeros((32, 32, 3), dtype=np.uint16)
    rgb[..., 0], rgb[..., 2] = 65535, 30000
    image = loader(png_rgb16(tmp_path / "rgb16.png", rgb))
    assert image[:, 0, 0].tolist() == [255, 0, 117]


@pytest.mark.parametrize("loader", [lambda p: load_photo(p, 32), lambda p: load_image(p)])
def test_cmyk_palette_transparency_and_exif_orientation(tmp_path: Path, loader) -> None:
    from PIL import Image

    Image.new("CMYK", (32, 32), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=100)
    red = loader(tmp_path / "cmyk.jpg")[:, 16, 16].tolist()
    assert red[0] > 240 and red[1] < 15 and red[2] < 15
    # a palette PNG whose transparent colour is black: shown over white, not black
    palette = Image.new("P", (32, 32), 0)
    palette.putpalette([0, 0, 0, 0, 128, 0] + [0] * 762)
    palette.paste(1, (0, 0, 16, 32))
    palette.save(tmp_path / "palette.png", transparency=0)
    image = loader(tmp_path / "palette.png")
    assert image[:, 16, 4].tolist() == [0, 128, 0] and image[:, 16, 28].tolist() == [255, 255, 255]
    # a phone photo stored sideways: red on the left, stored with its top to the right (6) or left (8)
    picture = np.zeros((32, 48, 3), dtype=np.uint8)  # (H, W): 48 wide, the top half red
    picture[:16] = (255, 0, 0)
    stored = Image.fromarray(picture)
    for orientation, turned in ((6, Image.Transpose.ROTATE_90), (8, Image.Transpose.ROTATE_270)):
        exif = Image.Exif()
        exif[0x0112] = orientation
        stored.transpose(turned).save(tmp_path / f"exif{orientation}.jpg", exif=exif, quality=100)
        upright = load_image(tmp_path / f"exif{orientation}.jpg")
        assert tuple(upright.shape) == (3, 32, 48)
        assert upright[0, 4, 24] > 240 and upright[0, 28, 24] < 15


def test_float_images_are_refused_with_the_file_named(tmp_path: Path) -> None:
    from PIL import Image

    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(tmp_path / "float.tif")
    with pytest.raises(ValueError, match="float.tif: not an image Pillow can read .*32-bit float"):
        load_photo(tmp_path / "float.tif", 8)


# ---------------------------------------------------------------- folders and feature files


def photo_folder(folder: Path, n: int = 2) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (40, 30), (40 * i, 80, 120)).save(folder / f"p{i}.jpg")
    return folder


def test_files_that_are_not_photos_are_skipped_with_a_count_or_refused(tmp_path: Path, capsys) -> None:
    images = photo_folder(tmp_path / "images")
    (images / "._p0.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")  # macOS
    (images / "notes.png").write_text("not a picture")
    features = extract_image_features(images, tmp_path / "f.safetensors", MeanColour(), progress=False)
    assert features.names == ["p0.jpg", "p1.jpg"]
    assert "skipped 2 files that are not images (first: ['._p0.jpg', 'notes.png'])" in (
        capsys.readouterr().err
    )
    with pytest.raises(ValueError, match=r"2 files in .* are not images \(first"):
        extract_image_features(images, tmp_path / "g.safetensors", MeanColour(), progress=False, strict=True)
    with pytest.raises(ValueError, match=r"1 files in .* are not images .*\['notes.png'\]"):  # asked by name
        extract_image_features(images, tmp_path / "g.safetensors", MeanColour(), ["p0.jpg", "notes.png"])
    assert not (tmp_path / "g.safetensors").exists()
    (images / "damaged.jpg").write_bytes(b"\xff\xd8\xff truncated")  # a photo, damaged: always refused
    with pytest.raises(
        ValueError, match="damaged.jpg: not an image Pillow can read, though it starts like one"
    ):
        extract_image_features(images, tmp_path / "g.safetensors", MeanColour(), progress=False)
    (images / "damaged.jpg").unlink()
    with pytest.raises(ValueError, match="would overwrite one of the photos"):
        extract_image_features(images, images / "p1.jpg", MeanColour(), progress=False)


def test_a_moved_folder_keeps_its_features_another_folder_is_refused(tmp_path: Path) -> None:
    photo_folder(tmp_path / "a")
    out = tmp_path / "f.safetensors"
    first = extract_image_features(tmp_path / "a", out, MeanColour(), progress=False)
    shutil.move(tmp_path / "a", tmp_path / "moved")  # the same photos, sizes and times
    encoder = MeanColour()
    again = extract_image_features(tmp_path / "moved", out, encoder, progress=False)
    assert encoder.seen == 0 and again.names == first.names and torch.equal(again.pooled, first.pooled)
    os.utime(tmp_path / "moved" / "p1.jpg", ns=(0, 123))  # touched: the same bytes, still recognised
    assert extract_image_features(tmp_path / "moved", out, encoder, progress=False).names == first.names
    assert encoder.seen == 0
    shutil.copy(tmp_path / "moved" / "p0.jpg", tmp_path / "moved" / "p1.jpg")  # one photo replaced since
    photo_folder(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "p0.jpg", tmp_path / "b" / "p1.jpg")  # another photo of the same name
    for folder in ("moved", "b"):
        with pytest.raises(ValueError, match=rf"features of the photos in .*/a, not .*/{folder}; .*p1.jpg"):
            extract_image_features(tmp_path / folder, out, MeanColour(), progress=False)


def test_feature_files_of_earlier_versions_still_load(tmp_path: Path) -> None:
    """0.5.1 to 0.11.0 recorded the absolute folder and each photo's size and time; before, no photos."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    images = photo_folder(tmp_path / "images")
    out = tmp_path / "f.safetensors"
    first = extract_image_features(images, out, MeanColour(), progress=False)
    with safe_open(str(out), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    stamps = {n: [(images / n).stat().st_size, (images / n).stat().st_mtime_ns] for n in first.names}
    meta["photos"] = f'{{"folder": "{images.resolve()}", "stamps": {str(stamps).replace(chr(39), chr(34))}}}'
    save_file(tensors, str(out), metadata=meta)
    assert load_image_features(out).image_dir == str(images.resolve())
    assert extract_image_features(images, out, MeanColour(), progress=False).names == first.names
    os.utime(images / "p0.jpg", ns=(0, 123))  # such a stamp has no digest: a new time is a changed photo
    with pytest.raises(ValueError, match=r"1 photos changed .*p0.jpg"):
        extract_image_features(images, out, MeanColour(), progress=False)
    del meta["photos"]
    save_file(tensors, str(out), metadata=meta)
    assert load_image_features(out).image_dir is None
    assert torch.equal(extract_image_features(images, out, MeanColour(), progress=False).pooled, first.pooled)


# ---------------------------------------------------------------- captions


def test_a_captions_tsv_refuses_empty_captions_and_counts_repeated_ones(tmp_path: Path, capsys) -> None:
    tsv = tmp_path / "captions.tsv"
    tsv.write_text("a.png\ta dog\na.png#1\ta dog\na.png\ta cat\nb.png\t  \n")
    with pytest.raises(ValueError, match=r"captions.tsv:4: empty caption for image 'b.png'"):
        read_captions_tsv(tsv)
    tsv.write_text("a.png\ta dog\na.png#1\ta dog \na.png\ta cat\nb.png\ta dog\n")
    assert read_captions_tsv(tsv) == {"a.png": ["a dog", "a cat"], "b.png": ["a dog"]}
    assert "1 captions repeated for the same image, each counted once" in capsys.readouterr().err
    photo_folder(tmp_path / "images")
    (tmp_path / "images.tsv").write_text("p0.jpg\tone\np0.jpg\tone\n")
    examples, _ = load_caption_folder(tmp_path / "images.tsv", tmp_path / "images")
    assert examples.references == [["one"]]


def test_corpora_count_captions_repeated_for_their_image(tmp_path: Path) -> None:
    photo_folder(tmp_path)
    corpus = _collect(
        tmp_path, [("p0.jpg", "a dog"), ("p0.jpg", "a dog"), ("p0.jpg", " "), ("p1.jpg", "x")], None
    )
    assert corpus.references == [["a dog"], ["x"]]
    assert corpus.problems == Counter({"caption repeated for its image": 1, "empty caption": 1})
