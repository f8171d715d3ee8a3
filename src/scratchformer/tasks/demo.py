"""An offline demo: train a tiny encoder-decoder to reverse (or sort) digit strings.

Runs in under a minute on 2 CPU cores, needs no data and no network, and exercises the whole
model: padding masks (inputs of varied length), the causal decoder, teacher forcing and greedy
decoding with the key/value cache. Then it draws what it learned: the cross-attention of one
held-out input (for reversal, an anti-diagonal: output digit t reads source digit n-1-t).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F
from tqdm.auto import tqdm

from scratchformer.core.transformer import Transformer, TransformerConfig
from scratchformer.fast import optimize
from scratchformer.generation import greedy_decode
from scratchformer.viz.attention_maps import record_attention

__all__ = [
    "DemoAttention",
    "DemoConfig",
    "DemoResult",
    "demo_attention",
    "make_batch",
    "plot_demo_attention",
    "run_demo",
]

PAD, BOS, EOS, FIRST_DIGIT = 0, 1, 2, 3
VOCAB_SIZE = FIRST_DIGIT + 10
TASKS = ("reverse", "sort")


@dataclass
class DemoConfig:
    task: str = "reverse"
    steps: int = 450
    batch_size: int = 64
    min_len: int = 3
    max_len: int = 10
    lr: float = 2e-3
    warmup: int = 100
    seed: int = 0
    eval_size: int = 500
    show: int = 5
    figure: str | None = "runs/demo/attention.png"  # the attention map (PNG, relative to the cwd); None: none
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
class DemoAttention:
    """The last decoder layer's cross-attention, mean of its heads, for one held-out input, the
    correct answer fed in (teacher forcing).

    Attributes:
        task: "reverse" or "sort".
        source: the input digits, e.g. "38201957" (the columns).
        target: the answer, e.g. "75910283"; the rows are its digits then </s>.
        weights: (len(target) + 1, len(source)); each row sums to 1.
        layer, heads: which decoder layer (1-based) and how many heads were averaged.
        mirror_mass: reversal only: the mean, over the answer's digits, of the weight on the mirrored
            source digit (row t, column n-1-t: the anti-diagonal); None for sorting, where no single
            source position is expected.
    """

    task: str
    source: str
    target: str
    weights: Tensor
    layer: int
    heads: int
    mirror_mass: float | None

    @property
    def title(self) -> str:
        lines = [
            f"cross-attention, decoder layer {self.layer} (mean of {self.heads} heads)",
            f"{self.task} {self.source} -> {self.target}",
        ]
        if self.mirror_mass is not None:
            lines.append(
                f"mean {self.mirror_mass:.0%} of each output digit's attention on its mirrored source digit"
            )
        return "\n".join(lines)


@dataclass
class DemoResult:
    accuracy: float  # exact-match rate of greedy outputs on held-out inputs
    final_loss: float
    seconds: float
    examples: list[tuple[str, str, str]]  # (input, expected, predicted)
    attention: DemoAttention | None = None  # the cross-attention of one held-out input
    figure: Path | None = None  # where its picture was written (None: not drawn)


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


def demo_attention(model: Transformer, src: Tensor, task: str) -> DemoAttention:
    """Feed one input ``src`` (S,) of digits (no padding) and its correct answer through ``model``,
    recording every attention module's weights; keep the last decoder layer's cross-attention."""
    answer = _target(src.tolist(), task)
    with torch.no_grad(), record_attention(model) as recorded:
        model(src[None], torch.tensor([[BOS] + answer]))
    layer = len(model.decoder.layers)
    weights = recorded[f"decoder.layers.{layer - 1}.cross_attn"][0][0]  # (H, T, S): the only call, sequence 0
    mean = weights.float().mean(dim=0)  # (n + 1, n): rows = answer digits + </s>
    n = len(answer)
    mirror = mean[torch.arange(n), torch.arange(n - 1, -1, -1)].mean().item() if task == "reverse" else None
    return DemoAttention(task, _text(src.tolist()), _text(answer), mean, layer, weights.shape[0], mirror)


def plot_demo_attention(attention: DemoAttention, path: str | Path) -> Path:
    """Draw ``attention`` as one heatmap with a colour bar (a PNG at ``path``, parent folders made)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows, cols = list(attention.target) + ["</s>"], list(attention.source)
    width = max(6.4, 0.45 * len(cols) + 2.6)  # room for the title
    fig, ax = plt.subplots(figsize=(width, 0.45 * len(rows) + 1.9))
    image = ax.imshow(attention.weights.cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
    ax.set_xticks(range(len(cols)), cols, fontsize=10)
    ax.set_yticks(range(len(rows)), rows, fontsize=10)
    ax.set_xlabel("source digit (input)", fontsize=10)
    ax.set_ylabel("output digit (written)", fontsize=10)
    ax.tick_params(length=0)
    ax.set_title(attention.title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label("attention weight", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_demo(config: DemoConfig | None = None, progress: bool = True) -> DemoResult:
    """Train on fresh random batches, then greedy-decode held-out inputs and score exact matches;
    then record the cross-attention of one longish held-out input, and draw it (``cfg.figure``)."""
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

    lengths = (src != PAD).sum(dim=1)
    longish = (lengths >= min(8, cfg.max_len)).nonzero()  # the first of 8+ digits, or the longest
    i = int(longish[0]) if len(longish) else int(lengths.argmax())
    attention = demo_attention(model, src[i, : int(lengths[i])], cfg.task)
    figure = plot_demo_attention(attention, cfg.figure) if cfg.figure is not None else None
    seconds = time.perf_counter() - start
    return DemoResult(correct / cfg.eval_size, loss.item(), seconds, examples, attention, figure)
