"""Captioning real photographs: the frozen image encoder, feature files, the Flickr8k and Karpathy
loaders, the COCO metrics, self-critical training, and the recipe/CLI end to end.

Photos are written by the tests (random pictures) or, where ../shared/data/flickr8k exists, taken
from there (skipped only where it is absent)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchformer import CaptioningConfig, CaptioningTransformer
from scratchformer.cli import main
from scratchformer.data.caption_corpora import load_flickr8k, load_karpathy_json
from scratchformer.data.captions import CaptionExamples, caption_words
from scratchformer.data.image_features import extract_image_features, load_image_features, load_photo
from scratchformer.generation import sample_decode
from scratchformer.models.image_encoder import ImageEncoder
from scratchformer.tasks.captioning import (
    CaptioningRecipe,
    CiderD,
    SelfCriticalTask,
    caption_scores,
    train_captioner,
)
from scratchformer.training import TrainConfig

DATA = Path(os.environ.get("SCRATCHFORMER_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
FLICKR = DATA / "flickr8k"
needs_flickr = pytest.mark.skipif(not (FLICKR / "captions.txt").is_file(), reason=f"no Flickr8k under {DATA}")
DOG = "1001773457_577c3a7d70.jpg"  # two dogs on a road, in the train split


@pytest.fixture(scope="module")
def encoder() -> ImageEncoder:
    return ImageEncoder()


def write_photo(path: Path, size: tuple[int, int], seed: int) -> Path:
    """A random smooth picture of ``size`` (W, H), saved in the format of the suffix."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    Image.fromarray(small).resize(size, Image.Resampling.BICUBIC).save(path)
    return path


class CountingEncoder:
    """A cheap stand-in encoder (mean colour of 7x7 cells, D_img = 3) that counts the photos it sees."""

    image_size = 224

    def __init__(self, name: str = "counting"):
        self.name, self.seen = name, 0

    def describe(self) -> dict[str, str]:
        return {"encoder": self.name, "preprocessing": "load_photo 224"}

    def __call__(self, photos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen += len(photos)
        cells = torch.nn.functional.avg_pool2d(photos.float(), 32).flatten(2).transpose(1, 2)  # (B, 49, 3)
        return cells, cells.mean(1)


# ---------------------------------------------------------------- the encoder and feature files


def test_load_photo_resizes_the_shorter_side_and_crops_the_centre(tmp_path: Path) -> None:
    from PIL import Image

    wide = np.zeros((100, 300, 3), dtype=np.uint8)
    wide[:, 100:200] = 255  # a white centre third
    Image.fromarray(wide).save(tmp_path / "wide.png")
    photo = load_photo(tmp_path / "wide.png")
    assert photo.shape == (3, 224, 224) and photo.dtype == torch.uint8
    # 100x300 -> 224x672, the centre 224 columns are the white third (edges blurred by resampling)
    assert photo[:, :, 5:-5].min() == 255
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="broken.jpg: not an image Pillow can read"):
        load_photo(tmp_path / "broken.jpg")


def test_encoder_features_are_deterministic_and_the_same_in_a_batch_as_alone(
    tmp_path: Path, encoder: ImageEncoder
) -> None:
    photos = torch.stack(
        [load_photo(write_photo(tmp_path / f"{i}.jpg", (260 + 40 * i, 224), i)) for i in range(3)]
    )
    regions, pooled = encoder(photos)
    assert regions.shape == (3, 49, 1280) and pooled.shape == (3, 1280)
    again, _ = encoder(photos)
    assert torch.equal(regions, again)  # two runs
    alone, alone_pooled = encoder(photos[1:2])
    torch.testing.assert_close(alone[0], regions[1], atol=1e-4, rtol=1e-4)  # batch vs alone
    torch.testing.assert_close(pooled, regions.mean(1))
    assert regions.min() >= 0 and regions.max() <= 6  # ReLU6 of the head
    with pytest.raises(ValueError, match=r"expected \(B, 3, 224, 224\) uint8"):
        encoder(photos.float())


@needs_flickr
@pytest.mark.parametrize("name", ["efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2"])
def test_the_pretrained_weights_are_real_a_dog_photo_is_a_dog(name: str) -> None:
    """ImageNet classes 151-268 are the dog breeds: random weights would not land there. Each
    encoder reads the photo at its native resolution and gives its own grid."""
    encoder = ImageEncoder(name)
    photo = load_photo(FLICKR / "Images" / DOG, encoder.image_size)[None]
    logits = encoder.classify(photo)
    assert 151 <= int(logits.argmax()) <= 268, logits.topk(5)
    assert encoder(photo)[0].shape == (1, encoder.grid**2, 1280)
    assert ImageEncoder.describe(name)["encoder"] == name
    with pytest.raises(ValueError, match=rf"expected \(B, 3, {encoder.image_size}, {encoder.image_size}\)"):
        encoder(load_photo(FLICKR / "Images" / DOG, 200)[None])


def test_an_unknown_image_encoder_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="image encoder: expected one of efficientnet-lite0, .*got 'vgg16'"):
        ImageEncoder("vgg16")
    with pytest.raises(ValueError, match="image encoder: expected one of"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", image_encoder="vgg16").validate()
    with pytest.raises(ValueError, match=r"num_regions=49: efficientnet-lite2 gives 9x9 = 81 regions"):
        CaptioningRecipe(
            data="flickr8k", flickr8k_dir="x", image_encoder="efficientnet-lite2", model={"num_regions": 49}
        ).validate()


def test_feature_files_are_resumable_and_never_mix_encoders(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for i in range(5):
        write_photo(images / f"p{i}.{'png' if i % 2 else 'jpg'}", (240, 200 + 10 * i), i)
    out = tmp_path / "features.safetensors"
    counting = CountingEncoder()
    first = extract_image_features(
        images,
        out,
        counting,
        names=["p0.jpg", "p1.png", "p2.jpg"],
        batch_size=2,
        chunk_size=2,
        progress=False,
    )
    assert first.names == ["p0.jpg", "p1.png", "p2.jpg"] and counting.seen == 3
    assert not (tmp_path / "features.safetensors.parts").exists()
    every = extract_image_features(
        images, out, counting, progress=False
    )  # the folder: only the 2 new ones run
    assert counting.seen == 5 and every.names == sorted(p.name for p in images.iterdir())
    torch.testing.assert_close(every.select(["p1.png"]), first.select(["p1.png"]))
    assert (
        every.regions.dtype == torch.float16 and load_image_features(out).description == counting.describe()
    )
    # a run killed after its first chunk: the finished chunk is kept and not computed again
    (tmp_path / "f2.safetensors.parts").mkdir()
    partial = extract_image_features(
        images,
        tmp_path / "f2.safetensors.parts" / "00000.safetensors",
        CountingEncoder(),
        names=["p3.png"],
        progress=False,
    )
    resumed = CountingEncoder()
    assert (
        len(extract_image_features(images, tmp_path / "f2.safetensors", resumed, progress=False).names) == 5
    )
    assert resumed.seen == 4 and partial.names == ["p3.png"]

    with pytest.raises(ValueError, match="features made by another encoder.*encoder differ"):
        extract_image_features(images, out, CountingEncoder("another"), progress=False)
    with pytest.raises(KeyError, match="1 of 2 images have no features"):
        every.select(["p0.jpg", "nope.jpg"])
    (images / "bad.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(ValueError, match="bad.jpg: not an image Pillow can read"):
        extract_image_features(images, out, counting, progress=False)
    with pytest.raises(FileNotFoundError, match="1 images not found"):
        extract_image_features(images, out, counting, names=["missing.jpg"], progress=False)
    (images / "bad.jpg").unlink()
    # a file and a leftover chunk holding the same photo (a kill between the write and the clean-up)
    leftover = tmp_path / "features.safetensors.parts"
    leftover.mkdir()
    extract_image_features(
        images, leftover / "00000.safetensors", CountingEncoder(), names=["p0.jpg"], progress=False
    )
    again = extract_image_features(images, out, counting, names=["p0.jpg"], progress=False)
    assert again.names.count("p0.jpg") == 1 and len(again.names) == 5 and not leftover.exists()
    (images / "sub").mkdir()
    write_photo(
        images / "sub" / "deep.jpg", (64, 64), 7
    )  # subfolders too, named as the caption loaders name them
    assert (
        "sub/deep.jpg"
        in extract_image_features(images, tmp_path / "sub.safetensors", counting, progress=False).names
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: no images to extract features from"):
        extract_image_features(tmp_path / "empty", tmp_path / "e.safetensors", counting, progress=False)
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.safetensors: cannot read image features"):
        load_image_features(tmp_path / "junk.safetensors")


def test_feature_files_refuse_another_image_folder_or_a_changed_photo(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    for folder in ("a", "b"):  # the same file names, other pictures
        (tmp_path / folder).mkdir()
        write_photo(tmp_path / folder / "x.jpg", (64, 48), ord(folder))
    out = tmp_path / "features.safetensors"
    first = extract_image_features(tmp_path / "a", out, CountingEncoder(), progress=False)
    with pytest.raises(ValueError, match=r"features of the photos in .*/a, not .*/b; .* another output file"):
        extract_image_features(tmp_path / "b", out, CountingEncoder(), progress=False)
    photo = tmp_path / "a" / "x.jpg"
    os.utime(photo, ns=(0, 123))  # touched (a copy, a checkout): the same bytes, so the same photo
    touched = CountingEncoder()
    extract_image_features(tmp_path / "a", out, touched, progress=False)
    assert touched.seen == 0
    data = bytearray(photo.read_bytes())
    data[len(data) // 2] ^= 0xFF  # replaced: the same size, other bytes, another time
    photo.write_bytes(bytes(data))
    os.utime(photo, ns=(0, 456))
    with pytest.raises(ValueError, match=r"1 photos changed .* \(first: \['x.jpg'\]\); delete .*features"):
        extract_image_features(tmp_path / "a", out, CountingEncoder(), progress=False)
    # a file from before photos were recorded still loads and is reused as it is
    with safe_open(str(out), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    del meta["photos"]
    save_file(tensors, str(out), metadata=meta)
    old = CountingEncoder()
    again = extract_image_features(tmp_path / "b", out, old, progress=False)
    assert old.seen == 0 and torch.equal(again.pooled, first.pooled)


def test_feature_files_reach_the_disk_before_the_rename_and_before_the_chunks_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file is flushed (fsync) under its temporary name, then renamed; the chunks are deleted
    only after the merged file was flushed and renamed, so a power cut never leaves only an empty file."""
    import scratchformer.data.image_features as image_features

    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        write_photo(images / f"p{i}.jpg", (64, 48), i)
    events: list[tuple[str, str]] = []
    fsync, replace, rmtree = os.fsync, os.replace, image_features.shutil.rmtree

    def logged_fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        fsync(fd)

    def logged_replace(src: str | Path, dst: str | Path) -> None:
        events.append(("replace", Path(src).name))
        replace(src, dst)

    def logged_rmtree(path: str | Path, *args: object, **kwargs: object) -> None:
        events.append(("rmtree", Path(path).name))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(image_features.os, "fsync", logged_fsync)
    monkeypatch.setattr(image_features.os, "replace", logged_replace)
    monkeypatch.setattr(image_features.shutil, "rmtree", logged_rmtree)
    extract_image_features(
        images, tmp_path / "f.safetensors", CountingEncoder(), chunk_size=2, progress=False
    )
    pid = os.getpid()
    assert events == [
        ("fsync", f"00000.safetensors.{pid}.tmp"),
        ("replace", f"00000.safetensors.{pid}.tmp"),
        ("fsync", f"00001.safetensors.{pid}.tmp"),
        ("replace", f"00001.safetensors.{pid}.tmp"),
        ("fsync", f"f.safetensors.{pid}.tmp"),
        ("replace", f"f.safetensors.{pid}.tmp"),
        ("rmtree", "f.safetensors.parts"),
    ]


# ---------------------------------------------------------------- loaders


def write_flickr_folder(root: Path, token_file: bool = False) -> Path:
    """Four images (one missing on disk) with captions (one empty) and train/dev split lists."""
    (root / "Images").mkdir(parents=True)
    for i in range(3):
        write_photo(root / "Images" / f"im{i}.jpg", (64, 48), i)
    rows = [
        ("im0.jpg", "A dog runs, fast ."),
        ("im0.jpg", "a dog running"),
        ("im1.jpg", "two cats"),
        ("im1.jpg", ""),
        ("im2.jpg", "a red car"),
        ("gone.jpg", "a missing photo"),
    ]
    if token_file:
        (root / "Flickr8k.token.txt").write_text("".join(f"{n}#{i}\t{c}\n" for i, (n, c) in enumerate(rows)))
    else:
        (root / "captions.txt").write_text("image,caption\n" + "".join(f'{n},"{c}"\n' for n, c in rows))
    (root / "Flickr_8k.trainImages.txt").write_text("im0.jpg\nim1.jpg\ngone.jpg\nno-captions.jpg\n")
    (root / "Flickr_8k.devImages.txt").write_text("im2.jpg\n")
    return root


@pytest.mark.parametrize("token_file", [False, True])
def test_flickr8k_loader_counts_every_row_it_leaves_out(tmp_path: Path, token_file: bool) -> None:
    root = write_flickr_folder(tmp_path / "f8", token_file)
    train = load_flickr8k(root, "train")
    assert train.names == ["im0.jpg", "im1.jpg"]
    assert train.references == [["A dog runs, fast .", "a dog running"], ["two cats"]]
    assert train.problems == {
        "empty caption": 1,
        "image file missing": 1,
        "image in the split list without captions": 1,
    }
    assert "left out: empty caption: 1, image file missing: 1" in train.report()
    assert load_flickr8k(root, "dev").names == ["im2.jpg"] and len(load_flickr8k(root, "all")) == 3
    with pytest.raises(FileNotFoundError, match="Flickr_8k.testImages.txt: the test split list is not there"):
        load_flickr8k(root, "test")
    with pytest.raises(ValueError, match="split: expected one of"):
        load_flickr8k(root, "valid")
    with pytest.raises(FileNotFoundError, match="not a Flickr8k folder"):
        load_flickr8k(tmp_path)


def test_karpathy_json_loader(tmp_path: Path) -> None:
    (tmp_path / "val2014").mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        write_photo(tmp_path / "val2014" / name, (32, 32), 0)
    images = [
        {
            "filepath": "val2014",
            "filename": "a.jpg",
            "split": "train",
            "sentences": [{"raw": "A cat."}, {"raw": " "}],
        },
        {"filepath": "val2014", "filename": "b.jpg", "split": "restval", "sentences": [{"raw": "a dog"}]},
        {"filepath": "val2014", "filename": "c.jpg", "split": "test", "sentences": [{"raw": "a bird"}]},
        {"filepath": "val2014", "filename": "gone.jpg", "split": "train", "sentences": [{"raw": "lost"}]},
    ]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    train = load_karpathy_json(path, tmp_path, "train")  # restval joins train, as customary
    assert train.names == ["val2014/a.jpg", "val2014/b.jpg"] and train.references == [["A cat."], ["a dog"]]
    assert train.problems == {"empty caption": 1, "image file missing": 1}
    assert load_karpathy_json(path, tmp_path, "test").references == [["a bird"]]
    with pytest.raises(ValueError, match="no images of split 'val'"):
        load_karpathy_json(path, tmp_path, "val")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json: not a Karpathy split JSON"):
        load_karpathy_json(tmp_path / "bad.json", tmp_path)


# ---------------------------------------------------------------- metrics and self-critical training


def test_caption_words_follow_coco_tokenisation() -> None:
    assert caption_words('A dog, in a T-shirt ("red") runs...') == [
        "a",
        "dog",
        "in",
        "a",
        "t-shirt",
        "red",
        "runs",
    ]
    assert caption_words("The dog's ball .") == ["the", "dog's", "ball"]
    # what the model writes (vocabulary words) is scored as the references are: a hyphenated word can match
    from scratchformer.data.captions import Vocabulary

    vocab = Vocabulary.build(["A man in a T-shirt, smiling ."])
    written = vocab.decode(vocab.encode("A man in a T-shirt, smiling ."))
    assert (
        "t-shirt" in written.split()
        and caption_scores([written], [["A man in a T-shirt, smiling ."]])["exact_match"] == 1
    )


def test_cider_d_reward_equals_pycocoevalcap() -> None:
    refs = [
        ["a dog runs on the grass .", "a brown dog is running", "the dog runs outside"],
        ["two men play soccer", "men are playing football on a field"],
        ["a child climbs stairs", "a girl"],
    ]
    hyps = ["a dog is running on grass", "two men men men playing soccer soccer", "a girl in a pink dress"]
    ours = CiderD(refs)
    mean = sum(ours.score(h, i) for i, h in enumerate(hyps)) / len(hyps)
    assert 100 * mean == pytest.approx(caption_scores(hyps, refs)["cider"], rel=1e-12)
    assert ours.score("a dog runs on the grass", 0) > ours.score("a dog", 0) > ours.score("two men", 0)


def features_model(**overrides) -> CaptioningTransformer:
    args = {
        "vocab_size": 12,
        "input": "features",
        "feature_dim": 8,
        "num_regions": 4,
        "d_model": 32,
        "num_heads": 2,
        "d_ff": 64,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "dropout": 0.0,
        "max_len": 8,
    }
    return CaptioningTransformer(CaptioningConfig(**{**args, **overrides}))


def test_several_captions_per_image_share_one_encoding() -> None:
    torch.manual_seed(0)
    model = features_model().eval()
    images, captions = torch.randn(2, 4, 8).half(), torch.randint(0, 12, (5, 6))
    together = model(images, captions, [2, 3])
    apart = torch.cat(
        [model(images[:1].expand(2, -1, -1), captions[:2]), model(images[1:].expand(3, -1, -1), captions[2:])]
    )
    torch.testing.assert_close(together, apart)
    with pytest.raises(ValueError, match="captions_per_image: sums to 4 for 2 images, but there are B'=5"):
        model(images, captions, [2, 2])
    with pytest.raises(ValueError, match="expected R=4 regions"):
        model(torch.randn(2, 3, 8), captions[:2])
    with pytest.raises(ValueError, match="last dim 8"):
        model(torch.randn(2, 4, 7), captions[:2])  # wrong feature width
    with pytest.raises(ValueError, match="captions_per_image: 3 counts for B=2 images"):
        model(images, captions, [2, 2, 1])
    with pytest.raises(ValueError, match="num_regions=49 applies to region features"):
        CaptioningConfig(vocab_size=12, input="pixels", num_regions=49)


def test_sampling_is_seeded_and_a_peaked_model_samples_its_argmax() -> None:
    torch.manual_seed(0)
    model = features_model().eval()
    images = torch.randn(3, 4, 8)

    def draw(seed, t=1.0):
        return sample_decode(
            model,
            images,
            bos_id=1,
            eos_id=2,
            num_samples=4,
            temperature=t,
            max_len_a=0,
            max_len_b=6,
            generator=torch.Generator().manual_seed(seed),
        )

    assert draw(0).shape[0] == 12 and torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    from scratchformer import greedy_decode

    greedy = greedy_decode(model, images, bos_id=1, eos_id=2, max_len_a=0, max_len_b=6)
    cold = draw(0, t=1e-4).view(3, 4, -1)
    for i in range(3):  # temperature -> 0 is greedy
        for j in range(4):
            row = cold[i, j][: greedy.shape[1]]
            assert torch.equal(row, greedy[i][: len(row)])


def test_self_critical_loss_reaches_every_decoder_weight() -> None:
    """Samples drawn, rewarded by CIDEr-D against the mean of the image's other samples, and the
    policy-gradient loss flows to the whole decoder."""
    from scratchformer.data.captions import Vocabulary

    torch.manual_seed(0)
    vocab = Vocabulary.build(["a dog runs", "a cat sits", "two birds fly"])
    train = CaptionExamples(torch.randn(3, 4, 8), [["a dog runs"], ["a cat sits"], ["two birds fly"]])
    model = features_model(vocab_size=len(vocab))
    task = SelfCriticalTask(vocab, train, train, model.config, 3, 0.0, {"beam_size": 1}, samples=4)
    torch.manual_seed(1)
    loss, tokens = task.loss(model, [(0, (0,)), (1, (0,)), (2, (0,))], torch.device("cpu"))
    assert torch.isfinite(loss) and tokens > 0
    loss.backward()
    assert all(p.grad is not None for p in model.decoder.parameters())
    with pytest.raises(ValueError, match="scst samples must be >= 2"):
        SelfCriticalTask(vocab, train, train, model.config, 3, 0.0, {}, samples=1)


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_self_critical_loss_is_the_papers_policy_gradient(baseline: str) -> None:
    """-(r(w^s) - b) log p(w^s) per token, with b the other samples' mean reward or the greedy
    caption's (Rennie et al. 2017), recomputed here from the same samples; without dropout the
    log-probabilities are the sampling policy's, so the loss is the same twice."""
    from scratchformer import greedy_decode
    from scratchformer.data.captions import Vocabulary

    vocab = Vocabulary.build(["a dog runs", "a cat sits", "two birds fly"])
    train = CaptionExamples(torch.randn(3, 4, 8), [["a dog runs"], ["a cat sits"], ["two birds fly"]])
    torch.manual_seed(0)
    model = features_model(vocab_size=len(vocab), dropout=0.5)
    task = SelfCriticalTask(
        vocab, train, train, model.config, 3, 0.0, {}, samples=3, baseline=baseline, dropout=False
    )
    batch = [(0, (0,)), (1, (0,)), (2, (0,))]
    torch.manual_seed(1)
    loss, _ = task.loss(model, batch, torch.device("cpu"))
    logged = task.train_metrics()  # what the trainer logs: this batch's mean reward and baseline
    assert task.train_metrics() == {}
    torch.manual_seed(1)
    assert task.loss(model, batch, torch.device("cpu"))[0].item() == pytest.approx(loss.item(), abs=1e-6)

    model.eval()
    limits = {"bos_id": 1, "eos_id": 2, "max_len_a": 0, "max_len_b": model.config.max_len - 1}
    torch.manual_seed(1)
    samples = sample_decode(model, train.inputs, num_samples=3, **limits)
    cider = CiderD(train.references)
    reward = [[cider.score(vocab.decode(samples[3 * i + j].tolist()), i) for j in range(3)] for i in range(3)]
    if baseline == "greedy":
        greedy = greedy_decode(model, train.inputs, **limits)
        base = [[cider.score(vocab.decode(greedy[i].tolist()), i)] * 3 for i in range(3)]
    else:
        base = [[(sum(r) - r[j]) / 2 for j in range(3)] for r in reward]
    tgt_in = torch.cat([torch.full_like(samples[:, :1], 1), samples[:, :-1]], dim=1)
    log_p = model(train.inputs, tgt_in, 3).log_softmax(-1).gather(-1, samples[..., None])[..., 0]
    real = samples != 0
    advantage = torch.tensor([r - b for rs, bs in zip(reward, base) for r, b in zip(rs, bs)])
    expected = -(advantage[:, None] * log_p * real).sum() / real.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert logged["reward"] == pytest.approx(sum(map(sum, reward)) / 9)
    assert logged["baseline"] == pytest.approx(sum(map(sum, base)) / 9)
    assert model.training is False  # the test's own eval(); the task leaves the model training
    task.dropout = True  # the same samples (same seed), scored through dropout: another loss
    model.train()
    torch.manual_seed(1)
    assert task.loss(model, batch, torch.device("cpu"))[0].item() != pytest.approx(loss.item(), abs=1e-6)
    assert model.training


# ---------------------------------------------------------------- recipe, training, CLI


def photo_recipe(tmp_path: Path, root: Path, **changes) -> CaptioningRecipe:
    return CaptioningRecipe(
        **{
            "data": "flickr8k",
            "flickr8k_dir": str(root),
            "features": str(tmp_path / "features.safetensors"),
            "splits": {"train": "train", "valid": "dev"},
            "batch_size": 4,
            "captions_per_image": 2,
            "label_smoothing": 0.0,
            "model": {
                "d_model": 64,
                "num_heads": 2,
                "d_ff": 128,
                "num_encoder_layers": 1,
                "num_decoder_layers": 1,
                "num_regions": 49,
                "dropout": 0.0,
                "max_len": 16,
            },
            "decoding": {"beam_size": 2},
            "train": TrainConfig(
                out_dir=str(tmp_path / "run"),
                max_steps=120,
                lr=3e-3,
                warmup_steps=10,
                eval_every=120,
                best_metric="cider",
                best_mode="max",
                progress=False,
                device="cpu",
            ),
            **changes,
        }
    )


@needs_flickr
def test_a_few_real_photos_are_learned_to_exact_match(tmp_path: Path) -> None:
    """Four shared-data photos, one caption each, through the real encoder: memorised in seconds."""
    root = tmp_path / "f8"
    (root / "Images").mkdir(parents=True)
    corpus = load_flickr8k(FLICKR, "train")
    rows = []
    for name, refs in list(zip(corpus.names, corpus.references))[:4]:
        (root / "Images" / name).symlink_to(FLICKR / "Images" / name)
        rows.append(f'{name},"{refs[0]}"')
    (root / "captions.txt").write_text("image,caption\n" + "\n".join(rows) + "\n")
    names = "\n".join(corpus.names[:4]) + "\n"
    (root / "Flickr_8k.trainImages.txt").write_text(names)
    (root / "Flickr_8k.devImages.txt").write_text(names)
    report = train_captioner(photo_recipe(tmp_path, root, captions_per_image=1))
    assert report["best_valid"]["exact_match"] == 1.0, report["best_valid"]
    assert report["valid"]["valid"]["beam2"]["exact_match"] == 1.0
    assert (tmp_path / "run" / "valid_attention.png").stat().st_size > 0
    assert (tmp_path / "run" / "valid_examples.png").stat().st_size > 0


def test_photo_recipe_scst_and_the_cli_end_to_end(tmp_path: Path, capsys) -> None:
    root = write_flickr_folder(tmp_path / "f8")
    recipe = photo_recipe(
        tmp_path,
        root,
        scst={"steps": 4, "lr": 1e-4, "samples": 2, "eval_every": 2},
        train=TrainConfig(
            out_dir=str(tmp_path / "run"),
            max_steps=6,
            eval_every=3,
            progress=False,
            best_metric="cider",
            best_mode="max",
            device="cpu",
        ),
    )
    report = train_captioner(recipe)
    assert set(report["best_valid"]) == {"xe", "scst"} and report["valid"]["valid"]["greedy"]["n"] == 1
    assert "image features" not in capsys.readouterr().err  # progress=False (--no-progress) silences it too
    assert (tmp_path / "run" / "scst" / "best" / "config.json").is_file()
    with pytest.raises(FileExistsError, match="holds an earlier run"):  # checked before any work
        train_captioner(recipe)
    recipe.train.overwrite = True  # replaces both phases
    assert set(train_captioner(recipe)["best_valid"]) == {"xe", "scst"}
    checkpoint = str(tmp_path / "run" / "scst" / "best")
    assert json.loads((Path(checkpoint) / "config.json").read_text())["photos"]["memory"] == "regions"

    # any photo, any size and format: resized, cropped, encoded, captioned; attention over 7 x 7
    photo = write_photo(tmp_path / "photo.png", (500, 333), 9)
    assert (
        main(
            ["caption", "--checkpoint", checkpoint, str(photo), "--attention-png", str(tmp_path / "att.png")]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith(f"{photo}\t")
    assert (tmp_path / "att.png").stat().st_size > 0
    (tmp_path / "broken.jpg").write_bytes(b"nope")
    capsys.readouterr()
    assert (
        main(["caption", "--checkpoint", checkpoint, str(tmp_path / "broken.jpg")]) == 2
    )  # bad input: one line, exit 2
    assert re.search("broken.jpg: not an image Pillow can read", capsys.readouterr().err)

    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                checkpoint,
                "--flickr8k",
                str(root),
                "--split",
                "dev",
                "--json",
                "--features",
                str(tmp_path / "eval.safetensors"),
            ]
        )
        == 0
    )
    scores = json.loads(capsys.readouterr().out)
    assert scores["n"] == 1 and {"bleu1", "bleu4", "cider"} <= set(scores)

    assert (
        main(
            [
                "features",
                "--images",
                str(root / "Images"),
                "--out",
                str(tmp_path / "cli.safetensors"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert "3 images, regions (3, 49, 1280)" in capsys.readouterr().out
    # features of another encoder are refused by the recipe
    extract_image_features(root / "Images", tmp_path / "other.safetensors", CountingEncoder(), progress=False)
    with pytest.raises(ValueError, match="features made by another encoder"):
        train_captioner(
            photo_recipe(
                tmp_path,
                root,
                features=str(tmp_path / "other.safetensors"),
                train=TrainConfig(out_dir=str(tmp_path / "run2"), max_steps=1, progress=False),
            )
        )


@pytest.mark.machine  # the same answers whatever the machine's precision choice
def test_caption_and_evaluate_take_an_ensemble_of_checkpoints(tmp_path: Path, capsys) -> None:
    """``--checkpoint A --checkpoint B``: one checkpoint twice is that checkpoint (captions, scores
    and log-probabilities), two are their ensemble; what cannot ensemble is refused by name."""
    from scratchformer.tasks.captioning.ensemble import EnsembleCaptioner, load_ensemble

    root = write_flickr_folder(tmp_path / "f8")
    runs, grid = [], {"beam_size": [1, 2], "no_repeat_ngram_size": [0, 2]}
    for seed in (0, 1):
        train = TrainConfig(out_dir=str(tmp_path / f"run{seed}"), max_steps=8, eval_every=8, progress=False)
        train.seed, train.device, train.lr = seed, "cpu", 3e-3
        report = train_captioner(
            photo_recipe(tmp_path, root, train=train, decoding_grid=grid if seed else {})
        )
        runs.append(str(tmp_path / f"run{seed}" / "best"))
    # seed 1 chose its decoding on the validation split: the highest CIDEr-D of the four, now its own
    trials = report["decoding_search"]
    assert len(trials) == 4 and {(t["beam_size"], t["no_repeat_ngram_size"]) for t in trials} == {
        (1, 0),
        (1, 2),
        (2, 0),
        (2, 2),
    }
    best = max(trials, key=lambda t: t["cider"])
    assert report["decoding"]["beam_size"] == best["beam_size"] and best["cider"] == max(
        t["cider"] for t in trials
    )
    assert json.loads((Path(runs[1]) / "config.json").read_text())["decoding"] == report["decoding"]
    photo = str(write_photo(tmp_path / "photo.png", (300, 200), 5))

    def caption(*checkpoints: str) -> dict:
        capsys.readouterr()
        flags = [x for c in checkpoints for x in ("--checkpoint", c)]
        assert main(["caption", *flags, photo, "--json", "--nbest", "2"]) == 0
        return json.loads(capsys.readouterr().out)

    def evaluate(*checkpoints: str) -> dict:
        capsys.readouterr()
        flags = [x for c in checkpoints for x in ("--checkpoint", c)]
        assert main(["evaluate", *flags, "--flickr8k", str(root), "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    one, twice, both = caption(runs[0]), caption(runs[0], runs[0]), caption(*runs)
    assert [n["text"] for n in twice["nbest"]] == [n["text"] for n in one["nbest"]]
    assert [n["score"] for n in twice["nbest"]] == pytest.approx([n["score"] for n in one["nbest"]], abs=1e-5)
    assert both["generated_text"] and both["nbest"] != one["nbest"]
    assert evaluate(runs[0], runs[0]) == pytest.approx(evaluate(runs[0]))
    assert evaluate(*runs)["n"] == 1

    # the Python API: an ensemble's captions are the members' mean log-probabilities
    a, b = load_ensemble(runs[:1]), load_ensemble(runs[1:])
    ensemble = load_ensemble(runs)
    assert isinstance(ensemble, EnsembleCaptioner) and ensemble.shared_input
    features, _ = ensemble.photo_features([photo])
    words = torch.tensor([[1, 4]])
    mean = (a.model(features, words).log_softmax(-1) + b.model(features, words).log_softmax(-1)) / 2
    torch.testing.assert_close(ensemble.model(features, words), mean)

    capsys.readouterr()
    att = str(tmp_path / "att.png")
    assert (
        main(["caption", "--checkpoint", runs[0], "--checkpoint", runs[1], photo, "--attention-png", att])
        == 2
    )
    assert "--attention-png draws one model's attention" in capsys.readouterr().err
    with pytest.raises(ValueError, match="attention maps are one model's"):  # the Python API says so too
        ensemble.plot_attention(features[0], tmp_path / "att.png")
    b.vocab.words.append("zebra")  # another vocabulary
    with pytest.raises(ValueError, match="ensemble member 2 has another caption vocabulary"):
        EnsembleCaptioner([a, b])


def test_recipe_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data 'flickr8k' needs flickr8k_dir"):
        CaptioningRecipe(data="flickr8k").validate()
    with pytest.raises(ValueError, match="memory: expected 'regions' or 'pooled'"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", memory="grid").validate()
    with pytest.raises(ValueError, match="scst: expected"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", scst={"steps": 0}).validate()
    with pytest.raises(ValueError, match="decoding: unknown key 'max_len_a'"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", decoding_grid={"max_len_a": [1.0]}).validate()
    with pytest.raises(ValueError, match="decoding_grid.beam_size: expected a non-empty list"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", decoding_grid={"beam_size": 3}).validate()
    with pytest.raises(ValueError, match="scst.baseline: expected 'mean' or 'greedy'"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", scst={"steps": 1, "baseline": "max"}).validate()
    with pytest.raises(ValueError, match="scst.dropout: expected true or false"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", scst={"steps": 1, "dropout": "no"}).validate()
    with pytest.raises(ValueError, match="captions_per_image"):
        CaptioningRecipe(data="flickr8k", flickr8k_dir="x", captions_per_image=0).validate()
    with pytest.raises(ValueError, match="model.num_regions: the pooled memory is one vector"):
        CaptioningRecipe(
            data="flickr8k", flickr8k_dir="x", memory="pooled", model={"num_regions": 49}
        ).validate()
    with pytest.raises(ValueError, match="splits.test: expected a split name or a list"):
        CaptioningRecipe(
            data="flickr8k", flickr8k_dir="x", splits={"train": "train", "valid": "dev", "test": 3}
        ).validate()


def test_committed_flickr8k_recipe_is_valid() -> None:
    recipe = CaptioningRecipe.from_json(Path(__file__).resolve().parents[2] / "recipes" / "flickr8k.json")
    assert recipe.data == "flickr8k" and recipe.memory == "regions" and recipe.captions_per_image == 5


def test_the_recipe_is_the_frozen_one_with_the_encoders_top_tuned() -> None:
    """recipes/flickr8k.json differs from recipes/flickr8k_frozen.json (the recipe before issue 56)
    only where it fine-tunes the encoder's top (three stages) and keeps it during self-critical training."""
    recipes = Path(__file__).resolve().parents[2] / "recipes"
    frozen = json.loads((recipes / "flickr8k_frozen.json").read_text())
    tuned = json.loads((recipes / "flickr8k.json").read_text())
    assert tuned.pop("finetune") == {"stages": 3, "lr": 5e-5} and tuned["scst"].pop("tune_top") is False
    assert tuned["train"].pop("out_dir") == "runs/flickr8k"
    assert frozen["train"].pop("out_dir") == "runs/flickr8k-frozen" and tuned == frozen
    CaptioningRecipe.from_json(recipes / "flickr8k_frozen.json").validate()
