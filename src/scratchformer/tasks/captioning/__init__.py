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

This package holds the task: the recipe (:mod:`.recipe`), the training tasks (cross-entropy,
self-critical: :mod:`.objectives`) and the run (here). A trained model at work is
:mod:`scratchformer.tasks.captioning.captioner`; the metrics are in
:mod:`scratchformer.data.caption_metrics`, the figures in :mod:`scratchformer.tasks.captioning.figures`
(all importable from here too).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scratchformer.data.caption_metrics import CiderD as CiderD  # (re-exported)
from scratchformer.data.caption_metrics import caption_scores as caption_scores  # (re-exported)
from scratchformer.data.caption_metrics import exact_matches
from scratchformer.data.caption_splits import (
    training_vocabulary,
)
from scratchformer.data.captions import CaptionExamples, Vocabulary
from scratchformer.data.image_features import (
    load_photo,
)
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR
from scratchformer.models.captioning import CaptioningTransformer
from scratchformer.models.image_encoder import ImageEncoder
from scratchformer.tasks.captioning import figures as caption_figures
from scratchformer.tasks.captioning.captioner import Captioner, choose_decoding, load_captioner
from scratchformer.tasks.captioning.figures import (
    plot_caption_attention as plot_caption_attention,  # (re-exported)
)
from scratchformer.tasks.captioning.objectives import CaptioningTask, SelfCriticalTask
from scratchformer.tasks.captioning.recipe import (
    AugmentOptions as AugmentOptions,
)
from scratchformer.tasks.captioning.recipe import (  # the recipe and its data; re-exported here
    CaptioningRecipe as CaptioningRecipe,
)
from scratchformer.tasks.captioning.recipe import (
    CaptionSplits as CaptionSplits,
)
from scratchformer.tasks.captioning.recipe import (
    FineTuneOptions as FineTuneOptions,
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
from scratchformer.tasks.shared import (
    TrainingRun,
    stopped_early,
)
from scratchformer.training import Trainer, check_run, distributed
from scratchformer.training.checkpoint import load_checked, update_config

__all__ = [
    "CaptioningRun",
    "CaptioningTask",
    "SelfCriticalTask",
    "plot_caption_examples",
    "train_captioner",
]
# also importable from here, as before they moved: Captioner, load_captioner (.captioner), caption_scores,
# CiderD (scratchformer.data.caption_metrics), plot_caption_attention (scratchformer.tasks.captioning.figures)

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
    (:func:`~scratchformer.tasks.captioning.figures.plot_caption_examples`)."""
    caption_figures.plot_caption_examples(
        images, hypotheses, references, path, title, matches=exact_matches(hypotheses, references)
    )


class CaptioningRun(TrainingRun):
    """:func:`train_captioner`'s run (:class:`~scratchformer.tasks.shared.TrainingRun`): the splits and
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
        self.top_lr = recipe.finetune.get("lr", 0.1 * recipe.train.lr) if recipe.finetune else 0.0
        if self.top_lr:  # the image encoder's top trains at its own learning rate
            self.config.lr_groups = {**self.config.lr_groups, "image_top.": self.top_lr}

    def check(self) -> None:
        r = self.recipe
        if r.scst:  # phase 2's output directory is checked now, not after phase 1
            scst_dir = self.out / "scst"
            scst_lr = r.scst.get("lr", r.train.lr * 0.05)  # the encoder's top (lr_groups) scaled alike
            self.scst_top_tuned = bool(self.top_lr) and r.scst.get("tune_top", True)
            groups = {
                k: v * scst_lr / r.train.lr
                for k, v in r.train.lr_groups.items()
                if self.scst_top_tuned or k != "image_top."
            }
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
                lr=scst_lr,
                lr_groups=groups,
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
        top = (
            {
                "image_stages": r.top_stages,
                "image_encoder": r.image_encoder,
                "feature_dim": ImageEncoder.feature_dim,
            }
            if r.finetune
            else {}
        )
        self.model_config = config = model_config_for(self.splits["train"], self.vocab, {**r.model, **top})
        self.photos = (
            {"image_encoder": ImageEncoder.describe(r.image_encoder, r.top_stages), "memory": r.memory}
            if r.data in r.PHOTOS
            else None
        )
        model = self.new_model(lambda: CaptioningTransformer(config))
        if r.finetune and not self.top_lr:
            model.image_top.requires_grad_(False)  # finetune.lr 0: the top runs, frozen
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
            r.augment,
        )
        if task.augment is not None and distributed.is_main():
            print(
                f"augment: {sum(task.flippable)} of {len(task.flippable)} training photos may be flipped "
                "(the others' captions mention writing or numbers)",
                file=sys.stderr,
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
        splits = self.splits
        if r.finetune and not self.scst_top_tuned:  # the top as cross-entropy left it: its output, once
            model.image_top.requires_grad_(False)
            splits = {name: self.through_top(model, splits[name]) for name in ("train", "valid")}  # type: ignore[index]
        scst = SelfCriticalTask(
            self.vocab,
            splits["train"],
            splits["valid"],
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

    def through_top(self, model: CaptioningTransformer, split: CaptionExamples) -> CaptionExamples:
        """``split`` with its regions through the model's (frozen) image top, computed once in fp32
        (``scst.tune_top`` false: each self-critical step then starts above the top)."""
        t0 = time.perf_counter()
        regions = model.top_regions(split.inputs.to(next(model.parameters()).device))
        if distributed.is_main():
            seconds = time.perf_counter() - t0
            shape = tuple(regions.shape)
            print(f"image top: regions {shape} computed once, {seconds:.0f} s", file=sys.stderr)
        return dataclasses.replace(split, inputs=regions)

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
