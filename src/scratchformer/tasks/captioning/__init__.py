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
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.data.caption_corpora import CaptionCorpus, load_flickr8k, load_karpathy_json
from scratchformer.data.caption_metrics import CiderD, caption_scores, exact_matches
from scratchformer.data.caption_splits import (
    cs231n_splits,
    folder_splits,
    photo_split_names,
    photo_splits,
    photos_folder,
    training_vocabulary,
)
from scratchformer.data.captions import CaptionExamples, Vocabulary
from scratchformer.data.image_features import (
    ImageFeatures,
    extract_image_features,
    load_image_features,
    load_photo,
)
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR
from scratchformer.generation import sample_decode
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.models.image_encoder import ImageEncoder
from scratchformer.tasks.captioning.captioner import Captioner, load_captioner
from scratchformer.tasks.common import (
    TrainingRun,
    check_decoding,
    check_model_fields,
    check_range,
    label_smoothed_loss,
    pad_ids,
    stopped_early,
)
from scratchformer.tools import caption_figures
from scratchformer.tools.caption_figures import (
    plot_caption_attention as plot_caption_attention,  # (re-exported)
)
from scratchformer.training import TrainConfig, Trainer, check_run, distributed, resolve_device
from scratchformer.training.checkpoint import load_checked
from scratchformer.training.recipe import Recipe, resolve_data_path

__all__ = [
    "CaptioningRecipe",
    "CaptioningRun",
    "CaptioningTask",
    "SelfCriticalTask",
    "load_caption_splits",
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
            logits = model(images, tgt_in).float()
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
    the samples that beat the mean of the image's other samples (the baseline of Luo 2020), lower
    the others. Evaluation as :class:`CaptioningTask`."""

    def __init__(self, *args: Any, samples: int = 5, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if samples < 2:
            raise ValueError(
                f"scst samples must be >= 2 (the baseline is the other samples' mean), got {samples}"
            )
        self.samples, self.cider = samples, CiderD(self.train.references)
        self.captions_per_image = 1  # batches of images; their captions are sampled

    def loss(
        self, model: nn.Module, batch: list[tuple[int, tuple[int, ...]]], device: torch.device
    ) -> tuple[Tensor, int]:
        index = [i for i, _ in batch]
        images, k = self.train.inputs[index].to(device), self.samples
        inner: CaptioningTransformer = getattr(model, "module", model)  # sample outside DDP: no gradient
        inner.eval()
        samples = sample_decode(
            inner,
            images,
            bos_id=START,
            eos_id=END,
            num_samples=k,
            max_len_a=0.0,
            max_len_b=self.model_config.max_len - 1,
        )
        inner.train()
        rewards = torch.tensor(
            [
                self.cider.score(self.vocab.decode(row), index[n // k])
                for n, row in enumerate(samples.tolist())
            ]
        ).view(-1, k)
        advantage = (rewards - (rewards.sum(1, keepdim=True) - rewards) / (k - 1)).flatten().to(device)
        tgt_in = torch.cat([torch.full_like(samples[:, :1], START), samples[:, :-1]], dim=1)
        logits = model(images, tgt_in, k)
        log_p = torch.log_softmax(logits.float(), dim=-1).gather(-1, samples[..., None])[..., 0]
        real = samples != PAD
        return -(advantage[:, None] * log_p * real).sum() / real.sum(), int(real.sum())


class _RequiredSplits(TypedDict):
    train: str  # the training split (Flickr8k: "train", "dev", "test"; Karpathy: "train" is train + restval)
    valid: str  # the validation split (it picks the best checkpoint)


class CaptionSplits(_RequiredSplits, total=False):
    """A captioning recipe's ``splits`` section (photos): split names of the data."""

    test: str | list[str]  # the test split(s), each scored at the end ([]: none)


class _RequiredSelfCritical(TypedDict):
    steps: int  # optimizer steps of self-critical training (>= 1)


class SelfCriticalOptions(_RequiredSelfCritical, total=False):
    """A captioning recipe's ``scst`` section: self-critical training (:class:`SelfCriticalTask`)
    from the best cross-entropy weights; its weights are scored only if they beat them on validation."""

    lr: float  # its learning rate, constant (default: 0.05 * train.lr)
    samples: int  # captions sampled per image, >= 2 (default 5)
    eval_every: int  # evaluate every N steps (default: train.eval_every)


@dataclass
class CaptioningRecipe(Recipe):
    """A captioning run, loadable from JSON (see recipes/shapes_captioning.json, recipes/flickr8k.json).

    ``data`` picks the source: "shapes" (built in; ``shapes`` holds :func:`shape_scene_splits`'s
    arguments), "cs231n" (``cs231n_dir``: train, and cs231n's val split cut into valid
    (``valid_size`` images) and test), "folder" (``image_dir`` and the captions TSVs
    ``train_captions``, ``valid_captions``, optional ``test_captions``; ``image_size`` resizes),
    "flickr8k" (the Flickr8k layout in ``flickr8k_dir``) or "karpathy" (Karpathy's split JSON
    ``karpathy_json`` with photos under ``image_dir``, e.g. COCO). The last two caption real
    photographs: the frozen :class:`~scratchformer.models.image_encoder.ImageEncoder` turns them into
    features once, stored in ``features`` (reused when there), and ``memory`` picks what the decoder
    attends over: "regions" (the 7 x 7 grid, "Show, Attend and Tell") or "pooled" (one vector, cs231n).
    ``splits`` names the training, validation and test splits there (tests are optional);
    ``{source}`` in ``features`` is the data kind. ``batch_size`` counts images, each with
    ``captions_per_image`` of its references (encoded once for all of them). ``scst`` adds
    self-critical training after cross-entropy (:class:`SelfCriticalTask`); its weights are scored
    only if they beat cross-entropy's on validation. ``{data}`` in paths is the shared data directory.
    """

    data: str = "shapes"  # the source: "shapes" (built in), "cs231n", "folder", "flickr8k" or "karpathy"
    shapes: dict[str, Any] = field(default_factory=dict)  # data "shapes": the scenes, as the arguments of
    # shape_scene_splits ({}: its defaults)
    cs231n_dir: str | None = None  # data "cs231n": the folder of cs231n's COCO files
    pca_features: bool = True  # data "cs231n": its PCA-reduced VGG-16 fc7 features (False: the full ones)
    max_train: int | None = None  # data "cs231n": only the first N training images (None: all)
    valid_size: int = 500  # data "cs231n": images of its val split that validate (the rest test)
    image_dir: str | None = None  # data "folder": the per-image files; data "karpathy": the photos
    train_captions: str | None = None  # data "folder": the training captions, ``image_id<TAB>caption``
    valid_captions: str | None = None  # data "folder": the validation captions (the same format)
    test_captions: str | None = None  # data "folder": the test captions (None: no test)
    image_size: int | None = None  # data "folder": resize the images to this side (None: as they are)
    flickr8k_dir: str | None = None  # data "flickr8k": the Flickr8k folder (captions file, Images/)
    karpathy_json: str | None = None  # data "karpathy": Karpathy's split JSON (e.g. COCO's)
    splits: dict[str, Any] = field(  # data "flickr8k"/"karpathy": the splits that train, validate and
        default_factory=lambda: {"train": "train", "valid": "dev", "test": []}
    )  # test (CaptionSplits)
    features: str = "runs/features/{source}-efficientnet-lite0.safetensors"  # photos: the feature
    # file, reused when there, else extracted into it; ``{source}`` is the data kind
    memory: str = "regions"  # photos: the decoder attends over "regions" (the 7 x 7 grid) or "pooled"
    # (one vector)
    min_count: int = 1  # words seen fewer times in training become <UNK>
    batch_size: int = 64  # images per batch
    captions_per_image: int = 1  # references of each image in a batch (5: all of Flickr8k's)
    label_smoothing: float = 0.1  # eps_ls of the cross-entropy, in [0, 1)
    model: dict[str, Any] = field(default_factory=dict)  # CaptioningConfig fields (V and input from the data)
    decoding: dict[str, Any] = field(  # the checkpoint's decoding (test splits, ``caption``): the
        default_factory=lambda: {"beam_size": 3, "length_penalty": 1.0}
    )  # DecodingOptions beam_size and
    # length_penalty
    train: TrainConfig = field(default_factory=TrainConfig)  # how to train: TrainConfig's fields
    scst: dict[str, Any] = field(default_factory=dict)  # self-critical training after cross-entropy, into
    # ``out_dir``/scst: SelfCriticalOptions ({}: none)

    METRICS = ("loss", "bleu4", "cider", "exact_match")
    PHOTOS = ("flickr8k", "karpathy")  # real photographs through the image encoder

    def validate(self) -> None:
        if self.data not in ("shapes", "cs231n", "folder", *self.PHOTOS):
            raise ValueError(
                f"data: expected 'shapes', 'cs231n', 'folder', 'flickr8k' or 'karpathy', got {self.data!r}"
            )
        if self.memory not in ("regions", "pooled"):
            raise ValueError(f"memory: expected 'regions' or 'pooled', got {self.memory!r}")
        if (
            not isinstance(self.splits, dict)
            or not {"train", "valid"} <= set(self.splits)
            or not all(isinstance(self.splits[k], str) for k in ("train", "valid"))
        ):
            raise ValueError(
                f"splits: expected {{'train': NAME, 'valid': NAME, 'test': [NAMES]}}, got {self.splits!r}"
            )
        tests = self.splits.get("test") or []
        if not isinstance(tests, str) and not (
            isinstance(tests, list) and all(isinstance(t, str) for t in tests)
        ):
            raise ValueError(f"splits.test: expected a split name or a list of names, got {tests!r}")
        if self.memory == "pooled" and self.model.get("num_regions"):
            raise ValueError("model.num_regions: the pooled memory is one vector, not regions; set it to 0")
        needed = {"flickr8k": ("flickr8k_dir",), "karpathy": ("karpathy_json", "image_dir")}.get(
            self.data, ()
        )
        for name in needed:
            if not getattr(self, name):
                raise ValueError(f"data {self.data!r} needs {name}")
        check_range(
            self,
            {
                "valid_size": 0,
                "min_count": 1,
                "batch_size": 1,
                "captions_per_image": 1,
                "max_train": 1,
                "image_size": 1,
            },
            ("label_smoothing",),
        )
        check_decoding(self.decoding, ("beam_size", "length_penalty"))
        if self.scst:
            unknown = set(self.scst) - {"steps", "lr", "samples", "eval_every"}
            if unknown or not isinstance(self.scst.get("steps"), int) or self.scst["steps"] < 1:
                raise ValueError(
                    f"scst: expected {{'steps': N >= 1, 'lr', 'samples', 'eval_every'}}, got {self.scst!r}"
                )
            if not isinstance(self.scst.get("samples", 5), int) or self.scst.get("samples", 5) < 2:
                raise ValueError(f"scst.samples must be an integer >= 2, got {self.scst.get('samples')!r}")
        decided = (
            {"input": "features", "num_encoder_layers": 0}
            if self.data == "cs231n"  # the data decides these
            else {"input": "features", "feature_dim": 1280}
            if self.data in self.PHOTOS
            else {"image_size": self.image_size or (64 if self.data == "shapes" else None)}
        )
        if decided.get("image_size") is None:  # a folder of images of a size known only when read
            decided["image_size"] = self.model.get("patch_size", 8)
        check_model_fields(CaptioningConfig, {**self.model, **decided}, vocab_size=1000)


def load_caption_splits(
    recipe: CaptioningRecipe, data_dir: str | Path = DEFAULT_DATA_DIR
) -> tuple[dict[str, CaptionExamples], Vocabulary]:
    """The recipe's splits ("train", "valid", and "test..." ones) and the vocabulary."""
    r = recipe

    def path(p: str | None) -> Any:  # a recipe path, ``{data}`` resolved
        return resolve_data_path(p, data_dir)

    if r.data == "shapes":
        from scratchformer.data.shapes import shape_scene_splits

        splits = shape_scene_splits(**r.shapes)
    elif r.data == "cs231n":
        if not r.cs231n_dir:
            raise ValueError("data 'cs231n' needs cs231n_dir")
        return cs231n_splits(path(r.cs231n_dir), r.pca_features, r.max_train, r.valid_size)
    elif r.data in r.PHOTOS:
        corpora = photo_corpora(r, data_dir)
        features = photo_feature_file(
            list(corpora.values()), path(r.features.replace("{source}", r.data)), r.train.device
        )
        splits = photo_splits(corpora, features, r.memory)
    else:
        if not (r.image_dir and r.train_captions and r.valid_captions):
            raise ValueError("data 'folder' needs image_dir, train_captions and valid_captions")
        captions = {"train": r.train_captions, "valid": r.valid_captions, "test": r.test_captions}
        splits = folder_splits(path(r.image_dir), {k: path(v) for k, v in captions.items()}, r.image_size)
    return splits, training_vocabulary(splits, r.min_count)


def photo_corpora(recipe: CaptioningRecipe, data_dir: str | Path) -> dict[str, CaptionCorpus]:
    """The recipe's splits of real photographs ("train", "valid", "test" or "test-NAME"), as
    captioned image names; what was left out of each is printed."""
    r, corpora = recipe, {}
    for key, split in photo_split_names(r.splits).items():
        if r.data == "flickr8k":
            corpora[key] = load_flickr8k(resolve_data_path(r.flickr8k_dir, data_dir), split)  # type: ignore[arg-type]
        else:
            corpora[key] = load_karpathy_json(
                resolve_data_path(r.karpathy_json, data_dir),  # type: ignore[arg-type]
                resolve_data_path(r.image_dir, data_dir),
                split,
            )  # type: ignore[arg-type]
        if distributed.is_main():
            print(f"{r.data} {split}: {corpora[key].report()}", file=sys.stderr)
    return corpora


def photo_feature_file(
    corpora: Sequence[CaptionCorpus], path: str | Path, device: str = "cpu"
) -> ImageFeatures:
    """The image encoder's features of every photo of ``corpora`` (one image folder), from the file
    ``path`` where it has them, else extracted into it (on rank 0 under torchrun; the others read it)."""
    folder, wanted = photos_folder(corpora)

    def extract() -> ImageFeatures:
        encoder = ImageEncoder().to(resolve_device(device))
        return extract_image_features(folder, path, encoder, names=wanted, device=encoder.mean.device)

    def extract_to_disk() -> None:  # under torchrun the features stay on disk, not broadcast
        extract()

    if not distributed.world().distributed:
        return extract()
    distributed.on_main(extract_to_disk)
    return load_image_features(path)


def model_config_for(data: CaptionExamples, vocab: Vocabulary, overrides: dict[str, Any]) -> CaptioningConfig:
    """Vocabulary size and input kind from the data; everything else from the recipe."""
    x = data.inputs
    if x.dim() == 4:
        shape = {"input": "pixels", "channels": x.shape[1], "image_size": x.shape[2]}
        if x.shape[2] != x.shape[3]:
            raise ValueError(f"images must be square, got {tuple(x.shape[1:])}; set image_size to resize")
    else:
        shape = {
            "input": "features",
            "feature_dim": x.shape[-1],
            **({"num_encoder_layers": 0} if x.dim() == 2 else {}),
        }
    return CaptioningConfig(**{**shape, **overrides, "vocab_size": len(vocab), "pad_id": PAD})


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
            {"image_encoder": ImageEncoder.describe(), "memory": r.memory} if r.data in r.PHOTOS else None
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
        captioner = load_captioner(self.final / "best", device=self.recipe.train.device)
        # the literature's figures on real photos are on dev too
        scored = ["valid"] if self.recipe.data in self.recipe.PHOTOS else []
        for name in scored + sorted(n for n in self.splits if n.startswith("test")):  # type: ignore[union-attr]
            self.score(captioner, name, report)

    def score(self, captioner: Captioner, name: str, report: dict[str, Any]) -> None:
        """Split ``name`` captioned greedily and with the recipe's beam, scored into ``report``; its
        captions in ``{name}_captions.txt``, a figure of its first four images (``{name}_examples.png``)
        and, with photo regions, of the first one's attention (``{name}_attention.png``)."""
        r, out, test = self.recipe, self.out, self.splits[name]  # type: ignore[index]
        beam = r.decoding.get("beam_size", 3)
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
