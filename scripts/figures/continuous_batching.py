"""The Serve guide's picture of continuous batching (docs/guides/serve.md): requests that arrive at
a running translator, step by step, decoded by continuous batching (each joins the running search
at its next step and is answered at the step it finishes) and by whole batches (a request waits
for the running batch to end, and is answered when its own batch ends).

The steps each sentence takes are the model's: a :meth:`Translator.session` decodes the requests
as they arrive (the top panel, as it ran); the whole-batch panel replays the same sentences' step
counts batch by batch (a batch starts when the last one ends, with every request that arrived
meanwhile, and lasts as long as its longest sentence).

    python scripts/figures/continuous_batching.py            # docs/figures/serve_continuous.png
    python scripts/figures/continuous_batching.py --checkpoint runs/multi30k/best --out /tmp/figs
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from scratchformer.tasks.translation import load_translator  # noqa: E402

FIXTURE = Path(__file__).parents[2] / "tests" / "fixtures" / "v0.1.0" / "translation"
REQUESTS = [  # (the step it arrives at, its text)
    (0, "Ein Mann fährt Fahrrad auf einer Straße."),
    (0, "Zwei Hunde."),
    (2, "Eine Frau mit einem roten Hut liest ein Buch im Park."),
    (5, "Kinder spielen."),
    (6, "Ein Junge springt in einen See."),
    (11, "Eine Gruppe von Menschen steht vor einem Gebäude."),
    (13, "Ein Hund läuft."),
]


def continuous(checkpoint: Path, beam: int) -> tuple[dict[int, int], dict[int, int]]:
    """Each request's first and last decoding step, decoded by a session as it arrives."""
    translator = load_translator(checkpoint, device="cpu")
    session = translator.session(translator.generation_config(beam))
    first, last, step = {}, {}, 0
    while len(last) < len(REQUESTS):
        arriving = [i for i, (at, _) in enumerate(REQUESTS) if at == step]
        if arriving:
            session.join([REQUESTS[i][1] for i in arriving], arriving)
            first.update((i, step) for i in arriving)
        last.update((tag, step) for tag, _ in session.step())
        step += 1
    return first, last


def whole(steps: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """Each request's batch start and end, batch by batch, from the steps each sentence takes."""
    start, end, clock, waiting = {}, {}, 0, list(range(len(REQUESTS)))
    while waiting:
        clock = max(clock, REQUESTS[waiting[0]][0])
        batch = [i for i in waiting if REQUESTS[i][0] <= clock]
        longest = max(steps[i] for i in batch)
        for i in batch:
            start[i], end[i] = clock, clock + longest - 1
        waiting, clock = [i for i in waiting if i not in batch], clock + longest
    return start, end


def draw(path: Path, checkpoint: Path, beam: int) -> None:
    first, last = continuous(checkpoint, beam)
    steps = {i: last[i] - first[i] + 1 for i in first}
    start, end = whole(steps)
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True)
    panels = [
        (axes[0], first, last, "continuous batching: a request joins the running search at the next step"),
        (axes[1], start, end, "whole batches: it waits for the running batch, then for its own batch's end"),
    ]
    labels = [f"{text[:24]}..." if len(text) > 24 else text for _, text in REQUESTS]
    for ax, begin, answered, title in panels:
        for i, (arrival, _) in enumerate(REQUESTS):
            y, decoded = len(REQUESTS) - 1 - i, begin[i] + steps[i]
            ax.barh(y, begin[i] - arrival, left=arrival, color="#d9d9d9")  # waits
            ax.barh(y, steps[i], left=begin[i], color="#2b8cbe")  # decodes
            ax.barh(y, answered[i] + 1 - decoded, left=decoded, color="#a6bddb")  # done, batch runs on
            ax.plot(arrival, y, "k|", markersize=14)
            ax.plot(answered[i] + 1, y, "k>", markersize=6)
        ax.set_yticks(range(len(REQUESTS)), labels[::-1])
        waits = [answered[i] + 1 - at for i, (at, _) in enumerate(REQUESTS)]
        ax.set_title(
            f"{title}\n(mean steps from arrival to answer: {sum(waits) / len(waits):.1f})", fontsize=10
        )
        ax.set_xlim(0, max(end.values()) + 2)
    axes[1].set_xlabel(
        "decoding step   |: arrives   grey: waits   blue: decodes   light blue: done, its batch runs on"
        "   >: answered",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=FIXTURE, help="a translation checkpoint")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "serve_continuous.png"
    draw(path, args.checkpoint, args.beam)
    print(path)


if __name__ == "__main__":
    main()
