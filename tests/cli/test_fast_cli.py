"""A command line that answers at once: ``--help``, ``--version``, every command's ``--help`` and the
refusals of bad arguments (an unknown flag, a bad value, a missing checkpoint, model or recipe) import
neither torch nor the models. Checked by what a fresh process has imported, not with a timer; and
the checks that stand in for torch's (device names, missing paths) against torch's own answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchformer.cli import build_parser
from scratchformer.cli.options import TORCH_DEVICE_TYPES, check_device
from scratchformer.cli.paths import require_checkpoint, require_model_dir, require_recipe

# What answering at once must not import: torch and what needs it (numpy, safetensors, tokenizers,
# transformers), and the layers of the package that are built on torch.
HEAVY = ("torch", "numpy", "safetensors", "tokenizers", "transformers") + tuple(
    f"scratchformer.{layer}"
    for layer in ("core", "fast", "generation", "models", "formats", "tasks", "training", "viz")
)

# Runs each command line of argv[1] (JSON) through main() in this one fresh process and reports its
# exit code, its stderr and the modules it imported.
RUNNER = r"""
import contextlib, io, json, sys
from scratchformer.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    before, out, err = set(sys.modules), io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    imported = sorted(set(sys.modules) - before)
    results.append({"code": code, "out": out.getvalue(), "err": err.getvalue(), "imported": imported})
print(json.dumps({"results": results, "modules": sorted(sys.modules)}))
"""


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def _commands() -> list[list[str]]:
    """Every command and ``train`` task of the parser, as the words that name it."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    names = []
    for name, command in sub.choices.items():
        nested = [a for a in command._actions if a.dest == "task"]
        names += [[name, task] for task in nested[0].choices] if nested else [[name]]
    return names


def _cases(tmp: Path) -> list[tuple[list[str], int, str]]:
    """(argv, exit code, words its last line of stderr must contain)."""
    m = str(tmp / "missing")  # a path that does not exist
    no_checkpoint, no_file = f"no checkpoint at {m}", f"No such file or directory: '{m}'"
    return [
        (["--version"], 0, ""),
        (["--help"], 0, ""),
        *(([*words, "--help"], 0, "") for words in _commands()),
        # unknown flags, missing and bad values: argparse's usage errors
        (["--bogus"], 2, "the following arguments are required: command"),
        (["demo", "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["translate", "--checkpoint", m, "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["train", "translation", "--config", m, "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["translate"], 2, "the following arguments are required: --checkpoint"),
        (["translate", "--checkpoint", m, "--beam", "0"], 2, "argument --beam: must be >= 1, got 0"),
        (["classify", "--checkpoint", m, "--batch-size", "x"], 2, "argument --batch-size"),
        (["train", "translation", "--config", m, "--precision", "fp8"], 2, "argument --precision"),
        (["demo", "--steps", "-1"], 2, "argument --steps: must be >= 1"),
        # bad values that the commands check before any work
        (["translate", "--checkpoint", m, "--sampling", "--top-p", "1.5"], 2, "top_p must be in (0, 1]"),
        (["translate", "--checkpoint", m, "--top-k", "5"], 2, "--top-k: only with --sampling"),
        (["classify", "--checkpoint", m, "--device", "nope", "x"], 2, "--device 'nope': not a device"),
        (["classify", "--checkpoint", m, "--device", "meta", "x"], 2, "--device 'meta': not supported"),
        (["train", "classifier", "--train", m, "--resume", "--overwrite"], 2, "give one of them"),
        # missing checkpoints, models and recipes
        (["translate", "--checkpoint", m], 2, no_checkpoint),
        (["translate", "--checkpoint", m, "--device", "cpu", "a text"], 2, no_checkpoint),
        (["caption", "--checkpoint", m, "a.png"], 2, no_checkpoint),
        (["classify", "--checkpoint", m, "a text"], 2, no_checkpoint),
        (["evaluate", "--checkpoint", m, "--data", m], 2, no_checkpoint),
        (["export", "--checkpoint", m, "--out", str(tmp / "out")], 2, no_checkpoint),
        (["attention", "--checkpoint", m, "a text"], 2, no_checkpoint),
        (["embed", "--model", m, "a text"], 2, f"checkpoint directory not found: {m}"),
        (["similarity", "--model", m, "a", "b"], 2, f"checkpoint directory not found: {m}"),
        *((["train", task, "--config", m], 2, no_file) for task in ("classifier", "translation", "mlm")),
        (["train", "captioner", "--config", m], 2, no_file),
    ]


def test_help_version_and_refusals_import_no_torch(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps([argv for argv, _, _ in cases])],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    for (argv, code, words), result in zip(cases, report["results"], strict=True):
        last = (result["err"].strip().splitlines() or [""])[-1]
        assert (result["code"], words in last) == (code, True), (argv, result["code"], result["err"])
        assert not _heavy(result["imported"]), (argv, _heavy(result["imported"]))
        if code == 0:
            assert result["out"], argv  # the help or the version was printed
    assert not _heavy(report["modules"])
    assert "scratchformer.cli._generation_config" not in report["modules"]  # read once, not kept


def test_the_console_entry_point_imports_no_torch() -> None:
    """``python -m scratchformer`` (the console script's own path: scratchformer.cli.main), as
    ``-X importtime`` lists what it imports."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "scratchformer", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.startswith("scratchformer "), run.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if "|" in line]
    assert "scratchformer.cli" in imported and not _heavy(imported), _heavy(imported)


def test_a_missing_path_is_refused_with_its_loaders_message(tmp_path: Path) -> None:
    from scratchformer.tasks.sentence_embedding import SentenceEncoder
    from scratchformer.tasks.translation import TranslationRecipe
    from scratchformer.training.checkpoint import resolve_checkpoint
    from scratchformer.training.recipe import load_recipe

    missing = tmp_path / "missing"
    for early, loader in (
        (require_checkpoint, resolve_checkpoint),
        (require_model_dir, SentenceEncoder.from_pretrained),
        (require_recipe, lambda path: load_recipe(TranslationRecipe, path)),
    ):
        for path in (missing, str(missing) + "/"):
            with pytest.raises(FileNotFoundError) as theirs:
                loader(path)
            with pytest.raises(FileNotFoundError) as ours:
                early(path)
            assert str(ours.value) == str(theirs.value)
    # What exists is left to the loaders: a folder of anything; a checkpoint an interrupted save
    # left at NAME.old (resolve_checkpoint reads it)
    for early in (require_checkpoint, require_model_dir, require_recipe):
        early(tmp_path)
    (tmp_path / "run.old").mkdir()
    (tmp_path / "run.old" / "config.json").write_text("{}")
    require_checkpoint(tmp_path / "run")
    assert resolve_checkpoint(tmp_path / "run") == tmp_path / "run.old"


def _torch_check_device(name: str) -> str:
    """The check as it was, asking torch: "ok", or the start of its message."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        return "not a device"
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return "ok" if count and (device.index is None or device.index < count) else "no such CUDA"
    if device.type == "mps":
        return "ok" if torch.backends.mps.is_available() else "no MPS"
    return "ok" if device.type == "cpu" else "not supported"


@pytest.mark.filterwarnings("ignore:'mkldnn' is no longer used")
def test_device_names_are_read_as_torch_reads_them() -> None:
    try:
        torch.device("nodevice")
    except RuntimeError as e:  # "Expected one of cpu, cuda, ... device type at start of device string"
        listed = str(e).split("Expected one of ", 1)[1].split(" device type", 1)[0]
    assert TORCH_DEVICE_TYPES == {t.strip() for t in listed.split(",")}
    names = [
        *TORCH_DEVICE_TYPES,
        *(f"{t}:0" for t in TORCH_DEVICE_TYPES),
        *("cpu:1 cpu:01 cpu:00 cpu: cpu:-1 cpu:x cpu:1:2 CPU Cpu _cpu cpu_ cuda:0 cuda:01 cuda:7".split()),
        *("mps:0 mps:1 gpu nope meta:3 xla:2 cpu:2147483647 cpu:2147483648 cpu:99999999999999999999".split()),
        "",
        " cpu",
        "cpu ",
        "cpu\n",
        "cpu:١",  # an Arabic-Indic digit: a digit to Python, not to torch
    ]
    for name in names:
        expected = _torch_check_device(name)
        try:
            check_device(name)
            got = "ok"
        except ValueError as e:
            got = str(e)
        if expected in ("ok", "not a device", "not supported"):
            assert got == expected or got.startswith(f"--device {name!r}: {expected}"), (name, got)
        else:  # a device type this machine lacks
            assert got != "ok" and "not a device" not in got and "not supported" not in got, (name, got)
