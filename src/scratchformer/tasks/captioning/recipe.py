"""A captioning run's recipe and the data it names: :class:`CaptioningRecipe` (with the keys of its
``splits`` and ``scst`` sections), :func:`load_caption_splits` (train/valid/test examples, photo
features extracted or reused) and :func:`model_config_for` (the model that fits the data)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from scratchformer.core.keys import reject_unknown
from scratchformer.data.caption_corpora import CaptionCorpus, load_flickr8k, load_karpathy_json
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
)
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR
from scratchformer.models.captioning import CaptioningConfig
from scratchformer.models.image_encoder import ImageEncoder
from scratchformer.tasks.captioning.figures import (
    plot_caption_attention as plot_caption_attention,  # (re-exported)
)
from scratchformer.tasks.shared import (
    CAPTIONING_DECODING,
    check_decoding,
    check_decoding_grid,
    check_model_fields,
    check_range,
)
from scratchformer.training import TrainConfig, distributed, resolve_device
from scratchformer.training.recipe import Recipe, resolve_data_path

__all__ = [
    "AugmentOptions",
    "CaptionSplits",
    "CaptioningRecipe",
    "FineTuneOptions",
    "SelfCriticalOptions",
    "load_caption_splits",
    "model_config_for",
    "photo_corpora",
    "photo_feature_file",
]


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
    baseline: str  # "mean": of the image's other samples (Luo 2020; default), "greedy": the greedy
    # caption's reward (Rennie et al. 2017)
    dropout: bool  # dropout in the policy-gradient forward pass (default true); false: the log-probabilities
    # are those of the policy that sampled (dropout is never on while sampling)
    tune_top: bool  # with ``finetune``: the image encoder's top trains on (default true); false: it
    # stays as cross-entropy left it, and its output regions are computed once (each step is cheaper)


class _RequiredFineTune(TypedDict):
    stages: int  # the image encoder's top stages that train (>= 1; EfficientNet-Lite has 7), with its head


class FineTuneOptions(_RequiredFineTune, total=False):
    """A captioning recipe's ``finetune`` section (photos): the image encoder's top ``stages`` and
    head train with the captioner (BatchNorm statistics frozen); the stages below stay frozen and
    their output is extracted once into ``features``."""

    lr: float  # their peak learning rate (default 0.1 * train.lr; the same schedule; scst scales it
    # as it scales train.lr); 0: they stay frozen (the frozen encoder's features, computed from the
    # cached regions at every step: the control of an ablation)
    features: str  # the file of the regions below the top stages (default
    # "runs/features/{source}-{encoder}-top{stages}.safetensors")


class AugmentOptions(TypedDict, total=False):
    """A captioning recipe's ``augment`` section (region memories): each training photo's regions
    are changed at random, in the grid the encoder made (:mod:`scratchformer.data.caption_augment`)."""

    flip: bool  # mirror half of the photos left-right, "left" and "right" swapped in their captions;
    # never a photo whose captions mention writing or numbers (signs, shirts)
    crop: float  # the least side of a random crop of the region grid, as a fraction (resized back to the
    # grid; 1.0: no crop)


@dataclass
class CaptioningRecipe(Recipe):
    """A captioning run, loadable from JSON (see recipes/shapes_captioning.json, recipes/flickr8k.json).

    ``data`` picks the source: "shapes" (built in; ``shapes`` holds :func:`shape_scene_splits`'s
    arguments), "cs231n" (``cs231n_dir``: train, and cs231n's val split cut into valid
    (``valid_size`` images) and test), "folder" (``image_dir`` and the captions TSVs
    ``train_captions``, ``valid_captions``, optional ``test_captions``; ``image_size`` resizes),
    "flickr8k" (the Flickr8k layout in ``flickr8k_dir``) or "karpathy" (Karpathy's split JSON
    ``karpathy_json`` with photos under ``image_dir``, e.g. COCO). The last two caption real
    photographs: the frozen :class:`~scratchformer.models.image_encoder.ImageEncoder` named by
    ``image_encoder`` turns them into features once, stored in ``features`` (reused when there), and
    ``memory`` picks what the decoder attends over: "regions" (its G x G grid, "Show, Attend and
    Tell") or "pooled" (one vector, cs231n). ``splits`` names the training, validation and test splits
    there (tests are optional); ``{source}`` in ``features`` is the data kind, ``{encoder}`` the
    encoder. ``batch_size`` counts images, each with ``captions_per_image`` of its references
    (encoded once for all of them). ``scst`` adds self-critical training after cross-entropy
    (:class:`SelfCriticalTask`); its weights are scored only if they beat cross-entropy's on
    validation. ``{data}`` in paths is the shared data directory.
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
    image_encoder: str = "efficientnet-lite0"  # photos: the frozen encoder, "efficientnet-lite0",
    # "-lite1" or "-lite2" (each at its native resolution: 7x7, 8x8 or 9x9 regions)
    features: str = "runs/features/{source}-{encoder}.safetensors"  # photos: the feature file, reused
    # when there, else extracted into it; ``{source}`` is the data kind, ``{encoder}`` the image encoder
    memory: str = "regions"  # photos: the decoder attends over "regions" (the encoder's G x G grid) or
    # "pooled" (one vector)
    min_count: int = 1  # words seen fewer times in training become <UNK>
    batch_size: int = 64  # images per batch
    captions_per_image: int = 1  # references of each image in a batch (5: all of Flickr8k's)
    label_smoothing: float = 0.1  # eps_ls of the cross-entropy, in [0, 1)
    model: dict[str, Any] = field(default_factory=dict)  # CaptioningConfig fields (V and input from the data)
    decoding: dict[str, Any] = field(  # the checkpoint's decoding (test splits, ``caption``): the
        default_factory=lambda: {"beam_size": 3, "length_penalty": 1.0}
    )  # DecodingOptions beam_size,
    # length_penalty, no_repeat_ngram_size and min_new_tokens
    decoding_grid: dict[str, list[Any]] = field(default_factory=dict)  # decoding options tried on the
    # validation split after training (decoding key -> values; every combination, on top of
    # ``decoding``); the highest CIDEr-D becomes the checkpoint's decoding ({}: none)
    train: TrainConfig = field(default_factory=TrainConfig)  # how to train: TrainConfig's fields
    scst: dict[str, Any] = field(default_factory=dict)  # self-critical training after cross-entropy, into
    # ``out_dir``/scst: SelfCriticalOptions ({}: none)
    finetune: dict[str, Any] = field(default_factory=dict)  # photos: train the image encoder's top
    # stages too: FineTuneOptions ({}: the encoder stays frozen)
    augment: dict[str, Any] = field(default_factory=dict)  # region memories: random flips and crops of
    # the training photos' regions: AugmentOptions ({}: none)

    METRICS = ("loss", "bleu4", "cider", "exact_match")
    PHOTOS = ("flickr8k", "karpathy")  # real photographs through the image encoder

    def validate(self) -> None:
        if self.data not in ("shapes", "cs231n", "folder", *self.PHOTOS):
            raise ValueError(
                f"data: expected 'shapes', 'cs231n', 'folder', 'flickr8k' or 'karpathy', got {self.data!r}"
            )
        if self.data in self.PHOTOS:
            grid = ImageEncoder.spec(self.image_encoder)[1]  # an unknown name is refused here
            regions = self.model.get("num_regions")
            if self.memory == "regions" and regions and regions != grid * grid:
                raise ValueError(
                    f"model.num_regions={regions}: {self.image_encoder} gives {grid}x{grid} = {grid * grid} "
                    "regions per photo"
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
        check_decoding(self.decoding, CAPTIONING_DECODING)
        check_decoding_grid(self.decoding, self.decoding_grid, CAPTIONING_DECODING)
        if self.scst:
            reject_unknown(
                self.scst, ("steps", "lr", "samples", "eval_every", "baseline", "dropout", "tune_top"), "scst"
            )
            if not isinstance(self.scst.get("steps"), int) or self.scst["steps"] < 1:
                raise ValueError(
                    "scst: expected {'steps': N >= 1, 'lr', 'samples', 'eval_every', 'baseline', 'dropout', "
                    "'tune_top'}, "
                    f"got {self.scst!r}"
                )
            if self.scst.get("baseline", "mean") not in ("mean", "greedy"):
                raise ValueError(f"scst.baseline: expected 'mean' or 'greedy', got {self.scst['baseline']!r}")
            for flag in ("dropout", "tune_top"):
                if not isinstance(self.scst.get(flag, True), bool):
                    raise ValueError(f"scst.{flag}: expected true or false, got {self.scst[flag]!r}")
            if not isinstance(self.scst.get("samples", 5), int) or self.scst.get("samples", 5) < 2:
                raise ValueError(f"scst.samples must be an integer >= 2, got {self.scst.get('samples')!r}")
        self._validate_finetune()
        self._validate_augment()
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

    def _validate_finetune(self) -> None:
        f = self.finetune
        if not f:
            return
        if self.data not in self.PHOTOS or self.memory != "regions":
            raise ValueError("finetune: the image encoder is fine-tuned on photos with memory 'regions'")
        reject_unknown(f, ("stages", "lr", "features"), "finetune")
        stages = f.get("stages")
        if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= 7:
            raise ValueError(
                f"finetune: expected {{'stages': 1..7, 'lr': number > 0, 'features': path}}, got {f!r}"
            )
        lr = f.get("lr", 1.0)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < float("inf"):
            raise ValueError(f"finetune.lr must be a number >= 0, got {lr!r}")
        if not isinstance(f.get("features", ""), str):
            raise ValueError(f"finetune.features must be a path, got {f['features']!r}")

    def _validate_augment(self) -> None:
        a = self.augment
        if not a:
            return
        if self.data not in (*self.PHOTOS, "folder", "cs231n") or self.memory != "regions":
            raise ValueError("augment: flips and crops apply to region features (memory 'regions')")
        reject_unknown(a, ("flip", "crop"), "augment")
        crop = a.get("crop", 1.0)
        if (
            not isinstance(a.get("flip", False), bool)
            or isinstance(crop, bool)
            or not isinstance(crop, (int, float))
            or not 0 < crop <= 1
        ):
            raise ValueError(f"augment: expected {{'flip': true/false, 'crop': number in (0, 1]}}, got {a!r}")

    @property
    def top_stages(self) -> int:
        """The image encoder's stages that train (0: frozen)."""
        return int(self.finetune.get("stages", 0))

    def features_path(self, data_dir: str | Path) -> str:
        """The feature file of the photos: the encoder's regions, or with ``finetune`` the regions
        below its top stages."""
        pattern = (
            self.finetune.get("features", "runs/features/{source}-{encoder}-top{stages}.safetensors")
            if self.finetune
            else self.features
        )
        path = pattern.replace("{source}", self.data).replace("{encoder}", self.image_encoder)
        return str(resolve_data_path(path.replace("{stages}", str(self.top_stages)), data_dir))


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
            list(corpora.values()),
            r.features_path(data_dir),
            r.train.device,
            r.image_encoder,
            r.top_stages,
            progress=r.train.progress,
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
    corpora: Sequence[CaptionCorpus],
    path: str | Path,
    device: str = "cpu",
    encoder_name: str = "efficientnet-lite0",
    top_stages: int = 0,
    progress: bool = True,
) -> ImageFeatures:
    """The image encoder's (``encoder_name``) features of every photo of ``corpora`` (one image folder),
    from the file ``path`` where it has them, else extracted into it (on rank 0 under torchrun; the
    others read it), with a progress bar unless ``progress`` is false (the run's ``train.progress``,
    ``--no-progress``). ``top_stages``: the regions below the encoder's top stages (to fine-tune them)."""
    folder, wanted = photos_folder(corpora)

    def extract() -> ImageFeatures:
        encoder = ImageEncoder(encoder_name, top_stages).to(resolve_device(device))
        return extract_image_features(
            folder, path, encoder, names=wanted, device=encoder.mean.device, progress=progress
        )

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
    return CaptioningConfig(**{**shape, **overrides, "vocab_size": len(vocab), "pad_id": Vocabulary.pad_id})
