"""Where the time goes: ``torch.profiler`` tables of every implementation of one benchmark row.

    python -m benchmarks.profile --group inference --row B8xT512 --precision bf16 [--size full] [--rounds 2]
    python -m benchmarks.profile --group decoding --row "batch 8, 64 new tokens" --only "greedy, KV cache" \
        --only "greedy, recompute prefix"

Builds the row exactly as ``benchmarks.run`` does (same builder, models, inputs and precision),
then profiles each implementation in turn (one warm-up call, then ``--rounds`` calls), ours and
the references, and writes ``benchmarks/results/profile-<group>-<row>-<precision>.txt``: per
implementation its wall time and the operators sorted by self CPU time. Use it to explain a gap
that ``benchmarks.run`` reports.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.suite import BUILDERS, ONCE, PRECISIONS, SIZES

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--group", choices=[g for g in BUILDERS if g not in ONCE], required=True)
    parser.add_argument(
        "--row", required=True, help='the row as the tables name it, e.g. "B8xT512, 25%% padding"'
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="an implementation to profile (repeatable; default: every one of the row)",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=16, help="operators per table")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    groups = BUILDERS[args.group](SIZES[args.size], device, args.precision)
    cases = [c for g in groups for c in g.cases if c.row == args.row]
    if not cases:
        rows = sorted({c.row for g in groups for c in g.cases})
        parser.error(f"--row {args.row!r}: not a row of group {args.group}; its rows: {rows}")
    only = args.only
    unknown = sorted(set(only) - {c.impl for c in cases})
    if unknown:
        parser.error(f"--only: {unknown} not among {[c.impl for c in cases]}")
    text = [
        f"profile of {args.group} row '{args.row}' ({args.precision}, size {args.size}): "
        "one warm-up call, then "
        f"{args.rounds} profiled calls per implementation; `python -m benchmarks.profile "
        f"--group {args.group} --row '{args.row}' --precision {args.precision}`\n"
    ]
    for case in cases:
        if only and case.impl not in only:
            continue
        (case.warmup_fn or case.fn)()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.rounds):
                case.fn()
        wall = (time.perf_counter() - start) / args.rounds
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.lines)
        text.append(f"== {case.impl}: {wall * 1e3:.1f} ms per call under the profiler\n{table}\n")
        print(text[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", args.row).strip("-")
    path = args.out / f"profile-{args.group}-{slug}-{args.precision}.txt"
    path.write_text("\n".join(text))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
