"""A captioning benchmark that needs no download: rendered scenes of coloured shapes.

Each image (3 x 64 x 64, uint8) shows one to three shapes (circle, square, triangle) in one of five
colours and two sizes. Two shapes stand side by side or one above the other; three stand in a row.
Every scene has four reference captions in varied English, e.g.

    a small red circle to the left of a large blue square
    a large blue square with a small red circle on its left

A seeded split holds out colour-shape combinations (e.g. "green triangle"): no training scene
contains them, and the ``test_heldout`` split has at least one in every scene. A model that scores
well there has learnt colour and shape separately and composes them (compositional
generalisation), rather than remembering the combinations it saw. ``test_seen`` is drawn like the
training scenes, for comparison.

    splits = shape_scene_splits(seed=0)           # {"train", "valid", "test_seen", "test_heldout"}
    splits["train"].images                        # (N, 3, 64, 64) uint8
    splits["train"].references[0]                 # the four captions of image 0
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from scratchformer.data.captions import CaptionExamples

__all__ = [
    "COLOURS",
    "SHAPES",
    "SIZES",
    "Shape",
    "held_out_pairs",
    "render_scene",
    "sample_scene",
    "scene_captions",
    "shape_scene_splits",
]

COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 85, 225),
    "yellow": (235, 200, 35),
    "purple": (145, 60, 185),
}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 5, "large": 9}  # half-width in pixels
IMAGE_SIZE = 64


@dataclass(frozen=True)
class Shape:
    colour: str
    shape: str
    size: str
    x: int  # centre, pixels from the left
    y: int  # centre, pixels from the top

    def words(self) -> str:
        return f"{self.size} {self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    shapes: tuple[Shape, ...]  # left to right (row) or top to bottom (vertical pair)
    layout: str  # "single", "horizontal", "vertical" or "row"


def held_out_pairs(seed: int) -> set[tuple[str, str]]:
    """Three (colour, shape) pairs never seen in training: one per shape, three different colours."""
    colours = sorted(COLOURS)
    random.Random(seed).shuffle(colours)
    return set(zip(colours, SHAPES))


def sample_scene(
    rng: random.Random,
    allowed: set[tuple[str, str]] | None = None,
    required: set[tuple[str, str]] | None = None,
) -> Scene:
    """A random scene whose (colour, shape) pairs all lie in ``allowed`` (None: any); with
    ``required``, one random object is drawn from those pairs instead."""
    pairs = [(c, s) for c in COLOURS for s in SHAPES if allowed is None or (c, s) in allowed]
    layout = rng.choices(["single", "horizontal", "vertical", "row"], weights=[2, 3, 3, 2])[0]
    n = {"single": 1, "horizontal": 2, "vertical": 2, "row": 3}[layout]
    chosen = [rng.choice(pairs) for _ in range(n)]
    if required:
        chosen[rng.randrange(n)] = rng.choice(sorted(required))
    sizes = [rng.choice(list(SIZES)) for _ in range(n)]

    def jitter(centre: int, spread: int) -> int:
        return centre + rng.randint(-spread, spread)

    if layout == "single":
        centres = [(jitter(32, 14), jitter(32, 14))]
    elif layout == "horizontal":
        y = jitter(32, 12)
        centres = [(jitter(17, 5), jitter(y, 3)), (jitter(47, 5), jitter(y, 3))]
    elif layout == "vertical":
        x = jitter(32, 12)
        centres = [(jitter(x, 3), jitter(17, 5)), (jitter(x, 3), jitter(47, 5))]
    else:
        y = jitter(32, 14)
        centres = [
            (jitter(11, 1), jitter(y, 3)),
            (jitter(32, 1), jitter(y, 3)),
            (jitter(53, 1), jitter(y, 3)),
        ]
    shapes = tuple(Shape(c, s, z, x, y) for (c, s), z, (x, y) in zip(chosen, sizes, centres))
    return Scene(shapes, layout)


def scene_captions(scene: Scene) -> list[str]:
    """The four reference captions of a scene (lower case, words and punctuation space-separated)."""
    o = [s.words() for s in scene.shapes]
    if scene.layout == "single":
        return [f"a {o[0]}", f"there is a {o[0]}", f"a single {o[0]}", f"one {o[0]} on its own"]
    if scene.layout == "horizontal":
        return [
            f"a {o[0]} to the left of a {o[1]}",
            f"a {o[1]} to the right of a {o[0]}",
            f"a {o[0]} with a {o[1]} on its right",
            f"a {o[1]} with a {o[0]} on its left",
        ]
    if scene.layout == "vertical":
        return [
            f"a {o[0]} above a {o[1]}",
            f"a {o[1]} below a {o[0]}",
            f"a {o[0]} on top of a {o[1]}",
            f"a {o[1]} under a {o[0]}",
        ]
    return [
        f"a {o[0]} , a {o[1]} and a {o[2]} from left to right",
        f"from left to right : a {o[0]} , a {o[1]} and a {o[2]}",
        f"a {o[2]} , a {o[1]} and a {o[0]} from right to left",
        f"a {o[1]} between a {o[0]} on the left and a {o[2]} on the right",
    ]


_YY, _XX = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]


def _mask(shape: Shape) -> np.ndarray:
    r, dx, dy = SIZES[shape.size], _XX - shape.x, _YY - shape.y
    if shape.shape == "circle":
        return dx**2 + dy**2 <= r**2
    if shape.shape == "square":
        side = round(r * 0.9)  # about the circle's area
        return (np.abs(dx) <= side) & (np.abs(dy) <= side)
    # triangle, apex up: the half-width grows from 0 at the top to r at the bottom
    return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2 * 1.15)


def render_scene(scene: Scene, rng: random.Random) -> np.ndarray:
    """(3, 64, 64) uint8: a light, slightly tinted background; each colour slightly jittered."""
    background = np.array([rng.randint(225, 250) for _ in range(3)], dtype=np.float32)
    image = np.broadcast_to(background[:, None, None], (3, IMAGE_SIZE, IMAGE_SIZE)).copy()
    for shape in scene.shapes:
        colour = np.array(
            [min(255, max(0, v + rng.randint(-20, 20))) for v in COLOURS[shape.colour]], np.float32
        )
        image[:, _mask(shape)] = colour[:, None]
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, 4.0, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8)


def _examples(
    n: int, rng: random.Random, allowed: set[tuple[str, str]] | None, required: set[tuple[str, str]] | None
) -> CaptionExamples:
    scenes = [sample_scene(rng, allowed, required) for _ in range(n)]
    images = (
        np.stack([render_scene(s, rng) for s in scenes]) if scenes else np.zeros((0, 3, 64, 64), np.uint8)
    )
    return CaptionExamples(torch.from_numpy(images), [scene_captions(s) for s in scenes])


def shape_scene_splits(
    seed: int = 0, train_size: int = 20000, valid_size: int = 500, test_size: int = 1000
) -> dict[str, CaptionExamples]:
    """The four splits, deterministic given the arguments. Held-out pairs: :func:`held_out_pairs`.

    Args:
        seed: picks the held-out colour-shape pairs and draws every scene.
        train_size: training scenes.
        valid_size: validation scenes (drawn like the training ones).
        test_size: scenes of each test split, ``test_seen`` and ``test_heldout``.
    """
    held_out = held_out_pairs(seed)
    seen = {(c, s) for c in COLOURS for s in SHAPES} - held_out
    return {
        "train": _examples(train_size, random.Random(f"{seed}-train"), seen, None),
        "valid": _examples(valid_size, random.Random(f"{seed}-valid"), seen, None),
        "test_seen": _examples(test_size, random.Random(f"{seed}-test_seen"), seen, None),
        "test_heldout": _examples(test_size, random.Random(f"{seed}-test_heldout"), None, held_out),
    }
