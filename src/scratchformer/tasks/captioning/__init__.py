"""Image captioning end to end: images, image features or photographs + captions ->
CaptioningTransformer -> BLEU-1..4 and CIDEr-D (the COCO caption evaluation code).

    recipe = CaptioningRecipe.from_json("recipes/flickr8k.json")
    report = train_captioner(recipe)          # features (extracted or reused), training; scores dev
    captioner = load_captioner("runs/flickr8k/best")
    features, photos = captioner.photo_features(["dog.jpg"])   # any photo: resized, cropped, encoded
    captioner.caption(features)               # ["a brown dog is running through the grass", ...]

Data (``CaptioningRecipe.data``, read by :func:`load_caption_splits` and
:mod:`scratchformer.data.caption_splits`): "flickr8k" / "karpathy" (real photographs through the frozen
:class:`~scratchformer.models.image_encoder.ImageEncoder`, see
:mod:`scratchformer.data.caption_corpora` and :mod:`scratchformer.data.image_features`), "shapes"
(the built-in rendered scenes, :mod:`scratchformer.data.shapes`), "cs231n" (cs231n's COCO
features) or "folder" (images or feature files with captions TSVs, :mod:`scratchformer.data.captions`).

This package holds the task: the recipe, the training tasks (cross-entropy, self-critical) and
the run. A trained model at work is :mod:`scratchformer.tasks.captioning.captioner`; the metrics
are in :mod:`scratchformer.data.caption_metrics`, the figures in
:mod:`scratchformer.tools.caption_figures` (all importable from here too).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.data.caption_metrics import CiderD, caption_scores, exact_matches
from scratchformer.data.caption_splits import (
    training_vocabulary,
)
from scratchformer.data.captions import CaptionExamples, Vocabulary
from scratchformer.data.image_features import (
    load_photo,
)
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR
from scratchformer.generation import greedy_decode, sample_decode
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.models.image_encoder import ImageEncoder
from scratchformer.tasks.captioning.captioner import Captioner, choose_decoding, load_captioner
from scratchformer.tasks.captioning.recipe import (  # the recipe and its data; re-exported here
    CaptioningRecipe as CaptioningRecipe,
)
from scratchformer.tasks.captioning.recipe import (
    CaptionSplits as CaptionSplits,
)
from scratchformer.tasks.captioning.recipe import (
    SelfCriticalOptions as SelfCriticalOptions,
)
from scratchformer.tasks.captioning.recipe import (
    load_caption_splits as load_caption_splits,
)
from scratchformer.tasks.captioning.recipe import (
    model_config_for as model_config_for,
)
from scratchformer.tasks.captioning.recipe import (
    photo_corpora as photo_corpora,
)
from scratchformer.tasks.captioning.recipe import (
    photo_feature_file as photo_feature_file,
)
from scratchformer.tasks.common import (
    TrainingRun,
    label_smoothed_loss,
    pad_ids,
    stopped_early,
)
from scratchformer.tools import caption_figures
from scratchformer.tools.caption_figures import (
    plot_caption_attention as plot_caption_attention,  # (re-exported)
)
from scratchformer.training import Trainer, check_run, distributed
from scratchformer.training.checkpoint import load_checked, update_config
from scratchformer.training.precision import at_least_fp32

__all__ = [
    "CaptioningRun",
    "CaptioningTask",
    "SelfCriticalTask",
    "plot_caption_examples",
    "train_captioner",
]
# also importable from here, as before they moved: Captioner, load_captioner (.captioner), caption_scores,
# CiderD (scratchformer.data.caption_metrics), plot_caption_attention (scratchformer.tools.caption_figures)

PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id


def plot_caption_examples(
    images: Tensor,
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    path: str | Path,
    title: str = "",
) -> None:
    """A row of images (N, C, H, W), each with the model's caption, whether it matches one of its
    references exactly, and its first two references below
    (:func:`~scratchformer.tools.caption_figures.plot_caption_examples`)."""
    caption_figures.plot_caption_examples(
        images, hypotheses, references, path, title, matches=exact_matches(hypotheses, references)
    )


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
    ):
        self.vocab, self.train, self.valid, self.model_config = vocab, train, valid, model_config
        self.captions_per_image = captions_per_image
        self.batch_size, self.label_smoothing, self.decoding, self.photos = (
            batch_size,
            label_smoothing,
            decoding,
            photos,
        )
        limit = model_config.max_len - 1  # room for <START> / <END>
        self.encoded = [[vocab.encode(r)[:limit] for r in refs] for refs in train.references]

    def batches(self, epoch: int, seed: int) -> list[list[tuple[int, tuple[int, ...]]]]:
        """Batches of ``batch_size`` images, each with ``captions_per_image`` of its references (drawn
        without replacement; all if it has fewer), shuffled by (seed, epoch)."""
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
        tgt_in, tgt_out = self._loss_inputs([self.encoded[i][j] for i, refs in batch for j in refs], device)
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


class CaptioningRun(TrainingRun):
    """:func:`train_captioner`'s run (:class:`~scratchformer.tasks.common.TrainingRun`): the splits and
    vocabulary, a CaptioningTransformer trained with cross-entropy, then (``scst``) self-critical
    training; the weights that did best on validation score the validation split (photos) and every
    test split."""

    def __init__(
        self,
        recipe: CaptioningRecipe,
        data_dir: str | Path = DEFAULT_DATA_DIR,
        resume: bool = False,
        splits: dict[str, CaptionExamples] | None = None,
    ):
        super().__init__(recipe, data_dir, resume)
        self.splits = splits
        self.final = self.out  # the weights scored: out_dir's, or out_dir/scst's

    def check(self) -> None:
        r = self.recipe
        if r.scst:  # phase 2's output directory is checked now, not after phase 1
            scst_dir = self.out / "scst"
            # it resumes from its own last/; killed before its first save, it starts afresh
            # (its partial log replaced)
            self.resume_scst = self.resume and distributed.on_main(
                lambda: any((scst_dir / d / "training_state.pt").is_file() for d in ("last", "last.old"))
            )
            self.scst_config = dataclasses.replace(
                r.train,
                out_dir=str(scst_dir),
                max_steps=r.scst["steps"],
                warmup_steps=0,
                schedule="constant",
                lr=r.scst.get("lr", r.train.lr * 0.05),
                eval_every=r.scst.get("eval_every", r.train.eval_every),
                overwrite=r.train.overwrite or (self.resume and not self.resume_scst),
            )
            check_run(self.scst_config, self.resume_scst)

    def setup(self) -> tuple[CaptioningTransformer, CaptioningTask, dict[str, Any]]:
        r = self.recipe
        if self.splits is None:
            self.splits, self.vocab = load_caption_splits(r, self.data_dir)
        else:
            self.vocab = training_vocabulary(self.splits, r.min_count)
        seconds_data = self.seconds()
        self.model_config = config = model_config_for(self.splits["train"], self.vocab, r.model)
        self.photos = (
            {"image_encoder": ImageEncoder.describe(r.image_encoder), "memory": r.memory}
            if r.data in r.PHOTOS
            else None
        )
        model = self.new_model(lambda: CaptioningTransformer(config))
        task = CaptioningTask(
            self.vocab,
            self.splits["train"],
            self.splits["valid"],
            config,
            r.batch_size,
            r.label_smoothing,
            r.decoding,
            self.photos,
            r.captions_per_image,
        )
        return (
            model,
            task,
            {
                "parameters": model.num_parameters(),
                "vocabulary": len(self.vocab),
                "train_images": len(self.splits["train"]),
                "seconds_data": seconds_data,
            },
        )

    def train(self, model: nn.Module, task: CaptioningTask) -> dict[str, Any]:  # type: ignore[override]
        """Cross-entropy training; then, with ``scst``, self-critical training from its best weights
        (in ``out_dir/scst``), whose weights are scored only if they beat cross-entropy's on validation."""
        xe = super().train(model, task)
        if not self.recipe.scst:
            return {**xe, "weights_scored": "xe", "valid": {}, "test": {}}
        r, first = self.recipe, self.result
        model.load_state_dict(
            load_checked(self.out / "best", lambda: CaptioningTransformer(self.model_config)).state_dict()
        )
        scst = SelfCriticalTask(
            self.vocab,
            self.splits["train"],
            self.splits["valid"],
            self.model_config,  # type: ignore[index]
            r.batch_size,
            r.label_smoothing,
            r.decoding,
            self.photos,
            samples=r.scst.get("samples", 5),
            baseline=r.scst.get("baseline", "mean"),
            dropout=r.scst.get("dropout", True),
        )
        second = Trainer(model, scst, self.scst_config).fit(resume=self.resume_scst)
        best = {"xe": first.best, "scst": second.best}
        sign = 1 if r.train.best_mode == "max" else -1
        if sign * best["scst"][r.train.best_metric] > sign * best["xe"][r.train.best_metric]:  # type: ignore[index]
            self.final = (
                self.out / "scst"
            )  # self-critical training helped on validation: its weights are scored
        stopped = {
            phase: flag
            for phase, result in (("xe", first), ("scst", second))
            for flag in stopped_early(result).values()
        }
        return {
            "seconds_train": first.seconds + second.seconds,
            "best_valid": best,
            **({"stopped_early": stopped} if stopped else {}),
            "weights_scored": "scst" if self.final != self.out else "xe",
            "valid": {},
            "test": {},
        }

    def finish(self, report: dict[str, Any]) -> None:
        r = self.recipe
        captioner = load_captioner(self.final / "best", device=r.train.device)
        if r.decoding_grid:  # on the validation split; the winner becomes the checkpoint's decoding
            t0 = time.perf_counter()
            captioner.decoding, report["decoding_search"] = choose_decoding(
                captioner,
                self.splits["valid"],
                r.decoding_grid,  # type: ignore[index]
            )
            report["decoding"] = captioner.decoding
            update_config(self.final / "best", decoding=captioner.decoding)
            report["seconds_decoding_search"] = time.perf_counter() - t0
        # the literature's figures on real photos are on dev too
        scored = ["valid"] if self.recipe.data in self.recipe.PHOTOS else []
        for name in scored + sorted(n for n in self.splits if n.startswith("test")):  # type: ignore[union-attr]
            self.score(captioner, name, report)

    def score(self, captioner: Captioner, name: str, report: dict[str, Any]) -> None:
        """Split ``name`` captioned greedily and with the recipe's beam, scored into ``report``; its
        captions in ``{name}_captions.txt``, a figure of its first four images (``{name}_examples.png``)
        and, with photo regions, of the first one's attention (``{name}_attention.png``)."""
        r, out, test = self.recipe, self.out, self.splits[name]  # type: ignore[index]
        beam = captioner.decoding.get("beam_size", 3)
        scores = {"greedy": captioner.evaluate(test, beam_size=1)}
        if beam > 1:
            scores[f"beam{beam}"] = captioner.evaluate(test, beam_size=beam)
        report["valid" if name == "valid" else "test"][name] = {
            k: {m: v for m, v in s.items() if m != "hypotheses"} for k, s in scores.items()
        }
        hypotheses = scores[f"beam{beam}" if beam > 1 else "greedy"]["hypotheses"]
        (out / f"{name}_captions.txt").write_text("\n".join(hypotheses) + "\n")
        pictures = (
            test.inputs[:4]
            if self.model_config.input == "pixels"
            else torch.stack([load_photo(p) for p in test.photos[:4]])
            if test.photos
            else None
        )
        if pictures is not None:
            plot_caption_examples(
                pictures,
                hypotheses[:4],
                test.references[:4],
                out / f"{name}_examples.png",
                f"{r.data} {r.splits.get(name, name) if name == 'valid' else name} (beam {beam})",
            )
        if self.photos and r.memory == "regions" and test.photos:
            captioner.plot_attention(test.inputs[0], out / f"{name}_attention.png", photo=pictures[0])  # type: ignore[index]


def train_captioner(
    recipe: CaptioningRecipe,
    data_dir: str | Path = DEFAULT_DATA_DIR,
    resume: bool = False,
    splits: dict[str, CaptionExamples] | None = None,
) -> dict[str, Any]:
    """Run a recipe: data (with photos: features extracted or reused), vocabulary, model, training;
    then the best checkpoint on the validation split and every test split (greedy and beam search).
    Writes ``report.json``, each scored split's captions and a figure of its first four images
    (``{split}_examples.png``); with photo regions, also an attention figure (``{split}_attention.png``).

    ``splits`` ("train", "valid", "test...") replaces the recipe's data; the vocabulary is then
    built from its training captions.

    Under torchrun every process runs this: all load the same (deterministic) data and
    vocabulary and train, then rank 0 alone tests and writes the report.
    """
    return CaptioningRun(recipe, data_dir, resume, splits).run()
