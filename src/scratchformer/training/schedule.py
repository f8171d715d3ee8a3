"""Learning-rate schedules: linear warm-up, then cosine, inverse-sqrt (the paper's), linear or constant.

Each is a multiplier of the peak learning rate, a function of the optimizer step (0-based).
The paper's schedule, lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), is
"inverse_sqrt" with peak lr = (d_model * warmup)^-0.5.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["SCHEDULES", "lr_multiplier"]

SCHEDULES = ("cosine", "inverse_sqrt", "linear", "constant")


def lr_multiplier(
    kind: str, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): warm-up from ~0 to 1 over
    ``warmup_steps``, then decay ``kind`` towards ``min_ratio`` at ``total_steps``."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {kind!r}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps}, {total_steps}")

    def multiplier(step: int) -> float:
        n = step + 1
        if n <= warmup_steps:
            return n / warmup_steps
        if kind == "constant":
            return 1.0
        if kind == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / n)
        progress = min(1.0, (n - warmup_steps) / max(1, total_steps - warmup_steps))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
        return min_ratio + (1 - min_ratio) * decay

    return multiplier
