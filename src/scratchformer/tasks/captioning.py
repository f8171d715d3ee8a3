"""Image captioning end to end: images, image features or photographs + captions ->
CaptioningTransformer -> BLEU-1..4 and CIDEr-D (the COCO caption evaluation code).

    recipe = CaptioningRecipe.from_json("recipes/flickr8k.json")
    report = train_captioner(recipe)          # features (extracted or reused), training; scores dev
    captioner = load_captioner("runs/flickr8k/best")
    features, photos = captioner.photo_features(["dog.jpg"])   # any photo: resized, cropped, encoded
    captioner.caption(features)               # ["a brown dog is running through the grass", ...]

Data (``CaptioningRecipe.data``): "flickr8k" / "karpathy" (real photographs through the frozen
:class:`~scratchformer.models.image_encoder.ImageEncoder`, see
:mod:`scratchformer.data.caption_corpora` and :mod:`scratchformer.data.image_features`), "shapes"
(the built-in rendered scenes, :mod:`scratchformer.data.shapes`), "cs231n" (cs231n's COCO
features) or "folder" (images or feature files with captions TSVs, :mod:`scratchformer.data.captions`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.tools.attention_maps import record_attention
from scratchformer.data.captions import (
    CaptionExamples,
    Vocabulary,
    load_caption_folder,
    load_cs231n_captions,
    caption_words,
    load_image,
)
from scratchformer.data.caption_corpora import CaptionCorpus, load_flickr8k, load_karpathy_json
from scratchformer.data.image_features import (
    ImageFeatures,
    extract_image_features,
    load_image_features,
    load_photo,
)
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.models.image_encoder import ImageEncoder
from scratchformer.generation import GenerationConfig, generate, greedy_decode, sample_decode
from scratchformer.models.patch_embedding import PatchEmbedding
from scratchformer.training import TrainConfig, Trainer, check_run, distributed, resolve_device
from scratchformer.training.checkpoint import load_checked, open_checkpoint
from scratchformer.training.recipe import Recipe, resolve_data_path
from scratchformer.tasks.common import Generated, check_batch, check_decoding, check_model_fields, check_range, label_smoothed_loss, pad_ids
from scratchformer.fast import optimize

__all__ = ["Captioner", "CaptioningRecipe", "CaptioningTask", "CiderD", "SelfCriticalTask", "caption_scores",
           "load_caption_splits", "load_captioner", "plot_caption_attention", "plot_caption_examples", "train_captioner"]

PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id


def caption_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, Any]:
    """BLEU-1..4 and CIDEr-D (x100) as the captioning literature reports them: the COCO caption
    evaluation code's scorers (``pycocoevalcap`` Bleu(4) and Cider, which is CIDEr-D: sigma 6,
    clipped counts, document frequencies from these references), each hypothesis against all of its
    image's references; and the exact-match rate (the hypothesis equals one of its references).

    Tokenisation (both sides alike): :func:`~scratchformer.data.captions.caption_words`, i.e. COCO's
    PTB tokenisation done in Python (lower case, punctuation split off and removed), not its Java
    tokenizer.
    """
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
    except ImportError as e:
        raise ImportError("captioning metrics need pycocoevalcap: pip install 'scratchformer[captioning]'") from e
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference lists (need the same, > 0)")
    res = {i: [" ".join(caption_words(h))] for i, h in enumerate(hypotheses)}
    gts = {i: [" ".join(caption_words(r)) for r in refs] for i, refs in enumerate(references)}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    exact = sum(res[i][0] in gts[i] for i in res)
    return {**{f"bleu{n}": 100 * b for n, b in enumerate(bleu, 1)}, "cider": 100 * float(cider),
            "exact_match": exact / len(res), "n": len(res),
            "tokenisation": "caption_words: lower case, punctuation split off and removed (PTB's list)"}


class CiderD:
    """CIDEr-D of hypotheses against fixed reference sets, as a per-caption training reward.

    The same formula as ``pycocoevalcap``'s Cider (n = 1..4, tf-idf vectors, clipped counts, the
    Gaussian length penalty with sigma 6, x10), but with document frequencies computed once from
    ``references`` (e.g. the training captions) and each reference set's vectors precomputed, so
    scoring a batch of samples is cheap. With ``references`` equal to the evaluated images'
    references, its mean equals pycocoevalcap's corpus CIDEr-D (a test checks this).
    """

    def __init__(self, references: Sequence[Sequence[str]], n: int = 4, sigma: float = 6.0):
        self.n, self.sigma = n, sigma
        tokenised = [[caption_words(r) for r in refs] for refs in references]
        self.df: Counter[tuple[str, ...]] = Counter()
        for refs in tokenised:
            self.df.update({g for words in refs for g in self._ngrams(words)})
        self.log_n = math.log(float(len(references)))
        self.refs = [[self._vector(words) for words in refs] for refs in tokenised]

    def _ngrams(self, words: list[str]) -> Counter[tuple[str, ...]]:
        return Counter(tuple(words[i : i + k]) for k in range(1, self.n + 1) for i in range(len(words) - k + 1))

    def _vector(self, words: list[str]) -> tuple[list[dict[tuple[str, ...], float]], list[float], int]:
        vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(self.n)]
        norm = [0.0] * self.n
        length = 0
        for gram, tf in self._ngrams(words).items():
            k = len(gram) - 1
            vec[k][gram] = w = tf * (self.log_n - math.log(max(1.0, self.df[gram])))
            norm[k] += w * w
            length += tf if k == 1 else 0  # pycocoevalcap counts the length in bigrams
        return vec, [math.sqrt(x) for x in norm], length

    def score(self, hypothesis: str, image: int) -> float:
        """CIDEr-D (x10, as pycocoevalcap: 10 = perfect consensus) of ``hypothesis`` for reference set ``image``."""
        vec, norm, length = self._vector(caption_words(hypothesis))
        total = 0.0
        for ref_vec, ref_norm, ref_length in self.refs[image]:
            penalty = math.exp(-((length - ref_length) ** 2) / (2 * self.sigma**2))
            for k in range(self.n):
                value = sum(min(w, ref_vec[k].get(g, 0.0)) * ref_vec[k].get(g, 0.0) for g, w in vec[k].items())
                if norm[k] and ref_norm[k]:
                    value /= norm[k] * ref_norm[k]
                total += value * penalty
        return 10.0 * total / (self.n * len(self.refs[image]))


class Captioner:
    """A trained captioning model with its vocabulary: images in, captions out."""

    def __init__(self, model: CaptioningTransformer, vocab: Vocabulary, decoding: dict[str, Any], device: torch.device,
                 photos: dict[str, Any] | None = None):
        self.model, self.vocab, self.decoding, self.device = model.eval(), vocab, decoding, device
        self.photos = photos  # {"image_encoder": description, "memory": "regions"|"pooled"} for photo models
        self._encoder: ImageEncoder | None = None

    def photo_features(self, paths: Sequence[str | Path], batch_size: int = 32) -> tuple[Tensor, Tensor]:
        """Photo files (any size, any format Pillow reads) -> the model's input features ((N, R, D_img)
        regions or (N, D_img) pooled, float16) and the cropped photos (N, 3, 224, 224) uint8, through
        the image encoder the model was trained with."""
        encoder, features, photos = self.image_encoder(), [], []
        for start in range(0, len(paths), batch_size):
            batch = torch.stack([load_photo(p, ImageEncoder.image_size) for p in paths[start : start + batch_size]])
            regions, pooled = encoder(batch.to(self.device))
            features.append((regions if self.photos["memory"] == "regions" else pooled).half().cpu())  # type: ignore[index]
            photos.append(batch)
        return torch.cat(features), torch.cat(photos)  # float16, as feature files store them

    def image_encoder(self) -> ImageEncoder:
        """The frozen image encoder the model was trained with (built on first use)."""
        if self.photos is None:
            raise ValueError("this model was not trained on photographs through the image encoder; "
                             "it takes " + ("image files of its own size" if self.model.config.input == "pixels"
                                            else "precomputed features"))
        if self._encoder is None:
            if ImageEncoder.describe() != self.photos["image_encoder"]:
                raise ValueError(f"this checkpoint was trained on features of {self.photos['image_encoder']}, "
                                 f"this installation's image encoder is {ImageEncoder.describe()}")
            self._encoder = ImageEncoder().to(self.device)
        return self._encoder

    def corpus_features(self, corpus: CaptionCorpus, features_file: str | Path | None = None,
                        batch_size: int = 32) -> Tensor:
        """The model's input features for every photo of ``corpus``: from ``features_file`` (extracted
        into it first where missing: resumable, reusable), else computed in memory."""
        encoder = self.image_encoder()
        if features_file is not None:
            found = extract_image_features(corpus.image_dir, features_file, encoder, names=corpus.names,
                                           device=self.device)
            return found.select(corpus.names, self.photos["memory"])  # type: ignore[index]
        return self.photo_features([corpus.image_dir / n for n in corpus.names], batch_size)[0]

    def load_image(self, path: str | Path, resize: bool = False) -> Tensor:
        """An image file as (3, H, W) uint8 of the model's size (``resize``: scaled to it; else an error)."""
        c = self.model.config
        if c.input != "pixels":
            raise ValueError("this model captions image features; use photo_features() for photo files")
        image = load_image(path, c.image_size if resize else None)
        if tuple(image.shape[1:]) != (c.image_size, c.image_size):
            raise ValueError(f"{path}: the image is {image.shape[2]}x{image.shape[1]} pixels, the model takes "
                             f"{c.image_size}x{c.image_size} (resize it, or pass --resize)")
        return image

    def _limits(self) -> dict[str, Any]:
        return {"max_len_a": 0.0, "max_len_b": self.model.config.max_len - 1}

    def generation_config(self, beam_size: int | None = None, **options: Any) -> GenerationConfig:
        """The recipe's ``decoding`` (beam 3 if it names none; captions up to the model's max_len) as a
        :class:`GenerationConfig`, with ``beam_size`` and ``options`` on top (None: keep)."""
        return GenerationConfig.from_decoding({"beam_size": 3, **self.decoding, **self._limits()},
                                              decoder_start_token_id=START, eos_token_id=END,
                                              **{"num_beams": beam_size, **options})

    @torch.no_grad()
    def generate(self, inputs: Tensor, config: GenerationConfig | None = None, prefix: str | None = None,
                 seed: int | None = None, batch_size: int = 128) -> list[list[Generated]]:
        """``config.num_return_sequences`` captions of each input (images (N, C, H, W) or features):
        the n best of the beam, or n samples; ``prefix``: words every caption starts with."""
        config = config or self.generation_config()
        check_batch(batch_size, config.num_beams)
        prefix_ids = self.vocab.encode(prefix) if prefix else None
        out: list[list[Generated]] = []
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size].to(self.device)
            for hyps in generate(self.model, batch, config, prefix_ids, seed):
                out.append([Generated(self.vocab.decode(h.tokens), h.tokens[:-1], h.log_prob, h.score) for h in hyps])
        return out

    def caption(self, inputs: Tensor, beam_size: int | None = None, batch_size: int = 128,
                config: GenerationConfig | None = None, prefix: str | None = None, seed: int | None = None
                ) -> list[str]:
        """Captions of ``inputs`` (images (N, C, H, W) uint8/float, or features); beam_size 1 = greedy;
        ``config`` (a :class:`GenerationConfig`) instead of the recipe's decoding settings."""
        config = config or self.generation_config(beam_size)
        return [n[0].text for n in self.generate(inputs, config, prefix, seed, batch_size)]

    def evaluate(self, examples: CaptionExamples, beam_size: int | None = None,
                 config: GenerationConfig | None = None, prefix: str | None = None, seed: int | None = None,
                 batch_size: int = 128) -> dict[str, Any]:
        hypotheses = self.caption(examples.inputs, beam_size, batch_size, config, prefix, seed)
        return {**caption_scores(hypotheses, examples.references), "hypotheses": hypotheses}

    @torch.no_grad()
    def caption_with_attention(self, image: Tensor) -> tuple[list[str], Tensor]:
        """Greedy caption of one image ((C, H, W) pixels, or features: (R, D_img) regions / (D_img,))
        and, for each generated word (and <END>), the last decoder layer's cross-attention over the
        memory, averaged over heads: (L, N) for N memory slots."""
        with record_attention(self.model) as recorded:
            ids = greedy_decode(self.model, image[None].to(self.device), bos_id=START, eos_id=END, **self._limits())
        assert isinstance(ids, Tensor)
        last = f"decoder.layers.{len(self.model.decoder.layers) - 1}.cross_attn"
        attention = torch.stack([w[0, :, -1].mean(dim=0) for w in recorded[last]])  # per step (1, H, 1, N) -> (N,)
        tokens = ids[0].tolist()
        length = tokens.index(END) + 1 if END in tokens else len(tokens)
        words = [self.vocab.words[t] for t in tokens[:length]]
        return words, attention[:length].cpu()

    def plot_attention(self, image: Tensor, path: str | Path, photo: Tensor | None = None) -> list[str]:
        """Caption one image greedily and draw each word's attention over it (a PNG): ``image`` is
        (C, H, W) pixels, or for a photo model its region features (R, D_img) with the ``photo``
        (3, H, W) they came from."""
        visual = self.model.visual
        if isinstance(visual, PatchEmbedding):
            grid, picture = visual.grid, image
        elif self.photos is not None and self.photos["memory"] == "regions" and photo is not None:
            grid, picture = int(round(image.shape[0] ** 0.5)), photo
        else:
            raise ValueError("attention over the image needs a model that reads pixels or photo regions (memory "
                             "'regions'), and the photo")
        words, attention = self.caption_with_attention(image)
        plot_caption_attention(picture, words, attention, grid, path)
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
        same = caption_words(hyp) in [caption_words(r) for r in refs]
        match = "exact match" if same else "differs from every reference"
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
    ``captions_per_image`` of its references drawn at random (the image is encoded once for all of
    them); label-smoothed cross-entropy; validation loss, greedy
    BLEU-4, CIDEr-D and exact match."""

    def __init__(self, vocab: Vocabulary, train: CaptionExamples, valid: CaptionExamples,
                 model_config: CaptioningConfig, batch_size: int, label_smoothing: float, decoding: dict[str, Any],
                 photos: dict[str, Any] | None = None, captions_per_image: int = 1):
        self.vocab, self.train, self.valid, self.model_config = vocab, train, valid, model_config
        self.captions_per_image = captions_per_image
        self.batch_size, self.label_smoothing, self.decoding, self.photos = batch_size, label_smoothing, decoding, photos
        limit = model_config.max_len - 1  # room for <START> / <END>
        self.encoded = [[vocab.encode(r)[:limit] for r in refs] for refs in train.references]

    def batches(self, epoch: int, seed: int) -> list[list[tuple[int, tuple[int, ...]]]]:
        """Batches of ``batch_size`` images, each with ``captions_per_image`` of its references (drawn
        without replacement; all if it has fewer), shuffled by (seed, epoch)."""
        rng = random.Random(f"{seed}-{epoch}")
        order = list(range(len(self.encoded)))
        rng.shuffle(order)
        k = self.captions_per_image
        items = [(i, (rng.randrange(len(self.encoded[i])),) if k == 1
                  else tuple(rng.sample(range(len(self.encoded[i])), min(k, len(self.encoded[i]))))) for i in order]
        return [items[s : s + self.batch_size] for s in range(0, len(items), self.batch_size)]

    def _loss_inputs(self, captions: Sequence[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
        return pad_ids([[START] + c for c in captions], device), pad_ids([c + [END] for c in captions], device)

    def loss(self, model: nn.Module, batch: list[tuple[int, tuple[int, ...]]], device: torch.device) -> tuple[Tensor, int]:
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
            total += F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum").item()
            tokens += int((tgt_out != PAD).sum())
        captioner = Captioner(model, self.vocab, self.decoding, device)  # type: ignore[arg-type]
        scores = caption_scores(captioner.caption(self.valid.inputs, beam_size=1), self.valid.references)
        return {"loss": total / tokens, **{k: scores[k] for k in ("bleu4", "cider", "exact_match")}}

    def checkpoint_config(self) -> dict[str, Any]:
        return {"kind": "captioning", "model": self.model_config.to_dict(), "decoding": self.decoding,
                **({"photos": self.photos} if self.photos else {})}

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
            raise ValueError(f"scst samples must be >= 2 (the baseline is the other samples' mean), got {samples}")
        self.samples, self.cider = samples, CiderD(self.train.references)
        self.captions_per_image = 1  # batches of images; their captions are sampled

    def loss(self, model: nn.Module, batch: list[tuple[int, tuple[int, ...]]], device: torch.device) -> tuple[Tensor, int]:
        index = [i for i, _ in batch]
        images, k = self.train.inputs[index].to(device), self.samples
        inner: CaptioningTransformer = getattr(model, "module", model)  # sample outside DDP: no gradient
        inner.eval()
        samples = sample_decode(inner, images, bos_id=START, eos_id=END, num_samples=k, max_len_a=0.0,
                                max_len_b=self.model_config.max_len - 1)
        inner.train()
        rewards = torch.tensor([self.cider.score(self.vocab.decode(row), index[n // k])
                                for n, row in enumerate(samples.tolist())]).view(-1, k)
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
        default_factory=lambda: {"train": "train", "valid": "dev", "test": []})  # test (CaptionSplits)
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
        default_factory=lambda: {"beam_size": 3, "length_penalty": 1.0})  # DecodingOptions beam_size and
    # length_penalty
    train: TrainConfig = field(default_factory=TrainConfig)  # how to train: TrainConfig's fields
    scst: dict[str, Any] = field(default_factory=dict)  # self-critical training after cross-entropy, into
    # ``out_dir``/scst: SelfCriticalOptions ({}: none)

    METRICS = ("loss", "bleu4", "cider", "exact_match")
    PHOTOS = ("flickr8k", "karpathy")  # real photographs through the image encoder

    def validate(self) -> None:
        if self.data not in ("shapes", "cs231n", "folder", *self.PHOTOS):
            raise ValueError(f"data: expected 'shapes', 'cs231n', 'folder', 'flickr8k' or 'karpathy', got {self.data!r}")
        if self.memory not in ("regions", "pooled"):
            raise ValueError(f"memory: expected 'regions' or 'pooled', got {self.memory!r}")
        if not isinstance(self.splits, dict) or not {"train", "valid"} <= set(self.splits) or not all(
                isinstance(self.splits[k], str) for k in ("train", "valid")):
            raise ValueError(f"splits: expected {{'train': NAME, 'valid': NAME, 'test': [NAMES]}}, got {self.splits!r}")
        tests = self.splits.get("test") or []
        if not isinstance(tests, str) and not (isinstance(tests, list) and all(isinstance(t, str) for t in tests)):
            raise ValueError(f"splits.test: expected a split name or a list of names, got {tests!r}")
        if self.memory == "pooled" and self.model.get("num_regions"):
            raise ValueError("model.num_regions: the pooled memory is one vector, not regions; set it to 0")
        needed = {"flickr8k": ("flickr8k_dir",), "karpathy": ("karpathy_json", "image_dir")}.get(self.data, ())
        for name in needed:
            if not getattr(self, name):
                raise ValueError(f"data {self.data!r} needs {name}")
        check_range(self, {"valid_size": 0, "min_count": 1, "batch_size": 1, "captions_per_image": 1, "max_train": 1,
                           "image_size": 1},
                    ("label_smoothing",))
        check_decoding(self.decoding, ("beam_size", "length_penalty"))
        if self.scst:
            unknown = set(self.scst) - {"steps", "lr", "samples", "eval_every"}
            if unknown or not isinstance(self.scst.get("steps"), int) or self.scst["steps"] < 1:
                raise ValueError(f"scst: expected {{'steps': N >= 1, 'lr', 'samples', 'eval_every'}}, got {self.scst!r}")
            if not isinstance(self.scst.get("samples", 5), int) or self.scst.get("samples", 5) < 2:
                raise ValueError(f"scst.samples must be an integer >= 2, got {self.scst.get('samples')!r}")
        decided = ({"input": "features", "num_encoder_layers": 0} if self.data == "cs231n"  # the data decides these
                   else {"input": "features", "feature_dim": 1280} if self.data in self.PHOTOS
                   else {"image_size": self.image_size or (64 if self.data == "shapes" else None)})
        if decided.get("image_size") is None:  # a folder of images of a size known only when read
            decided["image_size"] = self.model.get("patch_size", 8)
        check_model_fields(CaptioningConfig, {**self.model, **decided}, vocab_size=1000)


def training_vocabulary(splits: dict[str, CaptionExamples], min_count: int) -> Vocabulary:
    """The caption vocabulary of the training split's references (words seen ``min_count`` times)."""
    return Vocabulary.build((c for refs in splits["train"].references for c in refs), min_count)


def load_caption_splits(recipe: CaptioningRecipe, data_dir: str | Path = "../shared/data"
                        ) -> tuple[dict[str, CaptionExamples], Vocabulary]:
    """The recipe's splits ("train", "valid", and "test..." ones) and the vocabulary."""
    r = recipe
    if r.data == "shapes":
        from scratchformer.data.shapes import shape_scene_splits

        splits = shape_scene_splits(**r.shapes)
        return splits, training_vocabulary(splits, r.min_count)
    if r.data == "cs231n":
        if not r.cs231n_dir:
            raise ValueError("data 'cs231n' needs cs231n_dir")
        base = resolve_data_path(r.cs231n_dir, data_dir)
        train, vocab = load_cs231n_captions(base, "train", r.pca_features, r.max_train)  # type: ignore[arg-type]
        val, _ = load_cs231n_captions(base, "val", r.pca_features)  # type: ignore[arg-type]
        rest = range(r.valid_size, len(val))
        return {"train": train, "valid": val.subset(range(min(r.valid_size, len(val)))), "test": val.subset(rest)}, vocab
    if r.data in r.PHOTOS:
        return load_photo_splits(r, data_dir)
    if not (r.image_dir and r.train_captions and r.valid_captions):
        raise ValueError("data 'folder' needs image_dir, train_captions and valid_captions")
    folder = resolve_data_path(r.image_dir, data_dir)
    names = {"train": r.train_captions, "valid": r.valid_captions, "test": r.test_captions}
    splits = {name: load_caption_folder(resolve_data_path(tsv, data_dir), folder, r.image_size)[0]  # type: ignore[arg-type]
              for name, tsv in names.items() if tsv}
    return splits, training_vocabulary(splits, r.min_count)


def photo_corpora(recipe: CaptioningRecipe, data_dir: str | Path) -> dict[str, CaptionCorpus]:
    """The recipe's splits of real photographs ("train", "valid", "test" or "test-NAME"), as
    captioned image names; what was left out of each is printed."""
    r = recipe
    names = {"train": r.splits["train"], "valid": r.splits["valid"]}
    tests = r.splits.get("test") or []
    tests = [tests] if isinstance(tests, str) else list(tests)
    names.update({("test" if len(tests) == 1 else f"test-{t}"): t for t in tests})
    corpora = {}
    for key, split in names.items():
        if r.data == "flickr8k":
            corpora[key] = load_flickr8k(resolve_data_path(r.flickr8k_dir, data_dir), split)  # type: ignore[arg-type]
        else:
            corpora[key] = load_karpathy_json(resolve_data_path(r.karpathy_json, data_dir),  # type: ignore[arg-type]
                                              resolve_data_path(r.image_dir, data_dir), split)  # type: ignore[arg-type]
        if distributed.is_main():
            print(f"{r.data} {split}: {corpora[key].report()}", file=sys.stderr)
    return corpora


def photo_feature_file(corpora: Sequence[CaptionCorpus], path: str | Path, device: str = "cpu") -> ImageFeatures:
    """The image encoder's features of every photo of ``corpora`` (one image folder), from the file
    ``path`` where it has them, else extracted into it (on rank 0 under torchrun; the others read it)."""
    folders = {c.image_dir for c in corpora}
    if len(folders) != 1:
        raise ValueError(f"the splits' photos are in different folders {sorted(map(str, folders))}")
    wanted = list(dict.fromkeys(n for c in corpora for n in c.names))

    def extract() -> ImageFeatures:
        encoder = ImageEncoder().to(resolve_device(device))
        return extract_image_features(folders.pop(), path, encoder, names=wanted, device=encoder.mean.device)

    def extract_to_disk() -> None:  # under torchrun the features stay on disk, not broadcast
        extract()

    if not distributed.world().distributed:
        return extract()
    distributed.on_main(extract_to_disk)
    return load_image_features(path)


def load_photo_splits(recipe: CaptioningRecipe, data_dir: str | Path) -> tuple[dict[str, CaptionExamples], Vocabulary]:
    """Flickr8k or Karpathy-JSON splits as features (the recipe's ``memory``), with the vocabulary."""
    r = recipe
    corpora = photo_corpora(r, data_dir)
    path = r.features.replace("{source}", r.data)
    features = photo_feature_file(list(corpora.values()), resolve_data_path(path, data_dir), r.train.device)  # type: ignore[arg-type]
    splits = {key: CaptionExamples(features.select(c.names, r.memory), c.references, [c.image_dir / n for n in c.names])
              for key, c in corpora.items()}
    return splits, training_vocabulary(splits, r.min_count)


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
    """Run a recipe: data (with photos: features extracted or reused), vocabulary, model, training;
    then the best checkpoint on the validation split and every test split (greedy and beam search).
    Writes ``report.json``, each scored split's captions and a figure of its first four images
    (``{split}_examples.png``); with photo regions, also an attention figure (``{split}_attention.png``).

    ``splits`` ("train", "valid", "test...") replaces the recipe's data; the vocabulary is then
    built from its training captions.

    Under torchrun every process runs this: all load the same (deterministic) data and
    vocabulary and train, then rank 0 alone tests and writes the report.
    """
    start = time.perf_counter()
    r = recipe
    distributed.init(r.train.device)
    check_run(r.train, resume)  # device, precision, output directory: before any data work
    if r.scst:  # phase 2's output directory is checked now, not after phase 1
        scst_dir = Path(r.train.out_dir) / "scst"
        # it resumes from its own last/; killed before its first save, it starts afresh (its partial log replaced)
        resume_scst = resume and distributed.on_main(
            lambda: any((scst_dir / d / "training_state.pt").is_file() for d in ("last", "last.old")))
        scst_config = dataclasses.replace(
            r.train, out_dir=str(scst_dir), max_steps=r.scst["steps"], warmup_steps=0, schedule="constant",
            lr=r.scst.get("lr", r.train.lr * 0.05), eval_every=r.scst.get("eval_every", r.train.eval_every),
            overwrite=r.train.overwrite or (resume and not resume_scst))
        check_run(scst_config, resume_scst)
    if splits is None:
        splits, vocab = load_caption_splits(r, data_dir)
    else:
        vocab = training_vocabulary(splits, r.min_count)
    seconds_data = time.perf_counter() - start
    config = model_config_for(splits["train"], vocab, r.model)
    photos = {"image_encoder": ImageEncoder.describe(), "memory": r.memory} if r.data in r.PHOTOS else None
    torch.manual_seed(r.train.seed)
    model = optimize(CaptioningTransformer(config))
    task = CaptioningTask(vocab, splits["train"], splits["valid"], config, r.batch_size, r.label_smoothing,
                          r.decoding, photos, r.captions_per_image)
    result = Trainer(model, task, r.train).fit(resume=resume)
    out = final = Path(r.train.out_dir)
    seconds, best = {"xe": result.seconds}, {"xe": result.best}
    if r.scst:  # phase 2 from the best cross-entropy weights, in OUT/scst
        model.load_state_dict(load_checked(out / "best", lambda: CaptioningTransformer(config)).state_dict())
        scst = SelfCriticalTask(vocab, splits["train"], splits["valid"], config, r.batch_size, r.label_smoothing,
                                r.decoding, photos, samples=r.scst.get("samples", 5))
        result = Trainer(model, scst, scst_config).fit(resume=resume_scst)
        seconds["scst"], best["scst"] = result.seconds, result.best
        sign = 1 if r.train.best_mode == "max" else -1
        if sign * best["scst"][r.train.best_metric] > sign * best["xe"][r.train.best_metric]:
            final = scst_dir  # self-critical training helped on validation: its weights are scored
    report: dict[str, Any] = {"parameters": model.num_parameters(), "vocabulary": len(vocab),
                              "train_images": len(splits["train"]), "seconds_data": seconds_data,
                              "seconds_train": sum(seconds.values()), "best_valid": best if r.scst else best["xe"],
                              "weights_scored": "scst" if final != out else "xe", "valid": {}, "test": {}}
    if not distributed.is_main():
        return report
    captioner = load_captioner(final / "best", device=r.train.device)
    beam = r.decoding.get("beam_size", 3)
    scored = ["valid"] if r.data in r.PHOTOS else []  # the literature's figures on real photos: dev too
    for name in scored + sorted(n for n in splits if n.startswith("test")):
        test = splits[name]
        scores = {"greedy": captioner.evaluate(test, beam_size=1)}
        if beam > 1:
            scores[f"beam{beam}"] = captioner.evaluate(test, beam_size=beam)
        report["valid" if name == "valid" else "test"][name] = {
            k: {m: v for m, v in s.items() if m != "hypotheses"} for k, s in scores.items()}
        hypotheses = scores[f"beam{beam}" if beam > 1 else "greedy"]["hypotheses"]
        (out / f"{name}_captions.txt").write_text("\n".join(hypotheses) + "\n")
        pictures = (test.inputs[:4] if config.input == "pixels" else torch.stack([load_photo(p) for p in test.photos[:4]])
                    if test.photos else None)
        if pictures is not None:
            plot_caption_examples(pictures, hypotheses[:4], test.references[:4], out / f"{name}_examples.png",
                                  f"{r.data} {r.splits.get(name, name) if name == 'valid' else name} (beam {beam})")
        if photos and r.memory == "regions" and test.photos:
            captioner.plot_attention(test.inputs[0], out / f"{name}_attention.png", photo=pictures[0])  # type: ignore[index]
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
    return Captioner(model.to(dev), vocab, config["decoding"], dev, config.get("photos"))
