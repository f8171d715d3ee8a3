"""Timing: implementations interleaved round by round in one process, warm-up first, medians.

A :class:`Case` is one implementation of one row of the table. The cases of a :class:`Group` are
timed together: in every round each case runs once (in a rotated order, so none always follows
the same neighbour), so a slow spell of a noisy machine hits all of them alike and the ratios
between them stay meaningful even when the absolute times do not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Case:
    """One implementation of one row.

    Attributes:
        row: the row it belongs to, e.g. "encoder inference B32xT128".
        impl: the implementation, e.g. "scratchformer" or "torch.nn fast path".
        fn: runs it once (the timed call).
        tokens: tokens processed per call (real tokens only; new tokens for decoding).
        flops: useful floating-point operations per call (0: not counted).
        references: the ``impl`` of each case of the same row this one is compared with.
        precision: "fp32" or "bf16": which measured matmul peak its % of peak is against.
        warmup_fn: run instead of ``fn`` in the warm-up rounds (a shorter version of a slow case).
    """

    row: str
    impl: str
    fn: Callable[[], object]
    tokens: int
    flops: float = 0.0
    references: tuple[str, ...] = ()
    precision: str = "fp32"
    warmup_fn: Callable[[], object] | None = None
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.median

    @property
    def gflops(self) -> float:
        return self.flops / self.median / 1e9


@dataclass
class Group:
    """Cases timed together, interleaved; ``warmup`` untimed rounds, then ``repeats`` timed ones.
    ``precision``: "fp32" or "bf16" for a group run in one precision ("": its cases say)."""

    name: str
    cases: list[Case]
    repeats: int = 5
    warmup: int = 1
    note: str = ""
    precision: str = ""

    @property
    def title(self) -> str:
        return f"{self.name}, {self.precision}" if self.precision else self.name


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_group(group: Group, device: torch.device, log: Callable[[str], None] = print) -> None:
    """Time every case of ``group``, interleaved; fills each case's ``times``."""
    cases = group.cases
    for round_ in range(group.warmup + group.repeats):
        shift = round_ % len(cases)
        for case in cases[shift:] + cases[:shift]:
            synchronize(device)
            timed = round_ >= group.warmup
            fn = case.fn if timed or case.warmup_fn is None else case.warmup_fn
            start = time.perf_counter()
            fn()
            synchronize(device)
            if timed:
                case.times.append(time.perf_counter() - start)
    for case in cases:
        log(
            f"  {case.row:<26} {case.impl:<44} median {case.median * 1e3:9.2f} ms "
            f"(min {min(case.times) * 1e3:.2f}, max {max(case.times) * 1e3:.2f})"
        )
