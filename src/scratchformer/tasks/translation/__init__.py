"""Machine translation end to end: parallel text -> joint BPE -> Transformer -> beam search -> sacreBLEU.

recipe = TranslationRecipe.from_json("recipes/multi30k_de_en.json")
report = train_translation(recipe)          # trains, then scores the test set with beam search
translator = load_translator("runs/multi30k/best")
translator.translate(["Ein Mann fährt Fahrrad."], beam_size=5)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.core.transformer import Transformer, TransformerConfig
from scratchformer.data.batching import length_bucketed_batches
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR
from scratchformer.data.parallel_texts import ParallelTexts, load_parallel_texts
from scratchformer.data.tokenization import read_tokenizer, train_bpe
from scratchformer.tasks.shared import (
    TrainingRun,
    check_decoding,
    check_decoding_grid,
    check_files,
    check_model_fields,
    check_range,
    choose_from_grid,
    label_smoothed_loss,
    pad_ids,
)
from scratchformer.tasks.translation.translator import (  # inference lives there; re-exported here
    BOS as BOS,
)
from scratchformer.tasks.translation.translator import (
    EOS as EOS,
)
from scratchformer.tasks.translation.translator import (
    PAD as PAD,
)
from scratchformer.tasks.translation.translator import (
    Translator as Translator,
)
from scratchformer.tasks.translation.translator import (
    _encode,
)
from scratchformer.tasks.translation.translator import (
    bleu_and_chrf as bleu_and_chrf,
)
from scratchformer.tasks.translation.translator import (
    check_tokenizer as check_tokenizer,
)
from scratchformer.tasks.translation.translator import (
    load_translator as load_translator,
)
from scratchformer.tasks.translation.translator import (
    read_lines as read_lines,
)
from scratchformer.tasks.translation.translator import (
    translation_attention as translation_attention,
)
from scratchformer.tasks.translation.translator import (
    translation_attention_maps as translation_attention_maps,
)
from scratchformer.training import TrainConfig, distributed
from scratchformer.training.checkpoint import resolve_checkpoint, update_config
from scratchformer.training.precision import at_least_fp32
from scratchformer.training.recipe import Recipe, resolve_data_path

__all__ = [
    "TranslationRecipe",
    "TranslationRun",
    "TranslationTask",
    "choose_decoding",
    "train_translation",
]


class TranslationTask:
    """The translation :class:`~scratchformer.training.TrainingTask`: label-smoothed cross-entropy,
    batches by token count, validation loss and greedy BLEU."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        train: ParallelTexts,
        valid: ParallelTexts,
        model_config: TransformerConfig,
        max_tokens: int,
        label_smoothing: float,
        max_length: int,
        decoding: dict[str, Any],
    ):
        self.tokenizer, self.model_config, self.decoding = tokenizer, model_config, decoding
        self.max_tokens, self.label_smoothing = max_tokens, label_smoothing
        src, tgt = _encode(tokenizer, train.sources), _encode(tokenizer, train.targets)
        keep = [i for i in range(len(src)) if len(src[i]) + 1 <= max_length and len(tgt[i]) + 1 <= max_length]
        self.filtered = len(src) - len(keep)  # over-long pairs, counted and reported
        if not keep:
            raise ValueError(f"all {len(src)} training pairs are longer than max_length={max_length} tokens")
        self.src = [src[i] + [EOS] for i in keep]
        self.tgt = [tgt[i] for i in keep]
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]
        self.valid = valid

    def batches(self, epoch: int, seed: int) -> list[list[int]]:
        return length_bucketed_batches(self.lengths, max_tokens=self.max_tokens, seed=seed, epoch=epoch)

    def loss(self, model: nn.Module, batch: list[int], device: torch.device) -> tuple[Tensor, int]:
        src = pad_ids([self.src[i] for i in batch], device)
        tgt_in = pad_ids([[BOS] + self.tgt[i] for i in batch], device)
        tgt_out = pad_ids([self.tgt[i] + [EOS] for i in batch], device)
        logits = model(src, tgt_in)  # (B, T, V)
        return label_smoothed_loss(logits, tgt_out, self.label_smoothing, PAD), int((tgt_out != PAD).sum())

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        translator = Translator(model, self.tokenizer, self.decoding, device)  # type: ignore[arg-type]
        src = translator.encode_sources(self.valid.sources)
        limit = (
            self.model_config.max_len - 1
        )  # room for BOS / EOS; the loss of longer references is cut there
        tgt = [t[:limit] for t in _encode(self.tokenizer, self.valid.targets)]  # (BLEU scores them whole)
        total, tokens = 0.0, 0
        for start in range(0, len(src), 64):
            s, t = src[start : start + 64], tgt[start : start + 64]
            tgt_out = pad_ids([x + [EOS] for x in t], device)
            logits = model(pad_ids(s, device), pad_ids([[BOS] + x for x in t], device))
            n = int((tgt_out != PAD).sum())
            total += F.cross_entropy(
                at_least_fp32(logits).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum"
            ).item()
            tokens += n
        scores = bleu_and_chrf(translator.translate(self.valid.sources, beam_size=1), self.valid.targets)
        return {"loss": total / tokens, "bleu": scores["bleu"], "chrf": scores["chrf"]}

    def checkpoint_config(self) -> dict[str, Any]:
        return {
            "kind": "translation",
            "model": self.model_config.to_dict(),
            "decoding": self.decoding,
            "special_ids": {"pad": PAD, "bos": BOS, "eos": EOS},
        }

    def save_files(self, directory: Path) -> None:
        self.tokenizer.save(str(directory / "tokenizer.json"))


@dataclass
class TranslationRecipe(Recipe):
    """A translation run, loadable from JSON (see recipes/multi30k_de_en.json); ``{data}`` in paths
    is the shared data directory."""

    train_source: str  # training sentences of the source language, one per line (.gz ok)
    train_target: str  # their translations, line by line
    valid_source: str  # validation sentences (loss, greedy BLEU and chrF during training)
    valid_target: str  # their translations
    test_source: str | None = None  # test sentences, translated with ``decoding`` at the end (None: none)
    test_target: str | None = None  # their translations (give both test files or neither)
    vocab_size: int = 8000  # joint byte-level BPE vocabulary of both languages (>= 8)
    max_length: int = 128  # tokens per side (with EOS); longer training pairs are filtered, counted
    max_tokens: int = 4096  # padded tokens per batch and side
    label_smoothing: float = 0.1  # eps_ls of the cross-entropy (paper, 5.4), in [0, 1)
    average_last: int = 0  # average the last N evaluated checkpoints (0: off)
    decoding_grid: dict[str, list[Any]] = field(default_factory=dict)  # decoding options tried on the
    # validation set (decoding key -> values; every combination); the best becomes the checkpoint's
    # decoding ({}: none)
    tokenizer: str | None = None  # a tokenizer.json (joint BPE) to use instead of training one
    model: dict[str, Any] = field(default_factory=dict)  # TransformerConfig fields (vocabulary from the
    # tokenizer)
    decoding: dict[str, Any] = field(
        default_factory=lambda: {  # the checkpoint's decoding (the test set,
            "beam_size": 5,
            "length_penalty": 1.0,
            "max_len_a": 1.2,
            "max_len_b": 10,
        }
    )  # ``translate``):
    # DecodingOptions
    train: TrainConfig = field(default_factory=TrainConfig)  # how to train: TrainConfig's fields

    METRICS = ("loss", "bleu", "chrf")

    def validate(self) -> None:
        check_range(
            self, {"vocab_size": 8, "max_length": 2, "max_tokens": 1, "average_last": 0}, ("label_smoothing",)
        )
        check_decoding(self.decoding)
        if bool(self.test_source) != bool(self.test_target):
            raise ValueError(
                f"test_source and test_target: give both or neither, got {self.test_source!r} and "
                f"{self.test_target!r}"
            )
        check_decoding_grid(self.decoding, self.decoding_grid)
        check_model_fields(
            TransformerConfig,
            {"max_len": 256, **self.model},
            src_vocab_size=self.vocab_size,
            tgt_vocab_size=self.vocab_size,
            pad_id=PAD,
        )
        max_len = {"max_len": 256, **self.model}["max_len"]
        if self.max_length > max_len:
            raise ValueError(
                f"max_length={self.max_length} tokens per side exceeds the model's max_len={max_len}"
            )


class TranslationRun(TrainingRun):
    """:func:`train_translation`'s run (:class:`~scratchformer.tasks.shared.TrainingRun`): the parallel
    texts, a joint BPE and a Transformer; then the chosen checkpoint (best, or the average of the last
    ``average_last``), its decoding chosen on the validation set (``decoding_grid``), on the test set."""

    def __init__(
        self, recipe: TranslationRecipe, data_dir: str | Path = DEFAULT_DATA_DIR, resume: bool = False
    ):
        super().__init__(recipe, data_dir, resume)
        self.average_last = recipe.average_last

    def sized_model(self):
        r = self.recipe
        vocab = {"src_vocab_size": r.vocab_size, "tgt_vocab_size": r.vocab_size, "pad_id": PAD}
        config = TransformerConfig(**{"max_len": 256, **r.model, **vocab})
        return lambda: Transformer(config)

    def check(self) -> None:
        r = self.recipe

        def check_inputs() -> None:  # rank 0 reads them all
            check_files(
                self.data_dir,
                train_source=r.train_source,
                train_target=r.train_target,
                valid_source=r.valid_source,
                valid_target=r.valid_target,
                test_source=r.test_source,
                test_target=r.test_target,
            )
            # a resumed run reads its own tokenizer
            check_files(self.data_dir, "tokenizer", tokenizer=None if self.resume else r.tokenizer)

        distributed.on_main(check_inputs)

    def load_pair(self, source: str | None, target: str | None) -> ParallelTexts:
        return load_parallel_texts(
            resolve_data_path(source, self.data_dir), resolve_data_path(target, self.data_dir)
        )  # type: ignore[arg-type]

    def setup(self) -> tuple[Transformer, TranslationTask, dict[str, Any]]:
        r = self.recipe
        train, self.valid = (
            self.load_pair(r.train_source, r.train_target),
            self.load_pair(r.valid_source, r.valid_target),
        )

        def bpe() -> Tokenizer:  # on rank 0 (the checkpoints are its files); one BPE for all ranks
            given = (
                resolve_checkpoint(self.out / "last") / "tokenizer.json"
                if self.resume  # its own BPE
                else resolve_data_path(r.tokenizer, self.data_dir)
            )
            if not given:
                return train_bpe(train.sources + train.targets, r.vocab_size)
            tokenizer = read_tokenizer(given)
            check_tokenizer(tokenizer, given)
            return tokenizer

        tokenizer = distributed.on_main(bpe)
        config = TransformerConfig(
            **{
                "max_len": 256,
                **r.model,
                "src_vocab_size": tokenizer.get_vocab_size(),
                "tgt_vocab_size": tokenizer.get_vocab_size(),
                "pad_id": PAD,
            }
        )
        model = self.new_model(lambda: Transformer(config))
        task = TranslationTask(
            tokenizer, train, self.valid, config, r.max_tokens, r.label_smoothing, r.max_length, r.decoding
        )
        return (
            model,
            task,
            {
                "parameters": model.num_parameters(),
                "train_pairs": len(task.src),
                "filtered_long": task.filtered,
                "skipped": train.skipped,
            },
        )

    def finish(self, report: dict[str, Any]) -> None:
        r, chosen = self.recipe, self.choose_checkpoint(report)
        translator = load_translator(chosen, device=r.train.device)
        if r.decoding_grid:  # on the validation set only; the winner becomes the checkpoint's decoding
            t0 = time.perf_counter()
            translator.decoding, report["decoding_search"] = choose_decoding(
                translator, self.valid.sources, self.valid.targets, r.decoding_grid
            )
            report["decoding"] = translator.decoding
            update_config(chosen, decoding=translator.decoding)
            report["seconds_decoding_search"] = time.perf_counter() - t0
        if r.test_source and r.test_target:
            test = self.load_pair(r.test_source, r.test_target)
            t0 = time.perf_counter()
            scores = translator.evaluate(test.sources, test.targets)
            report["test"] = {k: v for k, v in scores.items() if k != "hypotheses"}
            report["seconds_test_decoding"] = time.perf_counter() - t0
            (self.out / "test_hypotheses.txt").write_text("\n".join(scores["hypotheses"]) + "\n")


def train_translation(
    recipe: TranslationRecipe, data_dir: str | Path = DEFAULT_DATA_DIR, resume: bool = False
) -> dict[str, Any]:
    """Run a recipe: BPE, model, training; then the best (or averaged) model on the test set, with beam
    search.

    Under torchrun every process runs this: rank 0 trains the BPE and sends it to the others, all
    train, then rank 0 alone averages, tests and writes the report.
    """
    return TranslationRun(recipe, data_dir, resume).run()


def choose_decoding(
    translator: Translator, sources: Sequence[str], references: Sequence[str], grid: dict[str, list[Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Translate ``sources`` with every combination of ``grid`` (e.g. ``{"beam_size": [4, 6],
    "length_penalty": [0.6, 1.0]}``) on top of the translator's decoding; return the decoding with
    the highest sacreBLEU (the first of equals) and every combination's scores. Pass validation
    pairs: choosing on the test set would report an optimistic score."""

    def score(decoding: dict[str, Any]) -> dict[str, Any]:
        trial = Translator(
            translator.model, translator.tokenizer, decoding, translator.device, translator.special_ids
        )
        scores = trial.evaluate(sources, references)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return choose_from_grid(translator.decoding, grid, score, "bleu")
