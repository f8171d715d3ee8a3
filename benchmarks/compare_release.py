"""Speed of this checkout against an earlier commit: same weights, interleaved in one process.

    python -m benchmarks.compare_release --base 5c00267 [--rounds 15] [--out results.md]

The earlier commit's package is unpacked from git into a temporary folder under another name
(``scratchformer_base``), so both import side by side. Each row times the two implementations
round by round in alternating order (median of the rounds, after a warm-up) with the same weights
(an old checkpoint's state_dict loads into the new model). This checkout's models are
``optimize``d, as the tasks and the benchmark use them; a base without ``optimize`` runs as it is.

An A/A row times one model against its own deep copy: two identical models differ by a few
percent on CPU (where their weights sit in memory), and that is the noise floor for the others.

With ``--checkpoint`` (a translation checkpoint) and ``--source`` (a text file, .gz too), the rows
are the serving path instead: both packages' translators (fp32 and int8) on the same lines, a batch
of 32 and 16 lines one at a time, with the checkpoint's beam, and how many lines come out the same::

    python -m benchmarks.compare_release --base HEAD~1 --checkpoint runs/multi30k/best \\
        --source ../shared/data/multi30k/test_2016_flickr.de.gz
"""

from __future__ import annotations

import argparse
import copy
import importlib
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

import scratchformer as sf
from benchmarks.harness import interleaved_medians

ROOT = Path(__file__).resolve().parent.parent
D, H, F, N = 512, 8, 2048, 6


def import_base(rev: str, into: Path):
    """The package as of ``rev``, imported as ``scratchformer_base``."""
    archive = into / "base.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "src/scratchformer"], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    package = into / "scratchformer_base"
    (into / "src" / "scratchformer").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bscratchformer\.", "scratchformer_base.", text)
        path.write_text(text.replace("from scratchformer import", "from scratchformer_base import"))
    sys.path.insert(0, str(into))
    return importlib.import_module("scratchformer_base")


def twins(base, kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model from the base package and from this checkout, with the same weights."""
    torch.manual_seed(0)
    if kind == "Encoder":
        old = base.Encoder([base.EncoderLayer(D, H, F, dropout=0.0) for _ in range(N)])
        new = sf.Encoder([sf.EncoderLayer(D, H, F, dropout=0.0) for _ in range(N)])
    else:
        kw = dict(
            vocab_size=8000,
            d_model=D,
            num_heads=H,
            num_layers=N,
            d_ff=F,
            dropout=0.0,
            activation="gelu",
            layer_norm_eps=1e-12,
            max_len=512,
            positional="learned",
            type_vocab_size=2,
            embedding_norm=True,
            scale_embedding=False,
            pad_id=0,
        )
        old, new = (
            base.ContextualEncoder(base.EncoderConfig(**kw)),
            sf.ContextualEncoder(sf.EncoderConfig(**kw)),
        )
    new.load_state_dict(old.state_dict())
    if hasattr(base, "optimize"):
        base.optimize(old)
    return old, sf.optimize(new)


def model_rows(base, rounds: int, row: Callable[[str, float, float], None]) -> None:
    """The encoders' inference, an A/A row and an encoder training step."""
    for kind in ("Encoder", "ContextualEncoder"):
        old, new = (m.eval() for m in twins(base, kind))
        for B, T in ((32, 128), (8, 512), (1, 32)):
            x = torch.randn(B, T, D) if kind == "Encoder" else torch.randint(1, 8000, (B, T))
            with torch.inference_mode():
                t = interleaved_medians(
                    {"base": lambda: old(x), "this": lambda: new(x)}, rounds if B * T > 64 else 4 * rounds
                )
            row(f"{kind} inference B{B}xT{T}", t["base"], t["this"])
    old, new = twins(base, "Encoder")
    x = torch.randn(32, 128, D)
    with torch.inference_mode():
        twin = copy.deepcopy(new.eval())
        t = interleaved_medians({"base": lambda: new(x), "this": lambda: twin(x)}, rounds)
    row("A/A: this Encoder vs its own copy, B32xT128 (noise floor)", t["base"], t["this"])
    x = torch.randn(16, 128, D)
    optimizers = {m: torch.optim.AdamW(m.parameters()) for m in (old.train(), new.train())}

    def step(m: torch.nn.Module) -> None:
        optimizers[m].zero_grad(set_to_none=True)
        m(x).square().mean().backward()
        optimizers[m].step()

    t = interleaved_medians({"base": lambda: step(old), "this": lambda: step(new)}, rounds)
    row("Encoder training step B16xT128 (+ AdamW)", t["base"], t["this"])


def translation_rows(
    checkpoint: str, source: str, rounds: int, row: Callable[[str, float, float], None]
) -> None:
    """Both packages' translators, fp32 and int8, on the same lines: a batch of 32 (and how many of
    its lines come out the same), and 16 lines one at a time."""
    from scratchformer.data.labelled_texts import open_text
    from scratchformer.tasks.translation import load_translator

    base_translation = importlib.import_module("scratchformer_base.tasks.translation")
    with open_text(source) as lines:
        texts = [line.strip() for line in lines][:48]
    batch, singles = texts[:32], texts[32:48]
    base_fp32, this_fp32 = (
        base_translation.load_translator(checkpoint, device="cpu"),
        load_translator(checkpoint),
    )
    for precision in ("fp32", "int8"):
        old, new = base_fp32.with_precision(precision), this_fp32.with_precision(precision)
        same = sum(a == b for a, b in zip(old.translate(batch), new.translate(batch)))
        runs = {
            "base": lambda: old.translate(batch, batch_size=32),
            "this": lambda: new.translate(batch, batch_size=32),
        }
        t = interleaved_medians(runs, rounds)
        row(f"translate {precision}, a batch of 32 lines ({same}/32 the same)", t["base"], t["this"])
        runs = {
            "base": lambda: [old.translate([s]) for s in singles],
            "this": lambda: [new.translate([s]) for s in singles],
        }
        t = interleaved_medians(runs, rounds)
        row(f"translate {precision}, 16 lines one at a time", t["base"], t["this"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--checkpoint", help="a translation checkpoint: time translating instead")
    parser.add_argument("--source", help="with --checkpoint: the lines to translate (text or .gz)")
    args = parser.parse_args()
    if args.checkpoint and not args.source:
        parser.error("--checkpoint needs --source (the lines to translate)")
    rows = []

    def row(name: str, base_s: float, new_s: float) -> None:
        rows.append(f"| {name} | {base_s * 1e3:.1f} | {new_s * 1e3:.1f} | {base_s / new_s:.3f} |")
        print(rows[-1], flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        base = import_base(args.base, Path(tmp))
        print("| row | base ms | this ms | this speed / base |\n|---|---|---|---|")
        if args.checkpoint:
            translation_rows(args.checkpoint, args.source, args.rounds, row)
        else:
            model_rows(base, args.rounds, row)

    header = (
        f"Base {args.base} vs this checkout, {args.rounds} rounds, "
        f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}\n\n"
        "| row | base ms | this ms | this speed / base |\n|---|---|---|---|\n"
    )
    if args.out:
        args.out.write_text(header + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
