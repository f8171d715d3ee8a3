"""Inference with a trained (or Marian) translation model: :class:`Translator` translates and scores
text, :func:`load_translator` reads a checkpoint directory (several: an ensemble),
:func:`translation_attention_maps` draws its attention for one sentence.

translator = load_translator("runs/multi30k/best")
translator.translate(["Ein Mann fährt Fahrrad."], beam_size=5)
ensemble = load_translator(["runs/multi30k/best", "runs/multi30k-seed1/best"])  # mean log-probabilities
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from tokenizers import Tokenizer
from torch import Tensor

from scratchformer.core.transformer import Transformer, TransformerConfig
from scratchformer.data.marian_tokenizer import MarianTokenizer
from scratchformer.data.tokenization import BPE_SPECIAL_TOKENS, read_tokenizer, save_hf_tokenizer
from scratchformer.fast import optimize
from scratchformer.formats.ctranslate2_export import write_ctranslate2
from scratchformer.formats.hf_files import write_export
from scratchformer.formats.hf_generation import hf_generation_config, model_card
from scratchformer.formats.marian import is_marian_dir, load_marian, marian_export
from scratchformer.formats.onnx_translator import export_translator_onnx
from scratchformer.generation import Ensemble, GenerationConfig, generate
from scratchformer.generation.continuous import ContinuousSearch
from scratchformer.generation.hypotheses import Hypothesis
from scratchformer.tasks.shared import DecodingSession, Generated, check_batch, pad_ids, rows_named
from scratchformer.training import resolve_device
from scratchformer.training.checkpoint import load_checked, open_checkpoint
from scratchformer.viz.attention_maps import plot_attention, record_attention

__all__ = [
    "Translator",
    "bleu_and_chrf",
    "check_tokenizer",
    "load_translator",
    "read_lines",
    "translation_attention",
    "translation_attention_maps",
]

T = TypeVar("T")

PAD, BOS, EOS = 0, 1, 2  # the ids train_bpe gives <pad>, <s>, </s>


def bleu_and_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """Corpus sacreBLEU (13a tokenisation, cased: the defaults) and chrF on detokenised text."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    refs = [list(references)]
    return {
        "bleu": bleu.corpus_score(list(hypotheses), refs).score,
        "chrf": chrf.corpus_score(list(hypotheses), refs).score,
        "bleu_signature": str(bleu.get_signature()),
    }


def _encode(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids without special tokens (an exported tokenizer.json appends EOS for transformers; we add it).
    Our BPE reads "</s>" or "<pad>" written in a text as text, not as the control ids (a Marian
    tokenizer keeps transformers' behaviour). One string instead of a list is refused: it would be
    translated character by character."""
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts: expected a sequence of str (a list of texts, not one string)")
    if isinstance(tokenizer, Tokenizer):
        tokenizer.encode_special_tokens = True  # (a runtime setting: tokenizer.json does not store it)
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


class Translator:
    """A trained model with its tokenizer: text in, text out. ``tokenizer``: a ``tokenizers.Tokenizer``
    (our recipes) or a :class:`~scratchformer.data.marian_tokenizer.MarianTokenizer`; ``special_ids``:
    pad / bos (the decoder's first token) / eos, by default our tokenizers' 0 / 1 / 2."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer | MarianTokenizer,
        decoding: dict[str, Any],
        device: torch.device,
        special_ids: dict[str, int] | None = None,
    ):
        self.model, self.tokenizer, self.decoding, self.device = model.eval(), tokenizer, decoding, device
        self.special_ids = special_ids or {"pad": PAD, "bos": BOS, "eos": EOS}
        self.pad, self.bos, self.eos = (self.special_ids[k] for k in ("pad", "bos", "eos"))

    @classmethod
    def ensemble(cls, translators: Sequence[Translator]) -> Translator:
        """Translators (>= 1) that share one tokenizer decoding as one: at every step of greedy, beam
        or sampled decoding the next token's log-probabilities are the mean of the members'
        (:class:`~scratchformer.generation.Ensemble`; each member encodes the source once and keeps
        its own cache). The decoding settings, device and tokenizer are the first member's; one
        translator is returned as it is."""
        if not translators:
            raise ValueError("an ensemble needs at least one translator")
        first = translators[0]
        if len(translators) == 1:
            return first
        for i, t in enumerate(translators[1:], 2):
            if _vocabulary(t.tokenizer) != _vocabulary(first.tokenizer) or t.special_ids != first.special_ids:
                raise ValueError(
                    f"ensemble member {i} has another tokenizer ({t.tokenizer.get_vocab_size()} tokens, the "
                    f"first has {first.tokenizer.get_vocab_size()}): members must share the vocabulary"
                )
            if t.device != first.device:
                raise ValueError(f"ensemble member {i} is on {t.device}, the first on {first.device}")
        model = Ensemble([t.model for t in translators])
        return cls(model, first.tokenizer, first.decoding, first.device, first.special_ids)  # type: ignore[arg-type]

    @property
    def members(self) -> int:
        """How many models decode as one (1: a single model)."""
        return len(self.model.members) if isinstance(self.model, Ensemble) else 1

    def _one_model(self, what: str) -> None:
        if self.members > 1:
            raise ValueError(f"{what} is one model's: give one checkpoint, not an ensemble of {self.members}")

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        limit = self.model.config.max_len - 1
        return [ids[:limit] + [self.eos] for ids in _encode(self.tokenizer, texts)]  # type: ignore[arg-type]

    def source_lengths(self, texts: Sequence[str]) -> list[int]:
        """Tokens in each source before truncation, EOS included: more than the model's ``max_len``
        and :meth:`encode_sources` cuts it to ``max_len``."""
        return [len(ids) + 1 for ids in _encode(self.tokenizer, texts)]  # type: ignore[arg-type]

    def unknown_prefix_pieces(self, prefix: str) -> list[str]:
        """The pieces of ``prefix`` that the target vocabulary lacks (they would be forced as <unk>):
        none for our byte-level BPE, which spells any text; a Marian model's target sentencepiece can."""
        target = getattr(self.tokenizer, "encode_target", None)
        if target is not None:
            encoding = target(prefix)
            unk = self.tokenizer.target_vocab.get("<unk>", self.tokenizer.unk_id)  # type: ignore[union-attr]
        else:
            self.tokenizer.encode_special_tokens = True  # type: ignore[union-attr]
            encoding = self.tokenizer.encode(prefix, add_special_tokens=False)  # type: ignore[union-attr]
            unk = self.tokenizer.token_to_id("<unk>")  # type: ignore[union-attr]
        return [piece for i, piece in zip(encoding.ids, encoding.tokens) if i == unk]

    def generation_config(self, beam_size: int | None = None, **options: Any) -> GenerationConfig:
        """The recipe's ``decoding`` section (beam 5 if it names none) and this model's special ids as
        a :class:`GenerationConfig`, with ``beam_size`` and ``options`` on top (None: keep)."""
        return GenerationConfig.from_decoding(
            {"beam_size": 5, **self.decoding},
            decoder_start_token_id=self.bos,
            eos_token_id=self.eos,
            **{"num_beams": beam_size, **options},
        )

    @torch.no_grad()
    def generate(
        self,
        texts: Sequence[str],
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
        batch_size: int = 64,
        on_step: Callable[[list[int], Tensor], None] | None = None,
    ) -> list[list[Generated]]:
        """``config.num_return_sequences`` translations of each text (batched by length; in input
        order): the n best of the beam, or n samples. ``prefix``: every translation starts with it
        (its tokens are forced). ``seed``: reproducible samples (see :func:`generate`).
        ``on_step(inputs, tokens)``: greedy search and sampling, to stream: after each step, the
        tokens (N,) its N rows chose, and for each row the position of its text in ``texts``."""
        config = config or self.generation_config()
        check_batch(batch_size, config.num_beams)
        sources, prefix_ids = self.encode_sources(texts), self._prefix_ids(prefix)
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out: list[list[Generated]] = [[] for _ in sources]
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            src = pad_ids([sources[i] for i in index], self.device, self.pad)
            step = rows_named(on_step, index, config.num_return_sequences)
            for i, hyps in zip(index, generate(self.model, src, config, prefix_ids, seed, on_step=step)):
                out[i] = [self._generated(h) for h in hyps]
        return out

    def session(
        self,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
        on_step: Callable[[list[Any], Tensor], None] | None = None,
    ) -> DecodingSession:
        """Texts translated by continuous batching (:class:`~scratchformer.tasks.shared.DecodingSession`):
        they join a running search between its steps and leave as they finish, each with the
        translations :meth:`generate` gives it alone. ``on_step(tags, tokens)``: greedy search and
        sampling, each step's tokens (N,) with the tag of each row's text. A model that the fast
        step cannot compute (an ensemble) is a ``ValueError``."""
        config = config or self.generation_config()
        search = ContinuousSearch(self.model, config, seed, on_step)
        inputs = lambda texts: (pad_ids(self.encode_sources(texts), self.device, self.pad), None)  # noqa: E731
        return DecodingSession(search, inputs, self._prefix_ids(prefix), self._generated)

    def _prefix_ids(self, prefix: str | None) -> list[int] | None:
        """A prefix's target-side tokens (a Marian model has a target sentencepiece model of its own)."""
        if not prefix:
            return None
        target = getattr(self.tokenizer, "encode_target", None)
        return target(prefix).ids if target else _encode(self.tokenizer, [prefix])[0]  # type: ignore[arg-type]

    def _generated(self, h: Hypothesis) -> Generated:
        """A hypothesis (its tokens end with EOS) as a translation."""
        return Generated(self.tokenizer.decode(h.tokens[:-1]), h.tokens[:-1], h.log_prob, h.score)

    def translate(
        self,
        texts: Sequence[str],
        beam_size: int | None = None,
        batch_size: int = 64,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """Translate ``texts`` (batched by length; output in input order). beam_size 1 = greedy;
        ``config`` (a :class:`GenerationConfig`) instead of the recipe's decoding settings; ``prefix``
        and ``seed`` as in :meth:`generate`."""
        config = config or self.generation_config(beam_size)
        return [n[0].text for n in self.generate(texts, config, prefix, seed, batch_size)]

    def evaluate(
        self,
        sources: Sequence[str],
        references: Sequence[str],
        beam_size: int | None = None,
        config: GenerationConfig | None = None,
        prefix: str | None = None,
        seed: int | None = None,
        batch_size: int = 64,
    ) -> dict[str, Any]:
        hypotheses = self.translate(sources, beam_size, batch_size, config, prefix, seed)
        return {**bleu_and_chrf(hypotheses, references), "n": len(sources), "hypotheses": hypotheses}

    def with_precision(self, precision: str) -> Translator:
        """This translator for serving at ``precision``: "auto" (bf16 where the device computes it
        natively, else fp32: :mod:`~scratchformer.training.precision`), "fp32" (itself), "bf16" (a
        copy of the model in bfloat16: half the memory; on the CPU a decoding step's single query
        still attends in fp32, :class:`~scratchformer.fast.FastMultiHeadAttention`) or "int8" (a
        copy with every linear map's weights in int8 and its inputs quantized on the fly, CPU only:
        :func:`~scratchformer.fast.quantized.quantize_int8`). Tokenizer, decoding settings and device
        are shared; this translator is not changed. Converts from fp32 only."""
        import copy

        from scratchformer.fast.quantized import model_precision, quantize_int8
        from scratchformer.training.precision import resolve_precision

        if precision not in ("auto", "fp32", "bf16", "int8"):
            raise ValueError(f"precision: expected 'auto', 'fp32', 'bf16' or 'int8', got {precision!r}")
        if isinstance(self.model, Ensemble):  # each member converted
            members = [
                Translator(m, self.tokenizer, self.decoding, self.device, self.special_ids).with_precision(
                    precision
                )
                for m in self.model.members
            ]
            return Translator.ensemble(members)
        if precision == "auto":  # bf16 where the device computes it natively, else fp32
            precision = resolve_precision(precision, self.device)
        current = model_precision(self.model)
        if precision == current:
            return self
        if current != "fp32":
            raise ValueError(f"precision: this translator is {current}; load it again to make it {precision}")
        model = quantize_int8(self.model) if precision == "int8" else copy.deepcopy(self.model).bfloat16()
        return Translator(model, self.tokenizer, self.decoding, self.device, self.special_ids)

    def save_pretrained(
        self, directory: str | Path, format: str = "hf", quantization: str | None = None
    ) -> Path:
        """Write the model for serving into a new ``directory``. ``format``:

        - "hf": a Hugging Face directory that ``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load,
          Marian for a post-LN model, Pegasus for a pre-LN one: config.json, model.safetensors,
          generation_config.json (our decoding defaults; the ``a * S + b`` length rule as the largest
          limit any source gets, and exactly under keys that :func:`load_translator` reads back), the
          tokenizer (tokenizer.json, adding EOS as Marian's tokenizer does; a Marian model's own
          sentencepiece files are copied) and a README.md model card;
        - "ctranslate2": a ``ctranslate2.Translator`` directory (``quantization``: its weights' type on
          disk) with the tokenizer and a README.md;
        - "onnx": encoder.onnx and decoder.onnx (one token a step, with past key/values) with the
          tokenizer, for onnxruntime (:class:`~scratchformer.formats.onnx_translator.OnnxTranslator`).

        Raises ``ValueError`` naming every option of the model the format cannot express, or a
        decoding option that is wrong."""
        if format not in ("hf", "ctranslate2", "onnx"):
            raise ValueError(f"format: expected 'hf', 'ctranslate2' or 'onnx', got {format!r}")
        if quantization is not None and format != "ctranslate2":
            raise ValueError(f"quantization applies to format 'ctranslate2' only, not {format!r}")
        self._one_model("an export")
        # the decoding checked first: a ValueError names a wrong option
        hf_generation_config(self.decoding, self.special_ids, self.model.config.max_len)
        self.generation_config()
        if format == "onnx":
            return export_translator_onnx(
                self.model, self.tokenizer, directory, self.special_ids, self.decoding
            )
        tokenizer_files = self._tokenizer_files()
        if format == "ctranslate2":
            return write_ctranslate2(
                self.model,
                self.tokenizer,
                self.special_ids,
                directory,
                quantization,
                tokenizer_files=tokenizer_files,
                decoding=self.decoding,
            )
        hf_config, state, generation = marian_export(self.model, self.special_ids, self.decoding)
        card = model_card(self.model.config, generation, Path(directory).name)

        def files(tmp: Path) -> None:
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
            (tmp / "README.md").write_text(card, encoding="utf-8")
            tokenizer_files(tmp)

        return write_export(directory, hf_config, state, files)

    def _tokenizer_files(self) -> Callable[[Path], None]:
        """Writes the tokenizer's Hugging Face files into a folder (AutoTokenizer reads them)."""
        tokenizer, max_len = self.tokenizer, self.model.config.max_len
        if isinstance(tokenizer, MarianTokenizer):
            return tokenizer.save
        return lambda tmp: save_hf_tokenizer(tokenizer, tmp, eos=self.eos, max_length=max_len)


def load_translator(directory: str | Path | Sequence[str | Path], device: str = "auto") -> Translator:
    """Our translation checkpoint, or a Hugging Face Marian directory (opus-mt; or our own export).
    Several directories (a list): their models decode as one (:meth:`Translator.ensemble`)."""
    if not isinstance(directory, (str, Path)):
        return Translator.ensemble([load_translator(d, device) for d in directory])
    if is_marian_dir(directory):
        model, special, decoding = load_marian(directory)
        marian_files = (Path(directory) / "source.spm").is_file()
        tokenizer = (
            MarianTokenizer(directory) if marian_files else read_tokenizer(Path(directory) / "tokenizer.json")
        )
        if tokenizer.get_vocab_size() > model.config.src_vocab_size:  # its ids would not fit the model
            raise ValueError(
                f"{directory}: the tokenizer has {tokenizer.get_vocab_size()} tokens, the model only "
                f"{model.config.src_vocab_size}"
            )
        dev = resolve_device(device)
        return Translator(optimize(model).to(dev), tokenizer, decoding, dev, special)
    directory, config = open_checkpoint(directory, "translation")
    model_config = TransformerConfig.from_dict(config["model"])
    tokenizer = read_tokenizer(directory / "tokenizer.json")
    check_tokenizer(tokenizer, directory / "tokenizer.json", model_config.src_vocab_size)
    model = optimize(load_checked(directory, lambda: Transformer(model_config)))
    dev = resolve_device(device)
    return Translator(model.to(dev), tokenizer, config["decoding"], dev)


def check_tokenizer(tokenizer: Tokenizer, path: str | Path, vocab_size: int | None = None) -> None:
    """A translation tokenizer has <pad>, <s>, </s> at ids 0, 1, 2 (and the model's vocabulary size)."""
    specials = {
        name: tokenizer.token_to_id(token) for name, token in zip(("pad", "bos", "eos"), BPE_SPECIAL_TOKENS)
    }
    if specials != {"pad": PAD, "bos": BOS, "eos": EOS} or vocab_size not in (
        None,
        tokenizer.get_vocab_size(),
    ):
        raise ValueError(
            f"{path} does not belong to this model: {tokenizer.get_vocab_size()} tokens and special ids "
            f"{specials}; expected pad/bos/eos = {PAD}/{BOS}/{EOS}"
            + (f" and {vocab_size} tokens" if vocab_size is not None else "")
        )


def _vocabulary(tokenizer: Tokenizer | MarianTokenizer) -> Any:
    """What members of an ensemble must share: the tokenizer's vocabulary (token -> id)."""
    if isinstance(tokenizer, MarianTokenizer):
        return (tokenizer.vocab, tokenizer.target_vocab)
    return tokenizer.get_vocab(with_added_tokens=True)


def read_lines(stream: Iterable[T], chunk: int) -> Iterable[list[T]]:
    """Group a stream of lines into lists of ``chunk`` (for streaming translation). A line that is a
    str is stripped, as the training and test files are read (load_parallel_texts); other items
    (the CLI's (text, problem) pairs) are kept as they are."""
    batch: list[T] = []
    for line in stream:
        batch.append(line.strip() if isinstance(line, str) else line)  # type: ignore[arg-type]
        if len(batch) == chunk:
            yield batch
            batch = []
    if batch:
        yield batch


def translation_attention(
    translator: Translator, text: str, config: GenerationConfig | None = None
) -> dict[str, Any]:
    """Translate ``text`` (``config``: the recipe's decoding if None), then read the sentence pair once
    with every attention module recording. Returns {"translation", "source" (S pieces, </s> last),
    "predicted" (T: the target pieces and </s>), "prefix" (T: <s> and the target pieces), "weights":
    {module name, e.g. "decoder.layers.2.cross_attn": (H, rows, columns)}}: encoder self-attention
    (S x S), decoder self-attention (T x T prefix), cross-attention (T x S)."""
    translator._one_model("attention")
    best = translator.generate([text], config or translator.generation_config())[0][0]
    tgt_ids = best.tokens  # the generated ids, not the text encoded again
    src_ids = translator.encode_sources([text])[0]

    def label(i: int) -> str:  # pieces decoded one by one; "▁" marks a word start
        return translator.tokenizer.decode([i], skip_special_tokens=False).replace(" ", "▁") or f"<{i}>"

    with torch.no_grad(), record_attention(translator.model) as recorded:
        pad = translator.pad
        translator.model(pad_ids([src_ids], pad_id=pad), pad_ids([[translator.bos] + tgt_ids], pad_id=pad))
    return {
        "translation": best.text,
        "source": [label(i) for i in src_ids[:-1]] + ["</s>"],
        "predicted": [label(i) for i in tgt_ids] + ["</s>"],
        "prefix": [label(translator.bos)] + [label(i) for i in tgt_ids],
        "weights": {name: calls[0][0] for name, calls in recorded.items()},
    }


def translation_attention_maps(
    translator: Translator, text: str, out_dir: str | Path, beam_size: int = 5
) -> tuple[str, list[Path]]:
    """Translate ``text``, then draw every attention module's weights for that sentence pair
    (:func:`translation_attention`), one PNG per layer and kind. Returns (translation, paths)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    found = translation_attention(translator, text, translator.generation_config(beam_size))
    source, predicted, prefix = found["source"], found["predicted"], found["prefix"]
    written = []
    for name, weights in found["weights"].items():  # e.g. "decoder.layers.2.cross_attn"
        stack, _, layer, kind = name.split(".")
        rows, cols = (
            (source, source)
            if stack == "encoder"
            else (predicted, source if kind == "cross_attn" else prefix)
        )
        path = out / f"{stack}-layer{layer}-{kind}.png"
        plot_attention(
            weights,
            rows,
            cols,
            path,
            f"{name}  (rows: {'queries' if stack == 'encoder' else 'predicted'})",
        )
        written.append(path)
    return found["translation"], written
