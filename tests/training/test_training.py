"""The training engine: learning, exact resumption, atomic checkpoints, NaN stop, schedules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from scratchformer.training import TrainConfig, Trainer, load_training_state, load_weights, lr_multiplier
from scratchformer.training import checkpoint as checkpoint_module
from scratchformer.training.checkpoint import resolve_checkpoint, save_checkpoint


class ToyTask:
    """Regression of a fixed random linear map, with dropout in the model (so RNG state matters)."""

    def __init__(self, n: int = 64, batch: int = 8, nan_at_call: int | None = None):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=gen)
        self.y = self.x @ torch.randn(6, 1, generator=gen)
        self.batch = batch
        self.calls = 0
        self.nan_at_call = nan_at_call

    def batches(self, epoch: int, seed: int) -> list[list[int]]:
        perm = torch.randperm(
            len(self.x), generator=torch.Generator().manual_seed(seed * 100 + epoch)
        ).tolist()
        return [perm[i : i + self.batch] for i in range(0, len(perm), self.batch)]

    def loss(self, model, batch, device):
        self.calls += 1
        loss = nn.functional.mse_loss(model(self.x[batch].to(device)), self.y[batch].to(device))
        if self.calls == self.nan_at_call:
            loss = loss * float("nan")
        return loss, len(batch)

    def evaluate(self, model, device):
        return {"loss": nn.functional.mse_loss(model(self.x.to(device)), self.y.to(device)).item()}

    def checkpoint_config(self):
        return {"kind": "toy"}

    def save_files(self, directory: Path) -> None:
        (directory / "extra.txt").write_text("tokenizer stand-in")


def toy_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))


def toy_config(out: Path, **kw) -> TrainConfig:
    base = {
        "out_dir": str(out),
        "epochs": 3,
        "lr": 3e-3,
        "warmup_steps": 3,
        "log_every": 1,
        "progress": False,
        "seed": 7,
        "grad_accum": 2,
    }
    return TrainConfig(**{**base, **kw})


def test_trainer_learns_and_writes_its_outputs(tmp_path: Path) -> None:
    result = Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=30, lr=3e-2)).fit()
    assert result.step == 30 * 4  # 8 batches per epoch, 2 per optimizer step
    assert result.losses[-1] < 0.1 * result.losses[0]
    for name in (
        "metrics.jsonl",
        "curves.png",
        "best/model.safetensors",
        "best/config.json",
        "best/extra.txt",
        "last/training_state.pt",
    ):
        assert (tmp_path / name).is_file(), name
    config = json.loads((tmp_path / "best" / "config.json").read_text())
    assert config["kind"] == "toy" and config["training"]["grad_accum"] == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 121))
    assert all({"lr", "items_per_s"} <= set(r) for r in records if "loss" in r)


def test_resume_reproduces_the_uninterrupted_losses_exactly(tmp_path: Path) -> None:
    full = Trainer(toy_model(), ToyTask(), toy_config(tmp_path / "full", epochs=5)).fit()
    assert len(full.losses) == 20

    class Stop(Exception):
        pass

    def crash_at_13(step: int, loss: float) -> None:
        if step == 13:
            raise Stop

    interrupted = tmp_path / "interrupted"
    with pytest.raises(Stop):
        Trainer(toy_model(), ToyTask(), toy_config(interrupted, save_every=5, epochs=5)).fit(
            on_step=crash_at_13
        )
    assert load_training_state(interrupted / "last")["step"] == 10

    model = toy_model()
    with torch.no_grad():  # resuming must not depend on the fresh model's weights
        for p in model.parameters():
            p.add_(1.0)
    resumed = Trainer(model, ToyTask(), toy_config(interrupted, save_every=5, epochs=5)).fit(resume=True)
    assert resumed.losses == full.losses[10:]  # bit for bit
    logged = [
        json.loads(line)["loss"]
        for line in (interrupted / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    assert logged == full.losses  # the log was cut back to step 10, then continued


def test_nan_loss_stops_with_the_step(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"loss is nan at step 3 \(epoch 0, batch 2\)"):
        Trainer(toy_model(), ToyTask(nan_at_call=5), toy_config(tmp_path)).fit()


def test_checkpoint_write_is_atomic(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "last"
    model = toy_model()
    save_checkpoint(target, model, {"kind": "toy", "version": 1}, {"step": 1})

    def crash(*args, **kwargs):  # the disk fills up half way through writing the training state
        Path(args[1]).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, model, {"kind": "toy", "version": 2}, {"step": 2})
    monkeypatch.undo()

    assert json.loads((target / "config.json").read_text())["version"] == 1
    assert load_training_state(target)["step"] == 1
    restored = toy_model()
    load_weights(restored, target)
    assert not torch.equal(restored[0].weight, model[0].weight)  # the old weights, not the new
    assert [p.name for p in tmp_path.iterdir()] == ["last"]  # no temporary left behind

    # A crash between the two renames leaves the complete previous checkpoint as last.old.
    target.rename(tmp_path / "last.old")
    assert resolve_checkpoint(target) == tmp_path / "last.old"


def test_training_state_is_loaded_without_arbitrary_unpickling(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    save_checkpoint(tmp_path / "ck", toy_model(), {"kind": "toy"}, {"step": 1})
    torch.save({"step": 1, "payload": Evil()}, tmp_path / "ck" / "training_state.pt")
    with pytest.raises(Exception, match="Weights only load failed|Unsupported global"):
        load_training_state(tmp_path / "ck")


def test_fp16_needs_cuda_and_config_is_validated(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16.*CUDA"):
            Trainer(toy_model(), ToyTask(), toy_config(tmp_path, precision="fp16", device="cpu"))
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="exponential")


@pytest.mark.machine  # an explicit bf16 is warned about where it is emulated
def test_bf16_autocast_training_runs_on_cpu(tmp_path: Path) -> None:
    result = Trainer(toy_model(), ToyTask(), toy_config(tmp_path, precision="bf16", epochs=5)).fit()
    assert all(math.isfinite(x) for x in result.losses) and result.losses[-1] < result.losses[0]


def test_the_optimizer_is_torch_fused_adamw_on_cpu(tmp_path: Path) -> None:
    """One kernel for all parameters (torch's fused AdamW; Hugging Face Trainer's default too)."""
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=1)).fit()
    state = torch.load(tmp_path / "last" / "training_state.pt", weights_only=True)
    assert all(group["fused"] is True for group in state["optimizer"]["param_groups"])


def test_paper_schedule_is_inverse_sqrt_with_warmup() -> None:
    d_model, warmup = 512, 4000
    peak = (d_model * warmup) ** -0.5
    multiplier = lr_multiplier("inverse_sqrt", warmup, 100_000)
    for step in (1, 100, 3999, 4000, 4001, 20_000, 99_999):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert peak * multiplier(step - 1) == pytest.approx(paper, rel=1e-12)


def test_cosine_and_linear_schedules_end_at_the_floor() -> None:
    for kind in ("cosine", "linear"):
        m = lr_multiplier(kind, 10, 110, min_ratio=0.1)
        assert m(0) == pytest.approx(0.1) and m(9) == 1.0
        assert m(109) == pytest.approx(0.1) and m(500) == pytest.approx(0.1)
        assert all(m(i) >= m(i + 1) for i in range(10, 120))


def test_resume_with_an_optimizer_state_of_another_layout_is_a_clear_error(tmp_path: Path) -> None:
    """E.g. a 0.1 run (W^Q, W^K, W^V as 3 tensors, now 1): its weights load, its optimizer state cannot."""
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=1)).fit()
    path = tmp_path / "last" / "training_state.pt"
    state = torch.load(path, weights_only=True)
    state["optimizer"]["param_groups"][0]["params"].append(99)  # one tensor more than this model has
    torch.save(state, path)
    with pytest.raises(
        ValueError,
        match=r"optimizer state holds \[.*\] parameter tensors per group, this model has .* "
        r"cannot resume",
    ):
        Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=2)).fit(resume=True)


def test_an_overflowed_fp16_step_is_detected_as_skipped() -> None:
    """The trainer does not count a step the GradScaler skipped (no schedule, step or log advance);
    here the detection, with PyTorch's CPU GradScaler (the trainer's is CUDA's: fp16 needs a GPU)."""
    from scratchformer.training.trainer import optimizer_step

    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale((weight * float("inf")).sum()).backward()
    assert optimizer_step(scaler, optimizer) is True and torch.equal(weight.detach(), torch.ones(3))
    assert scaler.get_scale() == 2.0**15
    scaler.scale((weight * 2).sum()).backward()
    assert optimizer_step(scaler, optimizer) is False and not torch.equal(weight.detach(), torch.ones(3))
    plain = torch.amp.GradScaler("cpu", enabled=False)
    (weight * 2).sum().backward()
    assert optimizer_step(plain, optimizer) is False


@pytest.mark.machine  # an explicit bf16 is warned about where it is emulated
def test_a_bf16_state_resumes_under_another_precision_and_loads_on_cpu(tmp_path: Path) -> None:
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=1, precision="bf16")).fit()
    state = load_training_state(tmp_path / "last")  # CPU memory by default
    assert state["scaler"] == {} and state["rng"]["torch"].device.type == "cpu"
    result = Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=2)).fit(resume=True)  # fp32 now
    assert result.step == 2 * 4 and result.skipped_steps == 0


def test_deterministic_mode_trains_and_restores_the_global_setting(tmp_path: Path) -> None:
    before = torch.are_deterministic_algorithms_enabled()
    result = Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=1, deterministic=True)).fit()
    assert result.step == 4 and torch.are_deterministic_algorithms_enabled() == before


def test_resume_refuses_another_model_or_training_settings(tmp_path: Path) -> None:
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, max_steps=4)).fit()
    saved = (tmp_path / "last" / "config.json").read_text()
    for change, message in [
        ({"lr": 0.01}, r"last was saved with lr=0.003; this run has lr=0.01: --resume continues a run"),
        ({"seed": 8, "grad_accum": 1}, r"saved with seed=7, grad_accum=2; this run has seed=8, grad_accum=1"),
    ]:
        with pytest.raises(ValueError, match=message):
            Trainer(toy_model(), ToyTask(), toy_config(tmp_path, max_steps=8, **change)).fit(resume=True)
    assert (tmp_path / "last" / "config.json").read_text() == saved  # nothing loaded, nothing rewritten
    assert load_training_state(tmp_path / "last")["step"] == 4


def test_resume_refuses_a_changed_model_setting(tmp_path: Path) -> None:
    class Heads(ToyTask):
        def __init__(self, heads: int):
            super().__init__()
            self.heads = heads

        def checkpoint_config(self):
            return {"kind": "toy", "model": {"encoder": {"num_heads": self.heads}}}

    Trainer(toy_model(), Heads(2), toy_config(tmp_path, max_steps=4)).fit()
    with pytest.raises(
        ValueError,
        match=r"saved with model.encoder.num_heads=2, lr=0.003; "
        r"this run has model.encoder.num_heads=4, lr=0.01",
    ):
        Trainer(toy_model(), Heads(4), toy_config(tmp_path, max_steps=8, lr=0.01)).fit(resume=True)


def test_resume_may_change_the_length_device_and_logging(tmp_path: Path) -> None:
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, max_steps=4)).fit()
    result = Trainer(
        toy_model(),
        ToyTask(),
        toy_config(  # out_dir as a path now
            tmp_path, out_dir=tmp_path, max_steps=10, epochs=9, device="cpu", log_every=2, save_every=5
        ),
    ).fit(resume=True)
    assert result.step == 10 and len(result.losses) == 6


def test_the_logged_lr_is_the_one_each_step_used(tmp_path: Path) -> None:
    stepped: list[float] = []  # the lr of every optimizer step, as the optimizer applies it
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: stepped.append(optimizer.param_groups[0]["lr"])
    )
    try:
        Trainer(
            toy_model(), ToyTask(), toy_config(tmp_path, schedule="linear", warmup_steps=4, lr=0.01)
        ).fit()
    finally:
        hook.remove()
    logged = [
        json.loads(line)["lr"]
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    multiplier = lr_multiplier("linear", 4, 12)  # 3 epochs of 4 steps
    assert logged == stepped == pytest.approx([0.01 * multiplier(s - 1) for s in range(1, 13)])
    assert logged[:4] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])


def test_epochs_are_whole_passes_when_the_batch_count_varies(tmp_path: Path) -> None:
    class TokenBudget(ToyTask):  # token-budget batching: epochs of 8, 6 and 8 batches
        def batches(self, epoch, seed):
            return super().batches(epoch, seed)[: 6 if epoch == 1 else 8]

    result = Trainer(toy_model(), TokenBudget(), toy_config(tmp_path, epochs=2, grad_accum=1)).fit()
    assert result.step == 14
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if "loss" in r][-1] == 2  # (epochs counted after the step: 2 done)
    assert load_training_state(tmp_path / "last")["epoch"] == 2
