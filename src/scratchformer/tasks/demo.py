"""An offline demo: train a tiny encoder-decoder to reverse (or sort) digit strings.

Runs in under a minute on 2 CPU cores, needs no data and no network, and exercises the whole
model: padding masks (inputs of varied length), the causal decoder, teacher forcing and greedy
decoding with the key/value cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn import functional as F
from tqdm.auto import tqdm

from scratchformer.fast import optimize
from scratchformer.generation import greedy_decode
from scratchformer.core.transformer import Transformer, TransformerConfig

__all__ = ["DemoConfig", "DemoResult", "make_batch", "run_demo"]

PAD, BOS, EOS, FIRST_DIGIT = 0, 1, 2, 3
VOCAB_SIZE = FIRST_DIGIT + 10
TASKS = ("reverse", "sort")


@dataclass
class DemoConfig:
    task: str = "reverse"
    steps: int = 700
    batch_size: int = 64
    min_len: int = 3
    max_len: int = 10
    lr: float = 2e-3
    warmup: int = 100
    seed: int = 0
    eval_size: int = 500
    show: int = 5
    model: TransformerConfig = field(
        default_factory=lambda: TransformerConfig(
            src_vocab_size=VOCAB_SIZE,
            tgt_vocab_size=VOCAB_SIZE,
            d_model=64,
            num_heads=4,
            num_encoder_layers=2,
            num_decoder_layers=2,
            d_ff=128,
            dropout=0.0,
            norm_first=True,
            share_embeddings=True,
            tie_output=True,
            max_len=32,
            pad_id=PAD,
        )
    )

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task: expected one of {TASKS}, got {self.task!r}")
        for name in ("steps", "batch_size", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")


@dataclass
class DemoResult:
    accuracy: float  # exact-match rate of greedy outputs on held-out inputs
    final_loss: float
    seconds: float
    examples: list[tuple[str, str, str]]  # (input, expected, predicted)


def _target(digits: list[int], task: str) -> list[int]:
    return digits[::-1] if task == "reverse" else sorted(digits)


def make_batch(
    task: str, batch_size: int, min_len: int, max_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Random digit strings and their answers.

    Returns:
        src (B, S) digits then PAD; tgt_in (B, T) BOS + answer; tgt_out (B, T) answer + EOS,
        all right-padded with PAD.
    """
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)
    S = int(lengths.max())
    src = torch.full((batch_size, S), PAD, dtype=torch.long)
    tgt_in = torch.full((batch_size, S + 1), PAD, dtype=torch.long)
    tgt_out = torch.full((batch_size, S + 1), PAD, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        digits = (torch.randint(0, 10, (n,), generator=generator) + FIRST_DIGIT).tolist()
        answer = _target(digits, task)
        src[i, :n] = torch.tensor(digits)
        tgt_in[i, : n + 1] = torch.tensor([BOS] + answer)
        tgt_out[i, : n + 1] = torch.tensor(answer + [EOS])
    return src, tgt_in, tgt_out


def _text(ids: list[int]) -> str:
    return "".join(str(i - FIRST_DIGIT) for i in ids if i >= FIRST_DIGIT)


def _answer(row: Tensor) -> list[int]:
    ids = row.tolist()
    return ids[: ids.index(EOS)] if EOS in ids else ids + [-1]  # no EOS: never an exact match


def run_demo(config: DemoConfig | None = None, progress: bool = True) -> DemoResult:
    """Train on fresh random batches, then greedy-decode held-out inputs and score exact matches."""
    cfg = config or DemoConfig()
    torch.manual_seed(cfg.seed)
    train_gen = torch.Generator().manual_seed(cfg.seed)
    model = optimize(Transformer(cfg.model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / cfg.warmup) * max(0.05, 1 - step / cfg.steps)
    )
    start = time.perf_counter()
    model.train()
    loss = torch.tensor(float("nan"))
    bar = tqdm(range(cfg.steps), desc=f"demo: {cfg.task}", disable=not progress, unit="step", mininterval=0.5)
    for step in bar:
        src, tgt_in, tgt_out = make_batch(cfg.task, cfg.batch_size, cfg.min_len, cfg.max_len, train_gen)
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if progress and step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{schedule.get_last_lr()[0]:.1e}", refresh=False)

    model.eval()
    eval_gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)  # a stream training never saw
    src, _, tgt_out = make_batch(cfg.task, cfg.eval_size, cfg.min_len, cfg.max_len, eval_gen)
    pred = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_b=2)
    correct, examples = 0, []
    for i in range(cfg.eval_size):
        expected, got = _answer(tgt_out[i]), _answer(pred[i])
        correct += expected == got
        if i < cfg.show:
            examples.append((_text(src[i].tolist()), _text(expected), _text(got)))
    return DemoResult(correct / cfg.eval_size, loss.item(), time.perf_counter() - start, examples)
