"""Training throughput of torchrun with N processes against one process, on this machine.

    python -m benchmarks.ddp_throughput                  # IMDB subset, 2 processes vs 1
    python -m benchmarks.ddp_throughput --nproc 4 --steps 60 --examples 4000

Both runs are the real command line on the IMDB recipe's model (recipes/imdb.json: 2 pre-LN
layers, D=128, bf16 autocast) with a smaller vocabulary and 256-token reviews, on the first
``--examples`` training reviews (from ``--data-dir``):

    python -m scratchformer train classifier --config R.json                       (1 process)
    python -m torch.distributed.run --standalone --nproc-per-node N -m scratchformer train classifier \\
        --config R.json

Every process keeps the recipe's batch of 32 reviews, so N processes train on N times more data per
step. Throughput is the trainer's own tokens/s (real tokens, all ranks together), the median of its
log windows after the first (warm-up) window. torchrun gives each process 1 CPU thread
(OMP_NUM_THREADS=1); the single process uses torch's default (all cores), and, as a second
reference, 1 thread. The runs are interleaved ``--repeats`` times and each one's median is kept.
Prints a markdown table with the ratio to the single process measured in the same invocation.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_inputs(data_dir: Path, examples: int, steps: int, work: Path) -> Path:
    """A JSONL subset of IMDB's training reviews and a recipe that trains on it for ``steps`` steps."""
    source = data_dir / "imdb" / "train.jsonl.gz"
    if not source.is_file():
        raise SystemExit(
            f"error: {source} not found (give --data-dir, the folder holding imdb/train.jsonl.gz)"
        )
    with gzip.open(source, "rt") as f:
        lines = [line for _, line in zip(range(examples), f)]
    subset = work / "train.jsonl"
    subset.write_text("".join(lines))
    recipe = json.loads((ROOT / "recipes" / "imdb.json").read_text())
    recipe.update(
        train_file=str(subset),
        test_file=None,
        valid_size=64,
        vocab_size=8000,
        max_length=256,
        head_length=64,
        average_last=0,
    )
    recipe["train"].update(
        max_steps=steps, eval_every=0, log_every=5, save_every=0, progress=False, warmup_steps=10
    )
    path = work / "recipe.json"
    path.write_text(json.dumps(recipe, indent=2))
    return path


def tokens_per_second(out: Path) -> float:
    """The median tokens/s of the log windows after the first."""
    rates = [
        r["items_per_s"]
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if "items_per_s" in r
    ]
    if len(rates) < 2:
        raise SystemExit(f"error: {out}/metrics.jsonl has {len(rates)} log windows; raise --steps")
    return statistics.median(rates[1:])


def run(name: str, command: list[str], env: dict[str, str]) -> None:
    print(f"# {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"error: {name} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", default=os.environ.get("SCRATCHFORMER_DATA", str(ROOT.parent / "shared" / "data"))
    )
    parser.add_argument("--nproc", type=int, default=2, help="processes of the torchrun run (default 2)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of each run (default 40)")
    parser.add_argument("--examples", type=int, default=3000, help="training reviews used (default 3000)")
    parser.add_argument(
        "--repeats", type=int, default=2, help="interleaved repetitions of the runs (default 2)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ddp-throughput-") as tmp:
        work = Path(tmp)
        recipe = write_inputs(Path(args.data_dir), args.examples, args.steps, work)
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "WORLD_SIZE", "RANK", "LOCAL_RANK")
        }
        train = ["-m", "scratchformer", "train", "classifier", "--config", str(recipe)]
        runs = {
            "1 process, default threads": [sys.executable, *train],
            "1 process, 1 thread": [sys.executable, *train, "--threads", "1"],
            f"{args.nproc} processes (torchrun), 1 thread each": [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(args.nproc),
                *train,
            ],
        }
        measured: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for i, (name, command) in enumerate(runs.items()):
                out = work / f"run{repeat}-{i}"
                run(name, [*command, "--out", str(out)], env)
                measured[name].append(tokens_per_second(out))
        rates = {name: statistics.median(values) for name, values in measured.items()}

    import torch

    reference = rates["1 process, default threads"]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}, "
        f"torch {torch.__version__}; "
        f"{args.examples} IMDB reviews, {args.steps} steps, batch 32 per process, bf16 autocast, "
        f"median of {args.repeats} interleaved runs"
    )
    print("| run | tokens/s (median of log windows) | throughput vs 1 process |")
    print("|---|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.0f} | {rate / reference:.2f}x |")


if __name__ == "__main__":
    main()
