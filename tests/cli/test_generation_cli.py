"""The generation flags of `scratchformer translate` / `evaluate`, their JSON Lines output, and
streaming: each line of a pipe answered before the next one is written (--buffer-size 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from scratchformer.cli import main

SOURCES = ["Ein rot hund läuft.", "Ein klein katze schläft."]


@pytest.fixture(scope="module")
def checkpoint(tiny_translation) -> tuple[str, object]:
    """The session's tiny translator (conftest.py): its checkpoint's path and its recipe."""
    recipe, report, run = tiny_translation
    return str(run / report["test_checkpoint"]), recipe


def run(capsys, *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["translate", "--checkpoint", *args, "--device", "cpu"]) == 0
    return capsys.readouterr().out.splitlines()


def test_json_lines_with_nbest_lists_and_scores(checkpoint, capsys, monkeypatch) -> None:
    path, _ = checkpoint
    monkeypatch.setattr("sys.stdin", iter(line + "\n" for line in SOURCES))
    rows = [
        json.loads(line)
        for line in run(capsys, path, "--beam", "3", "--nbest", "3", "--lenpen", "0.6", "--json")
    ]
    assert [r["source"] for r in rows] == SOURCES
    assert [r["translation_text"] for r in rows] == ["A red dog runs.", "A small cat sleeps."]
    for r in rows:
        assert set(r) == {"translation_text", "score", "log_prob", "tokens", "source", "nbest"}
        assert len(r["nbest"]) == 3 and r["nbest"][0]["text"] == r["translation_text"]
        scores = [h["score"] for h in r["nbest"]]
        assert scores == sorted(scores, reverse=True)
        for h in r["nbest"]:
            assert h["score"] == pytest.approx(h["log_prob"] / (len(h["tokens"]) + 1) ** 0.6)  # EOS counts
    monkeypatch.setattr("sys.stdin", iter(line + "\n" for line in SOURCES))
    plain = run(capsys, path, "--beam", "3", "--nbest", "2")
    assert [line.split("\t")[:2] for line in plain] == [["0", "0"], ["0", "1"], ["1", "0"], ["1", "1"]]
    assert plain[0].split("\t")[3] == "A red dog runs."  # index, rank, score, text


def test_every_generation_flag(checkpoint, capsys) -> None:
    path, _ = checkpoint
    greedy = run(capsys, path, "--beam", "1", SOURCES[0])
    assert run(capsys, path, "--sampling", "--top-k", "1", "--seed", "1", SOURCES[0]) == greedy
    assert run(capsys, path, "--sampling", "--top-p", "0.000001", SOURCES[0]) == greedy
    assert run(capsys, path, "--sampling", "--temperature", "0.0001", "--seed", "3", SOURCES[0]) == greedy
    hot = ["--sampling", "--temperature", "3", "--top-p", "0.95", "--seed", "7", "--nbest", "4", SOURCES[0]]
    assert run(capsys, path, *hot) == run(capsys, path, *hot)  # seeded
    assert len({line.split("\t")[3] for line in run(capsys, path, *hot)}) > 1
    assert run(capsys, path, "--prefix", "A big", SOURCES[0])[0].startswith("A big")

    def tokens(*flags: str) -> list[int]:
        return json.loads(run(capsys, path, *flags, "--json", SOURCES[0])[0])["tokens"]

    assert len(tokens("--max-len-a", "0", "--max-len-b", "2")) == 1  # 2 new tokens: one, then EOS
    assert len(tokens("--max-new-tokens", "3")) == 2
    assert len(tokens("--min-len", "9", "--max-new-tokens", "12")) >= 9
    one = tokens("--no-repeat-ngram", "1", "--min-len", "9", "--max-new-tokens", "12")
    assert len(one) == len(set(one))  # no token twice
    plain_tokens = tokens("--min-len", "9", "--max-new-tokens", "12")
    penalised = tokens("--repetition-penalty", "1000", "--min-len", "9", "--max-new-tokens", "12")
    assert (
        len(set(penalised)) == len(penalised) and penalised != plain_tokens
    )  # a huge penalty: nothing twice


def test_impossible_flags_are_refused_before_loading(capsys) -> None:
    for flags, message in (
        (["--sampling", "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--sampling", "--beam", "2"], "sampling inside beams is not supported"),
        (["--nbest", "3", "--beam", "2"], "num_return_sequences=3 > num_beams=2"),
        (["--sampling", "--temperature", "0"], "temperature must be > 0"),
        (["--top-k", "5"], "--top-k: only with --sampling"),
    ):
        assert main(["translate", "--checkpoint", "/no/such/checkpoint", *flags, "x"]) == 2
        assert message in capsys.readouterr().err  # the flag is named, not the missing checkpoint


def test_evaluate_takes_the_flags_and_prints_one_json_line(checkpoint, capsys) -> None:
    path, recipe = checkpoint
    capsys.readouterr()
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                path,
                "--source",
                recipe.test_source,
                "--reference",
                recipe.test_target,
                "--beam",
                "2",
                "--lenpen",
                "0.6",
                "--no-repeat-ngram",
                "3",
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["bleu"] > 90


def test_a_pipe_is_answered_line_by_line(checkpoint) -> None:
    """--buffer-size 1: the answer to the first line arrives while the second is not yet written."""
    path, _ = checkpoint
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scratchformer",
            "translate",
            "--checkpoint",
            path,
            "--device",
            "cpu",
            "--buffer-size",
            "1",
            "--beam",
            "1",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    answers: list[str] = []
    try:
        for source in SOURCES:
            proc.stdin.write(source + "\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            reader = threading.Thread(target=lambda: answers.append(proc.stdout.readline().strip()))  # type: ignore[union-attr]
            reader.start()
            reader.join(timeout=120)
            assert not reader.is_alive(), "no answer before the next line: the input was buffered"
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert answers == ["A red dog runs.", "A small cat sleeps."]


def spy_on_decoding(monkeypatch, module: str) -> list[tuple[int, bool]]:
    """(batch size, bf16 autocast on?) of each batch ``scratchformer.tasks.<module>`` decodes."""
    import importlib

    import torch

    tasks = importlib.import_module(f"scratchformer.tasks.{module}")
    decode, batches = tasks.generate, []

    def spy(model, inputs, *args, **kwargs):
        bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        batches.append((len(inputs), bf16))
        return decode(model, inputs, *args, **kwargs)

    monkeypatch.setattr(tasks, "generate", spy)
    return batches


def test_evaluate_decodes_with_the_batch_size_and_precision_given(checkpoint, capsys, monkeypatch) -> None:
    path, recipe = checkpoint
    batches = spy_on_decoding(monkeypatch, "translation.translator")  # where Translator decodes
    args = [
        "evaluate",
        "--checkpoint",
        path,
        "--source",
        recipe.test_source,
        "--reference",
        recipe.test_target,
        "--device",
        "cpu",
        "--json",
    ]
    assert main([*args, "--batch-size", "16", "--precision", "bf16"]) == 0
    assert batches == [(16, True), (16, True), (8, True)]  # 40 sentences
    assert json.loads(capsys.readouterr().out)["bleu"] > 90
    batches.clear()
    assert main(args) == 0
    assert batches == [(40, False)]  # the default: 64 a batch, fp32
