"""Run the benchmark suite and write its tables, timings and chart.

    python -m benchmarks.run [--size smoke|full] [--device cpu|cuda] [--precision fp32|bf16|both] [--only ...]

Writes ``benchmarks/results/<size>-<device>.md`` (the tables, the machine, the targets),
``.json`` (every timing) and ``.png`` (a bar chart of the ratios to the references); with one
precision only, ``<size>-<device>-<precision>.*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from benchmarks.harness import Group, run_group
from benchmarks.report import machine_description, targets, write_markdown, write_png
from benchmarks.suite import BUILDERS, GROUPS, ONCE, PRECISIONS, SIZES, Size
from scratchformer.training.precision import native_bf16, no_native_bf16

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument(
        "--precision",
        choices=[*PRECISIONS, "both"],
        default="both",
        help="fp32, bf16 (inference models cast to bf16, training under bf16 autocast) or both "
        "(default), each group once per precision",
    )
    parser.add_argument(
        "--only",
        default=",".join(g for g in GROUPS if g != "gpt2"),
        help=f"comma-separated groups among {','.join(GROUPS)} (default: all but gpt2, which "
        "is added on CUDA)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed rounds per group (default: the size's)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the .md, .json and .png")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every group in this process (default: each builder and precision in a fresh one)",
    )
    args = parser.parse_args(argv)
    only = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = sorted(set(only) - set(GROUPS))
    if unknown:
        parser.error(f"--only: unknown groups {unknown}; choose among {list(GROUPS)}")
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.device.type == "cuda" and "--only" not in " ".join(argv or sys.argv) and "gpt2" not in only:
        only.append("gpt2")
    if "gpt2" in only and args.device.type != "cuda":
        print("gpt2 (decoder-only MFU) runs on CUDA only; skipped", file=sys.stderr)
        only.remove("gpt2")
    args.groups = [g for g in GROUPS if g in only]
    if not args.groups:
        parser.error("--only: no group left to run on this device")
    args.precisions = list(PRECISIONS) if args.precision == "both" else [args.precision]
    return args


def run_builder(name: str, size: Size, device: str, precision: str, threads: int | None) -> list[Group]:
    """Build and time the groups of one builder at one precision; returns them without their models."""
    if threads:
        torch.set_num_threads(threads)
    groups = BUILDERS[name](size, torch.device(device), precision)
    for group in groups:
        print(f"{group.title} ({group.repeats} rounds after {group.warmup} warm-up)", flush=True)
        run_group(group, torch.device(device))
        for case in group.cases:  # free this group's models before the next one (and let it pickle)
            case.fn = case.warmup_fn = None  # type: ignore[assignment]
    return groups


def emulated_bf16(name: str, precision: str, device: torch.device) -> Group | None:
    """A note in place of a bf16 group (or of the bf16-vs-fp32 group) on a device that would emulate
    bf16 (:func:`~scratchformer.training.precision.native_bf16`), many times slower than fp32;
    None: run it."""
    if not (precision == "bf16" or name == "precision") or native_bf16(device):
        return None
    note = f"not run: {no_native_bf16(device)}, so bf16 is emulated there, about 20x slower than fp32"
    return Group(name, [], repeats=0, note=note, precision=precision)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Run the groups; the reports are written again after every job (a builder at one precision),
    so a run stopped part way keeps what it measured. A job that fails becomes a note in the
    reports (its error), the others still run, and the exit status is 1."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    size = SIZES[args.size]
    if args.repeats:
        size = dataclasses.replace(size, repeats=args.repeats, latency_repeats=args.repeats)
    command = "python -m benchmarks.run " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    machine = machine_description(args.device)
    print(machine)
    start = time.perf_counter()
    jobs = [(name, p) for name in args.groups for p in ([""] if name in ONCE else args.precisions)]
    groups: list[Group] = []
    failed = 0
    for done, (name, precision) in enumerate(jobs, 1):
        job = (name, size, str(args.device), precision, args.threads)
        skipped = emulated_bf16(name, precision, args.device)
        try:
            if skipped:  # hours of emulated bf16 would measure nothing worth having: the row says so
                groups.append(skipped)
            elif args.in_process:
                groups += run_builder(*job)
            else:  # a fresh process: no group inherits another's allocator state or warm caches
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as worker:
                    groups += worker.submit(run_builder, *job).result()
        except Exception as error:  # noqa: BLE001 - one broken group must not cost the others' timings
            failed += 1
            note = f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            print(f"{name} {precision}: {note}", file=sys.stderr)
            groups.append(Group(name, [], repeats=0, note=note, precision=precision))
        progress = "" if done == len(jobs) else f"partial: {done} of {len(jobs)} jobs"
        raw = write_reports(args, groups, machine, command, time.perf_counter() - start, progress)
    print(raw.pop("markdown"))
    print(f"wrote {args.out / stem_of(args)}.md, .json, .png in {raw['elapsed_s']:.0f} s")
    if failed:
        raise SystemExit(f"{failed} of {len(jobs)} jobs failed (their errors are notes in the reports)")
    return raw


def stem_of(args: argparse.Namespace) -> str:
    return f"{args.size}-{args.device.type}" + ("" if args.precision == "both" else f"-{args.precision}")


def write_reports(
    args: argparse.Namespace,
    groups: list[Group],
    machine: str,
    command: str,
    elapsed: float,
    progress: str = "",
) -> dict[str, object]:
    """Write ``<stem>.md``, ``.json`` and ``.png`` for the groups so far; returns the JSON's dict
    (with the markdown under "markdown", not saved). ``progress``: "" once every job is done."""
    args.out.mkdir(parents=True, exist_ok=True)
    stem = stem_of(args)
    met = targets(groups)
    md = write_markdown(args.out / f"{stem}.md", groups, machine, command, elapsed, met, progress)
    write_png(args.out / f"{stem}.png", groups, machine)
    raw = {
        "command": command,
        "machine": machine,
        "elapsed_s": elapsed,
        "progress": progress,
        "pid_nice": os.nice(0),
        "platform": platform.platform(),
        "groups": [
            {
                "name": g.name,
                "precision": g.precision,
                "note": g.note,
                "repeats": g.repeats,
                "cases": [
                    {
                        "row": c.row,
                        "impl": c.impl,
                        "times_s": c.times,
                        "tokens": c.tokens,
                        "flops": c.flops,
                        "references": list(c.references),
                        "precision": c.precision,
                    }
                    for c in g.cases
                ],
            }
            for g in groups
        ],
        "targets": met,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(raw, indent=1) + "\n")
    return {**raw, "markdown": md}


if __name__ == "__main__":
    main()
