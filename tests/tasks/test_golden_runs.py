"""Behaviour is unchanged by refactoring: a tiny run of each training task (classifier, translation,
captioning, masked LM) gives the metrics.jsonl values, test figures and weights recorded before.

The runs compute in float64 (``"precision": "fp64"``, and fp64 as the default dtype, so the
checkpoints loaded for testing compute in fp64 too): then the order in which a CPU's kernels add
(AVX-512, AVX2 or plain C; MKL's or oneDNN's choice) moves the results by ~1e-12, where an fp32 run
moved them by up to 4e-3 between an Intel Xeon and an AMD EPYC. Measured spread, AVX2 against
``ATEN_CPU_CAPABILITY=default`` on an AMD EPYC: at most 4.7e-12 absolute, 1.7e-9 relative (a
weight sum near zero) over every value compared. The tolerance, 1e-6 relative or 1e-9 absolute
(the larger), is 500 times that spread, and 30 times smaller than what a small change of
behaviour moves: label smoothing x 0.99 moves the first logged loss of translation and captioning
by 3e-5 relative, and fails here under both kernel settings.

Tokenizers are fixed files (tests/fixtures/golden/): WordPiece and BPE training is not reproducible
across processes. Timings are left out of the comparison. Weights are compared tensor by tensor
(their sum and the sum of their absolute values).

Record anew (only on purpose): ``GOLDEN_RECORD=1 python -m pytest tests/tasks/test_golden_runs.py``.
CI runs this file a second time under other kernels (.ci/run).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scratchformer.tasks.captioning import CaptioningRecipe, train_captioner
from scratchformer.tasks.classification import ClassifierRecipe, train_classifier
from scratchformer.tasks.masked_lm import MLMRecipe, pretrain_mlm
from scratchformer.tasks.translation import TranslationRecipe, train_translation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
GOLDEN = FIXTURES / "runs.json"
TIMING = ("items_per_s", "seconds")
RTOL, ATOL = 1e-6, 1e-9  # 500 x the spread measured between kernels in fp64 (see above)
TRAIN = {
    "max_steps": 8,
    "warmup_steps": 3,
    "eval_every": 4,
    "log_every": 1,
    "progress": False,
    "seed": 1,
    "precision": "fp64",
    "threads": 0,
    "device": "cpu",  # what was recorded (on a machine with CUDA, "auto" would be the GPU)
}


def _tokenizer(task: str) -> str | None:
    """The fixed tokenizer of a task; when recording and it is missing, None (the run trains one,
    which is then kept as the fixture)."""
    path = FIXTURES / f"{task}_tokenizer.json"
    return None if os.environ.get("GOLDEN_RECORD") and not path.is_file() else str(path)


def _lines(path: Path, lines: list[str]) -> str:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def _reviews(path: Path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    good, bad = ["great", "superb", "loved"], ["awful", "dull", "hated"]
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = rng.choices(["the", "film", "plot", "was", "a", "story"], k=rng.randint(3, 9))
        words.insert(rng.randint(0, len(words)), rng.choice(good if label else bad))
        rows.append(json.dumps({"text": " ".join(words), "label": label}))
    return _lines(path, rows)


def _pairs(tmp: Path, split: str, n: int, seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    lexicon = {"ein": "a", "hund": "dog", "katze": "cat", "läuft": "runs", "schläft": "sleeps", "rot": "red"}
    src, tgt = [], []
    for _ in range(n):
        words = [
            "ein",
            rng.choice(["rot", "ein"]),
            rng.choice(["hund", "katze"]),
            rng.choice(["läuft", "schläft"]),
        ]
        src.append(" ".join(words).capitalize() + ".")
        tgt.append(" ".join(lexicon[w] for w in words).capitalize() + ".")
    return _lines(tmp / f"{split}.de.gz", src), _lines(tmp / f"{split}.en.gz", tgt)


def classifier(tmp: Path) -> dict:
    recipe = ClassifierRecipe(
        train_file=_reviews(tmp / "train.jsonl.gz", 120, 0),
        test_file=_reviews(tmp / "test.jsonl.gz", 40, 1),
        valid_size=24,
        label_names=["negative", "positive"],
        max_length=16,
        truncation="head",
        batch_size=16,
        tokenizer=_tokenizer("classifier"),
        average_last=2,
        model={
            "d_model": 16,
            "num_heads": 2,
            "num_layers": 1,
            "d_ff": 32,
            "dropout": 0.1,
            "norm_first": True,
        },
        train={
            **TRAIN,
            "out_dir": str(tmp / "run"),
            "lr": 5e-3,
            "best_metric": "accuracy",
            "best_mode": "max",
            "keep_checkpoints": 2,
        },
    )
    return train_classifier(recipe)


def translation(tmp: Path) -> dict:
    train, valid, test = _pairs(tmp, "train", 80, 0), _pairs(tmp, "valid", 12, 1), _pairs(tmp, "test", 12, 2)
    recipe = TranslationRecipe(
        train_source=train[0],
        train_target=train[1],
        valid_source=valid[0],
        valid_target=valid[1],
        test_source=test[0],
        test_target=test[1],
        max_length=16,
        max_tokens=160,
        average_last=2,
        tokenizer=_tokenizer("translation"),
        decoding_grid={"beam_size": [1, 2]},
        model={
            "d_model": 16,
            "num_heads": 2,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "d_ff": 32,
            "dropout": 0.1,
            "norm_first": True,
            "share_embeddings": True,
            "tie_output": True,
            "max_len": 32,
        },
        decoding={"beam_size": 2, "length_penalty": 1.0, "max_len_a": 1.5, "max_len_b": 4},
        train={
            **TRAIN,
            "out_dir": str(tmp / "run"),
            "lr": 1e-2,
            "schedule": "inverse_sqrt",
            "best_metric": "bleu",
            "best_mode": "max",
        },
    )
    return train_translation(recipe)


def captioning(tmp: Path) -> dict:
    recipe = CaptioningRecipe(
        data="shapes",
        shapes={"seed": 0, "train_size": 24, "valid_size": 8, "test_size": 4},
        batch_size=8,
        model={
            "patch_size": 16,
            "d_model": 16,
            "num_heads": 2,
            "d_ff": 32,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "dropout": 0.1,
            "max_len": 24,
        },
        decoding={"beam_size": 2},
        train={**TRAIN, "out_dir": str(tmp / "run"), "lr": 1e-2, "best_metric": "bleu4", "best_mode": "max"},
    )
    return train_captioner(recipe)


def masked_lm(tmp: Path) -> dict:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    (tmp / "corpus.txt").write_text("\n".join(" ".join(rng.sample(words, 10)) for _ in range(60)) + "\n")
    recipe = MLMRecipe(
        train_files=[str(tmp / "corpus.txt")],
        valid_size=8,
        max_length=16,
        max_tokens=256,
        tokenizer=_tokenizer("mlm"),
        model={"d_model": 16, "num_heads": 2, "num_layers": 1, "d_ff": 32},
        train={**TRAIN, "out_dir": str(tmp / "run"), "lr": 3e-3},
    )
    return pretrain_mlm(recipe)


RUNS = {
    "classifier": classifier,
    "translation": translation,
    "captioning": captioning,
    "masked_lm": masked_lm,
}


def _numbers(value):
    """The JSON value with timings dropped (keys in TIMING or starting with 'seconds')."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items() if k not in TIMING and not k.startswith("seconds")}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def _weights(path: Path) -> dict:
    tensors = load_file(str(path))
    stats = {name: [float(t.double().sum()), float(t.double().abs().sum())] for name, t in tensors.items()}
    return {"tensors": stats}


def observe(name: str, tmp: Path) -> dict:
    torch.set_num_threads(2)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the checkpoints loaded for testing compute in fp64 too
    try:
        report = RUNS[name](tmp)
    finally:
        torch.set_default_dtype(default)
    run = tmp / "run"
    return {
        "metrics": _numbers([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]),
        "test": _numbers(report.get("test")),
        "last": _weights(run / "last" / "model.safetensors"),
        "best": _weights(run / "best" / "model.safetensors"),
    }


def _close(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (
            f"{where}: {len(a)} != {len(b) if isinstance(b, list) else b}"
        )
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, (int, float)):
        assert b == pytest.approx(a, rel=RTOL, abs=ATOL), f"{where}: {b} != recorded {a}"
    else:
        assert a == b, f"{where}: {b!r} != recorded {a!r}"


@pytest.mark.parametrize("name", list(RUNS))
def test_a_tiny_run_gives_the_recorded_metrics_and_weights(name: str, tmp_path: Path) -> None:
    seen = observe(name, tmp_path)
    if os.environ.get("GOLDEN_RECORD"):
        task = {"masked_lm": "mlm"}.get(name, name)
        if name != "captioning" and not (FIXTURES / f"{task}_tokenizer.json").is_file():
            (FIXTURES / f"{task}_tokenizer.json").write_bytes(
                (tmp_path / "run" / "best" / "tokenizer.json").read_bytes()
            )
            pytest.skip("tokenizer recorded: record again for the run's values")
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        golden[name] = {**seen, "cpu": _cpu(), "torch": torch.__version__}
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    recorded = json.loads(GOLDEN.read_text())[name]
    for part in ("metrics", "test"):
        _close(recorded[part], seen[part], f"{name}.{part}")
    for which in ("last", "best"):
        _close(recorded[which]["tensors"], seen[which]["tensors"], f"{name}.{which}")


def _cpu() -> str:
    try:
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        return platform.processor()
