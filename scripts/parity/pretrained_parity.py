"""Measure how closely our encoder with all-MiniLM-L6-v2 weights reproduces the references.

    pip install -c constraints-cpu.txt -e ".[test]"
    python scripts/parity/pretrained_parity.py [--data ../shared/data/multi30k] [--n 1000]

On real text (Multi30k test captions in English, German and French, plus inputs long enough to
be truncated at 256 tokens) it reports, in float32:
  * the max abs difference of every layer's hidden states vs transformers.BertModel (real tokens),
    and how far each of the two float32 implementations is from the float64 result,
  * the max abs difference of sentence embeddings vs sentence_transformers.SentenceTransformer,
  * the max difference between batch size 1 and batch size 16,
  * encoding time of ours vs BertModel, as a ratio measured in this run.
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

from scratchformer.formats.hf_bert import default_model_dir, load_bert_encoder  # noqa: E402
from scratchformer.tasks.sentence_embedding import SentenceEncoder  # noqa: E402


def load_texts(data: Path, n: int) -> list[str]:
    texts: list[str] = []
    for lang in ("en", "de", "fr"):
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += [line.strip() for line, _ in zip(f, range(n // 3))]
    long_text = " ".join(texts[:60])  # several hundred tokens: truncated
    return texts + [long_text, long_text.upper(), ""]


def main() -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel

    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
    )
    parser.add_argument("--model", type=Path, default=default_model_dir())
    parser.add_argument("--n", type=int, default=999)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    texts = load_texts(args.data, args.n)
    ours = SentenceEncoder.from_pretrained(args.model)
    hf = BertModel.from_pretrained(str(args.model)).eval()
    print(
        f"{len(texts)} texts; torch {torch.__version__}; {platform.machine()} {os.cpu_count()} CPUs; "
        f"{torch.get_num_threads()} threads"
    )

    exact = load_bert_encoder(args.model).double()  # float64: the same function, ~exact
    n_states = ours.encoder.config.num_layers + 1
    layer_diff, ours_err, hf_err = [0.0] * n_states, [0.0] * n_states, [0.0] * n_states
    t_ours = t_hf = 0.0
    for start in range(0, len(texts), args.batch_size):
        batch = ours.tokenizer(texts[start : start + args.batch_size])
        real = batch.padding_mask[..., None]
        with torch.no_grad():
            t0 = time.perf_counter()
            _, hidden = ours.encoder(batch.ids, batch.padding_mask, batch.type_ids, output_hidden_states=True)
            t1 = time.perf_counter()
            ref = hf(
                input_ids=batch.ids,
                attention_mask=batch.padding_mask.long(),
                token_type_ids=batch.type_ids,
                output_hidden_states=True,
            ).hidden_states
            t2 = time.perf_counter()
            _, truth = exact(batch.ids, batch.padding_mask, batch.type_ids, output_hidden_states=True)
        t_ours, t_hf = t_ours + t1 - t0, t_hf + t2 - t1
        for i, (a, b, c) in enumerate(zip(hidden, ref, truth)):
            layer_diff[i] = max(layer_diff[i], ((a - b).abs() * real).max().item())
            ours_err[i] = max(ours_err[i], ((a.double() - c).abs() * real).max().item())
            hf_err[i] = max(hf_err[i], ((b.double() - c).abs() * real).max().item())

    st = SentenceTransformer(str(args.model), device="cpu")
    emb = ours.encode(texts, batch_size=16)
    emb_diff = (emb - st.encode(texts, convert_to_tensor=True, batch_size=16)).abs().max().item()
    batch_diff = (ours.encode(texts[:200], batch_size=1) - emb[:200]).abs().max().item()

    print("max abs diff vs transformers.BertModel, real tokens, per hidden state (embeddings, layers 1-6):")
    print("  " + "  ".join(f"{d:.1e}" for d in layer_diff))
    print("max abs diff from the float64 result, ours / BertModel:")
    print("  " + "  ".join(f"{a:.1e}/{b:.1e}" for a, b in zip(ours_err, hf_err)))
    print(f"max abs diff of sentence embeddings vs sentence-transformers: {emb_diff:.1e}")
    print(f"max abs diff batch size 1 vs 16 (first 200 texts): {batch_diff:.1e}")
    print(f"encoder time, ours / BertModel (same batches, this run): {t_ours / t_hf:.2f}x")


if __name__ == "__main__":
    main()
