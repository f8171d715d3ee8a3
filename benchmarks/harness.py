"""Timing: implementations interleaved round by round in one process, warm-up first, medians.

A :class:`Case` is one implementation of one row of the table. The cases of a :class:`Group` are
timed together: in every round each case runs once (in a rotated order, so none always follows
the same neighbour), so a slow spell of a noisy machine hits all of them alike and the ratios
between them stay meaningful even when the absolute times do not. The same loop, without the
table's rows, is :func:`interleaved_times` (and :func:`interleaved_medians`): the one-off timing
scripts beside the suite (``decoding_speed``, ``compare_release``, ``fast_path_micro``) use it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
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


def interleaved_times(
    fns: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    device: torch.device | None = None,
    warmup_fns: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each timed call of each function: ``warmup`` untimed rounds, then ``repeats`` timed
    ones; in every round each function runs once, the order rotated by one each round (so none always
    follows the same neighbour). ``device``: a CUDA device is synchronized around every call.
    ``warmup_fns``: run instead of a function in the warm-up rounds (a shorter version of a slow one)."""
    names, extra = list(fns), warmup_fns or {}
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + repeats):
        shift = round_ % len(names)
        timed = round_ >= warmup
        for name in names[shift:] + names[:shift]:
            fn = fns[name] if timed else extra.get(name, fns[name])
            if device is not None:
                synchronize(device)
            start = time.perf_counter()
            fn()
            if device is not None:
                synchronize(device)
            if timed:
                times[name].append(time.perf_counter() - start)
    return times


def interleaved_medians(
    fns: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1, device: torch.device | None = None
) -> dict[str, float]:
    """The median seconds per call of each function, timed by :func:`interleaved_times`."""
    return {name: statistics.median(t) for name, t in interleaved_times(fns, repeats, warmup, device).items()}


def run_group(group: Group, device: torch.device, log: Callable[[str], None] = print) -> None:
    """Time every case of ``group``, interleaved (:func:`interleaved_times`); fills each case's
    ``times``."""
    cases = {str(i): case for i, case in enumerate(group.cases)}
    times = interleaved_times(
        {i: case.fn for i, case in cases.items()},
        group.repeats,
        group.warmup,
        device,
        {i: case.warmup_fn for i, case in cases.items() if case.warmup_fn is not None},
    )
    for i, case in cases.items():
        case.times.extend(times[i])
    for case in group.cases:
        log(
            f"  {case.row:<26} {case.impl:<44} median {case.median * 1e3:9.2f} ms "
            f"(min {min(case.times) * 1e3:.2f}, max {max(case.times) * 1e3:.2f})"
        )
