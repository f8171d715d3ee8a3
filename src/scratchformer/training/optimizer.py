"""The optimizer: AdamW, weight decay on weight matrices only, and one step through fp16's GradScaler."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scratchformer.training.config import TrainConfig

__all__ = ["adamw", "optimizer_step", "param_groups"]

FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # torch's fused AdamW kernel (one pass over all parameters) runs there


def param_groups(
    model: nn.Module, weight_decay: float, lr_groups: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Decay weight matrices and embeddings (dim >= 2); never biases or LayerNorm gains. Parameters
    whose name starts with a key of ``lr_groups`` form groups of their own with that ``lr`` (the
    first prefix that matches); the others come first. A key that names no parameter is an error."""
    prefixes = list(lr_groups or {})
    groups: dict[tuple[str | None, bool], list[nn.Parameter]] = {
        (prefix, decay): [] for prefix in [None, *prefixes] for decay in (True, False)
    }
    for name, p in model.named_parameters():
        if p.requires_grad:
            prefix = next((k for k in prefixes if name.startswith(k)), None)
            groups[prefix, p.dim() >= 2].append(p)
    unused = [k for k in prefixes if not groups[k, True] and not groups[k, False]]
    if unused:
        raise ValueError(
            f"lr_groups: no trainable parameter's name starts with {', '.join(map(repr, unused))}"
        )
    return [
        {
            "params": params,
            "weight_decay": weight_decay if decay else 0.0,
            **({"lr": lr_groups[prefix]} if prefix is not None and lr_groups else {}),
        }
        for (prefix, decay), params in groups.items()
        if params or prefix is None
    ]


def adamw(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters as ``config`` says (fused where torch has the kernel)."""
    return torch.optim.AdamW(
        param_groups(model, config.weight_decay, config.lr_groups),
        lr=config.lr,
        betas=config.betas,
        eps=config.adam_eps,
        fused=device.type in FUSED_ADAMW_DEVICES,
    )


def optimizer_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """One optimizer step through the GradScaler (a plain step when it is disabled), then zero the
    gradients. Returns whether the scaler skipped it: inf/NaN gradients (fp16 overflow, or its
    first calibration steps) make it lower the scale and leave the weights unchanged."""
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return scale is not None and scaler.get_scale() < scale
