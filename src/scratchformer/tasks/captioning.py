"""Image captioning end to end: images (or features) + captions -> CaptioningTransformer -> BLEU-4.

    recipe = CaptioningRecipe.from_json("recipes/shapes_captioning.json")
    report = train_captioner(recipe)          # trains, then scores every test split
    captioner = load_captioner("runs/shapes/best")
    captioner.caption(images)                 # (B, 3, 64, 64) -> ["a small red circle above ...", ...]

Data (``CaptioningRecipe.data``): "shapes" (the built-in rendered scenes, see
:mod:`scratchformer.data.shapes`), "cs231n" (cs231n's COCO features) or "folder" (a folder of
images or feature files with captions TSVs); see :mod:`scratchformer.data.captions`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.tools.attention_maps import record_attention
from scratchformer.data.captions import (
    CaptionExamples,
    Vocabulary,
    load_caption_folder,
    load_cs231n_captions,
    load_image,
    tokenize_caption,
)
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.generation import beam_search, greedy_decode
from scratchformer.models.patch_embedding import PatchEmbedding
from scratchformer.training import TrainConfig, Trainer, check_run, distributed, resolve_device
from scratchformer.training.checkpoint import load_checked, open_checkpoint
from scratchformer.training.recipe import Recipe, resolve_data_path
from scratchformer.tasks.common import check_batch, check_decoding, check_model_fields, check_range, label_smoothed_loss, pad_ids
from scratchformer.fast import optimize

__all__ = ["Captioner", "CaptioningRecipe", "CaptioningTask", "caption_scores", "load_caption_splits",
           "load_captioner", "plot_caption_attention", "plot_caption_examples", "train_captioner"]

PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id


def caption_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Corpus BLEU-4 (sacreBLEU, every reference of each image) and the exact-match rate (the
    hypothesis equals one of its references). Both sides are first normalised as the vocabulary
    sees text (lower case, punctuation split off), as COCO's evaluation does."""
    from sacrebleu.metrics import BLEU

    def normal(text: str) -> str:
        return " ".join(tokenize_caption(text))

    hyps = [normal(h) for h in hypotheses]
    refs = [[normal(r) for r in rs] for rs in references]
    # sacreBLEU wants the same number of references per image; repeating one changes nothing
    # (n-gram counts are clipped by the maximum over references, the closest length is the same).
    streams = [[rs[min(j, len(rs) - 1)] for rs in refs] for j in range(max(len(rs) for rs in refs))]
    bleu = BLEU()
    exact = sum(h in rs for h, rs in zip(hyps, refs))
    return {"bleu4": bleu.corpus_score(hyps, streams).score, "exact_match": exact / max(len(hyps), 1),
            "n": len(hyps), "bleu_signature": str(bleu.get_signature())}


class Captioner:
    """A trained captioning model with its vocabulary: images in, captions out."""

    def __init__(self, model: CaptioningTransformer, vocab: Vocabulary, decoding: dict[str, Any], device: torch.device):
        self.model, self.vocab, self.decoding, self.device = model.eval(), vocab, decoding, device

    def load_image(self, path: str | Path, resize: bool = False) -> Tensor:
        """An image file as (3, H, W) uint8 of the model's size (``resize``: scaled to it; else an error)."""
        c = self.model.config
        if c.input != "pixels":
            raise ValueError("this model captions precomputed image features, not image files")
        image = load_image(path, c.image_size if resize else None)
        if tuple(image.shape[1:]) != (c.image_size, c.image_size):
            raise ValueError(f"{path}: the image is {image.shape[2]}x{image.shape[1]} pixels, the model takes "
                             f"{c.image_size}x{c.image_size} (resize it, or pass --resize)")
        return image

    def _limits(self) -> dict[str, Any]:
        return {"max_len_a": 0.0, "max_len_b": self.model.config.max_len - 1}

    @torch.no_grad()
    def caption(self, inputs: Tensor, beam_size: int | None = None, batch_size: int = 128) -> list[str]:
        """Captions of ``inputs`` (images (N, C, H, W) uint8/float, or features); beam_size 1 = greedy."""
        beam_size = self.decoding.get("beam_size", 3) if beam_size is None else beam_size
        check_batch(batch_size, beam_size)
        out: list[str] = []
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size].to(self.device)
            if beam_size == 1:
                rows = greedy_decode(self.model, batch, bos_id=START, eos_id=END, **self._limits()).tolist()  # type: ignore[union-attr]
            else:
                hyps = beam_search(self.model, batch, bos_id=START, eos_id=END, beam_size=beam_size,
                                   length_penalty=self.decoding.get("length_penalty", 1.0), **self._limits())
                rows = [h[0].tokens for h in hyps]
            out.extend(self.vocab.decode(r) for r in rows)
        return out

    def evaluate(self, examples: CaptionExamples, beam_size: int | None = None) -> dict[str, Any]:
        hypotheses = self.caption(examples.inputs, beam_size)
        return {**caption_scores(hypotheses, examples.references), "hypotheses": hypotheses}

    @torch.no_grad()
    def caption_with_attention(self, image: Tensor) -> tuple[list[str], Tensor]:
        """Greedy caption of one image (C, H, W) and, for each generated word (and <END>), the
        last decoder layer's cross-attention over the memory, averaged over heads: (L, N)."""
        with record_attention(self.model) as recorded:
            ids = greedy_decode(self.model, image[None].to(self.device), bos_id=START, eos_id=END, **self._limits())
        assert isinstance(ids, Tensor)
        last = f"decoder.layers.{len(self.model.decoder.layers) - 1}.cross_attn"
        attention = torch.stack([w[0, :, -1].mean(dim=0) for w in recorded[last]])  # per step (1, H, 1, N) -> (N,)
        tokens = ids[0].tolist()
        length = tokens.index(END) + 1 if END in tokens else len(tokens)
        words = [self.vocab.words[t] for t in tokens[:length]]
        return words, attention[:length].cpu()

    def plot_attention(self, image: Tensor, path: str | Path) -> list[str]:
        """Caption one image (C, H, W) greedily and draw each word's attention over it (a PNG)."""
        visual = self.model.visual
        if not isinstance(visual, PatchEmbedding):
            raise ValueError("attention over the image needs a model that reads pixels, not features")
        words, attention = self.caption_with_attention(image)
        plot_caption_attention(image, words, attention, visual.grid, path)
        return words


def plot_caption_attention(image: Tensor, words: Sequence[str], attention: Tensor, grid: int, path: str | Path) -> None:
    """For each word, the image (C, H, W) with its attention over the grid x grid patches overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pixels = image.permute(1, 2, 0).cpu().float()
    pixels = pixels / 255.0 if image.dtype == torch.uint8 else pixels
    size = image.shape[-1]
    cols = min(6, len(words))
    rows = (len(words) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 2.2 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(words):
            continue
        heat = attention[i].reshape(1, 1, grid, grid).float()
        heat = F.interpolate(heat, size=(size, size), mode="bilinear", align_corners=False)[0, 0]
        ax.imshow(pixels.numpy())
        ax.imshow(heat.numpy(), cmap="inferno", alpha=0.55)
        ax.set_title(words[i], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def plot_caption_examples(images: Tensor, hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                          path: str | Path, title: str = "") -> None:
    """A row of images (N, C, H, W), each with the model's caption and its first two references below."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(images)
    fig, axes = plt.subplots(1, n, figsize=(3.0 * n, 5.0), squeeze=False)
    for ax, image, hyp, refs in zip(axes[0], images, hypotheses, references):
        pixels = image.permute(1, 2, 0).float() / (255.0 if image.dtype == torch.uint8 else 1.0)
        ax.imshow(pixels.numpy())
        ax.set_xticks([])
        ax.set_yticks([])
        match = "exact match" if caption_scores([hyp], [refs])["exact_match"] else "differs from every reference"
        lines = [textwrap.fill(f"model: {hyp}", 38), f"({match})", "references:"]
        lines += [textwrap.fill(f"- {r}", 38) for r in refs[:2]]
        ax.text(0.0, -0.04, "\n".join(lines), transform=ax.transAxes, va="top", ha="left", fontsize=7.5)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.93 if title else 0.98, bottom=0.36, wspace=0.08)
    fig.savefig(path, dpi=110)
    plt.close(fig)


class CaptioningTask:
    """The captioning :class:`~scratchformer.training.TrainingTask`: each epoch every image once, with
    one of its references drawn at random; label-smoothed cross-entropy; validation loss, greedy
    BLEU-4 and exact match."""

    def __init__(self, vocab: Vocabulary, train: CaptionExamples, valid: CaptionExamples,
                 model_config: CaptioningConfig, batch_size: int, label_smoothing: float, decoding: dict[str, Any]):
        self.vocab, self.train, self.valid, self.model_config = vocab, train, valid, model_config
        self.batch_size, self.label_smoothing, self.decoding = batch_size, label_smoothing, decoding
        limit = model_config.max_len - 1  # room for <START> / <END>
        self.encoded = [[vocab.encode(r)[:limit] for r in refs] for refs in train.references]

    def batches(self, epoch: int, seed: int) -> list[list[tuple[int, int]]]:
        """(image, reference) pairs, shuffled by (seed, epoch)."""
        rng = random.Random(f"{seed}-{epoch}")
        order = list(range(len(self.encoded)))
        rng.shuffle(order)
        pairs = [(i, rng.randrange(len(self.encoded[i]))) for i in order]
        return [pairs[s : s + self.batch_size] for s in range(0, len(pairs), self.batch_size)]

    def _loss_inputs(self, captions: Sequence[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
        return pad_ids([[START] + c for c in captions], device), pad_ids([c + [END] for c in captions], device)

    def loss(self, model: nn.Module, batch: list[tuple[int, int]], device: torch.device) -> tuple[Tensor, int]:
        images = self.train.inputs[[i for i, _ in batch]].to(device)
        tgt_in, tgt_out = self._loss_inputs([self.encoded[i][j] for i, j in batch], device)
        logits = model(images, tgt_in)
        return label_smoothed_loss(logits, tgt_out, self.label_smoothing, PAD), int((tgt_out != PAD).sum())

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        limit = self.model_config.max_len - 1
        total, tokens = 0.0, 0
        for start in range(0, len(self.valid), 128):
            images = self.valid.inputs[start : start + 128].to(device)
            refs = [self.vocab.encode(r[0])[:limit] for r in self.valid.references[start : start + 128]]
            tgt_in, tgt_out = self._loss_inputs(refs, device)
            logits = model(images, tgt_in).float()
            total += F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum").item()
            tokens += int((tgt_out != PAD).sum())
        captioner = Captioner(model, self.vocab, self.decoding, device)  # type: ignore[arg-type]
        scores = caption_scores(captioner.caption(self.valid.inputs, beam_size=1), self.valid.references)
        return {"loss": total / tokens, "bleu4": scores["bleu4"], "exact_match": scores["exact_match"]}

    def checkpoint_config(self) -> dict[str, Any]:
        return {"kind": "captioning", "model": self.model_config.to_dict(), "decoding": self.decoding}

    def save_files(self, directory: Path) -> None:
        (directory / "vocab.json").write_text(json.dumps(self.vocab.to_json()))


@dataclass
class CaptioningRecipe(Recipe):
    """A captioning run, loadable from JSON (see recipes/shapes_captioning.json).

    ``data`` picks the source: "shapes" (built in; ``shapes`` holds :func:`shape_scene_splits`'s
    arguments), "cs231n" (``cs231n_dir``: train, and cs231n's val split cut into valid
    (``valid_size`` images) and test), or "folder" (``image_dir`` and the captions TSVs
    ``train_captions``, ``valid_captions``, optional ``test_captions``; ``image_size`` resizes).
    ``{data}`` in paths is the shared data directory.
    """

    data: str = "shapes"
    shapes: dict[str, Any] = field(default_factory=dict)
    cs231n_dir: str | None = None
    pca_features: bool = True
    max_train: int | None = None
    valid_size: int = 500
    image_dir: str | None = None
    train_captions: str | None = None
    valid_captions: str | None = None
    test_captions: str | None = None
    image_size: int | None = None
    min_count: int = 1  # words seen fewer times in training become <UNK>
    batch_size: int = 64
    label_smoothing: float = 0.1
    model: dict[str, Any] = field(default_factory=dict)  # CaptioningConfig fields (V and input from the data)
    decoding: dict[str, Any] = field(default_factory=lambda: {"beam_size": 3, "length_penalty": 1.0})
    train: TrainConfig = field(default_factory=TrainConfig)

    METRICS = ("loss", "bleu4", "exact_match")

    def validate(self) -> None:
        if self.data not in ("shapes", "cs231n", "folder"):
            raise ValueError(f"data: expected 'shapes', 'cs231n' or 'folder', got {self.data!r}")
        check_range(self, {"valid_size": 0, "min_count": 1, "batch_size": 1, "max_train": 1, "image_size": 1},
                    ("label_smoothing",))
        check_decoding(self.decoding, ("beam_size", "length_penalty"))
        decided = ({"input": "features", "num_encoder_layers": 0} if self.data == "cs231n"  # the data decides these
                   else {"image_size": self.image_size or (64 if self.data == "shapes" else None)})
        if decided.get("image_size") is None:  # a folder of images of a size known only when read
            decided["image_size"] = self.model.get("patch_size", 8)
        check_model_fields(CaptioningConfig, {**self.model, **decided}, vocab_size=1000)


def load_caption_splits(recipe: CaptioningRecipe, data_dir: str | Path = "../shared/data"
                        ) -> tuple[dict[str, CaptionExamples], Vocabulary]:
    """The recipe's splits ("train", "valid", and "test..." ones) and the vocabulary."""
    r = recipe
    if r.data == "shapes":
        from scratchformer.data.shapes import shape_scene_splits

        splits = shape_scene_splits(**r.shapes)
        return splits, Vocabulary.build((c for refs in splits["train"].references for c in refs), r.min_count)
    if r.data == "cs231n":
        if not r.cs231n_dir:
            raise ValueError("data 'cs231n' needs cs231n_dir")
        base = resolve_data_path(r.cs231n_dir, data_dir)
        train, vocab = load_cs231n_captions(base, "train", r.pca_features, r.max_train)  # type: ignore[arg-type]
        val, _ = load_cs231n_captions(base, "val", r.pca_features)  # type: ignore[arg-type]
        rest = range(r.valid_size, len(val))
        return {"train": train, "valid": val.subset(range(min(r.valid_size, len(val)))), "test": val.subset(rest)}, vocab
    if not (r.image_dir and r.train_captions and r.valid_captions):
        raise ValueError("data 'folder' needs image_dir, train_captions and valid_captions")
    folder = resolve_data_path(r.image_dir, data_dir)
    names = {"train": r.train_captions, "valid": r.valid_captions, "test": r.test_captions}
    splits = {name: load_caption_folder(resolve_data_path(tsv, data_dir), folder, r.image_size)[0]  # type: ignore[arg-type]
              for name, tsv in names.items() if tsv}
    return splits, Vocabulary.build((c for refs in splits["train"].references for c in refs), r.min_count)


def model_config_for(data: CaptionExamples, vocab: Vocabulary, overrides: dict[str, Any]) -> CaptioningConfig:
    """Vocabulary size and input kind from the data; everything else from the recipe."""
    x = data.inputs
    if x.dim() == 4:
        shape = {"input": "pixels", "channels": x.shape[1], "image_size": x.shape[2]}
        if x.shape[2] != x.shape[3]:
            raise ValueError(f"images must be square, got {tuple(x.shape[1:])}; set image_size to resize")
    else:
        shape = {"input": "features", "feature_dim": x.shape[-1], **({"num_encoder_layers": 0} if x.dim() == 2 else {})}
    return CaptioningConfig(**{**shape, **overrides, "vocab_size": len(vocab), "pad_id": PAD})


def train_captioner(recipe: CaptioningRecipe, data_dir: str | Path = "../shared/data", resume: bool = False,
                    splits: dict[str, CaptionExamples] | None = None) -> dict[str, Any]:
    """Run a recipe: data, vocabulary, model, training; then the best checkpoint on every test split
    (greedy and beam search). Writes ``report.json``, each test split's captions and, with images,
    a figure of its first four images (``{split}_examples.png``).

    ``splits`` ("train", "valid", "test...") replaces the recipe's data; the vocabulary is then
    built from its training captions.

    Under torchrun every process runs this: all load the same (deterministic) data and
    vocabulary and train, then rank 0 alone tests and writes the report.
    """
    start = time.perf_counter()
    r = recipe
    distributed.init(r.train.device)
    check_run(r.train, resume)  # device, precision, output directory: before any data work
    if splits is None:
        splits, vocab = load_caption_splits(r, data_dir)
    else:
        vocab = Vocabulary.build((c for refs in splits["train"].references for c in refs), r.min_count)
    config = model_config_for(splits["train"], vocab, r.model)
    torch.manual_seed(r.train.seed)
    model = optimize(CaptioningTransformer(config))
    task = CaptioningTask(vocab, splits["train"], splits["valid"], config, r.batch_size, r.label_smoothing, r.decoding)
    result = Trainer(model, task, r.train).fit(resume=resume)
    out = Path(r.train.out_dir)
    report: dict[str, Any] = {"parameters": model.num_parameters(), "vocabulary": len(vocab),
                              "train_images": len(splits["train"]), "seconds_train": result.seconds,
                              "best_valid": result.best, "test": {}}
    if not distributed.is_main():
        return report
    captioner = load_captioner(out / "best", device=r.train.device)
    beam = r.decoding.get("beam_size", 3)
    for name in sorted(n for n in splits if n.startswith("test")):
        test = splits[name]
        scores = {"greedy": captioner.evaluate(test, beam_size=1)}
        if beam > 1:
            scores[f"beam{beam}"] = captioner.evaluate(test, beam_size=beam)
        report["test"][name] = {k: {m: v for m, v in s.items() if m != "hypotheses"} for k, s in scores.items()}
        hypotheses = scores[f"beam{beam}" if beam > 1 else "greedy"]["hypotheses"]
        (out / f"{name}_captions.txt").write_text("\n".join(hypotheses) + "\n")
        if config.input == "pixels":
            plot_caption_examples(test.inputs[:4], hypotheses[:4], test.references[:4], out / f"{name}_examples.png",
                                  f"{name} (beam {beam})")
    report["seconds_total"] = time.perf_counter() - start
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def load_captioner(directory: str | Path, device: str = "auto") -> Captioner:
    directory, config = open_checkpoint(directory, "captioning")
    model_config = CaptioningConfig.from_dict(config["model"])
    try:
        vocab = Vocabulary.from_json(json.loads((directory / "vocab.json").read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as e:
        raise ValueError(f"{directory / 'vocab.json'}: not a caption vocabulary ({e})") from None
    if len(vocab) != model_config.vocab_size:
        raise ValueError(f"{directory / 'vocab.json'} does not belong to this model: {len(vocab)} words, the model "
                         f"has {model_config.vocab_size}")
    model = optimize(load_checked(directory, lambda: CaptioningTransformer(model_config)))
    dev = resolve_device(device)
    return Captioner(model.to(dev), vocab, config["decoding"], dev)
