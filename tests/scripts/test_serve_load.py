"""The server load benchmark runs end to end at toy scale: the fixture translator served in a
process of its own, clients at two concurrency levels (and httpx's), every request answered, the
rows against the offline figure, the soak's memory samples, the table naming the machine."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from benchmarks.serve_load import main

TRANSLATION = Path(__file__).parents[1] / "fixtures" / "v0.1.0" / "translation"


def test_serve_load_at_toy_scale(tmp_path: Path) -> None:
    source = tmp_path / "source.de.gz"
    with gzip.open(source, "wt", encoding="utf-8") as f:
        f.write(
            "\n".join(["ein Mann", "zwei Hunde laufen", "eine Frau im Schnee", "Kinder spielen"] * 6) + "\n"
        )
    argv = ["--checkpoint", str(TRANSLATION), "--source", str(source), "--clients", "1,8", "--threads", "1"]
    argv += ["--httpx", "--rounds", "2", "--soak", "300", "--name", "toy", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "serve-load-toy.json").read_text())
    rows = report["rows"]
    assert [(r["clients"], r["client"]) for r in rows] == [(1, "raw"), (8, "raw"), (8, "httpx")]
    assert all(r["codes"] == {"200": 24} and r["sentences_s"] > 0 for r in rows)
    assert rows[0]["mean_batch"] == 1.0 and rows[1]["mean_batch"] > 1.0  # 8 clients: batches form
    assert abs(rows[1]["ratio_to_offline"] - rows[1]["sentences_s"] / rows[1]["offline_sentences_s"]) < 1e-9
    assert len(rows[1]["ratios"]) == 2 and round(rows[1]["ratio_to_offline"], 3) in rows[1]["ratios"]
    assert (
        abs(rows[1]["ratio_to_sorted"] - rows[1]["sentences_s"] / rows[1]["offline_sorted_sentences_s"])
        < 1e-9
    )
    assert [(s["requests"], s["codes"]) for s in report["soak"]] == [(300, {"200": 300})]
    table = (tmp_path / "serve-load-toy.md").read_text()
    assert "| 8 | httpx |" in table and "cores" in table.splitlines()[0]
