"""Dev curves of a captioning run with self-critical training: greedy CIDEr-D and BLEU-4 at each
evaluation of the cross-entropy phase, then of the self-critical phase (its steps after the last
cross-entropy step), one line per run (e.g. per seed).

    python scripts/figures/scst_curves.py runs/flickr8k runs/flickr8k-seed1 \\
        --out docs/figures/flickr8k_scst.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def evaluations(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "eval/cider" in r]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="run folders (out_dir), each with metrics.jsonl and scst/")
    parser.add_argument("--out", default="docs/figures/flickr8k_scst.png")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in map(Path, args.runs):
        xe = evaluations(run / "metrics.jsonl")
        scst = (
            evaluations(run / "scst" / "metrics.jsonl") if (run / "scst" / "metrics.jsonl").is_file() else []
        )
        last = xe[-1]["step"] if xe else 0
        steps = [r["step"] for r in xe] + [last + r["step"] for r in scst]
        for ax, metric in zip(axes, ("cider", "bleu4")):
            values = [r[f"eval/{metric}"] for r in xe + scst]
            ax.plot(steps, values, marker="o", label=run.name)
            if scst:
                ax.axvline(last, color="grey", linestyle=":", linewidth=1)
        print(
            run, [(s, round(r["eval/cider"], 2), round(r["eval/bleu4"], 2)) for s, r in zip(steps, xe + scst)]
        )
    for ax, name in zip(axes, ("dev CIDEr-D (greedy)", "dev BLEU-4 (greedy)")):
        ax.set_xlabel("step (cross-entropy, then self-critical after the dotted line)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(args.out)


if __name__ == "__main__":
    main()
