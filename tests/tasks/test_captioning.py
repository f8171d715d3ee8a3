"""Image captioning: the model, the rendered-scene benchmark, the loaders, training, decoding, CLI."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from scratchformer import CaptioningConfig, CaptioningTransformer, PatchEmbedding, beam_search, greedy_decode
from scratchformer.cli import main
from scratchformer.data.captions import (
    CaptionExamples,
    Vocabulary,
    caption_words,
    load_caption_folder,
    load_cs231n_captions,
    save_caption_folder,
    tokenize_caption,
)
from scratchformer.data.shapes import COLOURS, held_out_pairs, shape_scene_splits
from scratchformer.tasks.captioning import (
    Captioner,
    CaptioningRecipe,
    caption_scores,
    load_captioner,
    train_captioner,
)
from scratchformer.training import TrainConfig

END = Vocabulary.end_id


def tiny_config(**overrides) -> CaptioningConfig:
    args = {
        "vocab_size": 30,
        "image_size": 16,
        "patch_size": 4,
        "d_model": 32,
        "num_heads": 2,
        "d_ff": 64,
        "num_encoder_layers": 1,
        "num_decoder_layers": 2,
        "dropout": 0.0,
        "max_len": 12,
    }
    return CaptioningConfig(**{**args, **overrides})


# ---------------------------------------------------------------- model


def test_patch_embedding_equals_a_strided_convolution() -> None:
    """ViT's patch projection is a Conv2d with kernel = stride = P: same weights, same output."""
    torch.manual_seed(0)
    ours = PatchEmbedding(image_size=16, patch_size=4, channels=3, d_model=8)
    conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_(ours.proj.weight.view(8, 3, 4, 4))
        conv.bias.copy_(ours.proj.bias)
    images = torch.rand(2, 3, 16, 16)
    reference = conv(images).flatten(2).transpose(1, 2)  # (B, N, D), row-major patches
    positions = (ours.row[:, None] + ours.col[None, :]).reshape(16, 8)
    torch.testing.assert_close(ours(images), reference + positions, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (torch.rand(2, 1, 16, 16), "expected 3 channels"),
        (torch.rand(2, 3, 32, 32), "expected 16x16 pixels"),
        (torch.rand(3, 16, 16), "3 dims"),
        (torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.int32), "floating-point"),
    ],
)
def test_wrong_images_are_clear_errors(images: torch.Tensor, message: str) -> None:
    model = CaptioningTransformer(tiny_config())
    with pytest.raises((ValueError, TypeError), match=message):
        model(images, torch.ones(images.shape[0], 3, dtype=torch.long))


def test_features_input_and_its_errors() -> None:
    model = CaptioningTransformer(tiny_config(input="features", feature_dim=10, num_encoder_layers=0))
    captions = torch.ones(2, 5, dtype=torch.long)
    assert model(torch.randn(2, 10), captions).shape == (2, 5, 30)  # one vector per image (cs231n)
    assert model(torch.randn(2, 7, 10), captions).shape == (2, 5, 30)  # region features
    with pytest.raises(ValueError, match="last dim 10"):
        model(torch.randn(2, 11), captions)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.randn(2, 10), torch.full((2, 3), 30))
    with pytest.raises(ValueError, match="exceeds max_len=12"):
        model(torch.randn(2, 10), torch.ones(2, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="patch_size=5 must divide"):
        tiny_config(patch_size=5)


def test_uint8_images_are_read_as_0_to_1() -> None:
    model = CaptioningTransformer(tiny_config()).eval()
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    torch.testing.assert_close(model.encode(images), model.encode(images.float() / 255))


def test_cached_and_uncached_generation_agree() -> None:
    torch.manual_seed(1)
    model = CaptioningTransformer(tiny_config(dropout=0.1)).eval()
    images = torch.rand(4, 3, 16, 16)
    args = {"bos_id": 1, "eos_id": END, "max_len_a": 0.0, "max_len_b": 11, "return_logits": True}
    cached, cached_logits = greedy_decode(model, images, use_cache=True, **args)
    full, full_logits = greedy_decode(model, images, use_cache=False, **args)
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-5, rtol=1e-5)
    assert cached.shape[1] == 11 and (cached[:, -1] == END).all()  # an untrained model hits the limit


def test_generation_stops_at_end() -> None:
    """A decoder that says <END> at step 3: greedy stops there (no further decoder call); beam
    search's best hypothesis ends there, and every hypothesis ends with exactly one <END>."""
    model = CaptioningTransformer(tiny_config()).eval()
    original, calls = model.decode, []

    def scripted(captions, memory, src_padding_mask=None, cache=None):
        logits = original(captions, memory, src_padding_mask, cache=cache)
        step = len(calls)
        calls.append(step)
        favourite = torch.full_like(logits, -10.0)
        favourite[..., 5 + step] = 0.0  # words 5, 6, then <END>
        if step == 2:
            favourite[..., END] = 10.0
        return favourite

    model.decode = scripted  # type: ignore[method-assign]
    out = greedy_decode(model, torch.rand(2, 3, 16, 16), bos_id=1, eos_id=END, max_len_a=0.0, max_len_b=11)
    assert out.tolist() == [[5, 6, END]] * 2 and len(calls) == 3
    calls.clear()
    hyps = beam_search(
        model,
        torch.rand(1, 3, 16, 16),
        bos_id=1,
        eos_id=END,
        beam_size=2,
        n_best=2,
        max_len_a=0.0,
        max_len_b=11,
    )
    assert hyps[0][0].tokens == [5, 6, END]
    assert all(h.tokens.count(END) == 1 and h.tokens[-1] == END for h in hyps[0])


# ---------------------------------------------------------------- the rendered scenes


def test_scene_splits_hold_out_colour_shape_pairs_and_are_deterministic() -> None:
    splits = shape_scene_splits(seed=3, train_size=300, valid_size=20, test_size=100)
    again = shape_scene_splits(seed=3, train_size=300, valid_size=20, test_size=100)
    assert torch.equal(splits["train"].inputs, again["train"].inputs)
    assert splits["train"].inputs.shape == (300, 3, 64, 64) and splits["train"].inputs.dtype == torch.uint8
    held = {f"{c} {s}" for c, s in held_out_pairs(3)}
    assert len(held) == 3
    for name in ("train", "valid", "test_seen"):
        assert not any(h in c for refs in splits[name].references for c in refs for h in held), name
    assert all(any(h in refs[0] for h in held) for refs in splits["test_heldout"].references)
    assert all(len(refs) == 4 for refs in splits["train"].references)


def test_scene_images_show_the_colours_their_captions_name() -> None:
    """Independent of the renderer's code: every colour a caption names covers pixels of the image
    (within the colour jitter), and no other palette colour appears at all."""
    splits = shape_scene_splits(seed=0, train_size=200, valid_size=1, test_size=1)
    palette = {name: torch.tensor(rgb, dtype=torch.float32) for name, rgb in COLOURS.items()}
    for image, refs in zip(splits["train"].inputs, splits["train"].references):
        pixels = image.float().flatten(1).T  # (H*W, 3)
        named = {w for w in refs[0].split() if w in palette}
        for colour, rgb in palette.items():
            present = int(((pixels - rgb).abs().max(dim=1).values < 40).sum())
            assert (present >= 20) if colour in named else (present == 0), (refs[0], colour, present)


# ---------------------------------------------------------------- data loaders and metrics


def _vocab() -> Vocabulary:
    return Vocabulary.build(["a dog runs", "a cat sleeps on a mat"])


def test_cs231n_files_load_from_hdf5_and_npz(tmp_path: Path) -> None:
    vocab = _vocab()
    captions = np.zeros((5, 8), dtype=np.int64)  # <START> words <END> <NULL>..., cs231n's layout
    texts = ["a dog runs", "a cat sleeps", "a dog", "a cat sleeps on a mat", "a dog runs"]
    for row, text in zip(captions, texts):
        ids = [vocab.start_id] + vocab.encode(text) + [vocab.end_id]
        row[: len(ids)] = ids
    arrays = {
        "train_captions": captions,
        "train_image_idxs": np.array([0, 1, 0, 2, 1]),
        "val_captions": captions[:2],
        "val_image_idxs": np.array([1, 0]),
    }
    features = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    (tmp_path / "coco2014_vocab.json").write_text(json.dumps(vocab.to_json()))
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "coco2014_captions.h5", "w") as f:
        for key, value in arrays.items():
            f[key] = value
    with h5py.File(tmp_path / "train2014_vgg16_fc7_pca.h5", "w") as f:
        f["features"] = features
    np.savez(tmp_path / "val2014_vgg16_fc7_pca.npz", features=features[:2])

    train, loaded_vocab = load_cs231n_captions(tmp_path, "train")
    assert loaded_vocab.words == vocab.words
    assert train.references == [
        ["a dog runs", "a dog"],
        ["a cat sleeps", "a dog runs"],
        ["a cat sleeps on a mat"],
    ]
    torch.testing.assert_close(train.inputs, torch.from_numpy(features))
    val, _ = load_cs231n_captions(tmp_path, "val")  # .npz features next to .h5 captions
    assert val.references == [["a cat sleeps"], ["a dog runs"]]  # grouped by image index
    with pytest.raises(FileNotFoundError, match="val2014_vgg16_fc7"):
        load_cs231n_captions(tmp_path, "val", pca_features=False)


def test_caption_folder_with_images_or_feature_files(tmp_path: Path) -> None:
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        Image.new("RGB", (20, 20), colour).save(images / f"im{i}.png")
    tsv = tmp_path / "captions.tsv"
    tsv.write_text("im0.png#0\tA red square.\nim0.png#1\tred\nim1\ta blue square\n")
    examples, ids = load_caption_folder(tsv, images)
    assert ids == ["im0.png", "im1"] and examples.references == [["A red square.", "red"], ["a blue square"]]
    assert examples.inputs.shape == (2, 3, 20, 20) and examples.inputs[0, 0, 0, 0] == 255
    resized, _ = load_caption_folder(tsv, images, image_size=8)
    assert resized.inputs.shape == (2, 3, 8, 8)

    features = tmp_path / "features"
    features.mkdir()
    for i in range(2):
        np.save(features / f"im{i}.npy", np.full((4, 5), i, dtype=np.float32))
    (tmp_path / "f.tsv").write_text("im0\ta\nim1\tb\n")
    examples, _ = load_caption_folder(tmp_path / "f.tsv", features)
    assert examples.inputs.shape == (2, 4, 5) and examples.inputs.dtype == torch.float32
    (tmp_path / "bad.tsv").write_text("im9\tmissing\n")
    with pytest.raises(FileNotFoundError, match="im9"):
        load_caption_folder(tmp_path / "bad.tsv", features)
    (tmp_path / "notab.tsv").write_text("im0 no tab\n")
    with pytest.raises(ValueError, match="notab.tsv:1"):
        load_caption_folder(tmp_path / "notab.tsv", features)


def test_saved_caption_folder_loads_back_exactly(tmp_path: Path) -> None:
    scenes = shape_scene_splits(seed=1, train_size=0, valid_size=0, test_size=3)["test_seen"]
    tsv = save_caption_folder(scenes, tmp_path / "scenes", "seen")
    loaded, ids = load_caption_folder(tsv, tmp_path / "scenes")
    assert ids == ["seen-0000.png", "seen-0001.png", "seen-0002.png"]
    assert torch.equal(loaded.inputs, scenes.inputs) and loaded.references == scenes.references


def test_vocabulary_round_trip_and_unknown_words() -> None:
    vocab = _vocab()
    assert vocab.words[:4] == ["<NULL>", "<START>", "<END>", "<UNK>"] and vocab.words[4] == "a"
    assert tokenize_caption("A dog, running.") == ["a", "dog", ",", "running", "."]
    ids = vocab.encode("a zebra runs")
    assert ids[1] == vocab.unk_id and vocab.decode(ids + [vocab.end_id, 5]) == "a <UNK> runs"
    assert Vocabulary.from_json(json.loads(json.dumps(vocab.to_json()))).words == vocab.words


def test_unk_is_one_token_ids_text_ids_round_trip_and_scoring() -> None:
    """<UNK> as decode writes it (cs231n's references are rebuilt as text and encoded again) is one
    token, encoded back to the unknown id, and one token when scored, as COCO's PTB tokenizer keeps it."""
    from pycocoevalcap.bleu.bleu import Bleu

    vocab = _vocab()
    ids = vocab.encode("a dog runs")
    ids.insert(1, vocab.unk_id)
    assert vocab.encode(vocab.decode(ids)) == ids and vocab.encode("A <unk> dog") == ids[:3]
    assert tokenize_caption("a <UNK>, dog") == ["a", "<unk>", ",", "dog"]
    assert caption_words("the <Unk>.") == ["the", "<unk>"]
    assert "<unk>" not in Vocabulary.build(["a <UNK> dog"]).words
    hyps = ["a man in a <UNK> shirt is riding a bike", "a dog runs on the <UNK>"]
    refs = [
        ["a man in a striped shirt is riding a bike .", "a man rides a bicycle ."],
        ["a dog runs on the beach .", "a brown dog running on sand ."],
    ]
    ptb_res = {0: ["a man in a <unk> shirt is riding a bike"], 1: ["a dog runs on the <unk>"]}  # PTB's output
    ptb_gts = {
        0: ["a man in a striped shirt is riding a bike", "a man rides a bicycle"],
        1: ["a dog runs on the beach", "a brown dog running on sand"],
    }
    bleu, _ = Bleu(4).compute_score(ptb_gts, ptb_res, verbose=0)
    scores = caption_scores(hyps, refs)
    assert [scores[f"bleu{n}"] for n in range(1, 5)] == pytest.approx([100 * b for b in bleu])
    assert scores["bleu1"] == pytest.approx(87.5)  # 70.0 with <UNK> split into < unk >


def test_caption_scores_are_pycocoevalcap_against_every_reference() -> None:
    """BLEU-1..4 and CIDEr-D equal the COCO caption evaluation code called directly on the same
    tokenised text (lower case, punctuation removed), every reference of each image."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    hyps = ["A red circle above a blue square.", "a small cat", "two dogs play in the snow"]
    refs = [
        ["a blue square below a red circle", "A red circle above a blue square ."],
        ["one small cat"],
        ["Two dogs are playing in the snow.", "dogs in snow", "two brown dogs run through snow"],
    ]
    scores = caption_scores(hyps, refs)
    res = {0: ["a red circle above a blue square"], 1: ["a small cat"], 2: ["two dogs play in the snow"]}
    gts = {
        0: ["a blue square below a red circle", "a red circle above a blue square"],
        1: ["one small cat"],
        2: ["two dogs are playing in the snow", "dogs in snow", "two brown dogs run through snow"],
    }
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    for n in range(4):
        assert scores[f"bleu{n + 1}"] == pytest.approx(100 * bleu[n])
    assert scores["cider"] == pytest.approx(100 * cider) and scores["exact_match"] == pytest.approx(1 / 3)
    assert caption_scores(["a small cat ."], [["A small cat."]])["exact_match"] == 1.0
    with pytest.raises(ValueError, match="2 hypotheses for 1 reference lists"):
        caption_scores(["a", "b"], [["a"]])


@pytest.mark.skipif(shutil.which("java") is None, reason="METEOR is a Java program; no java here")
def test_meteor_is_the_jar_pycocoevalcap_ships(monkeypatch) -> None:
    """METEOR (x100) equals pycocoevalcap's Meteor called directly on the same tokenised text; a
    caption as one of its references scores above a wrong one."""
    from pycocoevalcap.meteor import meteor

    jar = meteor.Meteor()  # one Java process (10 s to start) serves both: ours asks for it by name
    monkeypatch.setattr(meteor, "Meteor", lambda: jar)
    hyps = ["A dog runs on the grass.", "a man rides a bike"]
    refs = [["a dog is running on grass", "A brown dog runs across the grass ."], ["two girls on a bench"]]
    scores = caption_scores(hyps, refs, meteor=True)
    gts = {0: ["a dog is running on grass", "a brown dog runs across the grass"], 1: ["two girls on a bench"]}
    direct, each = jar.compute_score(gts, {0: ["a dog runs on the grass"], 1: ["a man rides a bike"]})
    assert scores["meteor"] == pytest.approx(100 * direct) and each[0] > 2 * each[1]
    assert "meteor" not in caption_scores(hyps, refs)


def test_meteor_without_java_is_refused_before_any_decoding(monkeypatch, capsys) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="METEOR needs Java: no `java` on PATH"):
        caption_scores(["a dog"], [["a dog"]], meteor=True)
    model = CaptioningTransformer(tiny_config()).eval()
    vocab = Vocabulary.build(["a red circle"])
    captioner = Captioner(model, vocab, {}, torch.device("cpu"))
    monkeypatch.setattr(captioner, "caption", lambda *a, **k: pytest.fail("decoded before the check"))
    examples = CaptionExamples(torch.zeros(1, 3, 16, 16), [["a red circle"]])
    with pytest.raises(RuntimeError, match="METEOR needs Java"):
        captioner.evaluate(examples, meteor=True)


# ---------------------------------------------------------------- training end to end, CLI


def tiny_recipe(tmp_path: Path, **train) -> CaptioningRecipe:
    return CaptioningRecipe(
        data="shapes",
        shapes={"seed": 0, "train_size": 16, "valid_size": 16, "test_size": 8},
        batch_size=16,
        label_smoothing=0.0,
        model={
            "patch_size": 16,
            "d_model": 48,
            "num_heads": 2,
            "d_ff": 96,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "dropout": 0.0,
            "max_len": 24,
        },
        decoding={"beam_size": 2},
        train=TrainConfig(
            **{
                "out_dir": str(tmp_path / "run"),
                "max_steps": 300,
                "lr": 1e-2,
                "warmup_steps": 20,
                "eval_every": 300,
                "best_metric": "bleu4",
                "best_mode": "max",
                "progress": False,
                **train,
            }
        ),
    )


@pytest.mark.machine
def test_a_tiny_scene_set_is_learned_to_exact_match(tmp_path: Path) -> None:
    """16 training scenes, one caption each: memorised to exact match (greedy and beam) in seconds.
    In fp64, so that every CPU trains the same model: in fp32 with one thread on an AVX-512 Xeon,
    beam 2 found a caption the model scored higher than the memorised one for 1 scene of 16."""
    recipe = tiny_recipe(tmp_path, precision="fp64")
    splits = shape_scene_splits(**recipe.shapes)
    one_caption = CaptionExamples(splits["train"].inputs, [refs[:1] for refs in splits["train"].references])
    report = train_captioner(recipe, splits={**splits, "train": one_caption, "valid": one_caption})
    assert report["best_valid"]["exact_match"] == 1.0, report
    captioner = load_captioner(tmp_path / "run" / "best", device="cpu")
    assert captioner.evaluate(one_caption, beam_size=2)["exact_match"] == 1.0
    assert set(report["test"]) == {"test_heldout", "test_seen"}
    assert (tmp_path / "run" / "test_seen_examples.png").stat().st_size > 0


def test_cli_train_captioner_caption_and_attention_png(tmp_path: Path, capsys) -> None:
    recipe_file = tmp_path / "recipe.json"
    recipe = tiny_recipe(tmp_path)
    recipe_file.write_text(json.dumps({**recipe.to_dict(), "train": {"lr": 3e-3, "warmup_steps": 5}}))
    assert (
        main(
            [
                "train",
                "captioner",
                "--config",
                str(recipe_file),
                "--out",
                str(tmp_path / "run"),
                "--max-steps",
                "20",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["test"]["test_seen"]["greedy"]["n"] == 8

    assert main(["shapes", "--split", "test_heldout", "--count", "2", "--out", str(tmp_path / "scenes")]) == 0
    capsys.readouterr()
    pngs = sorted(str(p) for p in (tmp_path / "scenes").glob("*.png"))
    assert len(pngs) == 2 and (tmp_path / "scenes" / "captions.tsv").exists()
    checkpoint = str(tmp_path / "run" / "best")
    assert (
        main(
            [
                "caption",
                "--checkpoint",
                checkpoint,
                *pngs,
                "--beam",
                "1",
                "--attention-png",
                str(tmp_path / "att.png"),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith(p + "\t") for line, p in zip(lines, pngs))
    assert (tmp_path / "att-0.png").stat().st_size > 0 and (tmp_path / "att-1.png").stat().st_size > 0
    assert (
        main(
            [
                "caption",
                "--checkpoint",
                checkpoint,
                *pngs,
                "--beam",
                "3",
                "--nbest",
                "2",
                "--lenpen",
                "0.6",
                "--no-repeat-ngram",
                "2",
                "--min-len",
                "2",
                "--json",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["image"] for r in rows] == pngs and all(len(r["nbest"]) == 2 for r in rows)
    assert all(r["generated_text"] == r["nbest"][0]["text"] and len(r["tokens"]) >= 2 for r in rows)
    assert (
        main(
            [
                "caption",
                "--checkpoint",
                checkpoint,
                pngs[0],
                "--sampling",
                "--top-p",
                "0.9",
                "--temperature",
                "0.8",
                "--seed",
                "3",
                "--nbest",
                "3",
                "--prefix",
                "a",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.split("\t")[3].startswith("a ") for line in lines)

    from PIL import Image

    Image.new("RGB", (32, 32)).save(tmp_path / "small.png")
    capsys.readouterr()
    assert (
        main(["caption", "--checkpoint", checkpoint, str(tmp_path / "small.png")]) == 2
    )  # bad input: one line, exit 2
    assert re.search("32x32.*64x64", capsys.readouterr().err)
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                checkpoint,
                "--captions",
                str(tmp_path / "scenes" / "captions.tsv"),
                "--images",
                str(tmp_path / "scenes"),
                "--json",
                *(["--meteor"] if shutil.which("java") else []),
            ]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out)
    assert scored["n"] == 2 and ("meteor" in scored) == bool(shutil.which("java"))


def test_a_run_killed_in_scst_before_its_first_save_resumes(tmp_path: Path, monkeypatch) -> None:
    """Phase 1 done, scst/metrics.jsonl written, no scst/last: --resume reruns phase 2 alone, one log."""
    from scratchformer.tasks.captioning import SelfCriticalTask

    recipe = tiny_recipe(tmp_path, max_steps=2, warmup_steps=1, eval_every=0, log_every=1)
    recipe.scst = {"steps": 3, "samples": 2}
    recipe.shapes = {"seed": 0, "train_size": 16, "valid_size": 4, "test_size": 2}
    loss, calls = SelfCriticalTask.loss, []

    def killed_at_step_2(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return loss(self, *args)

    monkeypatch.setattr(SelfCriticalTask, "loss", killed_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        train_captioner(recipe)
    run = tmp_path / "run"
    assert (run / "scst" / "metrics.jsonl").is_file() and not (run / "scst" / "last").exists()
    phase1_log = (run / "metrics.jsonl").read_text()
    monkeypatch.setattr(SelfCriticalTask, "loss", loss)
    report = train_captioner(recipe, resume=True)
    assert set(report["best_valid"]) == {"xe", "scst"}
    assert (run / "metrics.jsonl").read_text() == phase1_log  # phase 1 not rerun
    records = map(json.loads, (run / "scst" / "metrics.jsonl").read_text().splitlines())
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]  # the killed attempt's step 1 not kept


def test_cli_evaluate_decodes_with_the_batch_size_and_precision_given(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    from cli.test_generation_cli import spy_on_decoding

    recipe = tiny_recipe(tmp_path, max_steps=1, warmup_steps=0, eval_every=0)
    recipe.shapes = {"seed": 0, "train_size": 4, "valid_size": 2, "test_size": 5}
    train_captioner(recipe)
    tsv = save_caption_folder(shape_scene_splits(**recipe.shapes)["test_seen"], tmp_path / "scenes")
    batches = spy_on_decoding(monkeypatch, "captioning.captioner")  # where Captioner decodes
    args = [
        "evaluate",
        "--checkpoint",
        str(tmp_path / "run" / "best"),
        "--captions",
        str(tsv),
        "--images",
        str(tmp_path / "scenes"),
        "--device",
        "cpu",
        "--json",
    ]
    capsys.readouterr()
    assert main([*args, "--batch-size", "2", "--precision", "bf16"]) == 0
    assert batches == [(2, True), (2, True), (1, True)] and json.loads(capsys.readouterr().out)["n"] == 5
    batches.clear()
    assert main(args) == 0
    assert batches == [(5, False)]


def test_committed_recipe_is_valid() -> None:
    recipe = CaptioningRecipe.from_json(
        Path(__file__).resolve().parents[2] / "recipes" / "shapes_captioning.json"
    )
    assert recipe.data == "shapes" and recipe.train.best_metric == "bleu4"
