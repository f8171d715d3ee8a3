"""Pre-LN translators (the committed Multi30k recipe's kind) go out as Hugging Face Pegasus, Marian's
pre-LN sibling: ``PegasusForConditionalGeneration`` computes our logits and greedy and beam
translations (identical up to ties: a differing line must score within 1e-4 by our model), with the
exported generation config, and our loader reads the export back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from formats.test_hf_checkpoints import max_diff_where, padded_batch  # noqa: E402
from tasks.test_translation import tiny_recipe  # noqa: E402

from scratchformer.cli import main  # noqa: E402
from scratchformer.tasks.translation import Translator, load_translator, train_translation  # noqa: E402
from scratchformer.tasks.translation.ties import same_translations_up_to_ties  # noqa: E402

TEXTS = ["Ein rot hund läuft.", "Ein klein katze schläft und ein groß mann läuft.", "Ein mann läuft."]


@pytest.fixture(scope="module")
def pre_ln(tmp_path_factory) -> tuple[Path, Translator]:
    """Our recipe as committed: pre-LN with a LayerNorm after each stack, interleaved positions."""
    tmp = tmp_path_factory.mktemp("pre_ln")
    recipe = tiny_recipe(tmp, max_steps=40, eval_every=40)
    recipe.model["final_norm"], recipe.average_last = True, 0
    checkpoint = tmp / "run" / train_translation(recipe)["test_checkpoint"]
    return checkpoint, load_translator(checkpoint, device="cpu")


def test_pre_ln_exports_as_pegasus(pre_ln, tmp_path: Path) -> None:
    checkpoint, translator = pre_ln
    assert translator.model.config.norm_first and translator.model.encoder.norm is not None
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "PegasusForConditionalGeneration"
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    tgt, tgt_mask = padded_batch([[1, 36, 310, 294], [1, 36, 316, 294, 281, 17, 2], [1, 5]], 0)
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=tgt).logits
        mine = translator.model(batch.input_ids, tgt, batch.attention_mask.bool())
    assert max_diff_where(mine, theirs, tgt_mask) < 1e-5
    for beams in (1, 3):
        with torch.no_grad():
            out = hf.generate(**batch, num_beams=beams, max_new_tokens=20)
        translations = translator.translate(TEXTS, beam_size=beams, config=None)
        theirs = tokenizer.batch_decode(out, skip_special_tokens=True)
        report = same_translations_up_to_ties(translator, TEXTS, translations, theirs)
        assert report.ok and all(translations), (beams, report.describe(translator.tokenizer.decode))
    reloaded = load_translator(tmp_path / "hf", device="cpu")  # our loader reads the export back
    assert reloaded.model.config.norm_first and reloaded.model.config.final_norm
    assert reloaded.translate(TEXTS) == translator.translate(TEXTS)
    assert reloaded.decoding == translator.decoding


def test_parity_fails_without_the_final_norm(pre_ln, tmp_path: Path) -> None:
    """Mutation: the same export with the encoder's final LayerNorm left at its initial values no
    longer computes our logits (so the test above can fail)."""
    _, translator = pre_ln
    translator.save_pretrained(tmp_path / "hf")
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        hf.model.encoder.layer_norm.weight.fill_(1.0)
        hf.model.encoder.layer_norm.bias.zero_()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    tgt = torch.tensor([[1, 36, 310]] * len(TEXTS))
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=tgt).logits
        mine = translator.model(batch.input_ids, tgt, batch.attention_mask.bool())
    assert float((mine - theirs).abs().max()) > 1e-3


def test_pre_ln_without_final_norm_is_refused(pre_ln, tmp_path: Path) -> None:
    _, translator = pre_ln
    translator.model.encoder.norm, kept = None, translator.model.encoder.norm
    try:
        with pytest.raises(ValueError, match="Pegasus.*norm_first=True without final_norm"):
            translator.save_pretrained(tmp_path / "hf")
    finally:
        translator.model.encoder.norm = kept
    assert not (tmp_path / "hf").exists()
