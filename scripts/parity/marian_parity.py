"""Run a Marian directory (a real opus-mt model, or one of ours exported with ``scratchformer
export``) in our Transformer and in ``transformers.MarianMTModel`` on real text, and report how
closely they agree.

    python scripts/parity/marian_parity.py DIR --source test.de [--reference test.en] [--n 1000] [--beam 4]

Reports, in float32 on CPU: token ids equal to the Hugging Face tokenizer's; the max abs
difference of encoder states and of decoder logits (teacher-forced on Hugging Face's greedy
output; real positions only); the share of identical greedy and beam outputs; sacreBLEU of both
(with --reference); beam-search time of ours / theirs, measured in this run.
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scratchformer.tasks.translation import bleu_and_chrf, load_translator  # noqa: E402


def read_lines(path: str, n: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line, _ in zip(f, range(n))]


def cpu_name() -> str:
    try:
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    from transformers import AutoTokenizer, MarianMTModel

    torch.set_grad_enabled(False)
    ours = load_translator(args.directory, device="cpu")
    hf = MarianMTModel.from_pretrained(args.directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.directory)
    texts = read_lines(args.source, args.n)
    pad, limit = ours.pad, ours.decoding["max_len_b"]
    same_ids = sum(tokenizer(t).input_ids == ours.encode_sources([t])[0] for t in texts)

    encoder_diff = logits_diff = 0.0
    outputs: dict[str, list[list[str]]] = {"greedy": [[], []], "beam": [[], []]}
    seconds = [0.0, 0.0]
    for start in range(0, len(texts), args.batch_size):
        chunk = texts[start : start + args.batch_size]
        batch = tokenizer(chunk, return_tensors="pt", padding=True, truncation=True)
        greedy = hf.generate(**batch, num_beams=1, max_length=limit + 1, early_stopping=False)
        ref = hf(**batch, decoder_input_ids=greedy)
        real_tgt = torch.ones_like(greedy, dtype=torch.bool)
        real_tgt[:, 1:] = greedy[:, 1:] != pad
        src_mask = batch.attention_mask.bool()
        encoder_diff = max(
            encoder_diff,
            float(
                (ours.model.encode(batch.input_ids, src_mask) - ref.encoder_last_hidden_state)
                .abs()[src_mask]
                .max()
            ),
        )
        logits = ours.model(batch.input_ids, greedy, src_padding_mask=src_mask)
        logits_diff = max(logits_diff, float((logits - ref.logits).abs()[real_tgt].max()))
        outputs["greedy"][0] += ours.translate(chunk, beam_size=1)
        outputs["greedy"][1] += tokenizer.batch_decode(greedy, skip_special_tokens=True)
        t0 = time.perf_counter()
        outputs["beam"][0] += ours.translate(chunk, beam_size=args.beam)
        t1 = time.perf_counter()
        beam = hf.generate(
            **batch,
            num_beams=args.beam,
            max_length=limit + 1,
            early_stopping=False,
            length_penalty=ours.decoding.get("length_penalty", 1.0),
        )
        seconds[0], seconds[1] = seconds[0] + t1 - t0, seconds[1] + time.perf_counter() - t1
        outputs["beam"][1] += tokenizer.batch_decode(beam, skip_special_tokens=True)

    print(
        f"{args.directory}: {len(texts)} sentences of {args.source}; "
        f"{cpu_name()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, float32"
    )
    print(f"token ids equal to the Hugging Face tokenizer's: {same_ids}/{len(texts)}")
    print(f"max |ours - MarianMTModel|: encoder states {encoder_diff:.2e}, decoder logits {logits_diff:.2e}")
    for kind, (mine, theirs) in outputs.items():
        same = sum(a == b for a, b in zip(mine, theirs))
        line = f"{kind}: identical outputs {same}/{len(texts)}"
        if args.reference:
            refs = read_lines(args.reference, args.n)
            line += (
                f"; sacreBLEU ours {bleu_and_chrf(mine, refs)['bleu']:.2f}, "
                f"theirs {bleu_and_chrf(theirs, refs)['bleu']:.2f}"
            )
        print(line)
    print(f"beam {args.beam} decoding time, ours / MarianMTModel.generate: {seconds[0] / seconds[1]:.2f}x")


if __name__ == "__main__":
    main()
