"""Past frozen features: the image encoder's top stages fine-tuned inside the captioner (cached
lower stages, frozen BatchNorm statistics, their own learning rate; checkpoints, `caption` and
`evaluate` run the tuned top), and flips and crops of the training photos' regions."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tasks.test_flickr8k import photo_recipe, write_flickr_folder, write_photo
from torch.nn import functional as F

from scratchformer import CaptioningConfig, CaptioningTransformer
from scratchformer.cli import main
from scratchformer.data.caption_augment import RegionAugment, flippable, mirror_words
from scratchformer.data.image_features import load_image_features, load_photo
from scratchformer.models.image_encoder import ImageEncoder, ImageTop, stage_starts
from scratchformer.tasks.captioning import CaptioningRecipe, CaptioningTask, train_captioner
from scratchformer.tasks.captioning.captioner import load_captioner
from scratchformer.training import TrainConfig
from scratchformer.training.optimizer import param_groups


@pytest.mark.parametrize("stages", [1, 2])
def test_the_lower_stages_then_the_top_are_the_whole_network(tmp_path: Path, stages: int) -> None:
    """ImageEncoder(name, k) then ImageTop(name, k) = the frozen encoder's regions, for
    EfficientNet-Lite0 (1 stage: 7x7x192 in; 2 stages: 14x14x112 in)."""
    photos = torch.stack([load_photo(write_photo(tmp_path / f"{i}.png", (90, 70), i)) for i in range(2)])
    regions, _ = ImageEncoder()(photos)
    lower, pooled = ImageEncoder(top_stages=stages)(photos)
    side, channels = {1: (7, 192), 2: (14, 112)}[stages]
    assert lower.shape == (2, side * side, channels) and pooled.shape == (2, channels)
    top = ImageTop("efficientnet-lite0", stages)
    with torch.no_grad():
        torch.testing.assert_close(top(lower.clone()), regions, rtol=1e-4, atol=1e-4)
    assert ImageEncoder.describe("efficientnet-lite0", stages) != ImageEncoder.describe("efficientnet-lite0")
    with pytest.raises(ValueError, match=r"expected \(B, 49, 192\)"):
        ImageTop("efficientnet-lite0", 1)(torch.zeros(1, 49, 112))
    with pytest.raises(ValueError, match=r"top_stages: expected an integer in \[0, 7\]"):
        ImageEncoder(top_stages=8)
    assert len(stage_starts(ImageEncoder().net)) == 7


def test_the_top_computes_in_fp32_under_bf16_autocast_on_a_cpu() -> None:
    """bf16 training (autocast) leaves the tuned top in fp32 on a CPU, where oneDNN's bf16 depthwise
    convolutions are slower (benchmarks/image_top.py): its output and gradients are fp32's, to the bit."""
    torch.manual_seed(0)
    top = ImageTop("efficientnet-lite0", 1)
    regions = torch.randn(2, 49, 192)
    results = []
    for bf16 in (False, True):
        top.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = top(regions)
        out.square().mean().backward()
        results.append((out.detach(), top.head.weight.grad.clone()))
    assert results[1][0].dtype == torch.float32
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)


def finetuned_model(stages: int = 1) -> CaptioningTransformer:
    config = CaptioningConfig(
        vocab_size=12,
        input="features",
        feature_dim=1280,
        num_regions=49,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_encoder_layers=0,
        num_decoder_layers=1,
        max_len=8,
        image_stages=stages,
        image_encoder="efficientnet-lite0",
    )
    return CaptioningTransformer(config)


def test_the_tuned_top_trains_at_its_own_rate_with_frozen_batch_norm_statistics() -> None:
    torch.manual_seed(0)
    model = finetuned_model().train()
    torch.manual_seed(0)  # the rest of the model starts as without the top (the random stream is kept)
    frozen = CaptioningTransformer(
        CaptioningConfig(**{**model.config.to_dict(), "image_stages": 0, "image_encoder": ""})
    )
    torch.testing.assert_close(frozen.visual.weight, model.visual.weight)
    assert not model.image_top.training and model.decoder.training  # BN statistics, no drop-connect
    norms = {k: v.clone() for k, v in model.image_top.state_dict().items() if "running" in k}
    weights = {k: p.detach().clone() for k, p in model.image_top.named_parameters()}
    groups = param_groups(model, 0.01, {"image_top.": 1e-5})
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-3, 1e-5, 1e-5]
    tuned = {id(p) for g in groups[2:] for p in g["params"]}
    assert tuned == {id(p) for p in model.image_top.parameters()}
    regions = torch.randn(2, 49, 192)
    captions = torch.randint(0, 12, (2, 5))
    model(regions, captions).logsumexp(-1).mean().backward()
    optimizer.step()
    for k, v in model.image_top.state_dict().items():
        if "running" in k:
            torch.testing.assert_close(v, norms[k])  # the statistics never move
    changed = [k for k, p in model.image_top.named_parameters() if not torch.equal(p, weights[k])]
    assert len(changed) == len(weights)  # every tuned weight got a gradient
    with pytest.raises(ValueError, match="no trainable parameter's name starts with 'encoder.'"):
        param_groups(model, 0.01, {"encoder.": 1e-5})
    with pytest.raises(ValueError, match="lr_groups must be"):
        TrainConfig(lr_groups={"x": "fast"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="image_stages=1: fine-tuning needs input 'features'"):
        CaptioningConfig(vocab_size=12, input="features", image_stages=1)


def test_flips_mirror_the_grid_and_swap_left_and_right() -> None:
    assert (
        mirror_words("a dog left of a man on the right".split()) == "a dog right of a man on the left".split()
    )
    assert flippable(["a dog runs left", "a brown dog"])
    assert not flippable(["a man holds a sign", "a man"]) and not flippable(["player 23 runs"])
    regions = torch.randn(4, 9, 5)
    augment = RegionAugment(flip=True)
    out, flipped = augment(regions, [True, True, False, True], random.Random(3))
    grid = regions.view(4, 3, 3, 5)
    for b in range(4):
        expected = grid[b].flip(1) if flipped[b] else grid[b]
        torch.testing.assert_close(out[b].view(3, 3, 5), expected)
    assert not flipped[2] and any(flipped)
    draws = [augment(regions, [True] * 4, random.Random(s))[1] for s in range(50)]
    assert 0.35 < sum(map(sum, draws)) / 200 < 0.65  # half of the photos


def test_a_crop_is_a_window_of_the_grid_resized_back() -> None:
    regions = torch.randn(3, 16, 2)
    unchanged, _ = RegionAugment(crop=1.0)(regions, [True] * 3, random.Random(0))
    torch.testing.assert_close(unchanged, regions)
    rng, replay = random.Random(7), random.Random(7)
    out, _ = RegionAugment(crop=0.5)(regions, [True] * 3, rng)
    for b in range(3):  # the same draws, by hand
        s = replay.randint(2, 4)
        top, left = replay.randint(0, 4 - s), replay.randint(0, 4 - s)
        window = regions[b].view(4, 4, 2)[top : top + s, left : left + s].permute(2, 0, 1)[None]
        expected = F.interpolate(window, size=(4, 4), mode="bilinear", align_corners=False)[0].permute(
            1, 2, 0
        )
        torch.testing.assert_close(out[b].view(4, 4, 2), expected)


def test_training_batches_flip_photos_and_their_captions_together() -> None:
    from scratchformer.data.captions import CaptionExamples, Vocabulary

    references = [["a dog on the left", "a dog on the right"], ["a sign on the left"], ["a cat left"]]
    vocab = Vocabulary.build([r for refs in references for r in refs])
    examples = CaptionExamples(torch.randn(3, 4, 3), references)
    config = CaptioningConfig(
        vocab_size=len(vocab), input="features", feature_dim=3, num_regions=4, max_len=10
    )
    task = CaptioningTask(vocab, examples, examples, config, 2, 0.0, {}, augment={"flip": True})
    assert task.flippable == [True, False, True]
    vocab_left = Vocabulary.build(["a cat left"])  # "right" unknown: a photo with "left" is never flipped
    lefts = CaptionExamples(torch.randn(1, 4, 3), [["a cat left"]])
    config_left = CaptioningConfig(vocab_size=len(vocab_left), input="features", feature_dim=3, num_regions=4)
    assert CaptioningTask(
        vocab_left, lefts, lefts, config_left, 2, 0.0, {}, augment={"flip": True}
    ).flippable == [False]
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, images, tgt_in, per_image):
            seen.append((images, [vocab.decode(row.tolist()) for row in tgt_in[:, 1:]]))
            return torch.zeros(*tgt_in.shape, len(vocab), requires_grad=True)

    batch = [(0, (0,)), (1, (0,))]
    for seed in range(20):
        task.batches(0, seed=seed)
        task.loss(Spy(), batch, torch.device("cpu"))
    task.loss(Spy(), batch, torch.device("cpu"))  # the last seed again: drawn from (seed, batch), as a
    flips = 0  # resumed run draws
    for images, (dog, sign) in seen:
        mirrored = torch.equal(images[0], examples.inputs[0].view(2, 2, 3).flip(1).reshape(4, 3))
        assert mirrored or torch.equal(images[0], examples.inputs[0])
        assert dog == ("a dog on the right" if mirrored else "a dog on the left")
        assert sign == "a sign on the left" and torch.equal(images[1], examples.inputs[1])  # never flipped
        flips += mirrored
    assert 0 < flips < 20
    assert seen[-1][1] == seen[-2][1] and torch.equal(seen[-1][0], seen[-2][0])


def test_a_finetuned_recipe_trains_saves_and_captions_new_photos(tmp_path: Path, capsys) -> None:
    """The recipe with ``finetune`` and ``augment`` end to end: the lower stages' file, the top's
    own learning rate, checkpoints that hold the tuned top, `caption` and `evaluate` through it."""
    root = write_flickr_folder(tmp_path / "f8")
    recipe = photo_recipe(
        tmp_path,
        root,
        finetune={"stages": 1, "lr": 1e-3, "features": str(tmp_path / "lower.safetensors")},
        augment={"flip": True, "crop": 0.8},
        scst={"steps": 2, "samples": 2, "eval_every": 2},
        train=TrainConfig(
            out_dir=str(tmp_path / "run"), max_steps=4, eval_every=2, lr=1e-3, progress=False, device="cpu"
        ),
    )
    report = train_captioner(recipe)
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["train"]["lr_groups"] == {
        "image_top.": 1e-3
    }
    lower = load_image_features(tmp_path / "lower.safetensors")
    assert lower.regions.shape[1:] == (49, 192) and lower.description == ImageEncoder.describe(
        "efficientnet-lite0", 1
    )
    assert report["parameters"] > 1_000_000  # the top's weights count: they train
    best = tmp_path / "run" / "best"
    state = load_file(best / "model.safetensors")
    pretrained = ImageTop("efficientnet-lite0", 1).state_dict()
    tuned = [k for k, v in pretrained.items() if not torch.equal(state[f"image_top.{k}"], v)]
    assert tuned and all("running" not in k for k in tuned)  # weights moved, statistics did not

    captioner = load_captioner(best, device="cpu")
    photo = root / "Images" / "im2.jpg"
    features, photos = captioner.photo_features([photo])
    assert features.shape == (1, 49, 192)
    torch.testing.assert_close(features, lower.select(["im2.jpg"]))
    expected = captioner.caption(features)
    capsys.readouterr()
    assert main(["caption", "--checkpoint", str(best), str(photo), "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["generated_text"] == expected[0]
    argv = ["evaluate", "--checkpoint", str(best), "--flickr8k", str(root), "--split", "dev"]
    assert main([*argv, "--features", str(tmp_path / "lower.safetensors"), "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 1
    out = tmp_path / "cli.safetensors"  # the command line makes the same file for the photos it is given
    assert main(["features", "--images", str(root / "Images"), "--out", str(out), "--top-stages", "1"]) == 0
    made = load_image_features(out)
    assert made.description == lower.description
    torch.testing.assert_close(made.select(["im2.jpg"]), lower.select(["im2.jpg"]))
    words = captioner.caption_with_attention(features[0])[0]
    assert captioner.attention_picture(features[0], photos[0])[0] == 7 and words  # the top's 7 x 7 grid


def test_finetune_and_augment_errors_name_the_field() -> None:
    base = {"data": "flickr8k", "flickr8k_dir": "x"}
    with pytest.raises(ValueError, match="finetune: expected"):
        CaptioningRecipe(**base, finetune={"stages": 0}).validate()
    with pytest.raises(ValueError, match="finetune: unknown key 'depth'; known: stages, lr, features"):
        CaptioningRecipe(**base, finetune={"stages": 1, "depth": 2}).validate()
    with pytest.raises(ValueError, match="finetune.lr must be a number >= 0"):
        CaptioningRecipe(**base, finetune={"stages": 1, "lr": -1}).validate()
    with pytest.raises(ValueError, match="memory 'regions'"):
        CaptioningRecipe(**base, memory="pooled", finetune={"stages": 1}).validate()
    with pytest.raises(ValueError, match=r"augment: expected \{'flip'"):
        CaptioningRecipe(**base, augment={"crop": 1.5}).validate()
    with pytest.raises(ValueError, match=r"augment: expected \{'flip'"):
        CaptioningRecipe(**base, augment={"flip": "yes"}).validate()
    recipe = CaptioningRecipe(**base, image_encoder="efficientnet-lite2", finetune={"stages": 2})
    recipe.validate()
    assert recipe.features_path("/d").endswith("runs/features/flickr8k-efficientnet-lite2-top2.safetensors")


def test_finetune_lr_0_runs_the_top_frozen(tmp_path: Path) -> None:
    """The ablation's control: the top computed from the cached regions, never trained."""
    root = write_flickr_folder(tmp_path / "f8")
    train = TrainConfig(out_dir=str(tmp_path / "run"), max_steps=2, lr=1e-2, progress=False, device="cpu")
    lower = str(tmp_path / "lower.safetensors")  # (the default path is under the working folder)
    recipe = photo_recipe(tmp_path, root, finetune={"stages": 1, "lr": 0, "features": lower}, train=train)
    train_captioner(recipe)
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["train"]["lr_groups"] == {}
    state = load_file(tmp_path / "run" / "best" / "model.safetensors")
    for k, v in ImageTop("efficientnet-lite0", 1).state_dict().items():
        assert torch.equal(state[f"image_top.{k}"], v), k


def test_the_tops_regions_computed_once_encode_as_the_top_does() -> None:
    """What ``scst.tune_top`` false feeds the captioner (the top's output, computed once) gives the
    memory the top gives at every step."""
    torch.manual_seed(0)
    model = finetuned_model().eval()
    lower = torch.randn(5, 49, 192)
    with torch.no_grad():
        regions = model.top_regions(lower, batch_size=2)
        assert regions.shape == (5, 49, 1280)
        torch.testing.assert_close(model.encode(regions), model.encode(lower))
    with pytest.raises(ValueError, match=r"expected \(B, 49, 192\)"):
        model.encode(torch.randn(1, 49, 100))
    with pytest.raises(ValueError, match="no fine-tuned image top"):
        CaptioningTransformer(dataclasses.replace(model.config, image_stages=0)).top_regions(lower)


def test_self_critical_training_with_the_top_frozen(tmp_path: Path, capsys) -> None:
    """``scst.tune_top`` false: self-critical training starts from the regions through the tuned top,
    computed once; the top stays as cross-entropy left it, the decoder trains on."""
    root = write_flickr_folder(tmp_path / "f8")
    train = TrainConfig(
        out_dir=str(tmp_path / "run"), max_steps=2, eval_every=2, lr=1e-3, progress=False, device="cpu"
    )
    lower = str(tmp_path / "lower.safetensors")
    scst = {"steps": 2, "samples": 2, "eval_every": 2, "tune_top": False, "lr": 1e-2}
    finetune = {"stages": 1, "lr": 1e-3, "features": lower}
    train_captioner(photo_recipe(tmp_path, root, finetune=finetune, scst=scst, train=train))
    err = capsys.readouterr().err  # the training and dev photos through the top, once
    assert "image top: regions (2, 49, 1280) computed once" in err and "regions (1, 49, 1280)" in err
    xe = load_file(tmp_path / "run" / "best" / "model.safetensors")
    sc = load_file(tmp_path / "run" / "scst" / "last" / "model.safetensors")
    assert all(torch.equal(sc[k], v) for k, v in xe.items() if k.startswith("image_top."))
    assert not all(torch.equal(sc[k], v) for k, v in xe.items() if k.startswith("decoder."))
    with pytest.raises(ValueError, match="scst.tune_top: expected true or false"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", scst={"steps": 1, "tune_top": "no"}).validate()
