"""``scratchformer evaluate`` on every input form training takes (a photo captioner on a captions
TSV, its photographs encoded as in training), and outputs that would overwrite an input, refused
before any work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from scratchformer.cli import main
from scratchformer.data.captions import CaptionExamples
from scratchformer.tasks.captioning import CaptioningRecipe, train_captioner
from scratchformer.training import TrainConfig

TINY = {"d_model": 32, "num_heads": 2, "d_ff": 64, "num_encoder_layers": 1, "num_decoder_layers": 1}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def flickr_folder(root: Path) -> Path:
    """Three photos, captions.txt, train and dev lists (dev: im2.jpg), and dev.tsv, the same split as
    a captions TSV (image ids without their suffix, as Flickr8k's token file may have them)."""
    from PIL import Image

    (root / "Images").mkdir(parents=True)
    for i in range(3):
        small = np.random.default_rng(i).integers(0, 256, (6, 6, 3), dtype=np.uint8)
        Image.fromarray(small).resize((64, 48), Image.Resampling.BICUBIC).save(root / "Images" / f"im{i}.jpg")
    rows = [
        ("im0.jpg", "a dog runs"),
        ("im1.jpg", "two cats"),
        ("im2.jpg", "a red car"),
        ("im2.jpg", "a car"),
    ]
    (root / "captions.txt").write_text("image,caption\n" + "".join(f"{n},{c}\n" for n, c in rows))
    (root / "Flickr_8k.trainImages.txt").write_text("im0.jpg\nim1.jpg\n")
    (root / "Flickr_8k.devImages.txt").write_text("im2.jpg\n")
    (root / "dev.tsv").write_text("im2\ta red car\nim2\ta car\n")
    return root


def test_a_photo_captioner_is_evaluated_on_a_captions_tsv_as_on_its_corpus(tmp_path: Path, capsys) -> None:
    root = flickr_folder(tmp_path / "f8")
    recipe = CaptioningRecipe(
        data="flickr8k",
        flickr8k_dir=str(root),
        features=str(tmp_path / "train.safetensors"),
        splits={"train": "train", "valid": "dev"},
        batch_size=2,
        model={**TINY, "num_regions": 49, "max_len": 8},
        decoding={"beam_size": 1},
        train=TrainConfig(
            out_dir=str(tmp_path / "run"), max_steps=2, eval_every=2, progress=False, device="cpu"
        ),
    )
    train_captioner(recipe)
    checkpoint = ["evaluate", "--checkpoint", str(tmp_path / "run" / "best"), "--json"]
    code, out, _ = run([*checkpoint, "--flickr8k", str(root), "--split", "dev"], capsys)
    on_corpus = json.loads(out)
    assert code == 0 and on_corpus["n"] == 1
    tsv = ["--captions", str(root / "dev.tsv"), "--images", str(root / "Images")]
    code, out, _ = run([*checkpoint, *tsv], capsys)  # encoded in memory
    assert code == 0 and json.loads(out) == on_corpus
    features = tmp_path / "eval.safetensors"
    code, out, _ = run([*checkpoint, *tsv, "--features", str(features)], capsys)  # extracted into the file
    assert code == 0 and json.loads(out) == on_corpus and features.is_file()


def test_features_are_refused_for_a_model_that_reads_no_photographs(tmp_path: Path, capsys) -> None:
    references = [["a dog runs"], ["two cats"], ["a red car"]]
    data = CaptionExamples(torch.randn(3, 4, 8), references)
    recipe = CaptioningRecipe(
        model={**TINY, "max_len": 8},
        decoding={"beam_size": 1},
        train=TrainConfig(
            out_dir=str(tmp_path / "run"), max_steps=1, eval_every=1, progress=False, device="cpu"
        ),
    )
    train_captioner(recipe, splits={"train": data, "valid": data})
    (tmp_path / "features").mkdir()
    for i in range(3):
        np.save(tmp_path / "features" / f"im{i}.npy", data.inputs[i].numpy())
    (tmp_path / "c.tsv").write_text("".join(f"im{i}\t{r[0]}\n" for i, r in enumerate(references)))
    argv = ["evaluate", "--checkpoint", str(tmp_path / "run" / "best"), "--captions", str(tmp_path / "c.tsv")]
    argv += ["--images", str(tmp_path / "features"), "--json"]
    code, out, _ = run(argv, capsys)
    assert code == 0 and json.loads(out)["n"] == 3
    code, _, err = run([*argv, "--features", str(tmp_path / "f.safetensors")], capsys)
    assert code == 2 and "--features: this model was not trained on photographs" in err
    assert not (tmp_path / "f.safetensors").exists()


def test_evaluate_never_writes_its_output_over_an_input(tmp_path: Path, capsys) -> None:
    """Refused before the checkpoint is even opened (it does not exist here)."""
    source, reference, captions = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "c.tsv"
    for path in (source, reference, captions):
        path.write_text("kept\n")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "link.txt").symlink_to(source)
    os.link(reference, tmp_path / "hard.txt")
    base = ["evaluate", "--checkpoint", str(tmp_path / "ckpt"), "--source", str(source)]
    base += ["--reference", str(reference)]
    for output, named in [
        (source, "--source"),
        (tmp_path / "link.txt", "--source"),
        (tmp_path / "hard.txt", "--reference"),
        (tmp_path / "ckpt" / "config.json", "--checkpoint"),
        (tmp_path / "sub" / ".." / "src.txt", "--source"),
    ]:
        code, _, err = run([*base, "--output", str(output)], capsys)
        assert code == 2 and f"is (or is in) the input {named}" in err, (output, err)
    photo = ["evaluate", "--checkpoint", str(tmp_path / "ckpt"), "--captions", str(captions)]
    photo += ["--images", str(tmp_path)]
    for flag, output in [
        ("--output", captions),
        ("--features", captions),
        ("--output", tmp_path / "ref.txt"),
    ]:
        code, _, err = run([*photo, flag, str(output)], capsys)
        assert code == 2 and f"error: {flag} {output} is (or is in) the input" in err, err
    assert all(p.read_text() == "kept\n" for p in (source, reference, captions))
