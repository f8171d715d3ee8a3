"""Serving a trained translator: ours (fp32, bf16, int8) against Hugging Face ``generate`` and
CTranslate2 (fp32, int8) on the same sentences, and ONNX Runtime against ours for a classifier.

    python -m benchmarks.serving --checkpoint runs/multi30k/averaged [--data ../shared/data] [--threads 2]
    python -m benchmarks.serving --checkpoint runs/multi30k/averaged --profile   # where our time goes

Every system translates the same source lines end to end (text in, text out: tokenising,
decoding, detokenising), with the checkpoint's decoding (beam, length penalty, at most a * S + b new
tokens), each in a fresh process with the same thread count: batch 32 (sources sorted by length, as
``scratchformer translate`` batches them) and batch 1 (latency p50/p95). Writes
``benchmarks/results/serving-<machine>.md`` and ``.json``; ratios are against ours in fp32 measured
in the same run. "lines = ours fp32" counts the lines identical to ours in fp32 up to ties: equal
texts, or texts our fp32 model scores within 1e-4 of each other (length-normalised log-probability,
the beam's ranking score: tasks/translation/ties.py); how many of them are ties is a column of its own.
"batch 1 = batch 32" counts the batch-1 lines translated exactly as in their batch of 32.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"
Translate = Callable[[Sequence[str]], list[str]]


@dataclass
class Row:
    """One system's figures: sentences/s and output tokens/s at batch 32, latency at batch 1, BLEU."""

    system: str
    batch32_sentences_s: float = 0.0
    batch32_tokens_s: float = 0.0
    batch1_sentences_s: float = 0.0
    batch1_p50_ms: float = 0.0
    batch1_p95_ms: float = 0.0
    bleu: float = 0.0
    identical_to_ours: float = 0.0  # the share of lines equal to ours in fp32 (batch 32), up to ties
    tied_with_ours: int = 0  # of them, lines that differ but score within 1e-4 by our fp32 model
    batch1_same: float = 0.0  # the share of the batch-1 lines translated exactly as in their batch of 32
    notes: list[str] = field(default_factory=list)


def read_lines(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open() as f:
        return [line.rstrip("\n") for line in f][:limit]


def batches(texts: Sequence[str], size: int, length: Callable[[str], int]) -> list[list[int]]:
    """Indices of ``texts`` sorted by length, in chunks of ``size``."""
    order = sorted(range(len(texts)), key=lambda i: length(texts[i]))
    return [order[i : i + size] for i in range(0, len(order), size)]


def run_batched(
    translate: Translate, texts: Sequence[str], chunks: list[list[int]]
) -> tuple[list[str], float]:
    """Translate every chunk; (outputs in input order, seconds)."""
    out = [""] * len(texts)
    start = time.perf_counter()
    for chunk in chunks:
        for i, text in zip(chunk, translate([texts[i] for i in chunk])):
            out[i] = text
    return out, time.perf_counter() - start


def measure(name: str, translate: Translate, texts: Sequence[str], args: argparse.Namespace, tools) -> Row:
    """Batch 32 over all ``texts``, then batch 1 over the first ``args.batch1`` (one warm-up batch each)."""
    from scratchformer.tasks.translation import bleu_and_chrf

    chunks = batches(texts, 32, tools.source_length)
    translate([texts[i] for i in chunks[len(chunks) // 2]])  # warm-up
    outputs, seconds = run_batched(translate, texts, chunks)
    tokens = sum(tools.target_length(o) for o in outputs)
    latencies, alone = [], []
    for text in texts[: args.batch1]:
        start = time.perf_counter()
        alone += translate([text])
        latencies.append(time.perf_counter() - start)
    p95 = statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 1 else latencies[0]
    row = Row(
        name,
        batch32_sentences_s=len(texts) / seconds,
        batch32_tokens_s=tokens / seconds,
        batch1_sentences_s=len(latencies) / sum(latencies),
        batch1_p50_ms=1e3 * statistics.median(latencies),
        batch1_p95_ms=1e3 * p95,
        bleu=bleu_and_chrf(outputs, tools.references)["bleu"],
        batch1_same=sum(a == b for a, b in zip(alone, outputs)) / len(alone),
    )
    row.notes.append(f"outputs: {json.dumps(outputs[:2], ensure_ascii=False)}")
    tools.outputs[name] = outputs
    print(
        f"{name}: {row.batch32_sentences_s:.1f} sent/s at batch 32, p50 {row.batch1_p50_ms:.1f} ms",
        flush=True,
    )
    return row


class Tools:
    """What every system shares: the translator, its tokenizer and limits, the references."""

    def __init__(self, translator, references: list[str]):
        self.translator, self.references = translator, references
        self.outputs: dict[str, list[str]] = {}
        d = translator.decoding
        self.beam = int(d.get("beam_size", 5))
        self.length_penalty = float(d.get("length_penalty", 1.0))
        self.a, self.b = float(d.get("max_len_a", 1.2)), int(d.get("max_len_b", 10))

    def source_length(self, text: str) -> int:
        return self.translator.source_lengths([text])[0]

    def target_length(self, text: str) -> int:
        return len(self.translator.tokenizer.encode(text, add_special_tokens=False).ids)

    def new_tokens(self, widest_source: int) -> int:
        """Ours: a * S + b new tokens for a batch whose widest source has S tokens (EOS included)."""
        return max(1, min(int(self.a * widest_source + self.b), self.translator.model.config.max_len - 1))


def ours(translator, tools: Tools) -> Translate:
    return lambda texts: translator.translate(list(texts), batch_size=len(texts))


def ours_reference_beam(translator, tools: Tools) -> Translate:
    """Ours with the readable ``beam_search`` (generation/beam.py) where ``generate`` runs
    ``fast_beam_search``: what the fast search gains, on the same lines."""
    from scratchformer.generation.fast_beam import readable_beam_search

    def translate(texts: Sequence[str]) -> list[str]:
        with readable_beam_search():
            return translator.translate(list(texts), batch_size=len(texts))

    return translate


def hugging_face(folder: Path, tools: Tools) -> Translate:
    """transformers' ``generate`` on our Hugging Face export, with the export's generation config
    and our length rule per batch (``max_new_tokens``)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    @torch.no_grad()
    def translate(texts: Sequence[str]) -> list[str]:
        batch = tokenizer(list(texts), return_tensors="pt", padding=True)
        new = tools.new_tokens(batch["input_ids"].shape[1])
        out = model.generate(  # max_length counts the decoder's start token: 1 + our new tokens
            **batch, max_length=1 + new, num_beams=tools.beam, length_penalty=tools.length_penalty
        )
        return tokenizer.batch_decode(out, skip_special_tokens=True)

    return translate


def ctranslate2_engine(folder: Path, tools: Tools, compute_type: str, threads: int) -> Translate:
    """CTranslate2 on our ``--format ctranslate2`` export: tokens in, tokens out, as its docs show,
    with the options that decode as ours (``ctranslate2_options``: patience 1.5, the length limit)."""
    import ctranslate2
    from transformers import AutoTokenizer

    from scratchformer.formats.ctranslate2_export import ctranslate2_options

    engine = ctranslate2.Translator(
        str(folder), device="cpu", compute_type=compute_type, intra_threads=threads
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def translate(texts: Sequence[str]) -> list[str]:
        sources = [tokenizer.convert_ids_to_tokens(tokenizer.encode(t)) for t in texts]
        options = ctranslate2_options(
            tools.translator.decoding, max(len(s) for s in sources), tools.translator.model.config.max_len
        )
        results = engine.translate_batch(sources, max_batch_size=len(texts), **options)
        return [
            tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True)
            for r in results
        ]

    return translate


SYSTEMS = (
    "scratchformer fp32",
    "scratchformer fp32, reference beam",
    "scratchformer bf16",
    "scratchformer int8",
    "transformers generate fp32",
    "CTranslate2 fp32",
    "CTranslate2 int8",
)


def systems(not_run: dict[str, str]) -> list[str]:
    """The SYSTEMS this CPU runs: ours in bf16 only where it computes bf16 natively (elsewhere it is
    emulated, ~20x slower than fp32: ``not_run`` gets the reason instead of hours of measuring)."""
    from scratchformer.training.precision import native_bf16, no_native_bf16

    cpu = torch.device("cpu")
    if not native_bf16(cpu):
        not_run["scratchformer bf16"] = f"{no_native_bf16(cpu)}: bf16 is emulated, ~20x slower than fp32"
    return [name for name in SYSTEMS if name not in not_run]


def build_system(name: str, translator, tools: Tools, folder: Path, threads: int) -> Translate:
    """One system of the table; ``folder`` holds the exports (``hf/``, ``ct2/``)."""
    if name == "scratchformer fp32, reference beam":
        return ours_reference_beam(translator.with_precision("fp32"), tools)
    if name.startswith("scratchformer"):
        return ours(translator.with_precision(name.split()[-1]), tools)
    if name.startswith("transformers"):
        return hugging_face(folder / "hf", tools)
    return ctranslate2_engine(
        folder / "ct2", tools, {"fp32": "float32"}.get(name.split()[-1], "int8"), threads
    )


def measure_in_process(name: str, args: argparse.Namespace, folder: Path) -> tuple[Row, list[str]]:
    """Measure one system in this (fresh) process: its own thread pools, nobody else's."""
    from scratchformer.tasks.translation import load_translator

    torch.set_num_threads(args.threads)
    translator = load_translator(args.checkpoint, device="cpu")
    data = Path(args.data) / "multi30k"
    texts = read_lines(data / "test_2016_flickr.de.gz", args.sentences)
    tools = Tools(translator, read_lines(data / "test_2016_flickr.en.gz", args.sentences))
    row = measure(name, build_system(name, translator, tools, folder, args.threads), texts, args, tools)
    return row, tools.outputs[name]


def translation_rows(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    """Every translation system of the table on the same lines, each in a fresh process (spawned:
    one engine's idle, spinning threads never slow another's), one after the other."""
    from scratchformer.tasks.translation import load_translator

    translator = load_translator(args.checkpoint, device="cpu")
    tools = Tools(translator, [])
    texts = read_lines(Path(args.data) / "multi30k" / "test_2016_flickr.de.gz", args.sentences)
    rows, outputs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        translator.save_pretrained(Path(tmp) / "hf", "hf")
        translator.save_pretrained(Path(tmp) / "ct2", "ctranslate2")
        spawn = multiprocessing.get_context("spawn")
        for name in systems(not_run := {}):
            if args.systems and name not in args.systems and name != "scratchformer fp32":
                continue
            if args.in_process:  # (the tests: the same code, no process started per system)
                row, outputs[name] = measure_in_process(name, args, Path(tmp))
            else:
                with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                    row, outputs[name] = pool.submit(measure_in_process, name, args, Path(tmp)).result()
            rows.append(row)
    reference = outputs["scratchformer fp32"]
    for row in rows:
        same_as_ours(row, translator, texts, reference, outputs[row.system])
    settings = {"sentences": len(reference), "beam": tools.beam, "length_penalty": tools.length_penalty}
    settings["ties_within"] = 1e-4  # lines = ours: identical, or scored within this by our fp32 model
    settings |= {"not_run": not_run} if not_run else {}
    settings |= {"environment": environment} if (environment := engine_environment()) else {}
    return rows, settings | {"max_new_tokens": f"{tools.a} * S + {tools.b}", "batch1_sentences": args.batch1}


def engine_environment() -> dict[str, str]:
    """The variables set that change an engine's kernels (``CT2_USE_MKL``: CTranslate2's SGEMM by
    MKL, its default on Intel CPUs, or by oneDNN, its default elsewhere)."""
    return {name: os.environ[name] for name in ("CT2_USE_MKL", "CT2_FORCE_CPU_ISA") if name in os.environ}


def same_as_ours(row: Row, translator, texts: list[str], ours: list[str], theirs: list[str]) -> None:
    """The row's share of lines identical to ours up to ties, and its tied lines (with their scores
    in the row's notes)."""
    from scratchformer.tasks.translation.ties import same_translations_up_to_ties

    report = same_translations_up_to_ties(translator, texts, ours, theirs)
    row.identical_to_ours, row.tied_with_ours = report.share, len(report.tied)
    for d in report.tied[:3]:
        row.notes.append(f"tied, line {d.line}: ours {d.ours_score:.6f}, it {d.theirs_score:.6f}")


def classifier_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """ONNX Runtime against ours for the encoder classifier of recipes/imdb.json (its size, random
    weights): batch 32 x 256 tokens and batch 1 x 64, same threads."""
    from scratchformer.fast import optimize
    from scratchformer.formats.onnx_export import export_classifier_onnx, onnx_session
    from scratchformer.models.classifier import ClassifierConfig, TextClassifier
    from scratchformer.models.contextual import EncoderConfig

    recipe = json.loads((Path(__file__).resolve().parents[1] / "recipes" / "imdb.json").read_text())
    encoder = {
        "max_len": recipe["max_length"],
        **recipe["model"],
        "vocab_size": recipe["vocab_size"],
        "pad_id": 0,
    }
    config = ClassifierConfig(EncoderConfig(**encoder), 2, recipe["pooling"])
    model = optimize(TextClassifier(config).eval(), skip_padding=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = toy_tokenizer(config.encoder.vocab_size)
        path = export_classifier_onnx(model, tokenizer, Path(tmp) / "onnx", ["negative", "positive"])
        shapes = [(32, 256), (1, 64)]
        inputs = [torch.randint(5, config.encoder.vocab_size, shape) for shape in shapes]
        with torch.no_grad():  # ours first: ONNX Runtime's idle threads spin and would slow it down
            ours_s = [
                best_of(lambda ids=ids: model(ids, torch.ones_like(ids).bool()), args.repeats)
                for ids in inputs
            ]
        session = onnx_session(path / "model.onnx", args.threads)
        for (batch, length), ids, ours in zip(shapes, inputs, ours_s):
            feeds = {"input_ids": ids.numpy(), "attention_mask": torch.ones_like(ids).numpy()}
            ort_s = best_of(lambda feeds=feeds: session.run(None, feeds), args.repeats)
            rows.append(
                {"shape": f"B{batch}xT{length}", "ours_ms": 1e3 * ours, "onnxruntime_ms": 1e3 * ort_s}
            )
    return rows


def toy_tokenizer(vocab_size: int):
    """A word-level tokenizer of ``vocab_size`` entries ([PAD] = 0): the classifier rows time the
    model, not the tokenizer, and its vocabulary must be the model's size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {name: i for i, name in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])}
    vocab |= {f"w{i}": i for i in range(len(vocab), vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def write_markdown(path: Path, rows: list[Row], settings: dict[str, Any], classifier, machine: str) -> None:
    base = next(r for r in rows if r.system == "scratchformer fp32")
    lines = [
        "# Serving a trained translator (Multi30k de-en, test_2016_flickr)",
        "",
        f"Machine: {machine}.",
        f"Settings: {json.dumps(settings)}. Ratios: ours in fp32 over the system (above 1: ours is faster).",
        "",
        "| system | batch 32 sent/s | tokens/s | ours fp32 / it | batch 1 sent/s | p50 ms | p95 ms"
        " | ours fp32 / it (batch 1) | BLEU | lines = ours fp32 (up to ties) | of them tied"
        " | batch 1 = batch 32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {r.batch32_sentences_s:.1f} | {r.batch32_tokens_s:.0f} "
            f"| {base.batch32_sentences_s / r.batch32_sentences_s:.2f}x | {r.batch1_sentences_s:.1f} "
            f"| {r.batch1_p50_ms:.1f} | {r.batch1_p95_ms:.1f} "
            f"| {base.batch1_sentences_s / r.batch1_sentences_s:.2f}x "
            f"| {r.bleu:.2f} | {100 * r.identical_to_ours:.1f}% | {r.tied_with_ours} "
            f"| {100 * r.batch1_same:.1f}% |"
        )
    lines += [
        f"| {system} | not run: {why} |" + " |" * 10 for system, why in settings.get("not_run", {}).items()
    ]
    if classifier:
        lines += [
            "",
            "| classifier (IMDB recipe size) | ours ms | ONNX Runtime ms | ours / ORT |",
            "|---|---:|---:|---:|",
        ]
        for c in classifier:
            lines.append(
                f"| {c['shape']} | {c['ours_ms']:.1f} | {c['onnxruntime_ms']:.1f} "
                f"| {c['ours_ms'] / c['onnxruntime_ms']:.2f}x |"
            )
    path.write_text("\n".join(lines) + "\n")


def profile_ours(args: argparse.Namespace) -> Path:
    """Where our batch-32 time goes: ``torch.profiler`` over the first 4 chunks of 32 (sorted by
    length, as measured), operators by self CPU time, written to
    ``profile-serving-B32-fp32.txt`` (``-NAME`` before ``.txt`` with ``--name``)."""
    from torch.profiler import ProfilerActivity, profile

    from scratchformer.tasks.translation import load_translator

    translator = load_translator(args.checkpoint, device="cpu")
    texts = read_lines(Path(args.data) / "multi30k" / "test_2016_flickr.de.gz", args.sentences)
    chunks = batches(texts, 32, lambda t: translator.source_lengths([t])[0])
    translator.translate([texts[i] for i in chunks[0]], batch_size=32)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for chunk in chunks[:: max(1, len(chunks) // 4)][:4]:
            translator.translate([texts[i] for i in chunk], batch_size=32)
        seconds = time.perf_counter() - start
    path = args.out / f"profile-serving-B32-fp32{'' if args.name == 'cpu' else '-' + args.name}.txt"
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    path.write_text(
        f"scratchformer translate, beam {translator.decoding.get('beam_size')}, 4 chunks of 32: "
        f"{seconds:.2f} s (profiled)\n\n{table}\n"
    )
    return path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a trained translation checkpoint directory")
    parser.add_argument("--data", default="../shared/data", help="the folder holding multi30k/")
    parser.add_argument(
        "--sentences", type=int, default=1000, help="test lines to translate (default: all 1,000)"
    )
    parser.add_argument("--batch1", type=int, default=1000, help="of them, how many to time one at a time")
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of the classifier rows")
    parser.add_argument("--no-classifier", action="store_true", help="skip the ONNX Runtime classifier rows")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="measure every system in this process (faster to run; default: each in a fresh one, "
        "so that no engine's idle threads slow another's)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="only profile ours at batch 32 (profile-serving-B32-fp32.txt)"
    )
    parser.add_argument(
        "--systems",
        type=lambda text: [name.strip() for name in text.split(";")],
        help="only these, separated by ';' (ours fp32 is always measured: the ratios' reference): "
        + "; ".join(SYSTEMS),
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="cpu", help="results file name: serving-NAME.md (default: cpu)")
    args = parser.parse_args(argv)
    if unknown := [name for name in args.systems or [] if name not in SYSTEMS]:
        parser.error(
            f"--systems: unknown {', '.join(map(repr, unknown))}; the systems are: {'; '.join(SYSTEMS)}"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.report import machine_description

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile:
        print(f"wrote {profile_ours(args)}")
        return 0
    rows, settings = translation_rows(args)
    classifier = [] if args.no_classifier else classifier_rows(args)
    machine = machine_description(torch.device("cpu"))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": machine,
        "settings": settings,
        "rows": [asdict(r) for r in rows],
        "classifier": classifier,
    }
    (args.out / f"serving-{args.name}.json").write_text(
        json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    )
    write_markdown(args.out / f"serving-{args.name}.md", rows, settings, classifier, machine)
    print(f"wrote {args.out / f'serving-{args.name}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
