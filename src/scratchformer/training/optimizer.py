"""The optimizer: AdamW, weight decay on weight matrices only, and one step through fp16's GradScaler."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scratchformer.training.config import TrainConfig

__all__ = ["adamw", "optimizer_step", "param_groups"]

FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # torch's fused AdamW kernel (one pass over all parameters) runs there


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay weight matrices and embeddings (dim >= 2); never biases or LayerNorm gains."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters as ``config`` says (fused where torch has the kernel)."""
    return torch.optim.AdamW(
        param_groups(model, config.weight_decay),
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
