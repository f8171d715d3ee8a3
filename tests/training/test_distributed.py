"""Multi-process training under torchrun (CPU, gloo, 2 processes on localhost).

Each torchrun launch runs tests/training/ddp_worker.py in 2 processes (``--standalone``: a free port is
picked, so tests never collide) and takes a few seconds; the single-process references run here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ddp_worker import EqualBatchTask, equivalence_config, toy_model
from safetensors.torch import load_file

from scratchformer.training import Trainer, distributed

WORKER = Path(__file__).with_name("ddp_worker.py")
LAUNCH_TIMEOUT_S = 300  # a hang fails the test instead of stalling the suite


def launch(args: list[str], timeout: float = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node 2 ARGS``. Past ``timeout`` it gets SIGTERM (torchrun
    then stops its workers, which run in sessions of their own) and the test fails."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail(f"torchrun {args} still running after {timeout} s:\n{out[-2000:]}\n{err[-5000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def torchrun(out: Path, *scenarios: str) -> subprocess.CompletedProcess[str]:
    return launch([str(WORKER), str(out), *scenarios])


def succeed(out: Path, *scenarios: str) -> None:
    done = torchrun(out, *scenarios)
    assert done.returncode == 0, (
        f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The equivalence run and the uninterrupted run, in one torchrun launch."""
    out = tmp_path_factory.mktemp("ddp")
    succeed(out, "equivalence", "full", "on_main")
    return out


def losses(directory: Path, rank: int = 0) -> list[float]:
    return json.loads((directory / f"losses-rank{rank}.json").read_text())


def test_two_processes_with_batch_b_equal_one_process_with_batch_2b(runs: Path, tmp_path: Path) -> None:
    # Dropout is 0 and every batch has the same size, so the mean of the two ranks' mean losses
    # (what DDP's averaged gradient descends) is the mean loss over the union of their batches.
    # Each step accumulates 2 micro-batches (no_sync on the first), 12 steps in all.
    reference = toy_model(dropout=0.0)
    single = Trainer(reference, EqualBatchTask(batch=8), equivalence_config(tmp_path / "single")).fit()
    half_batch = toy_model(dropout=0.0)  # the negative control: a single process with batch b
    Trainer(half_batch, EqualBatchTask(batch=4), equivalence_config(tmp_path / "half", epochs=2)).fit()

    ranks = [load_file(str(runs / "equivalence" / f"params-rank{r}.safetensors")) for r in (0, 1)]
    expected = reference.state_dict()
    assert len(single.losses) == 12 and len(losses(runs / "equivalence")) == 12
    for name, tensor in expected.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"{name}: the two ranks disagree"
        assert (ranks[0][name] - tensor).abs().max().item() <= 1e-5, name
        assert not torch.equal(tensor, toy_model(0.0).state_dict()[name]), f"{name} did not train"
    assert losses(runs / "equivalence") == pytest.approx(single.losses, abs=1e-6)
    assert losses(runs / "equivalence", 1) == losses(runs / "equivalence")  # the logged loss is global
    worst_control = max((half_batch.state_dict()[k] - v).abs().max().item() for k, v in expected.items())
    assert worst_control > 1e-3  # different data gives clearly different weights: the check can fail


def test_only_rank_0_writes_logs_and_checkpoints(runs: Path) -> None:
    full = runs / "full"
    records = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(
        range(1, 21)
    )  # 64 / (2 x 4 x 2) = 4 steps x 5 epochs
    assert [r["step"] for r in records if "eval/loss" in r] == [4, 8, 12, 16, 20]
    assert [r["loss"] for r in records if "loss" in r] == pytest.approx(losses(full))
    for name in ("curves.png", "best/model.safetensors", "last/training_state.pt"):
        assert (full / name).is_file(), name
    assert sorted(p.name for p in full.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], float, Path]:
    """The crash scenario, launched once: (torchrun's result, seconds it took, its folder, whose
    crash/ the resume test copies before resuming it)."""
    out = tmp_path_factory.mktemp("ddp-crash")
    start = time.monotonic()
    done = torchrun(out, "crash")
    return done, time.monotonic() - start, out


def test_a_failing_rank_ends_the_whole_job_with_an_error(crashed) -> None:
    # Rank 0 is blocked in the next step's gradient all-reduce when rank 1 dies: torchrun must
    # stop it and fail, well before the 30-minute process-group timeout (and the test's 5 minutes).
    done, seconds, out = crashed
    assert done.returncode != 0
    assert "deliberate failure on rank 1 at step 13" in done.stdout + done.stderr
    assert seconds < LAUNCH_TIMEOUT_S
    assert torch.load(out / "crash" / "last" / "training_state.pt", weights_only=True)["step"] == 10


def test_resumed_ddp_run_matches_the_uninterrupted_one(runs: Path, crashed, tmp_path: Path) -> None:
    crashed_run, _, out = crashed
    assert crashed_run.returncode != 0
    shutil.copytree(out / "crash", tmp_path / "crash")  # resumed here, the crash left as it was
    succeed(tmp_path, "resume")
    uninterrupted = losses(runs / "full")
    assert len(uninterrupted) == 20
    # Dropout is on (p = 0.2) and each rank draws its own masks: only restoring every rank's RNG
    # state, the optimizer, the schedule and the position in the epoch reproduces the losses.
    assert losses(tmp_path / "resume") == uninterrupted[10:]
    assert losses(tmp_path / "resume", rank=1) == uninterrupted[10:]
    logged = [json.loads(line) for line in (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in logged if "loss" in r] == uninterrupted
    full_weights = load_file(str(runs / "full" / "last" / "model.safetensors"))
    resumed_weights = load_file(str(tmp_path / "crash" / "last" / "model.safetensors"))
    assert all(torch.equal(full_weights[k], resumed_weights[k]) for k in full_weights)


def test_on_main_gives_every_rank_rank_0s_result_or_error(runs: Path) -> None:
    # WordPiece training is not deterministic across processes: the ranks must share rank 0's.
    assert (runs / "on_main" / "tokenizer-rank1.json").read_text() == (
        runs / "on_main" / "tokenizer-rank0.json"
    ).read_text()
    assert (
        runs / "on_main" / "error-rank0.txt"
    ).read_text() == "ZeroDivisionError: integer division or modulo by zero"
    assert (runs / "on_main" / "error-rank1.txt").read_text() == (
        "RuntimeError: rank 0 failed: ZeroDivisionError: integer division or modulo by zero"
    )


def test_cli_train_classifier_under_torchrun(tmp_path: Path) -> None:
    from tasks.test_text_classification import tiny_recipe

    recipe = tiny_recipe(tmp_path).to_dict()
    recipe["train"] = {k: v for k, v in recipe["train"].items() if k != "betas"}
    recipe["average_last"] = 2  # rank 0 alone averages, tests and reports afterwards
    config = tmp_path / "recipe.json"
    config.write_text(json.dumps(recipe))
    command = [
        "-m",
        "scratchformer",
        "train",
        "classifier",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "cli"),
        "--epochs",
        "6",
        "--device",
        "cpu",
    ]
    done = launch(command)
    assert done.returncode == 0, done.stderr[-5000:]
    summary = json.loads(done.stdout)  # one JSON document: only rank 0 printed
    assert summary["test"]["accuracy"] == 1.0
    assert summary["train_examples"] == 500
    records = [json.loads(line) for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 6 * 8  # 16 batches of 32 per epoch, 8 per rank
    assert json.loads((tmp_path / "cli" / "report.json").read_text())["test"]["accuracy"] == 1.0


def test_cli_train_captioner_under_torchrun(tmp_path: Path) -> None:
    recipe = {
        "data": "shapes",
        "shapes": {"seed": 0, "train_size": 64, "valid_size": 8, "test_size": 8},
        "batch_size": 8,
        "decoding": {"beam_size": 2},
        "model": {
            "patch_size": 16,
            "d_model": 32,
            "num_heads": 2,
            "d_ff": 64,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "max_len": 24,
        },
        "train": {"max_steps": 6, "eval_every": 3, "best_metric": "bleu4", "best_mode": "max"},
    }
    config = tmp_path / "recipe.json"
    config.write_text(json.dumps(recipe))
    done = launch(
        [
            "-m",
            "scratchformer",
            "train",
            "captioner",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "cap"),
            "--device",
            "cpu",
        ]
    )
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads(done.stdout)  # one JSON document: only rank 0 tested and printed
    assert (
        set(report["test"]) == {"test_heldout", "test_seen"}
        and report["test"]["test_seen"]["beam2"]["n"] == 8
    )
    records = [json.loads(line) for line in (tmp_path / "cap" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 6


def test_shard_deals_batches_like_a_distributed_sampler() -> None:
    batches = list(range(11))
    shares = [distributed.shard(batches, r, 3) for r in range(3)]
    assert shares == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # 9 and 10 cannot be dealt evenly
    assert sorted(b for share in shares for b in share) == list(range(9))
    with pytest.raises(ValueError, match="2 micro-batches cannot be shared by 3 processes"):
        distributed.shard([0, 1], 0, 3)
    with pytest.raises(ValueError, match="rank must be in"):
        distributed.shard(batches, 3, 3)


def test_a_single_process_starts_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.init("cpu") == distributed.World(0, 1, 0)
    assert not torch.distributed.is_initialized()
    assert distributed.on_main(lambda: 42) == 42 and distributed.all_reduce_sum([1.5, 2.0]) == [1.5, 2.0]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="inconsistent torchrun environment"):
        distributed.world()
    monkeypatch.setenv("RANK", "1")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            distributed.device_for("cuda", 1, distributed=True)
