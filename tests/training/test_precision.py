"""``"precision": "auto"``: bf16 where the device computes it natively, fp32 elsewhere, decided from
the CPU's flags (mocked here: both kinds of CPU, whatever this machine is), printed before the first
step and recorded in the checkpoint; an explicit bf16 that would be emulated is warned about; fp64
computes in float64."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from scratchformer.training import Trainer
from scratchformer.training import precision as precision_module
from scratchformer.training.precision import bf16_warning, native_bf16, resolve_precision
from tests.training.test_training import ToyTask, toy_config, toy_model

CPU = torch.device("cpu")
DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
# (AVX512_BF16, AMX tiles): an AVX2-only EPYC, a Cooper Lake Xeon, a Sapphire Rapids Xeon
MACHINES = {"avx2": (False, False), "avx512_bf16": (True, False), "amx": (True, True)}


@pytest.fixture(params=list(MACHINES))
def machine(request, monkeypatch) -> str:
    """This CPU, pretending to be one of MACHINES (oneDNN left uncapped)."""
    avx512_bf16, amx = MACHINES[request.param]
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    return request.param


def test_auto_is_bf16_only_where_the_cpu_has_native_bf16(machine: str) -> None:
    native = machine != "avx2"
    assert native_bf16(CPU) is native
    assert resolve_precision("auto", CPU) == ("bf16" if native else "fp32")
    for explicit in ("fp32", "bf16", "fp64"):
        assert resolve_precision(explicit, CPU) == explicit  # only "auto" is decided
    warning = bf16_warning("bf16", CPU)
    assert (warning is None) is native
    if warning:
        assert "slower than fp32" in warning and "\n" not in warning
    assert bf16_warning("fp32", CPU) is None and bf16_warning("auto", CPU) is None


def test_onednn_capped_below_bf16_is_not_native(monkeypatch) -> None:
    """ONEDNN_MAX_CPU_ISA=AVX2 (the AVX2 kernels tried on an AMX Xeon) takes away the bf16 units."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert resolve_precision("auto", CPU) == "fp32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert resolve_precision("auto", CPU) == "bf16"


def test_cuda_asks_torch_and_other_devices_stay_fp32(monkeypatch) -> None:
    for supported in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert resolve_precision("auto", torch.device("cuda")) == ("bf16" if supported else "fp32")
    assert resolve_precision("auto", torch.device("mps")) == "fp32"
    with pytest.raises(ValueError, match="precision: expected one of"):
        resolve_precision("fp8", CPU)


def test_a_run_says_and_records_what_auto_chose(machine: str, tmp_path: Path, capsys) -> None:
    chosen = "fp32" if machine == "avx2" else "bf16"
    config = toy_config(tmp_path / "run", precision="auto", epochs=1, progress=True, device="cpu")
    trainer = Trainer(toy_model(), ToyTask(n=16), config)
    assert trainer.precision == chosen
    if chosen == "bf16":
        # (the machine is only pretending: keep the steps in fp32 so the test runs fast anywhere)
        trainer._autocast = lambda: torch.autocast("cpu", enabled=False)
    trainer.fit()
    err = capsys.readouterr().err
    assert f"training on cpu, precision {chosen} (auto)" in err
    saved = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    assert saved["training"]["precision"] == chosen
    assert "slower than fp32" not in err  # auto never picks an emulated bf16


def test_explicit_bf16_on_a_cpu_without_it_warns_before_the_first_step(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: False)
    steps = []
    config = toy_config(tmp_path / "run", precision="bf16", epochs=1, device="cpu")
    trainer = Trainer(toy_model(), ToyTask(n=16), config)
    trainer.fit(on_step=lambda step, loss: steps.append(capsys.readouterr().err))
    assert "precision 'bf16': this CPU has no AMX or AVX512_BF16" in steps[0]  # said before step 1 ended
    assert trainer.precision == "bf16"  # it still runs as asked


class Fp64Task(ToyTask):
    """The toy regression, its inputs in the model's own dtype."""

    def loss(self, model, batch, device):
        dtype = next(model.parameters()).dtype
        x, y = self.x[batch].to(device, dtype), self.y[batch].to(device, dtype)
        return nn.functional.mse_loss(model(x), y), len(batch)

    def evaluate(self, model, device):
        dtype = next(model.parameters()).dtype
        return {
            "loss": nn.functional.mse_loss(model(self.x.to(device, dtype)), self.y.to(device, dtype)).item()
        }


def test_fp64_trains_in_float64_and_agrees_with_fp32(tmp_path: Path) -> None:
    runs = {}
    for precision in ("fp64", "fp32"):
        model = toy_model()
        # on the CPU: CUDA draws another dropout mask for float64 than for float32
        config = toy_config(tmp_path / precision, precision=precision, device="cpu")
        result = Trainer(model, Fp64Task(), config).fit()
        assert {p.dtype for p in model.parameters()} == {
            getattr(torch, {"fp64": "float64"}.get(precision, "float32"))
        }
        runs[precision] = result.losses
    assert runs["fp64"] == pytest.approx(runs["fp32"], rel=1e-4)  # the same run, in more digits
    assert runs["fp64"] != runs["fp32"]  # (but not the same numbers: it did compute in float64)
