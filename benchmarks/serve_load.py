"""The server under load: ``scratchformer serve`` in a process of its own, asyncio clients
(keep-alive HTTP/1.1, :class:`Connection`) sending one sentence per request at 1, 8 and 64 at a
time, against the same model's offline ``translate`` throughput (``--batch-size 32``, batched as
the command batches a file) measured in the same run with the same threads, and against all the
sentences sorted by length first (:class:`Offline`).

    python -m benchmarks.serve_load --checkpoint runs/multi30k/best --data ../shared/data --name epyc
    python -m benchmarks.serve_load ... --soak 10000      # and the server's memory over 10,000 requests

Per row: sentences/s and its ratio to offline, latency p50/p95 (send to answer), the mean batch the
server formed (its /metrics), the answers by status code (every request answered: 200, or 429 over
the queue limit), the server's resident memory after the row.

Then the open loop (``--rates``, as TGI's and vLLM's benchmarks send at a request rate): requests
sent at Poisson arrival times, at shares of the offline batch-32 rate measured in the same run,
whatever the earlier ones' state; latency from each request's arrival time to its answer, p50/p95
against the idle p50 (one request at a time, through the server), which is itself set against
offline batch 1 (the same sentences translated one at a time in-process). Writes
``benchmarks/results/serve-load-<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import machine_description
from benchmarks.serving import read_lines

RESULTS = Path(__file__).resolve().parent / "results"


class Offline:
    """Offline translation in a process of its own, the model loaded once (and warmed up): :meth:`rate`
    times one pass over the texts, so that each row is paired with offline figures measured just
    before it. ``sorted=False``: as ``scratchformer translate --batch-size 32`` batches a file (its
    lines 32 at a time, in order, each 32 sorted by length: the ratio's reference); ``sorted=True``: all
    the texts sorted by length, then cut into batches of 32 (``Translator.translate``: less padding
    than any server's batches can have, whose requests come in any order)."""

    def __init__(self, checkpoint: str, threads: int, precision: str):
        context = multiprocessing.get_context("spawn")
        self.pool = context.Pool(1, initializer=_load, initargs=(checkpoint, threads, precision))

    def rate(self, texts: list[str], sorted: bool = False) -> float:  # noqa: A002 (the mode's name)
        return self.pool.apply(_translate_all, (texts, sorted))

    def latencies(self, texts: list[str]) -> list[float]:
        """Seconds to translate each text alone (batch 1), in order."""
        return self.pool.apply(_translate_each, (texts,))

    def alone(self, texts: list[str]) -> list[str]:
        """Each text's translation alone (batch 1: what ``scratchformer translate TEXT`` prints)."""
        return self.pool.apply(_translations, (texts,))

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


_TRANSLATOR: Any = None  # (in the offline process)


def _load(checkpoint: str, threads: int, precision: str) -> None:
    global _TRANSLATOR
    import torch

    from scratchformer.tasks.translation import load_translator

    torch.set_num_threads(threads)
    _TRANSLATOR = load_translator(checkpoint, device="cpu").with_precision(precision)
    _TRANSLATOR.translate(["Ein Mann fährt Fahrrad."] * 32, batch_size=32)


def _translate_all(texts: list[str], sorted: bool) -> float:  # noqa: A002
    from scratchformer.tasks.translation import read_lines as chunks

    start = time.perf_counter()
    for chunk in [texts] if sorted else chunks(texts, 32):  # (the command's buffer: --batch-size lines)
        _TRANSLATOR.translate(chunk, batch_size=32)
    return len(texts) / (time.perf_counter() - start)


def _translations(texts: list[str]) -> list[str]:
    return [_TRANSLATOR.translate([text], batch_size=1)[0] for text in texts]


def _translate_each(texts: list[str]) -> list[float]:
    seconds = []
    for text in texts:
        start = time.perf_counter()
        _TRANSLATOR.translate([text], batch_size=1)
        seconds.append(time.perf_counter() - start)
    return seconds


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (for :func:`spawn`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: Sequence[str], port: int, seconds: float = 300, **popen: Any) -> subprocess.Popen:
    """``scratchformer serve ARGS --port PORT`` as a process of its own (``popen``: its
    ``subprocess.Popen`` options), returned once its /ready answers 200 (for this benchmark and
    scripts/figures/serve_page.py). A process that exits first, or is not ready in ``seconds``, is a
    RuntimeError."""
    options = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True, **popen}
    command = [sys.executable, "-m", "scratchformer", "serve", *args, "--port", str(port)]
    server = subprocess.Popen(command, **options)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pipe = server.stderr or server.stdout
            said = pipe.read() if pipe else ""
            raise RuntimeError(f"the server exited ({server.returncode}): {said[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"the server was not ready within {seconds:.0f} s")


def start_server(
    checkpoint: str,
    port: int,
    threads: int,
    precision: str,
    limits: Sequence[str],
    batching: str = "continuous",
) -> subprocess.Popen:
    """``scratchformer serve`` on 127.0.0.1:port, returned once /ready answers 200."""
    args = ["--checkpoint", f"model={checkpoint}", "--threads", str(threads), "--precision", precision]
    return spawn(args + ["--batching", batching] + [f"--limit={limit}" for limit in limits], port)


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the answer (Content-Length).
    The load's clients run on the server's machine: httpx spends about 9 ms of CPU per request here,
    a third of a core at these rates, and each time a client takes a core from the server's two
    compute threads, the other one waits for it. This client spends a fraction of that; its CPU
    time is reported with each row."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None

    async def post(self, path: str, payload: Any) -> tuple[int, bytes]:
        if self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        body = json.dumps(payload).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
        self.writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":")[1]) for line in lines[1:] if line.lower().startswith("content-length:")
        )
        return int(lines[0].split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        if self.reader is not None:
            self.writer.close()


async def load(port: int, texts: Sequence[str], clients: int, kind: str = "raw") -> dict[str, Any]:
    """``clients`` concurrent clients, each sending one sentence per request until all are sent;
    ``kind``: "raw" (:class:`Connection`) or "httpx" (one ``httpx.AsyncClient``, its pool)."""
    latencies: list[float] = []
    codes: Counter = Counter()
    queue = list(reversed(texts))
    if kind == "httpx":
        import httpx

        pool = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients))
        url = f"http://127.0.0.1:{port}/v1/translate"

    async def client() -> None:
        if kind == "httpx":
            while queue:
                text = queue.pop()
                start = time.perf_counter()
                codes[(await pool.post(url, json={"inputs": text})).status_code] += 1
                latencies.append(time.perf_counter() - start)
            return
        connection = Connection("127.0.0.1", port)
        try:
            while queue:
                text = queue.pop()
                start = time.perf_counter()
                code, _ = await connection.post("/v1/translate", {"inputs": text})
                latencies.append(time.perf_counter() - start)
                codes[code] += 1
        finally:
            connection.close()

    cpu, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = time.perf_counter() - start
    if kind == "httpx":
        await pool.aclose()
    latencies.sort()
    return {
        "sentences_s": len(texts) / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "codes": {str(c): n for c, n in sorted(codes.items())},
        "client_cpu_s": time.process_time() - cpu,
        "seconds": seconds,
    }


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    """p50 and p95 of ``seconds``, in ms."""
    ordered = sorted(seconds)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p95_ms": 1000 * ordered[int(0.95 * (len(ordered) - 1))],
    }


async def open_loop(port: int, texts: Sequence[str], rate: float, seed: int = 0) -> dict[str, Any]:
    """One request per text at Poisson arrival times, ``rate`` a second on average (exponential gaps
    drawn from ``seed``), each sent at its time on an idle keep-alive connection (a new one when all
    are busy), whatever the earlier requests' state. A request's latency runs from its arrival time,
    not from when it could be sent, so that a late client does not hide a slow server."""
    gaps = random.Random(seed)
    idle: list[Connection] = []
    latencies: list[float] = []
    codes: Counter = Counter()

    answers: dict[str, str] = {}

    async def request(text: str, arrival: float) -> None:
        connection = idle.pop() if idle else Connection("127.0.0.1", port)
        code, body = await connection.post("/v1/translate", {"inputs": text})
        latencies.append(time.perf_counter() - arrival)
        codes[code] += 1
        if code == 200:
            answers[text] = json.loads(body)[0]["translation_text"]
        idle.append(connection)

    cpu, start = time.process_time(), time.perf_counter()
    arrival, sent = start, []
    for text in texts:
        arrival += gaps.expovariate(rate)
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        sent.append(asyncio.create_task(request(text, arrival)))
    await asyncio.gather(*sent)
    seconds = time.perf_counter() - start
    for connection in idle:
        connection.close()
    return {
        "rate_s": rate,
        "sentences_s": len(texts) / seconds,
        **percentiles(latencies),
        "codes": {str(c): n for c, n in sorted(codes.items())},
        "client_cpu_s": time.process_time() - cpu,
        "seconds": seconds,
        "answers": answers,
    }


def open_loop_rows(
    url: str, texts: Sequence[str], offline: Offline, shares: Sequence[float], requests: int
) -> dict[str, Any]:
    """The idle latency (one request at a time through the server, against offline batch 1), then
    ``requests`` requests at each share of the offline batch-32 rate: p50/p95 against the idle p50."""
    idle = asyncio.run(load(port_of(url), texts, 1))
    alone = percentiles(offline.latencies(list(texts)))
    reference = offline.rate(list(texts))
    stream = [texts[i % len(texts)] for i in range(requests)]
    expected = dict(zip(texts, offline.alone(list(texts))))
    rows = []
    for share in shares:
        before = batch_totals(url)
        row = asyncio.run(open_loop(port_of(url), stream, share * reference))
        after = batch_totals(url)
        batches = after[1] - before[1]
        row.update(
            share=share,
            p50_to_idle=row["p50_ms"] / idle["p50_ms"],
            p95_to_idle=row["p95_ms"] / idle["p50_ms"],
            mean_batch=(after[0] - before[0]) / batches if batches else 0.0,
        )
        answers = row.pop("answers")  # each equal to its text's translation alone (the CLI's)?
        row["answers_as_alone"] = f"{sum(expected[t] == a for t, a in answers.items())}/{len(answers)}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {
        "idle_p50_ms": idle["p50_ms"],
        "idle_p95_ms": idle["p95_ms"],
        "offline_batch1_p50_ms": alone["p50_ms"],
        "offline_batch32_sentences_s": reference,
        "rows": rows,
    }


def batch_totals(url: str) -> tuple[float, float]:
    """(sum, count) of the server's batch-size histogram."""
    import httpx

    text = httpx.get(url + "/metrics").text
    found = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^scratchformer_batch_size_(sum|count)\{model="model"\} (\S+)$', text, re.M)
    }
    return found.get("sum", 0.0), found.get("count", 0.0)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_row(
    url: str, pid: int, texts: Sequence[str], clients: int, offline: Offline, kind: str, rounds: int
) -> dict[str, Any]:
    """``rounds`` times: offline, then the clients; the round of median ratio, with every ratio."""
    measured = []
    for _ in range(rounds):
        reference, every = offline.rate(list(texts)), offline.rate(list(texts), sorted=True)
        before = batch_totals(url)
        row = asyncio.run(load(port_of(url), texts, clients, kind))
        after = batch_totals(url)
        batches = after[1] - before[1]
        row.update(
            offline_sentences_s=reference,
            ratio_to_offline=row["sentences_s"] / reference,
            offline_sorted_sentences_s=every,
            ratio_to_sorted=row["sentences_s"] / every,
            mean_batch=(after[0] - before[0]) / batches if batches else 0.0,
        )
        measured.append(row)
    median = sorted(measured, key=lambda r: r["ratio_to_offline"])[len(measured) // 2]
    ratios = [round(r["ratio_to_offline"], 3) for r in measured]
    return {**median, "clients": clients, "client": kind, "ratios": ratios, "server_rss_mb": resident_mb(pid)}


def soak(url: str, pid: int, texts: Sequence[str], total: int, clients: int) -> list[dict[str, Any]]:
    """``total`` requests in rounds of 1,000 at ``clients`` at a time: the server's memory after each."""
    samples = []
    for done in range(0, total, 1000):
        round_texts = [texts[(done + i) % len(texts)] for i in range(min(1000, total - done))]
        row = asyncio.run(load(port_of(url), round_texts, clients))
        samples.append(
            {"requests": done + len(round_texts), "server_rss_mb": resident_mb(pid), "codes": row["codes"]}
        )
        print(f"soak: {samples[-1]}", flush=True)
    return samples


def write_markdown(
    path: Path, rows: list[dict], settings: dict[str, Any], soaked: list[dict], opened: dict | None = None
) -> None:
    lines = [
        f"# The server under load ({settings['machine']})",
        "",
        f"`{settings['command']}`",
        "",
        f"Model `{settings['checkpoint']}` ({settings['precision']}), {settings['threads']} threads, "
        f"{settings['sentences']} test_2016 sentences, one per request. Each row: {settings['rounds']} "
        "rounds, each offline translation (the model loaded in a process of its own) then the clients; "
        "the round of median ratio is shown, and every round's ratio. Offline: as `scratchformer "
        "translate --batch-size 32` batches the file (32 lines at a time, in order, each 32 sorted by "
        "length); sorted: all the sentences sorted by length first (less padding than requests in "
        "any order allow).",
        "",
        "| clients | client | sentences/s | offline | / offline | rounds | / sorted | p50 ms | p95 ms "
        "| mean batch | answers | client CPU | server RSS MB |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        codes = ", ".join(f"{n} x {c}" for c, n in r["codes"].items())
        lines.append(
            f"| {r['clients']} | {r['client']} | {r['sentences_s']:.1f} | {r['offline_sentences_s']:.1f} | "
            f"{r['ratio_to_offline']:.2f}x | {', '.join(f'{x:.2f}' for x in r['ratios'])} | "
            f"{r['ratio_to_sorted']:.2f}x | "
            f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['mean_batch']:.1f} | {codes} | "
            f"{r['client_cpu_s'] / r['seconds']:.0%} | {r['server_rss_mb']:.0f} |"
        )
    if opened:
        lines += open_loop_lines(opened)
    if soaked:
        lines += ["", "Soak (server resident memory, MB, after each 1,000 requests):", ""]
        lines.append(", ".join(f"{s['server_rss_mb']:.0f}" for s in soaked))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def open_loop_lines(opened: dict[str, Any]) -> list[str]:
    """The open-loop table: the idle path, then a row per load."""
    idle, alone = opened["idle_p50_ms"], opened["offline_batch1_p50_ms"]
    lines = [
        "",
        f"Open loop: Poisson arrivals at shares of the offline batch-32 rate "
        f"({opened['offline_batch32_sentences_s']:.1f} sentences/s), latency from arrival to answer. "
        f"Idle (one request at a time through the server): p50 {idle:.1f} ms, p95 "
        f"{opened['idle_p95_ms']:.1f} ms; offline batch 1: p50 {alone:.1f} ms "
        f"(the server adds {idle - alone:.1f} ms).",
        "",
        "| load | requests/s | answered/s | p50 ms | p95 ms | p50 / idle p50 | p95 / idle p50 | mean batch "
        "| answers | as alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in opened["rows"]:
        codes = ", ".join(f"{n} x {c}" for c, n in r["codes"].items())
        lines.append(
            f"| {r['share']:.0%} of offline | {r['rate_s']:.1f} | {r['sentences_s']:.1f} | "
            f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p50_to_idle']:.2f}x | {r['p95_to_idle']:.2f}x | "
            f"{r['mean_batch']:.1f} | {codes} | {r['answers_as_alone']} |"
        )
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.serve_load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--checkpoint", required=True, help="a translation checkpoint")
    parser.add_argument("--data", default=os.environ.get("SCRATCHFORMER_DATA", "../shared/data"))
    parser.add_argument(
        "--source", help="a file of source lines (default: DATA/multi30k/test_2016_flickr.de.gz)"
    )
    parser.add_argument("--sentences", type=int, default=320)
    parser.add_argument("--clients", default="1,8,64", help="comma-separated concurrency levels")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--limit", action="append", default=[], help="a server limit NAME=VALUE (repeat)")
    parser.add_argument("--batching", choices=("continuous", "whole"), default="continuous")
    parser.add_argument(
        "--rounds", type=int, default=3, help="each row this many times, paired with offline: the median"
    )
    parser.add_argument(
        "--rates", default="0.5,0.8", help="open loop: comma-separated shares of the offline batch-32 rate"
    )
    parser.add_argument(
        "--open-requests", type=int, default=0, help="requests per open-loop row (default: --sentences)"
    )
    parser.add_argument("--soak", type=int, default=0, help="then this many more requests, memory sampled")
    parser.add_argument(
        "--httpx", action="store_true", help="also measure the largest --clients with httpx's client (a row)"
    )
    parser.add_argument("--name", default="cpu", help="results file: serve-load-NAME.md/.json")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    source = Path(args.source or Path(args.data) / "multi30k" / "test_2016_flickr.de.gz")
    texts = [t for t in read_lines(source, args.sentences) if t.strip()]
    offline = Offline(args.checkpoint, args.threads, args.precision)
    port = free_port()
    server = start_server(args.checkpoint, port, args.threads, args.precision, args.limit, args.batching)
    url, rows, soaked, opened = f"http://127.0.0.1:{port}", [], [], None
    try:
        asyncio.run(load(port, texts[:8], 4))  # warm-up
        levels = [int(c) for c in args.clients.split(",")]
        for clients, kind in [(c, "raw") for c in levels] + ([(max(levels), "httpx")] if args.httpx else []):
            rows.append(run_row(url, server.pid, texts, clients, offline, kind, args.rounds))
            print(json.dumps(rows[-1]), flush=True)
        shares = [float(x) for x in args.rates.split(",") if x.strip()]
        if shares:
            opened = open_loop_rows(url, texts, offline, shares, args.open_requests or len(texts))
        if args.soak:
            soaked = soak(url, server.pid, texts, args.soak, 64)
    finally:
        server.terminate()
        server.wait(60)
        offline.close()
    settings = {
        "machine": machine_description(torch.device("cpu")),
        "command": "python -m benchmarks.serve_load " + " ".join(sys.argv[1:] if argv is None else argv),
        "checkpoint": args.checkpoint,
        "precision": args.precision,
        "batching": args.batching,
        "threads": args.threads,
        "sentences": len(texts),
        "rounds": args.rounds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"serve-load-{args.name}"
    stem.with_suffix(".json").write_text(
        json.dumps({"settings": settings, "rows": rows, "open_loop": opened, "soak": soaked}, indent=2)
    )
    write_markdown(stem.with_suffix(".md"), rows, settings, soaked, opened)
    print(f"wrote {stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
