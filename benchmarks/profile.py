"""Where the time goes: ``torch.profiler`` tables of our encoder next to a reference, per row.

    python -m benchmarks.profile [--size full] [--row latency|inference|long|padding|training]
                                 [--reference torch|bert] [--precision fp32|bf16] [--rounds 3]

Writes ``benchmarks/results/profile-<row>-<reference>-<precision>.txt``: the operators sorted by
self CPU time, ours first, then the reference, for the same input in the same process (inference
models cast to the precision, training under its autocast, as ``benchmarks.run`` does). Use it
to explain a gap that ``benchmarks.run`` reports.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.suite import FUSED_ADAMW, SIZES, Models, autocast, dtype_of, fast_path, padded_lengths, real_mask

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
    parser.add_argument("--row", choices=["latency", "inference", "long", "padding", "training"], default="latency")
    parser.add_argument("--reference", choices=["torch", "bert"], default="torch",
                        help="torch.nn (ours: Encoder) or transformers BertModel (ours: ContextualEncoder)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    size, cpu = SIZES[args.size], torch.device("cpu")
    models = Models(size, cpu)
    B, T = {"latency": size.shapes[-1], "long": size.shapes[1], "training": size.train}.get(args.row, size.shapes[0])
    lengths = padded_lengths(B, T, 0.25) if args.row == "padding" else [T] * B
    mask = real_mask(lengths, T, cpu)
    training = args.row == "training"
    dtype = torch.float32 if training else dtype_of(args.precision)
    x = torch.randn(B, T, size.d_model, dtype=dtype)
    tokens = torch.randint(1, size.vocab, (B, T)).masked_fill(~mask, 0)
    kpm = mask if args.row == "padding" else None
    bert = args.reference == "bert"
    ours_model = (models.ours_bert_skip if kpm is not None else models.ours_bert) if bert else (
        models.ours_skip if kpm is not None else models.ours)
    ref_model = models.bert if bert else models.torch
    for m in (ours_model, ref_model):
        m.train(training).to(dtype)

    def ours() -> object:
        return ours_model(tokens, mask) if bert else ours_model(x, kpm)

    def reference() -> object:
        if bert:
            return ref_model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        with fast_path(True):
            return ref_model(x, src_key_padding_mask=None if kpm is None else ~kpm)

    def run(model: torch.nn.Module, forward: Callable[[], object]) -> Callable[[], object]:
        if not training:
            def infer() -> object:
                with torch.inference_mode():
                    return forward()
            return infer
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cpu.type in FUSED_ADAMW)

        def step() -> object:
            opt.zero_grad(set_to_none=True)
            with autocast(cpu, args.precision == "bf16"):
                out = forward()
            assert isinstance(out, torch.Tensor)
            out.float().square().mean().backward()
            opt.step()
            return None
        return step

    ours_name = "scratchformer ContextualEncoder" if bert else "scratchformer Encoder"
    ref_name = "transformers BertModel" if bert else "torch.nn fast path"
    runs = {ours_name: run(ours_model, ours), ref_name: run(ref_model, reference)}
    text = [f"profile of row '{args.row}' ({args.precision}): B{B}xT{T}, {sum(lengths)} real tokens, "
            f"{args.rounds} rounds\n"]
    for name, fn in runs.items():
        text.append(f"== {name}\n{_table(fn, args.rounds, 18)}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile-{args.row}-{args.reference}-{args.precision}.txt"
    path.write_text("\n".join(text))
    print("\n".join(text))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
