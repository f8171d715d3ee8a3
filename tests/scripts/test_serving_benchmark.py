"""The serving benchmark runs end to end at toy scale: every engine translates the same lines, the
table and JSON name the machine, and the engines agree with ours where they must (CTranslate2 and
transformers in fp32 decode as we do)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")

from tasks.test_translation import tiny_recipe, toy_pairs, write  # noqa: E402

from benchmarks.serving import main  # noqa: E402
from scratchformer.tasks.translation import train_translation  # noqa: E402
from scratchformer.training.precision import native_bf16  # noqa: E402


def test_an_unknown_system_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--checkpoint", "x", "--systems", "CTranslate2 fp32; CTranslate2 fp16"])
    assert (
        "--systems: unknown 'CTranslate2 fp16'; the systems are: scratchformer fp32;"
        in capsys.readouterr().err
    )


def test_serving_benchmark_at_toy_scale(tmp_path: Path, monkeypatch) -> None:
    recipe = tiny_recipe(tmp_path, max_steps=40, eval_every=40)
    recipe.model["final_norm"], recipe.average_last = True, 0
    checkpoint = tmp_path / "run" / train_translation(recipe)["test_checkpoint"]
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True)
    sources, targets = toy_pairs(12, seed=5)
    write(data / "test_2016_flickr.de.gz", sources)
    write(data / "test_2016_flickr.en.gz", targets)
    out = tmp_path / "results"
    argv = ["--checkpoint", str(checkpoint), "--data", str(tmp_path / "data"), "--sentences", "12"]
    threads = torch.get_num_threads()
    try:
        assert (
            main(
                [
                    *argv,
                    "--batch1",
                    "3",
                    "--repeats",
                    "1",
                    "--threads",
                    "1",
                    "--in-process",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        # some systems only, and CTranslate2 with MKL's SGEMM: the settings name the variable
        monkeypatch.setenv("CT2_USE_MKL", "1")
        some = [
            *argv,
            "--batch1",
            "2",
            "--threads",
            "1",
            "--in-process",
            "--no-classifier",
            "--out",
            str(out),
        ]
        assert main([*some, "--systems", "CTranslate2 fp32", "--name", "some"]) == 0
    finally:
        torch.set_num_threads(threads)  # (main sets it for the process; later tests use the default)
    some = json.loads((out / "serving-some.json").read_text())
    assert [r["system"] for r in some["rows"]] == ["scratchformer fp32", "CTranslate2 fp32"]
    assert some["settings"]["environment"] == {"CT2_USE_MKL": "1"}
    result = json.loads((out / "serving-cpu.json").read_text())
    rows = {r["system"]: r for r in result["rows"]}
    native = native_bf16(torch.device("cpu"))  # (else the bf16 row is a note: emulated, ~20x slower)
    assert set(rows) == {
        "scratchformer fp32",
        "scratchformer fp32, reference beam",
        *(["scratchformer bf16"] if native else []),
        "scratchformer int8",
        "transformers generate fp32",
        "CTranslate2 fp32",
        "CTranslate2 int8",
    }
    assert ("not_run" in result["settings"]) is not native
    assert all(
        r["batch32_sentences_s"] > 0 and r["batch1_p95_ms"] >= r["batch1_p50_ms"] > 0 for r in rows.values()
    )
    # lines = ours, up to ties (our fp32 model scores both within 1e-4); beam: CTranslate2's own
    # stopping rule can differ (see ctranslate2_options), and transformers' at the length limit
    # (it scores the forced EOS 0: tests/models/test_hf_generation.py)
    assert rows["CTranslate2 fp32"]["identical_to_ours"] >= 11 / 12
    assert rows["transformers generate fp32"]["identical_to_ours"] >= 11 / 12
    assert (
        rows["scratchformer fp32"]["identical_to_ours"] == 1.0
        and rows["scratchformer fp32"]["tied_with_ours"] == 0
    )
    assert rows["scratchformer fp32, reference beam"]["identical_to_ours"] == 1.0  # fast = reference
    assert rows["scratchformer fp32"]["batch1_same"] == 1.0  # fp32: alone as in a batch of 32
    assert result["settings"]["ties_within"] == 1e-4
    assert [c["shape"] for c in result["classifier"]] == ["B32xT256", "B1xT64"]
    table = (out / "serving-cpu.md").read_text()
    assert "Machine: " in table and "| CTranslate2 int8 |" in table and "ONNX Runtime" in table
    assert "lines = ours fp32 (up to ties) | of them tied | batch 1 = batch 32 |" in table
    assert native or "| scratchformer bf16 | not run: this CPU has no AMX or AVX512_BF16" in table
    shutil.rmtree(out)
