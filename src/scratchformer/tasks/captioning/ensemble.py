"""Several trained captioners decoding as one: :class:`EnsembleCaptioner` (an
:class:`~scratchformer.generation.ensemble.Ensemble` of their models, their mean next-word
log-probabilities at every step of greedy, beam or sampled decoding) and :func:`load_ensemble`::

    captioner = load_ensemble(["runs/flickr8k/best", "runs/flickr8k-seed1/best"])
    features, photos = captioner.photo_features(["dog.jpg"])   # each member's own image encoder
    captioner.caption(features, beam_size=3)

Members must share the caption vocabulary and read the same kind of input. Members trained on the
same image encoder and memory read one features tensor; members of different encoders read their
features packed side by side (:meth:`EnsembleCaptioner.photo_features` and
:meth:`~EnsembleCaptioner.corpus_features` do it). The decoding settings are the first member's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from scratchformer.data.caption_corpora import CaptionCorpus
from scratchformer.generation.ensemble import Ensemble
from scratchformer.tasks.captioning.captioner import Captioner, load_captioner

__all__ = ["EnsembleCaptioner", "load_ensemble"]


class EnsembleCaptioner(Captioner):
    """Captioners (>= 1) with one vocabulary as one :class:`Captioner`."""

    def __init__(self, captioners: Sequence[Captioner]):
        if not captioners:
            raise ValueError("an ensemble needs at least one captioner")
        first = captioners[0]
        for i, c in enumerate(captioners[1:], 2):
            if c.vocab.words != first.vocab.words:
                raise ValueError(
                    f"ensemble member {i} has another caption vocabulary ({len(c.vocab)} words, the first "
                    f"has {len(first.vocab)}): members must be trained on the same captions and min_count"
                )
            if (c.photos is None) != (
                first.photos is None
            ) or c.model.config.input != first.model.config.input:
                raise ValueError(f"ensemble member {i} reads another kind of input than the first")
        self.members = list(captioners)
        self.shared_input = len({self._reads(c) for c in captioners}) == 1
        shapes = None if self.shared_input else [self._input_shape(c) for c in captioners]
        if shapes is not None and first.model.config.input == "pixels":
            raise ValueError("ensemble members that read pixels must read images of one size")
        model = Ensemble([c.model for c in captioners], shapes)
        super().__init__(model, first.vocab, first.decoding, first.device, first.photos)  # type: ignore[arg-type]

    @staticmethod
    def _reads(captioner: Captioner) -> str:
        """What a member reads: its photos' encoder and memory, and its input's shape."""
        c = captioner.model.config
        return repr((captioner.photos, c.input, c.image_size, c.channels, c.feature_dim, c.num_regions))

    @staticmethod
    def _input_shape(captioner: Captioner) -> tuple[int, ...]:
        c, model = captioner.model.config, captioner.model
        pooled = captioner.photos is not None and captioner.photos["memory"] == "pooled"
        if c.image_stages:  # the regions below its fine-tuned top
            return (model.image_top.in_side**2, model.image_top.in_channels)  # type: ignore[union-attr]
        return (c.feature_dim,) if pooled or not c.num_regions else (c.num_regions, c.feature_dim)

    def photo_features(self, paths: Sequence[str | Path], batch_size: int = 32) -> tuple[Tensor, Tensor]:
        """Photo files -> the ensemble's input (each member's features; packed if their encoders or
        memories differ) and the first member's cropped photos."""
        if self.shared_input:
            return self.members[0].photo_features(paths, batch_size)
        made = [c.photo_features(paths, batch_size) for c in self.members]
        return Ensemble.pack([features for features, _ in made]), made[0][1]

    def corpus_features(
        self, corpus: CaptionCorpus, features_file: str | Path | None = None, batch_size: int = 32
    ) -> Tensor:
        """Every photo of ``corpus`` as the ensemble reads it; ``features_file`` only when every
        member was trained on the same image encoder and memory."""
        if self.shared_input:
            return self.members[0].corpus_features(corpus, features_file, batch_size)
        if features_file is not None:
            encoders = [c.photos["image_encoder"]["encoder"] for c in self.members]  # type: ignore[index]
            raise ValueError(
                f"--features: the ensemble's members read features of different encoders or memories "
                f"({', '.join(encoders)}); leave it out (each member encodes the photos)"
            )
        return Ensemble.pack([c.corpus_features(corpus, None, batch_size) for c in self.members])

    def image_encoder(self) -> Any:
        if not self.shared_input:
            raise ValueError("the ensemble's members use different image encoders: ask a member")
        return self.members[0].image_encoder()

    def caption_with_attention(self, image: Tensor, caption: str | None = None) -> tuple[list[str], Tensor]:
        raise ValueError("attention maps are one model's: draw them with one checkpoint, not an ensemble")

    def plot_attention(
        self, image: Tensor, path: str | Path, photo: Any = None, caption: Any = None
    ) -> list[str]:
        return self.caption_with_attention(image, caption)[0]  # refused, before the base's self.model.visual


def load_ensemble(directories: Sequence[str | Path], device: str = "auto") -> Captioner:
    """Checkpoints of :func:`~scratchformer.tasks.captioning.train_captioner` decoding as one (one
    directory: that captioner itself)."""
    captioners = [load_captioner(d, device) for d in directories]
    return captioners[0] if len(captioners) == 1 else EnsembleCaptioner(captioners)
