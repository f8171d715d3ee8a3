"""A translator's decoding defaults in a Hugging Face export: ``generation_config.json`` written and
read back, and the export's ``README.md`` (its model card).

Our translator ends a sentence at EOS or after ``a * S + b`` new tokens, EOS included (fairseq's
``max_len_a``, ``max_len_b``; S the padded length of the batch's sources, EOS included; at most
``max_len - 1``). Hugging Face's ``GenerationConfig`` has no limit that depends on the source, so
``max_length`` gets the largest one any source the model takes can give (a longer source is cut to
``max_len`` tokens): ``generate`` never stops a translation earlier than ours would. The exact rule
is kept beside it under keys of ours, which :func:`read_decoding` reads back. The rest maps one to
one::

    beam_size         -> num_beams
    length_penalty    -> length_penalty       log_prob / len ** length_penalty, len: new tokens + EOS
    our stopping rule -> early_stopping=False (Hugging Face's: the best live beam at its length)
    never BOS or pad  -> bad_words_ids
    EOS at the limit  -> forced_eos_token_id  (it scores EOS 0 there, ours log p(EOS): see the card)
    min_new_tokens, no_repeat_ngram_size, repetition_penalty, do_sample, temperature, top_k,
    top_p             -> the same names
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

from scratchformer.core.keys import reject_unknown
from scratchformer.core.transformer import TransformerConfig
from scratchformer.formats.hf_files import CheckpointError

__all__ = [
    "DEFAULT_DECODING",
    "EXACT_RULE_KEYS",
    "hf_generation_config",
    "longest_new_tokens",
    "model_card",
    "read_decoding",
]

# What Translator.generation_config decodes with when a recipe's decoding section leaves a key out.
DEFAULT_DECODING: dict[str, Any] = {"beam_size": 5, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10}
SAME_NAMES = (
    "min_new_tokens",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
)
EXACT_RULE_KEYS = {"max_len_a": "scratchformer_max_len_a", "max_len_b": "scratchformer_max_len_b"}


def longest_new_tokens(max_len_a: float, max_len_b: int, max_len: int) -> int:
    """The most new tokens ``a * S + b`` gives any source the model takes (S <= ``max_len``: a longer
    one is cut), within the ``max_len - 1`` decoder positions after the start token."""
    return max(1, min(int(max_len_a * max_len + max_len_b), max_len - 1))


def hf_generation_config(decoding: dict[str, Any], special: dict[str, int], max_len: int) -> dict[str, Any]:
    """generation_config.json for a translator decoding by ``decoding`` (a recipe's section; a key
    left out: :data:`DEFAULT_DECODING`), with special ids pad / bos (the decoder start) / eos and
    ``max_len`` positions. An unknown key, a beam size or length rule out of range: a ValueError.
    The length penalty is written for beam search only (greedy search reads it back as 1.0)."""
    reject_unknown(decoding, [*DEFAULT_DECODING, *SAME_NAMES], "decoding")
    d = {**DEFAULT_DECODING, **decoding}
    beams = d["beam_size"]
    if isinstance(beams, bool) or not isinstance(beams, numbers.Integral) or beams < 1:
        raise ValueError(f"decoding: beam_size must be an integer >= 1, got {beams!r}")
    a, b = _length_rule(d["max_len_a"], d["max_len_b"], "decoding", ValueError)
    pad, bos, eos = special["pad"], special["bos"], special["eos"]
    return {
        "decoder_start_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "forced_eos_token_id": eos,
        "bad_words_ids": [[pad]] + ([[bos]] if bos != pad else []),
        "num_beams": beams,
        # beam search only (greedy: transformers warns that it ignores it, and so does our search)
        **({"length_penalty": d["length_penalty"]} if beams > 1 else {}),
        "early_stopping": False,
        "max_length": 1 + longest_new_tokens(a, b, max_len),  # the decoder start + the new tokens
        **{k: d[k] for k in SAME_NAMES if k in d},
        EXACT_RULE_KEYS["max_len_a"]: a,
        EXACT_RULE_KEYS["max_len_b"]: b,
    }


def read_decoding(gen: dict[str, Any], max_len: int, source: str | Path) -> dict[str, Any]:
    """Decoding defaults from a generation config ``gen`` (read from ``source``): our exact length
    rule where :func:`hf_generation_config` wrote it, else ``max_new_tokens`` or ``max_length`` (the
    decoder start included; default ``max_len``) as a fixed limit, as ``generate`` reads them."""
    new_tokens = gen.get("max_new_tokens") or (gen.get("max_length") or max_len) - 1
    decoding = {
        "beam_size": gen.get("num_beams") or 1,
        "length_penalty": gen.get("length_penalty", 1.0),
        "max_len_a": 0.0,
        "max_len_b": int(new_tokens),
        **{k: gen[k] for k in SAME_NAMES if k in gen},
    }
    present = [key for key in EXACT_RULE_KEYS.values() if key in gen]
    if present:
        if len(present) == 1:
            raise CheckpointError(
                f"{source}: {present[0]} without its pair {sorted(EXACT_RULE_KEYS.values())}"
            )
        a, b = (gen[key] for key in EXACT_RULE_KEYS.values())
        decoding["max_len_a"], decoding["max_len_b"] = _length_rule(a, b, str(source), CheckpointError)
    return decoding


def _length_rule(a: Any, b: Any, where: str, error: type[ValueError]) -> tuple[float, int]:
    """(a, b) checked: a finite number a >= 0 and an integer b >= 0, else ``error`` naming them."""
    if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a) or a < 0:
        raise error(f"{where}: max_len_a must be a finite number >= 0, got {a!r}")
    if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 0:
        raise error(f"{where}: max_len_b must be an integer >= 0, got {b!r}")
    return a, b


def model_card(config: TransformerConfig, generation: dict[str, Any], name: str) -> str:
    """README.md of an export named ``name``: what the model is, how to run it with transformers
    and with scratchformer, and the length rule (``generation``: :func:`hf_generation_config`)."""
    c, g = config, generation
    a, b = g[EXACT_RULE_KEYS["max_len_a"]], g[EXACT_RULE_KEYS["max_len_b"]]
    cap = c.max_len - 1
    lp = g.get("length_penalty", 1.0)
    search = (
        f"beam search with {g['num_beams']} beams, length penalty {lp} (a hypothesis scores its "
        f"log-probability / its new tokens ** {lp}, EOS counted), `early_stopping: false`"
        if g["num_beams"] > 1
        else "greedy search"
    )
    return f"""---
library_name: transformers
pipeline_tag: translation
tags: [marian, scratchformer]
---

# {name}

The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), trained with
scratchformer and written as a Marian checkpoint (`MarianMTModel`):
{c.num_encoder_layers} encoder and {c.num_decoder_layers} decoder layers, width {c.d_model}, \
{c.num_heads} heads, feed-forward {c.d_ff}, {c.src_vocab_size} tokens, {c.max_len} positions.

## With transformers

```python
from transformers import AutoTokenizer, MarianMTModel

tokenizer = AutoTokenizer.from_pretrained("{name}")
model = MarianMTModel.from_pretrained("{name}")
batch = tokenizer(["A sentence to translate."], return_tensors="pt", padding=True, truncation=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

`generation_config.json` holds the decoding it was evaluated with: {search}, never padding or
the start token, EOS forced at the length limit.

## The length rule

A translation ends at EOS or after `{a} * S + {b}` new tokens (EOS included, at most {cap}), S the
length of the batch's padded sources in tokens (EOS included). `GenerationConfig` cannot express a
limit that depends on the source, so `max_length` is {g["max_length"]} (the start token and
{g["max_length"] - 1} new tokens), the largest limit any source can get (at most {c.max_len} tokens:
scratchformer cuts a longer one, as `truncation=True` does). transformers never stops a translation
earlier than the rule, but may let one that never emits EOS run longer. The exact rule, per batch:

```python
S = batch["input_ids"].shape[1]
out = model.generate(**batch, max_length=1 + min(int({a} * S + {b}), {cap}))  # start + new tokens
```

Caveats: S is the batch's longest source, so the limit depends on which sentences go together
(scratchformer's `translate` sorts them by length and decodes 64 at a time); at the limit
transformers scores the forced EOS 0 and scratchformer with the model's log p(EOS), so a beam search
that reaches the limit may end with another hypothesis. `generation_config.json` also stores the
rule, as `{EXACT_RULE_KEYS["max_len_a"]}` and `{EXACT_RULE_KEYS["max_len_b"]}`.

## With scratchformer

```python
from scratchformer.tasks.translation import load_translator

translator = load_translator("{name}")  # reads the exact rule back
print(translator.translate(["A sentence to translate."]))
```

or `scratchformer translate --checkpoint {name} < sources.txt > translations.txt`.
"""
