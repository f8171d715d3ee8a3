"""One answer on every machine: inference computes in fp32 unless asked, so ``scratchformer translate``
and ``scratchformer serve`` give the same tokens for the same sentences, and an ensemble of one
checkpoint twice translates as the checkpoint, whatever the CPU (docs/proven.md). On 0.11, on a
CPU with AMX, ``translate`` chose bf16 by default and ``serve`` fp32: 10 of 40 sentences differed.

Marked ``machine``: CI's second pass runs them again as the other machine kind (``--native-bf16``),
where a default that followed the machine would show."""

from __future__ import annotations

import json

import pytest
from serve.servers import TRANSLATION, client_for, config

from scratchformer.cli import main
from scratchformer.serve import ModelSpec

pytestmark = pytest.mark.machine

SUBJECTS = ["ein Mann", "eine Frau", "zwei Hunde", "ein Kind", "Hunde", "ein Mann und eine Frau",
            "zwei Kinder", "eine Frau und ein Kind"]  # fmt: skip
ACTS = ["", "laufen im Schnee", "spielt", "laufen", "im Schnee"]
SENTENCES = [f"{s} {a}".strip() for a in ACTS for s in SUBJECTS]  # 40


def translate(argv: list[str], monkeypatch, capsys) -> list[dict]:
    """``scratchformer translate --checkpoint FIXTURE --json --beam 3 ARGV`` over SENTENCES on stdin."""
    monkeypatch.setattr("sys.stdin", iter(line + "\n" for line in SENTENCES))
    assert main(["translate", "--checkpoint", str(TRANSLATION), "--json", "--beam", "3", *argv]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(answers) == len(SENTENCES)
    return answers


def test_translate_and_serve_give_the_same_tokens_by_default(monkeypatch, capsys) -> None:
    cli = translate([], monkeypatch, capsys)
    spec = ModelSpec.parse(f"de-en={TRANSLATION}")  # as `scratchformer serve --checkpoint de-en=DIR`
    with client_for(config(spec, max_wait_ms=5)) as client:
        served = client.post("/v1/translate", json={"inputs": SENTENCES, "parameters": {"num_beams": 3}})
    assert served.status_code == 200, served.text
    differing = [s for s, a, c in zip(SENTENCES, served.json(), cli) if a["tokens"] != c["tokens"]]
    assert not differing, f"{len(differing)} of {len(SENTENCES)} sentences differ: {differing[:3]}"
    assert all(abs(a["score"] - c["score"]) < 1e-4 for a, c in zip(served.json(), cli))


def test_an_ensemble_of_one_checkpoint_twice_translates_as_the_checkpoint(monkeypatch, capsys) -> None:
    one = translate([], monkeypatch, capsys)
    twice = translate(["--checkpoint", str(TRANSLATION)], monkeypatch, capsys)
    differing = [s for s, a, b in zip(SENTENCES, one, twice) if a["tokens"] != b["tokens"]]
    assert not differing, f"{len(differing)} of {len(SENTENCES)} sentences differ: {differing[:3]}"
    assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(one, twice))


def test_every_inference_command_defaults_to_fp32() -> None:
    from scratchformer.cli import build_parser

    parser = build_parser()
    for argv in (["translate"], ["caption", "photo.jpg"], ["classify"], ["evaluate"]):
        assert parser.parse_args([*argv, "--checkpoint", "x"]).precision == "fp32", argv
    assert parser.parse_args(["serve", "--checkpoint", "x=y"]).precision == "fp32"
