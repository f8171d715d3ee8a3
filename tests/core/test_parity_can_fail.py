"""The parity checks are sharp: each classic mistake of from-scratch write-ups breaks them.

Each test builds a correct pair (ours == torch.nn within 1e-5), then introduces one mistake on
our side and requires the difference to jump far above the tolerance.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from helpers import TOL, copy_into_reference, encoder_layer_pairing, max_diff, random_padding, randomize_norms
from test_attention_parity import make_pair
from torch import nn

import scratchformer as sf

BROKEN = 1e-3  # a mistake must move the output by far more than TOL
D, H = 32, 4


def attention_diff(ours, ref, kpm_for_ours=None, kpm=None) -> float:
    gen = torch.Generator().manual_seed(11)
    q, kv = torch.randn(3, 6, D, generator=gen), torch.randn(3, 9, D, generator=gen)
    kpm = random_padding(3, 9, gen) if kpm is None else kpm
    out, _ = ours(q, kv, kv, key_padding_mask=kpm if kpm_for_ours is None else kpm_for_ours)
    ref_out, _ = ref(q, kv, kv, key_padding_mask=~kpm)
    return max_diff(out, ref_out)


def test_correct_attention_passes() -> None:
    ours, ref, _ = make_pair()
    assert attention_diff(ours, ref) <= TOL


def test_swapped_projection_fails() -> None:
    ours, ref, _ = make_pair()
    with torch.no_grad():
        w_q, w_k = ours.qkv_proj.weight[:D], ours.qkv_proj.weight[D : 2 * D]  # W^Q, W^K
        w_q_copy = w_q.clone()
        w_q.copy_(w_k)
        w_k.copy_(w_q_copy)
    assert attention_diff(ours, ref) > BROKEN


def test_one_shared_per_head_projection_fails() -> None:
    """The write-up mistake: one d_k x d_k map applied to every head instead of a full D x D W^Q."""
    ours, ref, _ = make_pair()
    with torch.no_grad():
        d_k = D // H
        w_q = ours.qkv_proj.weight[:D]  # W^Q
        shared = w_q[:d_k, :d_k].clone()
        w_q.copy_(torch.block_diag(*[shared] * H))
    assert attention_diff(ours, ref) > BROKEN


def test_inverted_mask_polarity_fails() -> None:
    ours, ref, _ = make_pair()
    kpm = random_padding(3, 9, torch.Generator().manual_seed(11))
    kpm[:, 0] = True
    kpm[:, -1] = False  # every row has both real and padded keys
    assert attention_diff(ours, ref, kpm=kpm) <= TOL
    assert attention_diff(ours, ref, kpm_for_ours=~kpm, kpm=kpm) > BROKEN


def test_wrong_scaling_fails() -> None:
    ours, ref, _ = make_pair()
    ours.scale = 1.0  # forgot the 1 / sqrt(d_k)
    assert attention_diff(ours, ref) > BROKEN
    ours.scale = 1.0 / D**0.5  # 1 / sqrt(D) instead of 1 / sqrt(d_k)
    assert attention_diff(ours, ref) > BROKEN


def test_wrong_norm_placement_fails() -> None:
    x = torch.randn(3, 8, D, generator=torch.Generator().manual_seed(4))
    for norm_first in (False, True):
        torch.manual_seed(0)
        ref = nn.TransformerEncoderLayer(
            D, H, 64, dropout=0.0, norm_first=norm_first, batch_first=True
        ).eval()
        good = sf.EncoderLayer(D, H, 64, dropout=0.0, norm_first=norm_first).eval()
        bad = sf.EncoderLayer(D, H, 64, dropout=0.0, norm_first=not norm_first).eval()
        randomize_norms(good)
        bad.load_state_dict(good.state_dict())
        copy_into_reference(encoder_layer_pairing(good, ref))
        assert max_diff(good(x), ref(x)) <= TOL
        assert max_diff(bad(x), ref(x)) > BROKEN


FORBIDDEN = {
    "MultiheadAttention",
    "Transformer",
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "LayerNorm",
    "layer_norm",
    "multi_head_attention_forward",
}


# the one exception: the fast path's LayerNorm runs ATen's fused kernel (the core one, which it is
# tested equal to, stays written out)
ALLOWED = {("fast/layer_norm.py", "layer_norm")}


def test_model_code_uses_no_torch_transformer_modules() -> None:
    """torch.nn's Transformer pieces appear only in the tests, as the reference."""
    package = Path(sf.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        where = path.relative_to(package).as_posix()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in FORBIDDEN
                and (where, node.attr) not in ALLOWED
            ):
                base = ast.unparse(node.value)
                if base.split(".")[0] in {"nn", "torch", "F", "functional"}:
                    offenders.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                offenders += [
                    f"{path.name}:{node.lineno} import {a.name}" for a in node.names if a.name in FORBIDDEN
                ]
    assert not offenders, offenders
