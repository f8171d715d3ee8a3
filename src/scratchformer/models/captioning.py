"""Image captioning Transformer (cs231n's CaptioningTransformer, grown up).

The image becomes the decoder's *memory*; a masked Transformer decoder writes the caption
word by word, attending to it:

    memory = Encoder(PatchEmbedding(pixels))      from pixels: a small ViT made of our layers
    memory = Linear(features) [+ region positions] from CNN features (B, D_img) or regions (B, R, D_img)
    memory = Linear(ImageTop(features)) [+ ...]   from the regions below a CNN's top stages, fine-tuned
    logits = Generator(Decoder(Embed(caption), memory))

It has the encoder-decoder interface of :class:`~scratchformer.Transformer` (``encode``,
``decode`` with a key/value cache), so :func:`~scratchformer.greedy_decode`
and :func:`~scratchformer.beam_search` caption images unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from scratchformer.core.checks import check_features, check_tokens
from scratchformer.core.config import ModelConfig
from scratchformer.models.image_encoder import IMAGE_ENCODERS, ImageTop
from scratchformer.models.patch_embedding import PatchEmbedding

__all__ = ["CaptioningConfig", "CaptioningTransformer"]


@dataclass
class CaptioningConfig(ModelConfig):
    """:class:`~scratchformer.core.config.ModelConfig`'s fields (pre-LN by default: it trains a ViT
    stably), and:

    Attributes:
        vocab_size: V, caption words (with the special words).
        input: "pixels" (images, through a patch embedding and an encoder) or "features"
            (precomputed image features, projected to D).
        image_size: H = W, the images' side in pixels ("pixels"; a multiple of patch_size).
        channels: C, the images' colour channels ("pixels").
        patch_size: P, the side of the square patches an image is cut into ("pixels").
        feature_dim: D_img of the features ("features").
        num_regions: with region features (B, R, D_img), a learned position embedding for each of
            the R regions (their place in the image's grid); 0: none (the regions are a set);
            "features" only.
        num_encoder_layers: encoder layers over the patches or regions (>= 0; 0: the patch
            embeddings or the projected features are the memory, as in cs231n).
        num_decoder_layers: caption decoder layers (>= 1).
        max_len: longest caption in tokens, <START> included.
        tie_output: the output projection reuses the word embedding matrix.
        image_stages: "features" only: > 0: the features are the regions below the top
            ``image_stages`` stages of ``image_encoder`` (B, h*w, C), and those stages and the
            head (:class:`~scratchformer.models.image_encoder.ImageTop`, ImageNet weights to start
            from) are part of the model and train with it; ``feature_dim`` is their output's, 1280.
        image_encoder: the EfficientNet-Lite of ``image_stages`` (e.g. "efficientnet-lite2").
    """

    VOCABS = ("vocab_size",)
    SIZES = ("image_size", "channels", "patch_size", "feature_dim", "num_decoder_layers")
    DEPTHS = ("num_encoder_layers", "num_regions", "image_stages")

    vocab_size: int
    _: KW_ONLY
    input: str = "pixels"
    image_size: int = 64
    channels: int = 3
    patch_size: int = 8
    feature_dim: int = 512
    num_regions: int = 0
    d_model: int = 256
    num_heads: int = 4
    d_ff: int = 1024
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    norm_first: bool = True
    max_len: int = 32
    tie_output: bool = True
    image_stages: int = 0
    image_encoder: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.input not in ("pixels", "features"):
            raise ValueError(f"input: expected 'pixels' or 'features', got {self.input!r}")
        if self.input == "pixels" and self.num_regions:
            raise ValueError(
                f"num_regions={self.num_regions} applies to region features (input 'features'), "
                "not to pixels (their patches have positions already)"
            )
        if self.image_stages and (self.input != "features" or self.image_encoder not in IMAGE_ENCODERS):
            raise ValueError(
                f"image_stages={self.image_stages}: fine-tuning needs input 'features' and an "
                f"image_encoder of {', '.join(IMAGE_ENCODERS)}, got {self.input!r}, {self.image_encoder!r}"
            )
        if self.input == "pixels" and self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")

    @property
    def tgt_vocab_size(self) -> int:
        """The decoding functions' name for V."""
        return self.vocab_size


class CaptioningTransformer(nn.Module):
    """Image -> memory -> Transformer decoder -> next-word logits.

    Example:
        >>> model = CaptioningTransformer(CaptioningConfig(vocab_size=40, d_model=64, d_ff=128))
        >>> logits = model(images, captions)   # (B, 3, 64, 64), (B, T) -> (B, T, V)
        >>> greedy_decode(model.eval(), images, bos_id=1, eos_id=2, max_len_a=0, max_len_b=20)
    """

    def __init__(self, config: CaptioningConfig):
        super().__init__()
        self.config = c = config
        if c.image_stages:  # the CNN's top, fine-tuned; the random stream is left as it was, so the
            with torch.random.fork_rng(devices=[]):  # layers below start as without it
                self.image_top = ImageTop(c.image_encoder, c.image_stages)
        self.visual: nn.Module = (
            PatchEmbedding(c.image_size, c.patch_size, c.channels, c.d_model)
            if c.input == "pixels"
            else nn.Linear(c.feature_dim, c.d_model)  # cs231n's visual_projection
        )
        if c.num_regions:
            self.region_positions = nn.Parameter(torch.randn(c.num_regions, c.d_model) * 0.02)
        self.encoder = c.build_encoder(c.num_encoder_layers)
        self.embed = c.build_embedding(c.vocab_size)
        self.pos = c.build_positions()
        self.dropout = nn.Dropout(c.dropout)
        self.decoder = c.build_decoder(c.num_decoder_layers)
        self.generator = c.build_output(c.vocab_size, self.embed if c.tie_output else None)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def source_padding_mask(self, images: Tensor) -> Tensor | None:
        """Every patch or region is real: no memory padding (the decoding functions ask)."""
        return None

    def encode(self, images: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """Image -> memory (B, N, D).

        ``images``: with input "pixels", (B, C, H, W) uint8 (0-255) or float (0-1); with
        "features", (B, D_img) (one memory slot) or (B, R, D_img) (R regions); with
        ``image_stages``, (B, h*w, C) regions below the image encoder's top stages, or the top's
        output (B, R, D_img) computed once (:meth:`top_regions`: the top frozen).
        ``src_padding_mask`` must be None (kept for the decoding functions' interface).
        """
        if src_padding_mask is not None:
            raise ValueError("src_padding_mask: images have no padding; pass None")
        c = self.config
        if c.input == "pixels":
            if images.dtype == torch.uint8:
                images = images.float() / 255.0
            x = self.visual(images)  # (B, N, D), checks the shape
        else:
            if c.image_stages and images.shape[-1] != c.feature_dim:  # not yet through the top
                images = self.image_top(images)  # (B, h*w, C) -> (B, G*G, 1280)
            if images.dim() == 2:
                images = images[:, None, :]  # one vector per image: a memory of length 1
            check_features("features", images, "(B, D_img) or (B, R, D_img)", c.feature_dim)
            x = self.visual(images.to(self.visual.weight.dtype))  # features may be stored in float16
            if c.num_regions:
                if images.shape[1] != c.num_regions:
                    raise ValueError(
                        f"features: expected R={c.num_regions} regions (num_regions), "
                        f"got {tuple(images.shape)}"
                    )
                x = x + self.region_positions
        return self.encoder(self.dropout(x))

    @torch.no_grad()
    def top_regions(self, images: Tensor, batch_size: int = 64) -> Tensor:
        """The fine-tuned image top's output (N, G*G, D_img) for (N, h*w, C) regions below it, computed
        once in batches: :meth:`encode` takes it in their place while the top stays frozen."""
        if not self.config.image_stages:
            raise ValueError("top_regions: this captioner has no fine-tuned image top (image_stages 0)")
        starts = range(0, len(images), batch_size)
        return torch.cat([self.image_top(images[s : s + batch_size]) for s in starts])

    def embed_target(self, tgt: Tensor, offset: int | Tensor = 0) -> Tensor:
        """tgt (B, T) caption ids at positions offset, offset + 1, ... (``offset`` (B,): per row) ->
        (B, T, D): embedding plus positions, before dropout."""
        return self.pos(self.embed(tgt), offset=offset)

    def decode(
        self, captions: Tensor, memory: Tensor, src_padding_mask: Tensor | None = None, cache: Any = None
    ) -> Tensor:
        """Next-word logits (B, T, V) for ``captions`` (B, T) word ids (with a ``cache``: only the new
        words) given ``memory`` (B, N, D). The decoder's self-attention is causal."""
        offset = len(cache) if cache is not None else 0
        check_tokens("captions", captions, self.config.vocab_size)
        if offset + captions.shape[1] > self.config.max_len:
            raise ValueError(
                f"captions: length {offset + captions.shape[1]} exceeds max_len={self.config.max_len}"
            )
        check_features("memory", memory, "(B, N, D)", self.config.d_model, batch=captions.shape[0])
        x = self.dropout(self.embed_target(captions, offset))
        return self.generator(self.decoder(x, memory, memory_key_padding_mask=src_padding_mask, cache=cache))

    def forward(
        self, images: Tensor, captions: Tensor, captions_per_image: int | Sequence[int] = 1
    ) -> Tensor:
        """Teacher forcing: images (see :meth:`encode`), captions (B', T) starting with <START>
        -> (B', T, V) logits of each next word. With several captions of each image (B' =
        sum of ``captions_per_image``, in image order), each image is encoded once."""
        memory = self.encode(images)
        if captions_per_image != 1:
            counts = torch.as_tensor(captions_per_image)
            if counts.dim() == 1 and len(counts) != memory.shape[0]:
                raise ValueError(f"captions_per_image: {len(counts)} counts for B={memory.shape[0]} images")
            counts = counts.expand(memory.shape[0])
            if int(counts.sum()) != captions.shape[0]:
                raise ValueError(
                    f"captions_per_image: sums to {int(counts.sum())} for {memory.shape[0]} images, "
                    f"but there are B'={captions.shape[0]} captions"
                )
            memory = memory.repeat_interleave(counts.to(memory.device), dim=0, output_size=captions.shape[0])
        return self.decode(captions, memory)
