"""A features file in use by one extraction is refused to a second at once (the lock names the first);
the file is written readable as the umask says."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchformer.data.image_features import extract_image_features


class MeanColour:
    """A cheap stand-in encoder: the mean colour of 7x7 cells (D_img = 3)."""

    image_size = 224

    def __init__(self) -> None:
        self.seen = 0

    def describe(self) -> dict[str, str]:
        return {"encoder": "mean colour", "preprocessing": "load_photo 224"}

    def __call__(self, photos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen += len(photos)
        cells = torch.nn.functional.avg_pool2d(photos.float(), 32).flatten(2).transpose(1, 2)
        return cells, cells.mean(1)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        pixels = np.random.default_rng(i).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"p{i}.png")
    return folder


def test_a_features_file_in_use_is_refused_before_any_work(tmp_path: Path, photos: Path) -> None:
    out = tmp_path / "features.safetensors"
    lock = tmp_path / "features.safetensors.lock"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"pid": owner.pid, "host": socket.gethostname(), "started": "then"}))
        encoder = MeanColour()
        with pytest.raises(FileExistsError, match=rf"features file {out} is in use .*process {owner.pid}"):
            extract_image_features(photos, out, encoder, progress=False)
        assert encoder.seen == 0 and not out.exists()
    finally:
        owner.kill()
        owner.wait()
    # its owner gone, the lock is stale: taken over, and given back at the end
    assert extract_image_features(photos, out, MeanColour(), progress=False).names == ["p0.png", "p1.png"]
    assert not lock.exists()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_the_features_file_is_written_as_the_umask_says(
    tmp_path: Path, photos: Path, umask: int, mode: int
) -> None:
    previous = os.umask(umask)
    try:
        extract_image_features(photos, tmp_path / "f.safetensors", MeanColour(), progress=False)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "f.safetensors").stat().st_mode) == mode
