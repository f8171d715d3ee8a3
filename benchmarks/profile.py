"""Where the time goes: ``torch.profiler`` tables of our encoder next to a reference, per row.

    python -m benchmarks.profile [--size full] [--row latency|inference|padding|training] [--rounds 3]

Writes ``benchmarks/results/profile-<row>.txt``: the operators sorted by self CPU time, ours
first, then the reference, for the same input in the same process. Use it to explain a gap
that ``benchmarks.run`` reports.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.suite import SIZES, Models, fast_path, padded_lengths, real_mask

RESULTS = Path(__file__).resolve().parent / "results"


def _table(fn: Callable[[], object], rounds: int, rows: int) -> str:
    fn()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            fn()
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--row", choices=["latency", "inference", "padding", "training"], default="latency")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    models = Models(size, torch.device("cpu"))
    B, T = {"latency": size.shapes[-1], "training": size.train}.get(args.row, size.shapes[0])
    lengths = padded_lengths(B, T, 0.25) if args.row == "padding" else [T] * B
    mask = real_mask(lengths, T, torch.device("cpu"))
    x = torch.randn(B, T, size.d_model)
    runs: dict[str, Callable[[], object]]
    if args.row == "training":
        opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-5) for name, m in
                (("ours", models.ours), ("torch", models.torch))}

        def step(name: str, model: torch.nn.Module) -> Callable[[], object]:
            def run() -> object:
                opts[name].zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opts[name].step()
                return None

            return run

        models.ours.train()
        models.torch.train()
        runs = {"scratchformer Encoder": step("ours", models.ours), "torch.nn (training)": step("torch", models.torch)}
    else:
        models.ours.eval()
        models.ours_skip.eval()
        models.torch.eval()
        kpm = mask if args.row == "padding" else None

        def ours() -> object:
            with torch.inference_mode():
                return (models.ours if kpm is None else models.ours_skip)(x, kpm)

        def reference() -> object:
            with torch.inference_mode(), fast_path(True):
                return models.torch(x, src_key_padding_mask=None if kpm is None else ~kpm)

        runs = {"scratchformer Encoder": ours, "torch.nn fast path": reference}
    text = [f"profile of row '{args.row}': B{B}xT{T}, {sum(lengths)} real tokens, {args.rounds} rounds\n"]
    for name, fn in runs.items():
        text.append(f"== {name}\n{_table(fn, args.rounds, 18)}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile-{args.row}.txt"
    path.write_text("\n".join(text))
    print("\n".join(text))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
