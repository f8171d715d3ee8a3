"""The server load benchmark runs end to end at toy scale: the fixture translator served in a
process of its own, clients at two concurrency levels (and httpx's), every request answered, the
rows against the offline figure, the open loop's rows against the idle latency, the soak's memory
samples, the table naming the machine."""

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
    argv += ["--rates", "0.5,0.8", "--open-requests", "30"]
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
    opened = report["open_loop"]
    assert [r["share"] for r in opened["rows"]] == [0.5, 0.8]
    for r in opened["rows"]:
        assert r["codes"] == {"200": 30}
        assert abs(r["rate_s"] - r["share"] * opened["offline_batch32_sentences_s"]) < 1e-9
        assert abs(r["p50_to_idle"] - r["p50_ms"] / opened["idle_p50_ms"]) < 1e-9
        assert r["p95_ms"] >= r["p50_ms"] > 0
        assert r["answers_as_alone"] == "4/4"  # every answer is the text's translation alone
    assert 0 < opened["offline_batch1_p50_ms"] and 0 < opened["idle_p50_ms"] <= opened["idle_p95_ms"]
    table = (tmp_path / "serve-load-toy.md").read_text()
    assert "| 8 | httpx |" in table and "cores" in table.splitlines()[0]
    assert (
        "| 30 x 200 | 4/4 |" in table
        and "| 50% of offline |" in table
        and "| 80% of offline |" in table
        and "offline batch 1: p50" in table
    )


def test_open_loop_arrivals_are_poisson_at_the_rate_and_latency_counts_from_arrival(monkeypatch) -> None:
    """The arrival gaps are exponential at the asked rate (their mean within 10% over 2,000 draws of
    the seed); requests are sent at their times whatever the earlier ones' state (open loop: 20 at
    200/s, each answered in 50 ms, take ~0.15 s; one after another, over 1 s)."""
    import asyncio
    import random

    from benchmarks import serve_load

    gaps = random.Random(0)
    mean = sum(gaps.expovariate(40.0) for _ in range(2000)) / 2000
    assert abs(mean - 1 / 40.0) < 0.1 / 40.0

    class Answering:  # a connection that answers after 50 ms
        def __init__(self, host: str, port: int):
            pass

        async def post(self, path: str, payload: object) -> tuple[int, bytes]:
            await asyncio.sleep(0.05)
            return 200, json.dumps([{"translation_text": payload["inputs"].upper()}]).encode()

        def close(self) -> None:
            pass

    monkeypatch.setattr(serve_load, "Connection", Answering)
    row = asyncio.run(serve_load.open_loop(0, ["a"] * 20, rate=200.0))
    assert row["codes"] == {"200": 20} and row["p50_ms"] >= 50.0
    assert row["answers"] == {"a": "A"}  # kept for the check against each text's translation alone
    assert row["seconds"] < 0.6  # open loop: ~0.15 s; one after another: over 1 s
