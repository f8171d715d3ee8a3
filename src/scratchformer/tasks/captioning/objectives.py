"""The captioning training tasks (:class:`~scratchformer.training.TrainingTask` s):
:class:`CaptioningTask` (cross-entropy, with the ``augment`` recipe section's flips and crops of the
training regions) and :class:`SelfCriticalTask` (self-critical sequence training on CIDEr-D)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.data.caption_augment import MIRRORED, RegionAugment, flippable
from scratchformer.data.caption_metrics import CiderD, caption_scores
from scratchformer.data.captions import CaptionExamples, Vocabulary
from scratchformer.generation import greedy_decode, sample_decode
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.tasks.captioning.captioner import Captioner
from scratchformer.tasks.shared import label_smoothed_loss, pad_ids
from scratchformer.training.precision import at_least_fp32

__all__ = ["CaptioningTask", "SelfCriticalTask"]

PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id


class CaptioningTask:
    """The captioning :class:`~scratchformer.training.TrainingTask`: each epoch every image once, with
    ``captions_per_image`` of its references drawn at random (the image is encoded once for all of
    them); label-smoothed cross-entropy; validation loss, greedy
    BLEU-4, CIDEr-D and exact match."""

    def __init__(
        self,
        vocab: Vocabulary,
        train: CaptionExamples,
        valid: CaptionExamples,
        model_config: CaptioningConfig,
        batch_size: int,
        label_smoothing: float,
        decoding: dict[str, Any],
        photos: dict[str, Any] | None = None,
        captions_per_image: int = 1,
        augment: dict[str, Any] | None = None,
    ):
        self.vocab, self.train, self.valid, self.model_config = vocab, train, valid, model_config
        self.captions_per_image, self.seed = captions_per_image, 0
        self.batch_size, self.label_smoothing, self.decoding, self.photos = (
            batch_size,
            label_smoothing,
            decoding,
            photos,
        )
        limit = model_config.max_len - 1  # room for <START> / <END>
        self.encoded = [[vocab.encode(r)[:limit] for r in refs] for refs in train.references]
        self.augment = RegionAugment(**augment) if augment else None
        if self.augment is not None:
            pairs = {vocab.index[a]: vocab.index.get(b) for a, b in MIRRORED.items() if a in vocab.index}
            mirrored = {a: b for a, b in pairs.items() if b is not None}
            one_sided = set(pairs) - set(mirrored)  # its mirror word is not in the vocabulary: never flipped
            self.mirrored = [[[mirrored.get(t, t) for t in c] for c in refs] for refs in self.encoded]
            self.flippable = [
                flippable(refs) and not one_sided.intersection(t for c in encoded for t in c)
                for refs, encoded in zip(train.references, self.encoded)
            ]

    def batches(self, epoch: int, seed: int) -> list[list[tuple[int, tuple[int, ...]]]]:
        """Batches of ``batch_size`` images, each with ``captions_per_image`` of its references (drawn
        without replacement; all if it has fewer), shuffled by (seed, epoch)."""
        self.seed = seed  # the augmentation's draws derive from it and the batch
        rng = random.Random(f"{seed}-{epoch}")
        order = list(range(len(self.encoded)))
        rng.shuffle(order)
        k = self.captions_per_image
        items = [
            (
                i,
                (rng.randrange(len(self.encoded[i])),)
                if k == 1
                else tuple(rng.sample(range(len(self.encoded[i])), min(k, len(self.encoded[i])))),
            )
            for i in order
        ]
        return [items[s : s + self.batch_size] for s in range(0, len(items), self.batch_size)]

    def _loss_inputs(self, captions: Sequence[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
        return pad_ids([[START] + c for c in captions], device), pad_ids(
            [c + [END] for c in captions], device
        )

    def loss(
        self, model: nn.Module, batch: list[tuple[int, tuple[int, ...]]], device: torch.device
    ) -> tuple[Tensor, int]:
        images = self.train.inputs[[i for i, _ in batch]].to(device)
        flipped = [False] * len(batch)
        if self.augment is not None:  # drawn from the seed and the batch: a resumed run draws the same
            rng = random.Random(f"{self.seed}-{batch}")
            images, flipped = self.augment(images, [self.flippable[i] for i, _ in batch], rng)
        captions = [
            (self.mirrored if f else self.encoded)[i][j] for (i, refs), f in zip(batch, flipped) for j in refs
        ]
        tgt_in, tgt_out = self._loss_inputs(captions, device)
        per_image = [len(refs) for _, refs in batch]
        logits = model(images, tgt_in, per_image if max(per_image) > 1 else 1)  # each image encoded once
        return label_smoothed_loss(logits, tgt_out, self.label_smoothing, PAD), int((tgt_out != PAD).sum())

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        limit = self.model_config.max_len - 1
        total, tokens = 0.0, 0
        for start in range(0, len(self.valid), 128):
            images = self.valid.inputs[start : start + 128].to(device)
            refs = [self.vocab.encode(r[0])[:limit] for r in self.valid.references[start : start + 128]]
            tgt_in, tgt_out = self._loss_inputs(refs, device)
            logits = at_least_fp32(model(images, tgt_in))
            total += F.cross_entropy(
                logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum"
            ).item()
            tokens += int((tgt_out != PAD).sum())
        captioner = Captioner(model, self.vocab, self.decoding, device)  # type: ignore[arg-type]
        scores = caption_scores(captioner.caption(self.valid.inputs, beam_size=1), self.valid.references)
        return {"loss": total / tokens, **{k: scores[k] for k in ("bleu4", "cider", "exact_match")}}

    def checkpoint_config(self) -> dict[str, Any]:
        return {
            "kind": "captioning",
            "model": self.model_config.to_dict(),
            "decoding": self.decoding,
            **({"photos": self.photos} if self.photos else {}),
        }

    def save_files(self, directory: Path) -> None:
        (directory / "vocab.json").write_text(json.dumps(self.vocab.to_json()))


class SelfCriticalTask(CaptioningTask):
    """Self-critical sequence training (Rennie et al. 2017), the step after cross-entropy that
    optimises the metric itself: for each image draw ``samples`` captions from the model, reward
    each by its CIDEr-D against the image's training references, and raise the log-probability of
    the samples that beat the baseline, lower the others. The baseline is the mean reward of the
    image's other samples (``"mean"``, Luo 2020) or the reward of its greedy caption (``"greedy"``,
    the paper's). Sampling runs without dropout; ``dropout=False`` keeps it off in the gradient's
    forward pass too, so the log-probabilities are those of the policy that sampled. Evaluation as
    :class:`CaptioningTask`."""

    def __init__(
        self, *args: Any, samples: int = 5, baseline: str = "mean", dropout: bool = True, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        if samples < 2 and baseline == "mean":
            raise ValueError(
                f"scst samples must be >= 2 (the baseline is the other samples' mean), got {samples}"
            )
        if baseline not in ("mean", "greedy"):
            raise ValueError(f"scst baseline: expected 'mean' or 'greedy', got {baseline!r}")
        self.samples, self.cider = samples, CiderD(self.train.references)
        self.baseline, self.dropout = baseline, dropout
        self.captions_per_image = 1  # batches of images; their captions are sampled
        self._rewards: list[float] = []  # mean sample and baseline rewards of each batch since the last log
        self._baselines: list[float] = []

    def rewards(self, captions: Tensor, index: Sequence[int], per_image: int) -> Tensor:
        """CIDEr-D (pycocoevalcap's scale: the tables' figures / 100) of each caption (N * per_image,
        T) ids against its image's references: (N, per_image)."""
        return torch.tensor(
            [
                self.cider.score(self.vocab.decode(row), index[n // per_image])
                for n, row in enumerate(captions.tolist())
            ]
        ).view(-1, per_image)

    def loss(
        self, model: nn.Module, batch: list[tuple[int, tuple[int, ...]]], device: torch.device
    ) -> tuple[Tensor, int]:
        index = [i for i, _ in batch]
        images, k = self.train.inputs[index].to(device), self.samples
        inner: CaptioningTransformer = getattr(model, "module", model)  # sample outside DDP: no gradient
        limits = {
            "bos_id": START,
            "eos_id": END,
            "max_len_a": 0.0,
            "max_len_b": self.model_config.max_len - 1,
        }
        inner.eval()
        samples = sample_decode(inner, images, num_samples=k, **limits)
        if self.baseline == "greedy":
            greedy = greedy_decode(inner, images, **limits)
        inner.train(self.dropout)
        rewards = self.rewards(samples, index, k)
        if self.baseline == "greedy":
            base = self.rewards(greedy, index, 1)  # type: ignore[arg-type]
        else:
            base = (rewards.sum(1, keepdim=True) - rewards) / (k - 1)
        self._rewards.append(float(rewards.mean()))
        self._baselines.append(float(base.mean()))
        advantage = (rewards - base).flatten().to(device)
        tgt_in = torch.cat([torch.full_like(samples[:, :1], START), samples[:, :-1]], dim=1)
        logits = model(images, tgt_in, k)
        inner.train()
        log_p = torch.log_softmax(at_least_fp32(logits), dim=-1).gather(-1, samples[..., None])[..., 0]
        real = samples != PAD
        return -(advantage[:, None] * log_p * real).sum() / real.sum(), int(real.sum())

    def train_metrics(self) -> dict[str, float]:
        """The mean CIDEr-D (pycocoevalcap's scale) of the samples and of their baseline since the
        last call (the trainer logs them with each training record)."""
        rewards, baselines = self._rewards, self._baselines
        self._rewards, self._baselines = [], []
        if not rewards:
            return {}
        return {"reward": sum(rewards) / len(rewards), "baseline": sum(baselines) / len(baselines)}
