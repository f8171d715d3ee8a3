"""CI runs the kernel-sensitive tests twice: once as they are, once under the other machine kind's
kernels (.ci/run). The list of those tests (tests/conftest.py) names no file that is gone, and the
second pass is really there."""

from __future__ import annotations

from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_every_kernel_sensitive_pattern_names_test_files() -> None:
    for pattern in conftest.KERNEL_SENSITIVE:
        assert list(conftest.TESTS.glob(pattern)), (
            f"tests/conftest.py KERNEL_SENSITIVE: {pattern} matches no file"
        )


def test_ci_runs_them_again_under_the_other_kernels() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -m kernels" in ci
    for setting in ("ATEN_CPU_CAPABILITY=avx2", "ONEDNN_MAX_CPU_ISA=AVX2", "MKL_ENABLE_INSTRUCTIONS=AVX2"):
        assert setting in ci  # the AVX2 kernels, on an AVX-512 machine
    assert "ATEN_CPU_CAPABILITY=default" in ci  # plain C kernels, on an AVX2-only one
    assert "--durations=25" in ci
