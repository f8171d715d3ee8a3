"""The models behind the server, one class per kind, each a thin face of its task's Python API
(``Translator``, ``LoadedClassifier``, ``Captioner``, ``SentenceEncoder``), which it calls and never
bypasses. A served model checks a request's inputs and parameters before any queueing (in a worker
thread, never on the event loop) and runs a batch of inputs in its inference thread
(:mod:`~scratchformer.serve.batcher`). Its answers hold the fields of the command line's JSON Lines
output. Every request parameter comes checked in its range
(:class:`~scratchformer.serve.parameters.GenerationParameters`); the server's limits and the model's
own bounds are checked here. :data:`SERVED` is the one table of the kinds the server serves.

Before 0.12 this module was ``serve/models.py``, a name it shared with the ``scratchformer.models``
package; that path imports until 0.13, with a DeprecationWarning."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scratchformer.generation import GenerationConfig
from scratchformer.generation.fast_beam import reference_reason
from scratchformer.generation.interface import max_decode_length
from scratchformer.serve.config import ModelSpec
from scratchformer.serve.errors import RequestError
from scratchformer.serve.parameters import GenerationParameters, check_text, shown, token_ranges
from scratchformer.serve.session import Session
from scratchformer.tasks.shared import UnknownKind, checkpoint_kind, generated_answer

__all__ = ["SERVED", "Options", "ServedModel", "load_served", "served_class"]


@dataclass(frozen=True)
class Options:
    """A request's parameters, checked: ``key`` groups requests that may share a batch."""

    key: str
    values: dict[str, Any]
    config: GenerationConfig | None = None


class ServedModel:
    """What the server asks of every model. ``kind``: its task; ``endpoints``: the /v1/ routes it answers."""

    kind = ""
    also: tuple[str, ...] = ()  # the other checkpoint kinds (tasks.shared.KINDS) it serves as ``kind``
    endpoints: tuple[str, ...] = ()
    output_key = ""
    precisions: tuple[str, ...] = ("fp32", "bf16")

    def __init__(self, spec: ModelSpec, task: Any):
        self.spec, self.task, self.name = spec, task, spec.name

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> ServedModel:
        """The model of ``spec`` loaded by its task's loader, at its precision, on ``device``."""
        raise NotImplementedError

    @classmethod
    def check_precision(cls, spec: ModelSpec) -> None:
        """A ValueError unless the kind serves ``spec``'s precision (int8: translators only)."""
        if spec.precision not in cls.precisions:
            raise ValueError(f"model {spec.name!r}: int8 is for translation models; use fp32 or bf16")

    def describe(self) -> dict[str, Any]:
        """Its entry in GET /v1/models."""
        return {
            "id": self.name,
            "object": "model",
            "kind": self.kind,
            "endpoints": [f"/v1/{e}" for e in self.endpoints],
            "precision": self.spec.precision,
            "path": Path(self.spec.path).name,
        }

    def options(self, parameters: GenerationParameters, max_new_tokens: int) -> Options:
        """A request's ``parameters`` (in their ranges already) checked against the server's limits
        and each other (422 naming a wrong one); models without any take none."""
        if parameters.given():
            raise RequestError(422, f"parameters: model {self.name!r} ({self.kind}) takes none")
        return Options("", {})

    def bounded(self, options: Options, lengths: list[int], max_new_tokens: int) -> Options:
        """``options`` for inputs of these ``lengths``, within the server's ``max_new_tokens`` limit
        (for models that generate: see :class:`_Generating`)."""
        return options

    def lengths(self, items: Sequence[Any]) -> list[int]:
        """Each input's length in tokens, as the model reads it (before its own truncation)."""
        raise NotImplementedError

    @property
    def input_limit(self) -> int | None:
        """The most tokens of an input the model reads (it cuts longer ones); None: no such limit."""
        return None

    def with_truncated(self, answer: dict[str, Any], length: int) -> dict[str, Any]:
        """An input's answer, with ``"truncated": true`` if the model cut the input (as the command
        line's JSON Lines say it)."""
        limit = self.input_limit
        return {**answer, "truncated": True} if limit is not None and length > limit else answer

    def run(self, items: Sequence[Any], options: Options, on_step: Any = None) -> list[dict[str, Any]]:
        """One answer per input (called in the inference thread, with the inputs of one batch);
        ``on_step(inputs, tokens)``: each decoding step's tokens, where :meth:`streams_tokens`."""
        raise NotImplementedError

    def streams_tokens(self, options: Options) -> bool:
        """Whether a stream of these options gets its tokens one by one (greedy search, sampling)."""
        return False

    def session(self, options: Options, on_step: Any = None) -> Session | None:
        """(inference thread) A running decode that inputs of ``options`` join between its steps
        (continuous batching; ``on_step(tags, tokens)`` as :meth:`run`'s), or None: this model runs
        whole batches (:meth:`run`)."""
        return None

    def autocast(self) -> torch.autocast:
        """bf16 by autocast for a model served at "bf16" whose task has no bf16 copy of its own."""
        device = torch.device(self.task.device).type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.spec.precision == "bf16")

    def warm_up(self) -> None:
        """One small batch, so that the first request does not pay for lazy set-up."""
        self.run(self.warm_up_items(), self.options(GenerationParameters(), 1_000_000))

    def warm_up_items(self) -> list[Any]:
        return ["Hello world."]


class _Generating(ServedModel):
    """A model that decodes (translation, captioning): parameters are :class:`GenerationConfig`'s
    fields (``beam_size`` for ``num_beams``), ``seed`` and ``prefix``."""

    def options(self, parameters: GenerationParameters, max_new_tokens: int) -> Options:
        """``parameters`` (each in its range already) checked: the two the server's limit bounds
        (:func:`token_ranges`), then as :class:`GenerationConfig` checks them together."""
        values = parameters.given()
        for name, allowed in token_ranges(max_new_tokens).items():
            if values.get(name) is not None:
                allowed.check(name, values[name])
        seed, prefix = values.pop("seed", None), values.pop("prefix", None)
        if prefix is not None:
            check_text(prefix, "parameters.prefix")
        if seed is not None and not values.get("do_sample"):
            raise RequestError(422, "parameters.seed: only with do_sample")
        if values.get("do_sample"):  # sampling draws one token a step (as the command line's --sampling)
            values.setdefault("num_beams", 1)
        try:
            config = self.task.generation_config(**values)
        except (TypeError, ValueError) as e:
            raise RequestError(422, f"parameters: {e}") from None
        return _generating_options(config, seed, prefix)

    def bounded(self, options: Options, lengths: list[int], max_new_tokens: int) -> Options:
        """``options`` whose new tokens stay within the server's ``max_new_tokens`` limit, whatever
        asks for them. A request without ``max_new_tokens`` whose budget ``max_len_a * S +
        max_len_b`` (S: its longest source) could pass the limit decodes with ``max_new_tokens`` =
        the limit. 422 for a prefix that leaves no room within the model's ``max_len``, and for a
        ``min_new_tokens`` not below the budget of one of the inputs (decoded alone)."""
        config, prefix = options.config, options.values["prefix"]
        room = self.max_len - 1 - (self.prefix_length(prefix) if prefix else 0)
        if room < 1:
            raise RequestError(
                422, f"parameters.prefix: its tokens leave no room within the model's max_len={self.max_len}"
            )
        shortest, longest = self.sources(lengths)
        if config.max_new_tokens is None and self.budget(config, longest, room) > max_new_tokens:
            config = config.replace(max_new_tokens=max_new_tokens)
            options = _generating_options(config, options.values["seed"], prefix)
        least = self.budget(config, shortest, room)
        if config.min_new_tokens >= least:
            raise RequestError(
                422,
                f"parameters.min_new_tokens must be below the {least} new tokens allowed here "
                f"(max_new_tokens, or max_len_a * S + max_len_b, within the model's max_len), "
                f"got {config.min_new_tokens}",
            )
        return options

    def budget(self, config: GenerationConfig, source: int, room: int) -> int:
        """The new tokens decoding allows a source of ``source`` positions (as :func:`~scratchformer.
        generation.generate` counts them), with ``room`` left in the decoder after a prefix."""
        wanted = config.max_new_tokens or max_decode_length(
            self.task.model, source, config.max_len_a, config.max_len_b
        )
        return min(wanted, room)

    @property
    def max_len(self) -> int:
        """The decoder's positions: BOS, then at most ``max_len - 1`` tokens (a prefix's included)."""
        return self.task.model.config.max_len

    def sources(self, lengths: list[int]) -> tuple[int, int]:
        """The fewest and the most positions the model's source (S in ``max_len_a * S +
        max_len_b``) has for inputs of these lengths."""
        raise NotImplementedError

    def prefix_length(self, prefix: str) -> int:
        """The tokens of a prefix, as the model forces them."""
        raise NotImplementedError

    def streams_tokens(self, options: Options) -> bool:
        return options.config is not None and options.config.num_beams == 1

    def text_of(self, ids: list[int]) -> str:
        """An output's text so far (for streaming)."""
        raise NotImplementedError

    def session(self, options: Options, on_step: Any = None) -> Session | None:
        if reference_reason(self.task.model) is not None:  # (an ensemble): whole batches
            return None
        values = options.values
        return Session(self, self.task.session(options.config, values["prefix"], values["seed"], on_step))

    def model_inputs(self, items: Sequence[Any]) -> Any:
        """Inputs as the task's session takes them."""
        return items

    def first_fields(self, item: Any) -> dict[str, Any]:
        """What an answer says before its outputs (the command line's JSON line: a source)."""
        return {}

    def decoding(self) -> Any:
        """The context a decoding step runs in (bf16 autocast, for a model whose task has no bf16
        copy of its own)."""
        return contextlib.nullcontext()


def _generating_options(config: GenerationConfig, seed: int | None, prefix: str | None) -> Options:
    """Options of a generating model: requests that decode alike (one ``key``) share batches."""
    key = json.dumps({**dataclasses.asdict(config), "seed": seed, "prefix": prefix}, sort_keys=True)
    return Options(key, {"seed": seed, "prefix": prefix}, config)


class ServedTranslator(_Generating):
    kind, endpoints, output_key = "translation", ("translate", "attention"), "translation_text"
    precisions = ("fp32", "bf16", "int8")

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> ServedTranslator:
        from scratchformer.tasks.translation import load_translator

        return cls(spec, load_translator(spec.path, device=device).with_precision(spec.precision))

    def lengths(self, items: Sequence[str]) -> list[int]:
        return self.task.source_lengths(items)

    @property
    def input_limit(self) -> int:
        return self.max_len  # (a source is cut to max_len tokens, EOS included)

    def sources(self, lengths: list[int]) -> tuple[int, int]:
        return min(min(lengths), self.max_len), min(max(lengths), self.max_len)  # (cut to max_len)

    def prefix_length(self, prefix: str) -> int:
        target = getattr(self.task.tokenizer, "encode_target", None)  # (a Marian model's target side)
        return len(target(prefix).ids) if target else self.task.source_lengths([prefix])[0] - 1

    def text_of(self, ids: list[int]) -> str:
        return self.task.tokenizer.decode(ids)

    def first_fields(self, text: str) -> dict[str, Any]:
        return {"source": text}

    def run(self, items: Sequence[str], options: Options, on_step: Any = None) -> list[dict[str, Any]]:
        values = options.values
        outputs = self.task.generate(
            items, options.config, values["prefix"], values["seed"], batch_size=len(items), on_step=on_step
        )
        return [generated_answer(self.output_key, o, self.first_fields(s)) for s, o in zip(items, outputs)]

    def check_layer(self, layer: int | None) -> int:
        """The model's layers (the more of encoder and decoder); 422 unless ``layer`` is one of them
        or None (every layer)."""
        config = self.task.model.config
        layers = max(config.num_encoder_layers, config.num_decoder_layers)
        if layer is not None and not 0 <= layer < layers:
            raise RequestError(422, f"layer: expected 0..{layers - 1}, got {shown(layer)}")
        return layers

    def attention(self, items: Sequence[str], options: Options) -> list[dict[str, Any]]:
        """Each text's translation and attention weights (rounded to 4 decimals): ``weights``
        {"encoder.self_attn" | "decoder.self_attn" | "decoder.cross_attn": {layer: (H, rows, cols)}},
        every layer, or the one ``options.values["layer"]`` names."""
        from scratchformer.tasks.translation import translation_attention

        config, layer = self.task.model.config, options.values.get("layer")
        layers = self.check_layer(layer)
        out = []
        for text in items:
            found = translation_attention(self.task, text, options.config)
            weights: dict[str, dict[str, Any]] = {}
            for name, w in found.pop("weights").items():  # e.g. "decoder.layers.2.cross_attn"
                stack, _, index, kind = name.split(".")
                if layer is None or int(index) == layer:
                    weights.setdefault(f"{stack}.{kind}", {})[index] = _rounded(w)
            out.append({**found, "layers": layers, "heads": config.num_heads, "weights": weights})
        return out


class ServedCaptioner(_Generating):
    """Inputs are image files (bytes, or an :class:`~scratchformer.serve.images.Upload`: bytes and a
    label), read as the ``caption`` command reads files: a photo model through its image encoder (any
    size), a pixel model resized to its size. A file Pillow cannot decode is an error naming it."""

    kind, endpoints, output_key = "captioning", ("caption",), "generated_text"
    positions = 0  # what the decoder attends to, per image (its regions; a pixel model's channels)

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> ServedCaptioner:
        from scratchformer.tasks.captioning.ensemble import load_ensemble

        return cls(spec, load_ensemble([spec.path], device=device))

    def lengths(self, items: Sequence[Any]) -> list[int]:
        return [1] * len(items)  # a photo is one input of fixed cost

    def prefix_length(self, prefix: str) -> int:
        return len(self.task.vocab.encode(prefix))

    def sources(self, lengths: list[int]) -> tuple[int, int]:
        return self.positions, self.positions  # (the same for every image: fixed after the warm-up)

    def warm_up(self) -> None:
        super().warm_up()
        self.positions = self.images(self.warm_up_items())[0].shape[1]

    def images(self, items: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's inputs (pixels or features), and for a photo model the cropped photos."""
        captioner = self.task
        if captioner.photos is not None:
            return captioner.photo_features([_image_file(item) for item in items])
        return torch.stack([captioner.load_image(_image_file(item), resize=True) for item in items]), None

    def text_of(self, ids: list[int]) -> str:
        return self.task.vocab.decode(ids)

    def model_inputs(self, items: Sequence[Any]) -> torch.Tensor:
        return self.images(items)[0]

    def decoding(self) -> torch.autocast:
        return self.autocast()

    def run(self, items: Sequence[Any], options: Options, on_step: Any = None) -> list[dict[str, Any]]:
        values = options.values
        with self.decoding():
            outputs = self.task.generate(
                self.model_inputs(items), options.config, values["prefix"], values["seed"], on_step=on_step
            )
        return [
            generated_answer(self.output_key, o, self.first_fields(item)) for item, o in zip(items, outputs)
        ]

    def attention(self, items: Sequence[Any], options: Options) -> list[dict[str, Any]]:
        """Each image's caption, and each word's attention over the picture the model saw (the last
        decoder layer's cross-attention, mean over heads: (words, grid x grid), rounded), with that
        picture as a PNG data URL."""
        inputs, photos = self.images(items)
        out = []
        for k, image in enumerate(inputs):
            photo = None if photos is None else photos[k]
            grid, picture = self.task.attention_picture(image, photo)
            with self.autocast():
                best = self.task.generate(image[None], options.config, options.values["prefix"])[0][0]
                words, attention = self.task.caption_with_attention(image, best.text)
            out.append(
                {
                    "generated_text": best.text,
                    "words": words,
                    "grid": grid,
                    "attention": _rounded(attention),
                    "image": _png_data_url(picture),
                }
            )
        return out

    def warm_up_items(self) -> list[bytes]:
        from PIL import Image

        out = io.BytesIO()
        Image.new("RGB", (64, 48), (120, 110, 100)).save(out, format="PNG")
        return [out.getvalue()]


def _image_file(item: Any) -> io.BytesIO:
    """An input image as a file: plain bytes, or an upload (whose errors name it)."""
    return io.BytesIO(item) if isinstance(item, bytes) else item.open()


class _TokenizedText(ServedModel):
    """A model of texts, tokenized by its task's ``tokenizer`` and cut at its ``max_length``."""

    def lengths(self, items: Sequence[str]) -> list[int]:
        return self.task.tokenizer.full_lengths(items)

    @property
    def input_limit(self) -> int:
        return self.task.tokenizer.max_length


class ServedClassifier(_TokenizedText):
    kind, endpoints = "text_classifier", ("classify",)

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> ServedClassifier:
        from scratchformer.tasks.classification import load_classifier

        return cls(spec, load_classifier(spec.path, device=device))

    def run(self, items: Sequence[str], options: Options, on_step: Any = None) -> list[dict[str, Any]]:
        precision = "bf16" if self.spec.precision == "bf16" else "fp32"
        probs = self.task.probabilities(items, batch_size=len(items), precision=precision).float()
        names = self.task.label_names
        return [
            {
                "text": text,
                "label": names[int(p.argmax())],
                "score": float(p.max()),
                "scores": {name: float(q) for name, q in zip(names, p)},
            }
            for text, p in zip(items, probs)
        ]


class ServedEncoder(_TokenizedText):
    kind, endpoints = "embedding", ("embed", "embeddings")
    also = ("masked_lm",)  # a masked-LM run's encoder embeds too

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> ServedEncoder:
        from scratchformer.tasks.sentence_embedding import SentenceEncoder

        return cls(spec, SentenceEncoder.from_pretrained(spec.path, device=device))

    def run(self, items: Sequence[str], options: Options, on_step: Any = None) -> list[dict[str, Any]]:
        with self.autocast():
            vectors = self.task.encode(list(items), batch_size=len(items))
        return [{"text": t, "embedding": v} for t, v in zip(items, vectors.tolist())]


SERVED: dict[str, type[ServedModel]] = {
    model.kind: model for model in (ServedTranslator, ServedClassifier, ServedCaptioner, ServedEncoder)
}
"""The kinds of model the server serves, each with its class: the one table of them (/v1/models
reports these kinds; the page has a panel for each)."""


def served_class(kind: str) -> type[ServedModel] | None:
    """The class that serves checkpoints of ``kind`` (:func:`~scratchformer.tasks.shared.checkpoint_kind`)."""
    return next((m for m in SERVED.values() if kind == m.kind or kind in m.also), None)


def load_served(spec: ModelSpec, device: str = "cpu") -> ServedModel:
    """Load one model by its task's loader, at its precision."""
    try:
        kind = spec.kind or checkpoint_kind(spec.path)
    except UnknownKind as e:
        kind = e.kind
    served = served_class(kind)
    if served is None:
        raise ValueError(
            f"model {spec.name!r}: a {kind!r} checkpoint cannot be served (kinds: {', '.join(SERVED)})"
        )
    served.check_precision(spec)
    return served.load(spec, device)


def _rounded(weights: torch.Tensor) -> list:
    """Attention weights as nested lists, 4 decimals (what a page draws; a tenth of the JSON)."""
    return (weights.float().cpu() * 10_000).round().div(10_000).tolist()


def _png_data_url(picture: torch.Tensor) -> str:
    """A (3, H, W) uint8 picture as a data: URL."""
    import base64

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(picture.permute(1, 2, 0).contiguous().numpy()).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
