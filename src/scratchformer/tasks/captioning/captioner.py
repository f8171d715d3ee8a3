"""A trained captioning model at work: :class:`Captioner` (images, features or photographs in,
captions out, scored, or drawn with each word's attention) and :func:`load_captioner`, which
reads a checkpoint of :func:`~scratchformer.tasks.captioning.train_captioner` into one.

    captioner = load_captioner("runs/flickr8k/best")
    features, photos = captioner.photo_features(["dog.jpg"])   # any photo: resized, cropped, encoded
    captioner.caption(features)               # ["a brown dog is running through the grass", ...]
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchformer.data.caption_corpora import CaptionCorpus
from scratchformer.data.caption_metrics import caption_scores, check_meteor
from scratchformer.data.captions import CaptionExamples, Vocabulary, load_image
from scratchformer.data.image_features import extract_image_features, load_photo
from scratchformer.fast import optimize
from scratchformer.generation import GenerationConfig, generate, greedy_decode
from scratchformer.generation.continuous import ContinuousSearch
from scratchformer.generation.hypotheses import Hypothesis
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.models.image_encoder import IMAGE_ENCODERS, ImageEncoder
from scratchformer.models.patch_embedding import PatchEmbedding
from scratchformer.tasks.captioning.figures import plot_caption_attention
from scratchformer.tasks.shared import DecodingSession, Generated, check_batch, choose_from_grid, rows_named
from scratchformer.training import resolve_device
from scratchformer.training.checkpoint import load_checked, open_checkpoint
from scratchformer.viz.attention_maps import record_attention

__all__ = ["Captioner", "choose_decoding", "load_captioner"]

START, END = Vocabulary.start_id, Vocabulary.end_id


class Captioner:
    """A trained captioning model with its vocabulary: images in, captions out."""

    def __init__(
        self,
        model: CaptioningTransformer,
        vocab: Vocabulary,
        decoding: dict[str, Any],
        device: torch.device,
        photos: dict[str, Any] | None = None,
    ):
        self.model, self.vocab, self.decoding, self.device = model.eval(), vocab, decoding, device
        self.photos = photos  # {"image_encoder": description, "memory": "regions"|"pooled"} for photo models
        self._encoder: ImageEncoder | None = None

    def photo_features(self, paths: Sequence[str | Path], batch_size: int = 32) -> tuple[Tensor, Tensor]:
        """Photo files (any size, any format Pillow reads) -> the model's input features ((N, R, D_img)
        regions or (N, D_img) pooled, float16) and the cropped photos (N, 3, S, S) uint8 (S: the
        encoder's resolution), through the image encoder the model was trained with."""
        encoder, features, photos = self.image_encoder(), [], []
        for start in range(0, len(paths), batch_size):
            batch = torch.stack(
                [load_photo(p, encoder.image_size) for p in paths[start : start + batch_size]]
            )
            regions, pooled = encoder(batch.to(self.device))
            features.append((regions if self.photos["memory"] == "regions" else pooled).half().cpu())  # type: ignore[index]
            photos.append(batch)
        return torch.cat(features), torch.cat(photos)  # float16, as feature files store them

    def image_encoder(self) -> ImageEncoder:
        """The frozen image encoder the model was trained with (built on first use)."""
        if self.photos is None:
            raise ValueError(
                "this model was not trained on photographs through the image encoder; "
                "it takes "
                + (
                    "image files of its own size"
                    if self.model.config.input == "pixels"
                    else "precomputed features"
                )
            )
        if self._encoder is None:
            trained_on = self.photos["image_encoder"]
            name = trained_on.get("encoder")
            stages = getattr(self.model.config, "image_stages", 0)  # its top fine-tuned: the regions below it
            if name not in IMAGE_ENCODERS or ImageEncoder.describe(name, stages) != trained_on:
                raise ValueError(
                    f"this checkpoint was trained on features of {trained_on}, which this installation's "
                    f"image encoders ({', '.join(IMAGE_ENCODERS)}) do not make"
                )
            self._encoder = ImageEncoder(name, stages).to(self.device)
        return self._encoder

    def corpus_features(
        self, corpus: CaptionCorpus, features_file: str | Path | None = None, batch_size: int = 32
    ) -> Tensor:
        """The model's input features for every photo of ``corpus``: from ``features_file`` (extracted
        into it first where missing: resumable, reusable), else computed in memory."""
        encoder = self.image_encoder()
        if features_file is not None:
            found = extract_image_features(
                corpus.image_dir, features_file, encoder, names=corpus.names, device=self.device
            )
            return found.select(corpus.names, self.photos["memory"])  # type: ignore[index]
        return self.photo_features([corpus.image_dir / n for n in corpus.names], batch_size)[0]

    def load_image(self, path: str | Path, resize: bool = False) -> Tensor:
        """An image file as (3, H, W) uint8 of the model's size (``resize``: scaled to it; else an error)."""
        c = self.model.config
        if c.input != "pixels":
            raise ValueError("this model captions image features; use photo_features() for photo files")
        image = load_image(path, c.image_size if resize else None)
        if tuple(image.shape[1:]) != (c.image_size, c.image_size):
            raise ValueError(
                f"{path}: the image is {image.shape[2]}x{image.shape[1]} pixels, the model takes "
                f"{c.image_size}x{c.image_size} (resize it, or pass --resize)"
            )
        return image

    def _limits(self) -> dict[str, Any]:
        return {"max_len_a": 0.0, "max_len_b": self.model.config.max_len - 1}

    def generation_config(self, beam_size: int | None = None, **options: Any) -> GenerationConfig:
        """The recipe's ``decoding`` (beam 3 if it names none; captions up to the model's max_len) as a
        :class:`GenerationConfig`, with ``beam_size`` and ``options`` on top (None: keep)."""
        return GenerationConfig.from_decoding(
            {"beam_size": 3, **self.decoding, **self._limits()},
            decoder_start_token_id=START,
            eos_token_id=END,
            **{"num_beams": beam_size, **options},
        )

    @torch.no_grad()
    def generate(
        self,
        inputs: Tensor,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
        batch_size: int = 128,
        on_step: Callable[[list[int], Tensor], None] | None = None,
    ) -> list[list[Generated]]:
        """``config.num_return_sequences`` captions of each input (images (N, C, H, W) or features):
        the n best of the beam, or n samples; ``prefix``: words every caption starts with;
        ``on_step``: to stream, as :meth:`Translator.generate
        <scratchformer.tasks.translation.Translator.generate>`'s."""
        config = config or self.generation_config()
        check_batch(batch_size, config.num_beams)
        prefix_ids = self.vocab.encode(prefix) if prefix else None
        out: list[list[Generated]] = []
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size].to(self.device)
            step = rows_named(on_step, list(range(start, start + len(batch))), config.num_return_sequences)
            for hyps in generate(self.model, batch, config, prefix_ids, seed, on_step=step):
                out.append([self._generated(h) for h in hyps])
        return out

    def session(
        self,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
        on_step: Callable[[list[Any], Tensor], None] | None = None,
    ) -> DecodingSession:
        """Inputs (as :meth:`generate` takes them) captioned by continuous batching, as
        :meth:`Translator.session <scratchformer.tasks.translation.Translator.session>` translates."""
        config = config or self.generation_config()
        search = ContinuousSearch(self.model, config, seed, on_step)
        inputs = lambda batch: (batch.to(self.device), None)  # noqa: E731
        return DecodingSession(search, inputs, self.vocab.encode(prefix) if prefix else None, self._generated)

    def _generated(self, h: Hypothesis) -> Generated:
        """A hypothesis (its tokens end with END) as a caption."""
        return Generated(self.vocab.decode(h.tokens), h.tokens[:-1], h.log_prob, h.score)

    def caption(
        self,
        inputs: Tensor,
        beam_size: int | None = None,
        batch_size: int = 128,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """Captions of ``inputs`` (images (N, C, H, W) uint8/float, or features); beam_size 1 = greedy;
        ``config`` (a :class:`GenerationConfig`) instead of the recipe's decoding settings."""
        config = config or self.generation_config(beam_size)
        return [n[0].text for n in self.generate(inputs, config, prefix, seed, batch_size)]

    def evaluate(
        self,
        examples: CaptionExamples,
        beam_size: int | None = None,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
        batch_size: int = 128,
        meteor: bool = False,
    ) -> dict[str, Any]:
        """Caption ``examples`` and score them (:func:`~scratchformer.data.caption_metrics.caption_scores`;
        ``meteor``: METEOR too), with the hypotheses."""
        if meteor:
            check_meteor()  # before any decoding
        hypotheses = self.caption(examples.inputs, beam_size, batch_size, config, prefix, seed)
        return {**caption_scores(hypotheses, examples.references, meteor), "hypotheses": hypotheses}

    @torch.no_grad()
    def caption_with_attention(self, image: Tensor, caption: str | None = None) -> tuple[list[str], Tensor]:
        """The greedy caption of one image ((C, H, W) pixels, or features: (R, D_img) regions /
        (D_img,)), or the given ``caption`` (e.g. beam search's) read by the model, and for each of its
        words (and <END>) the last decoder layer's cross-attention over the memory, averaged over
        heads: (L, N) for N memory slots."""
        last = f"decoder.layers.{len(self.model.decoder.layers) - 1}.cross_attn"
        image = image[None].to(self.device)
        with record_attention(self.model) as recorded:
            if caption is None:
                ids = greedy_decode(self.model, image, bos_id=START, eos_id=END, **self._limits())
                assert isinstance(ids, Tensor)
                tokens = ids[0].tolist()
            else:  # teacher forcing: one call sees every position
                tokens = self.vocab.encode(caption)[: self.model.config.max_len - 1] + [END]
                self.model(image, torch.tensor([[START] + tokens[:-1]], device=self.device))
        weights = recorded[last]
        attention = (
            torch.stack([w[0, :, -1].mean(dim=0) for w in weights])  # per step (1, H, 1, N) -> (N,)
            if caption is None
            else weights[0][0].mean(dim=0)  # (1, H, L, N) -> (L, N)
        )
        length = tokens.index(END) + 1 if END in tokens else len(tokens)
        words = [self.vocab.words[t] for t in tokens[:length]]
        return words, attention[:length].cpu()

    def attention_picture(self, image: Tensor, photo: Tensor | None = None) -> tuple[int, Tensor]:
        """What a word's attention is drawn over: the side of the memory's grid of regions, and the
        picture ((3, H, W) uint8) the grid covers. ``image`` is (C, H, W) pixels, or for a photo model
        its region features (R, D_img) with the ``photo`` they came from."""
        visual = self.model.visual
        if isinstance(visual, PatchEmbedding):
            return visual.grid, image
        if self.photos is not None and self.photos["memory"] == "regions" and photo is not None:
            return int(round(self.model.config.num_regions**0.5 or image.shape[0] ** 0.5)), photo
        raise ValueError(
            "attention over the image needs a model that reads pixels or photo regions (memory "
            "'regions'), and the photo"
        )

    def plot_attention(
        self, image: Tensor, path: str | Path, photo: Tensor | None = None, caption: str | None = None
    ) -> list[str]:
        """Caption one image greedily (or read ``caption``) and draw each word's attention over it (a
        PNG): ``image`` is (C, H, W) pixels, or for a photo model its region features (R, D_img) with
        the ``photo`` (3, H, W) they came from."""
        grid, picture = self.attention_picture(image, photo)
        words, attention = self.caption_with_attention(image, caption)
        plot_caption_attention(picture, words, attention, grid, path)
        return words


def load_captioner(directory: str | Path, device: str = "auto") -> Captioner:
    """A checkpoint written by :func:`~scratchformer.tasks.captioning.train_captioner`, as a
    :class:`Captioner`."""
    directory, config = open_checkpoint(directory, "captioning")
    model_config = CaptioningConfig.from_dict(config["model"])
    try:
        vocab = Vocabulary.from_json(json.loads((directory / "vocab.json").read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as e:
        raise ValueError(f"{directory / 'vocab.json'}: not a caption vocabulary ({e})") from None
    if len(vocab) != model_config.vocab_size:
        raise ValueError(
            f"{directory / 'vocab.json'} does not belong to this model: {len(vocab)} words, the model "
            f"has {model_config.vocab_size}"
        )
    model = optimize(load_checked(directory, lambda: CaptioningTransformer(model_config)))
    dev = resolve_device(device)
    return Captioner(model.to(dev), vocab, config["decoding"], dev, config.get("photos"))


def choose_decoding(
    captioner: Captioner, examples: CaptionExamples, grid: dict[str, list[Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Caption ``examples`` with every combination of ``grid`` (e.g. ``{"beam_size": [3, 5],
    "length_penalty": [1.0, 1.5]}``) on top of the captioner's decoding; return the decoding with the
    highest CIDEr-D (the first of equals) and every combination's scores. Pass the validation split:
    the scores of the split chosen on are optimistic."""

    def score(decoding: dict[str, Any]) -> dict[str, Any]:
        trial = copy.copy(captioner)  # the same model, another decoding
        trial.decoding = decoding
        scores = trial.evaluate(examples)
        words = sum(len(h.split()) for h in scores["hypotheses"]) / len(scores["hypotheses"])
        return {**{m: scores[m] for m in ("bleu1", "bleu2", "bleu3", "bleu4", "cider")}, "words": words}

    return choose_from_grid(captioner.decoding, grid, score, "cider")
