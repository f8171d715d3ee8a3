"""Masked-language-model pretraining of a BERT-style encoder on unlabelled text, end to end:
recipe -> WordPiece -> MaskedLanguageModel -> Trainer -> a BERT checkpoint directory.

    recipe = MLMRecipe.from_json("recipes/imdb_mlm.json")
    report = pretrain_mlm(recipe)        # trains; writes runs/imdb_mlm/encoder (BertForMaskedLM format)
    clf = classifier_from_pretrained("runs/imdb_mlm/encoder", num_classes=2)  # formats.hf_classifier
    sentences = SentenceEncoder.from_pretrained("runs/imdb_mlm/encoder")

Every text becomes one or more sequences ``[CLS] piece [SEP]`` of at most ``max_length`` tokens
(the input format of the classifier that fine-tunes the encoder). Each batch is corrupted by
BERT's recipe (:mod:`scratchformer.data.masking`) from a seed fixed by (seed, epoch, batch), so a
resumed run masks exactly as the uninterrupted one, and the held-out slice is masked the same way
at every evaluation: its masked-token accuracy and perplexity are comparable across steps, and
across runs with the same ``max_length`` and ``max_tokens`` (which decide the batches).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.data.batching import length_bucketed_batches
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR, load_texts
from scratchformer.data.masking import IGNORE, check_masking, continuation_table, mask_tokens
from scratchformer.data.tokenization import SPECIAL_TOKENS, read_tokenizer, save_hf_tokenizer, train_wordpiece
from scratchformer.formats.hf_bert import bert_problems, masked_lm_export
from scratchformer.formats.hf_files import write_export
from scratchformer.models.contextual import EncoderConfig
from scratchformer.models.masked_lm import MaskedLanguageModel
from scratchformer.tasks.shared import TrainingRun, check_model_fields, check_range
from scratchformer.training import TrainConfig, distributed
from scratchformer.training.checkpoint import load_checked, open_checkpoint, resolve_checkpoint
from scratchformer.training.precision import at_least_fp32
from scratchformer.training.recipe import Recipe, resolve_data_path

__all__ = [
    "MLMRecipe",
    "MLMRun",
    "MaskedLMTask",
    "Sequences",
    "export_masked_lm",
    "load_masked_lm",
    "pretrain_mlm",
]

BERT_MODEL = {
    "activation": "gelu",
    "norm_first": False,
    "positional": "learned",
    "embedding_norm": True,
    "scale_embedding": False,
    "layer_norm_eps": 1e-12,
}  # the model section's defaults: BERT's choices
VALID_SEED = 1_234_567  # the held-out slice's masking (the same at every evaluation)


class Sequences:
    """Token sequences ``[CLS] piece [SEP]`` cut from texts, stored flat (int32) to keep millions of
    tokens small. ``lengths[i]`` counts the specials."""

    def __init__(self, tokenizer: Tokenizer, texts: list[str], max_length: int, chunk: int = 2000):
        body = max_length - 2
        tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: a given tokenizer may pad or truncate
        tokenizer.no_padding()
        tokenizer.no_truncation()
        pieces: list[Tensor] = []
        for start in range(0, len(texts), chunk):
            for encoding in tokenizer.encode_batch(texts[start : start + chunk], add_special_tokens=False):
                ids = torch.tensor(encoding.ids, dtype=torch.int32)
                pieces += [ids[i : i + body] for i in range(0, len(ids), body)] if len(ids) else []
        self.tokens = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32)
        self.starts = torch.tensor([0] + [len(p) for p in pieces], dtype=torch.long).cumsum(0)[:-1]
        self.lengths = [len(p) + 2 for p in pieces]
        self.cls_id, self.sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, index: list[int], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
        """ids (B, L), padding_mask (B, L) True at real tokens, maskable (B, L) True inside the pieces."""
        longest = max(self.lengths[i] for i in index)
        ids = torch.full((len(index), longest), pad_id, dtype=torch.long)
        maskable = torch.zeros(len(index), longest, dtype=torch.bool)
        for row, i in enumerate(index):
            n, start = self.lengths[i] - 2, int(self.starts[i])
            ids[row, 0], ids[row, n + 1] = self.cls_id, self.sep_id
            ids[row, 1 : n + 1] = self.tokens[start : start + n]
            maskable[row, 1 : n + 1] = True
        real = torch.arange(longest) < torch.tensor([self.lengths[i] for i in index])[:, None]
        return ids, real, maskable


class MaskedLMTask:
    """The MLM :class:`~scratchformer.training.TrainingTask`: cross-entropy at the chosen positions."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        train: Sequences,
        valid: Sequences,
        model_config: EncoderConfig,
        recipe: MLMRecipe,
    ):
        self.tokenizer, self.train, self.valid, self.model_config, self.recipe = (
            tokenizer,
            train,
            valid,
            model_config,
            recipe,
        )
        vocabulary = tokenizer.get_vocab()
        special = {vocabulary[t] for t in SPECIAL_TOKENS if t in vocabulary}
        self.pad_id, self.mask_id = vocabulary["[PAD]"], vocabulary["[MASK]"]
        self.replacements = torch.tensor(sorted(set(vocabulary.values()) - special))  # (K,)
        self.special = torch.zeros(max(vocabulary.values()) + 1, dtype=torch.bool)
        self.special[sorted(special)] = True  # also where a text spells "[SEP]": never a target
        self.continuation = continuation_table(vocabulary) if recipe.whole_word else None

    def _corrupt(
        self, sequences: Sequences, index: list[int], seed: int, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """A batch of ``sequences`` masked from ``seed``: inputs (B, L), padding_mask (B, L),
        targets (B, L)."""
        ids, real, maskable = sequences.batch(index, self.pad_id)
        r = self.recipe
        whole_words = None if self.continuation is None else self.continuation[ids]
        inputs, targets = mask_tokens(
            ids,
            maskable & ~self.special[ids],
            self.mask_id,
            self.replacements,
            torch.Generator().manual_seed(seed),
            r.mask_rate,
            r.mask_fraction,
            r.random_fraction,
            whole_words,
        )
        return inputs.to(device), real.to(device), targets.to(device)

    def batches(self, epoch: int, seed: int) -> list[tuple[int, list[int]]]:
        """(masking seed, sequence indices) per batch of at most ``max_tokens`` padded tokens."""
        batches = length_bucketed_batches(
            self.train.lengths, max_tokens=self.recipe.max_tokens, seed=seed, epoch=epoch
        )
        return [(((seed * 1_000_003 + epoch) * 1_000_003 + i) % 2**63, b) for i, b in enumerate(batches)]

    def loss(
        self, model: nn.Module, batch: tuple[int, list[int]], device: torch.device
    ) -> tuple[Tensor, int]:
        """Mean cross-entropy over the chosen positions; the items are the batch's real tokens."""
        inputs, real, targets = self._corrupt(self.train, batch[1], batch[0], device)
        chosen = targets != IGNORE
        logits = model(inputs, real, chosen)  # (M, V)
        if logits.shape[0] == 0:  # nothing chosen (a tiny batch): no loss, no NaN
            return logits.sum() * 0.0, int(real.sum())
        return F.cross_entropy(at_least_fp32(logits), targets[chosen]), int(real.sum())

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Masked-token loss (nats), accuracy and perplexity on the held-out sequences."""
        total, correct, count = 0.0, 0, 0
        batches = length_bucketed_batches(
            self.valid.lengths, max_tokens=self.recipe.max_tokens, shuffle=False
        )
        for i, index in enumerate(batches):
            inputs, real, targets = self._corrupt(self.valid, index, VALID_SEED + i, device)
            chosen = targets != IGNORE
            logits = at_least_fp32(model(inputs, real, chosen))
            total += F.cross_entropy(logits, targets[chosen], reduction="sum").item()
            correct += int((logits.argmax(-1) == targets[chosen]).sum())
            count += int(chosen.sum())
        loss = total / max(count, 1)
        return {"loss": loss, "accuracy": correct / max(count, 1), "perplexity": math.exp(min(loss, 50.0))}

    def checkpoint_config(self) -> dict[str, Any]:
        r = self.recipe
        return {
            "kind": "masked_lm",
            "model": self.model_config.to_dict(),
            "max_length": r.max_length,
            "masking": {
                "rate": r.mask_rate,
                "mask_fraction": r.mask_fraction,
                "random_fraction": r.random_fraction,
                "whole_word": r.whole_word,
            },
        }

    def save_files(self, directory: Path) -> None:
        self.tokenizer.save(str(directory / "tokenizer.json"))


@dataclass
class MLMRecipe(Recipe):
    """Everything an MLM pretraining run needs, loadable from JSON (see recipes/imdb_mlm.json).

    ``train_files``: JSONL/CSV (the ``text_field``) or plain-text files (one text per line), .gz ok;
    ``{data}`` in a path is the shared data directory. The best checkpoint is written as a BERT
    directory to ``out_dir/encoder`` at the end. ``valid_size`` texts are held out for the
    masked-token metrics. ``max_length``: tokens per sequence, [CLS] and [SEP] included (longer
    texts are cut into several); ``max_tokens``: padded tokens per batch. The model section holds
    :class:`EncoderConfig` fields, BERT's choices by default (post-LN, learned positions, a
    LayerNorm on the embeddings, GELU): the result is written as a BERT checkpoint.
    """

    train_files: list[str]  # unlabelled texts: JSONL/CSV (the text_field) or plain text, one text per
    # line; .gz ok (a non-empty list)
    text_field: str = "text"  # the key (JSONL) or column (CSV) of the text
    valid_size: int = 1000  # texts held out for the masked-token metrics (>= 1)
    vocab_size: int = 16000  # WordPiece vocabulary trained on the training texts (>= 8)
    lowercase: bool = True  # that WordPiece tokenizer lowercases and strips accents
    tokenizer: str | None = None  # a tokenizer.json to use instead of training one
    max_length: int = 512  # tokens per sequence, [CLS] and [SEP] included (>= 3); longer texts are cut
    # into several
    max_tokens: int = 16384  # padded tokens per batch (>= max_length)
    mask_rate: float = 0.15  # share of the real tokens (words, with whole_word) chosen as targets, in (0, 1)
    mask_fraction: float = 0.8  # share of the chosen replaced by [MASK] (>= 0)
    random_fraction: float = 0.1  # share of the chosen replaced by a random token (>= 0; with mask_fraction
    # at most 1; the rest are kept)
    whole_word: bool = False  # choose whole words: a "##" piece is chosen with its word's first piece
    model: dict[str, Any] = field(default_factory=dict)  # EncoderConfig fields, BERT's choices by default
    # (vocab/pad come from the tokenizer); a BERT checkpoint must be able to express them
    train: TrainConfig = field(default_factory=TrainConfig)  # how to train: TrainConfig's fields

    METRICS = ("loss", "accuracy", "perplexity")

    def validate(self) -> None:
        if not isinstance(self.train_files, list) or not self.train_files:
            raise ValueError(f"train_files: expected a non-empty list of paths, got {self.train_files!r}")
        check_range(self, {"valid_size": 1, "vocab_size": 8, "max_length": 3, "max_tokens": 1})
        if self.max_tokens < self.max_length:
            raise ValueError(
                f"max_tokens={self.max_tokens} must hold one sequence of max_length={self.max_length}"
            )
        check_masking(self.mask_rate, self.mask_fraction, self.random_fraction)
        check_model_fields(EncoderConfig, self.model_fields(), vocab_size=self.vocab_size, pad_id=0)
        if self.model_fields()["max_len"] < self.max_length:
            raise ValueError(
                f"model.max_len={self.model_fields()['max_len']} is shorter than max_length={self.max_length}"
            )
        problems = bert_problems(EncoderConfig(**self.model_fields(), vocab_size=self.vocab_size, pad_id=0))
        if problems:
            raise ValueError(
                "model: the pretrained encoder is written as a BERT checkpoint, which cannot express "
                + "; ".join(problems)
            )

    def model_fields(self) -> dict[str, Any]:
        return {**BERT_MODEL, "max_len": self.max_length, **self.model}


class MLMRun(TrainingRun):
    """:func:`pretrain_mlm`'s run (:class:`~scratchformer.tasks.shared.TrainingRun`): the texts (a
    held-out slice for the masked-token metrics), WordPiece and a MaskedLanguageModel; then the best
    checkpoint exported as a BERT directory, ``out_dir/encoder``."""

    def sized_model(self):
        config = EncoderConfig(**self.recipe.model_fields(), vocab_size=self.recipe.vocab_size, pad_id=0)
        return lambda: MaskedLanguageModel(config)

    def check(self) -> None:
        c = self.recipe
        self.paths = [Path(resolve_data_path(path, self.data_dir)) for path in c.train_files]  # type: ignore[arg-type]
        missing = [str(path) for path in self.paths if not path.is_file()]
        if missing:
            raise FileNotFoundError(f"train_files not found: {', '.join(missing)}")
        given = resolve_data_path(c.tokenizer, self.data_dir)
        self.given_tokenizer = (
            _check_tokenizer(read_tokenizer(given), given) if given and not self.resume else None
        )

    def setup(self) -> tuple[MaskedLanguageModel, MaskedLMTask, dict[str, Any]]:
        c = self.recipe
        texts = [t for path in self.paths for t in load_texts(path, c.text_field)]
        if len(texts) <= c.valid_size:
            raise ValueError(f"valid_size={c.valid_size} leaves no training text out of {len(texts)}")
        order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(c.train.seed)).tolist()
        valid_texts = [texts[i] for i in order[: c.valid_size]]
        train_texts = [texts[i] for i in order[c.valid_size :]]

        def wordpiece() -> Tokenizer:  # rank 0's, sent to the others (training it is not deterministic)
            if self.resume:
                return read_tokenizer(resolve_checkpoint(self.out / "last") / "tokenizer.json")
            if self.given_tokenizer is not None:
                return self.given_tokenizer
            return train_wordpiece(train_texts, c.vocab_size, c.lowercase)

        tokenizer = _check_tokenizer(distributed.on_main(wordpiece), "the tokenizer")
        train, valid = (
            Sequences(tokenizer, train_texts, c.max_length),
            Sequences(tokenizer, valid_texts, c.max_length),
        )
        config = EncoderConfig(
            **c.model_fields(), vocab_size=tokenizer.get_vocab_size(), pad_id=tokenizer.token_to_id("[PAD]")
        )
        model = self.new_model(lambda: MaskedLanguageModel(config))
        task = MaskedLMTask(tokenizer, train, valid, config, c)
        return (
            model,
            task,
            {
                "parameters": model.num_parameters(),
                "texts": len(texts),
                "train_sequences": len(train),
                "train_tokens": int(sum(train.lengths)),
                "valid_sequences": len(valid),
                "seconds_prepare": self.seconds(),
            },
        )

    def finish(self, report: dict[str, Any]) -> None:
        export = self.out / "encoder"
        if (
            export.exists()
        ):  # this run's own output (check_run refused an earlier run's); a resumed run writes it again
            shutil.rmtree(export)
        export_masked_lm(self.out / "best", export)
        report["export"] = str(export)


def pretrain_mlm(
    recipe: MLMRecipe, data_dir: str | Path = DEFAULT_DATA_DIR, resume: bool = False
) -> dict[str, Any]:
    """Run a recipe: read the texts, train WordPiece on them, pretrain, and export the best
    checkpoint as a BERT directory (``out_dir/encoder``). Returns (and writes to ``out_dir/report.json``)
    sizes, timings and the held-out masked-token metrics."""
    return MLMRun(recipe, data_dir, resume).run()


def _check_tokenizer(tokenizer: Tokenizer, name: str | Path) -> Tokenizer:
    """MLM needs every one of BERT's special tokens."""
    missing = [token for token in SPECIAL_TOKENS if tokenizer.token_to_id(token) is None]
    if missing:
        raise ValueError(f"{name}: no {missing} token (MLM needs {list(SPECIAL_TOKENS)})")
    return tokenizer


def load_masked_lm(directory: str | Path) -> tuple[MaskedLanguageModel, Tokenizer, dict[str, Any]]:
    """A checkpoint written by :func:`pretrain_mlm` (weights via safetensors): model, tokenizer, config."""
    directory, config = open_checkpoint(directory, "masked_lm")
    model_config = EncoderConfig.from_dict(config["model"])
    tokenizer = read_tokenizer(directory / "tokenizer.json")
    if (
        tokenizer.get_vocab_size() != model_config.vocab_size
        or tokenizer.token_to_id("[PAD]") != model_config.pad_id
    ):
        raise ValueError(
            f"{directory / 'tokenizer.json'} does not belong to this model: {tokenizer.get_vocab_size()} "
            f"tokens, [PAD] id {tokenizer.token_to_id('[PAD]')}; the model has {model_config.vocab_size} "
            f"tokens, pad id {model_config.pad_id}"
        )
    model = load_checked(directory, lambda: MaskedLanguageModel(model_config))
    return model.eval(), tokenizer, config


def export_masked_lm(checkpoint: str | Path, directory: str | Path, format: str = "hf") -> Path:
    """Write an MLM checkpoint as a Hugging Face BERT directory (``format="hf"``: ``BertForMaskedLM``;
    ``AutoModel`` and our ``load_bert_encoder`` read its encoder): config.json, model.safetensors,
    tokenizer.json; or as ONNX (``"onnx"``: model.onnx, input_ids and attention_mask (B, L) -> logits
    (B, L, V), with tokenizer.json)."""
    if format not in ("hf", "onnx"):
        raise ValueError(f"format: expected 'hf' or 'onnx', got {format!r}")
    model, tokenizer, config = load_masked_lm(checkpoint)
    if format == "onnx":
        from scratchformer.formats.onnx_export import export_masked_lm_onnx

        return export_masked_lm_onnx(model, tokenizer, directory)
    hf_config, state = masked_lm_export(model)
    max_length = int(config.get("max_length", model.config.max_len))
    return write_export(
        directory, hf_config, state, lambda tmp: save_hf_tokenizer(tokenizer, tmp, max_length=max_length)
    )
