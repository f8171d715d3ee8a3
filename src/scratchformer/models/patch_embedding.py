"""Images as token sequences (ViT, Dosovitskiy et al. 2020): cut the image into P x P patches,
flatten each, project it to D, and add a learned position for its row and one for its column.

    (B, C, H, W) -> (B, N, D),  N = (H / P) * (W / P) patches in row-major order
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["PatchEmbedding"]


class PatchEmbedding(nn.Module):
    """Linear projection of non-overlapping patches, plus learned 2-D positions.

    Args:
        image_size: H = W, in pixels.  patch_size: P; must divide ``image_size``.
        channels: C (3 for RGB).  d_model: D.
    """

    def __init__(self, image_size: int, patch_size: int, channels: int, d_model: int):
        super().__init__()
        if patch_size <= 0 or image_size % patch_size:
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size}")
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        self.grid = image_size // patch_size  # patches per row and per column
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model)
        self.row = nn.Parameter(torch.randn(self.grid, d_model) * 0.02)  # position of the patch's row
        self.col = nn.Parameter(torch.randn(self.grid, d_model) * 0.02)  # ... and of its column

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid

    def check(self, images: Tensor) -> None:
        """``images`` must be a floating (B, C, H, W) tensor of the configured size."""
        expected = f"(B, C, H, W) = (B, {self.channels}, {self.image_size}, {self.image_size})"
        if not images.is_floating_point():
            raise TypeError(
                f"images: expected a floating-point tensor {expected} (pixels in [0, 1]), "
                f"got dtype {images.dtype}"
            )
        if images.dim() != 4:
            raise ValueError(
                f"images: expected shape {expected}, got {tuple(images.shape)} ({images.dim()} dims)"
            )
        if images.shape[1] != self.channels:
            raise ValueError(
                f"images: expected {self.channels} channels in {expected}, got {tuple(images.shape)}"
            )
        if tuple(images.shape[2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"images: expected {self.image_size}x{self.image_size} pixels in {expected}, "
                f"got {tuple(images.shape)}; resize the images first"
            )

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> patch embeddings (B, N, D)."""
        self.check(images)
        B, C, P, G = images.shape[0], self.channels, self.patch_size, self.grid
        patches = images.reshape(B, C, G, P, G, P).permute(0, 2, 4, 1, 3, 5).reshape(B, G * G, C * P * P)
        position = (self.row[:, None, :] + self.col[None, :, :]).reshape(G * G, -1)  # (N, D), row-major
        return self.proj(patches.to(self.proj.weight.dtype)) + position  # (pixels in the model's dtype)
