"""Choose the IMDB pretraining recipe on the validation set only: MLM pretraining variants, each
with the step budget the 2-core CPU affords in 60 minutes, then fine-tuning from each (the test set
is never read). Runs anywhere; on a GPU the whole sweep takes minutes (docs/guides/pretraining.md).

    python scripts/experiments/mlm_sweep.py --tokenizer tok.json --parallel 5            # every variant
    python scripts/experiments/mlm_sweep.py --only d128_l4_learned post_ln_6k            # some of them

Each variant prints one JSON line: the held-out masked-token loss/accuracy every ``eval_every``
steps, and the validation accuracy curve of each fine-tuning. ``--tokenizer``: one WordPiece
vocabulary for all (train one with ``scratchformer train mlm`` or ``train_wordpiece``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

D256 = {
    "d_model": 256,
    "num_heads": 4,
    "num_layers": 4,
    "d_ff": 1024,
    "max_len": 512,
    "dropout": 0.0,
    "attention_dropout": 0.0,
}
D128 = {**D256, "d_model": 128, "num_heads": 2, "d_ff": 512}
SIN = {"positional": "sinusoidal", "scale_embedding": True}
FT256 = {"name": "ft256_lr1e-4", "max_length": 256, "head_length": 64, "lr": 1e-4, "epochs": 1, "warmup": 70}
FT512 = {"name": "ft512_lr1e-4", "max_length": 512, "head_length": 128, "lr": 1e-4, "epochs": 1, "warmup": 70}
FT512_3 = {
    "name": "ft512_lr3e-4_3ep",
    "max_length": 512,
    "head_length": 128,
    "lr": 3e-4,
    "epochs": 3,
    "warmup": 200,
}

# name: (recipe overrides, steps, peak lr, fine-tunings). Steps: what 55 min of the 2-core CPU hold.
VARIANTS = {
    "d256_lr7e-4": ({"model": D256}, 1500, 7e-4, [FT256, FT512]),
    "d256_lr1.5e-3": ({"model": D256}, 1500, 1.5e-3, [FT256, FT512]),
    "d256_whole_word": ({"model": D256, "whole_word": True}, 1500, 7e-4, [FT256, FT512]),
    "d256_T512": ({"model": D256, "max_length": 512}, 1150, 7e-4, [FT256, FT512]),
    "d192_l4_learned": (
        {"model": {**D256, "d_model": 192, "num_heads": 3, "d_ff": 768}},
        2400,
        1e-3,
        [FT256, FT512],
    ),
    "d256_pre_ln": ({"model": {**D256, "norm_first": True}}, 1500, 1e-3, []),
    "d256_mask40": ({"model": D256, "mask_rate": 0.4}, 1500, 7e-4, []),
    "d256_sinusoidal": ({"model": {**D256, **SIN}}, 1500, 1e-3, []),
    "post_ln_6k": ({"model": D256}, 6000, 7e-4, []),  # 4x the budget: where the plateau ends
    "d128_l4_learned": ({"model": D128}, 3400, 1e-3, [FT512_3]),
    "d128_l4_sinusoidal": ({"model": {**D128, **SIN}}, 3400, 1e-3, [FT512_3]),
    "d128_l2_sinusoidal": ({"model": {**D128, **SIN, "num_layers": 2}}, 6600, 1e-3, [FT512_3]),
}


def run(name: str, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    import scratchformer.tasks.masked_lm as mlm
    from scratchformer.tasks.classification import ClassifierRecipe, train_classifier

    overrides, steps, lr, finetunes = VARIANTS[name]
    if overrides["model"].get("norm_first"):  # not a BERT checkpoint: pretraining only, no export
        mlm.bert_problems = lambda config: []
        mlm.export_masked_lm = lambda checkpoint, directory: None
    out = Path(args.out) / name
    recipe = mlm.MLMRecipe.from_json(
        args.recipe,
        tokenizer=args.tokenizer,
        **overrides,
        train={
            "out_dir": str(out),
            "max_steps": steps,
            "lr": lr,
            "warmup_steps": steps // 10,
            "eval_every": 250,
            "progress": False,
            "overwrite": True,
            "device": args.device,
        },
    )
    start = time.time()
    report = mlm.pretrain_mlm(recipe, data_dir=args.data_dir)
    evals = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval/loss" in line
    ]
    result = {
        "variant": name,
        "steps": steps,
        "seconds": round(time.time() - start),
        "mlm": [[e["step"], round(e["eval/loss"], 3), round(e["eval/accuracy"], 4)] for e in evals],
        "finetune": {},
    }
    for ft in finetunes:
        ft_out = Path(args.out) / f"{name}-{ft['name']}"
        recipe = ClassifierRecipe.from_json(
            args.finetune,
            pretrained=report["export"],
            test_file=None,
            max_length=ft["max_length"],
            head_length=ft["head_length"],
            train={
                "out_dir": str(ft_out),
                "lr": ft["lr"],
                "epochs": ft["epochs"],
                "warmup_steps": ft["warmup"],
                "eval_every": 250,
                "progress": False,
                "overwrite": True,
                "device": args.device,
            },
        )
        train_classifier(recipe, data_dir=args.data_dir)
        curve = [
            json.loads(line)
            for line in (ft_out / "metrics.jsonl").read_text().splitlines()
            if "eval/accuracy" in line
        ]
        result["finetune"][ft["name"]] = [[e["step"], round(e["eval/accuracy"], 4)] for e in curve]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), help="variants to run (default: all)")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json shared by every variant")
    parser.add_argument("--recipe", default="recipes/imdb_mlm.json")
    parser.add_argument("--finetune", default="recipes/imdb_finetune.json")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--out", default="runs/mlm_sweep")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--parallel", type=int, default=1, help="variants run at once (separate processes)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # a worker process: run this one, print its line
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run(args.variant, args)), flush=True)
        return
    names, running = list(args.only or VARIANTS), []
    while names or running:
        while names and len(running) < args.parallel:
            name = names.pop(0)
            command = [sys.executable, __file__, *sys.argv[1:], "--variant", name]
            Path(args.out).mkdir(parents=True, exist_ok=True)
            log = open(Path(args.out) / f"{name}.log", "w")  # the worker's errors, if any
            running.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True))
        for process in [p for p in running if p.poll() is not None]:
            running.remove(process)
            line = process.stdout.read().strip().splitlines()  # type: ignore[union-attr]
            failed = {"failed": process.args[-1], "log": str(Path(args.out) / f"{process.args[-1]}.log")}
            print(line[-1] if process.returncode == 0 and line else json.dumps(failed), flush=True)
        time.sleep(1)


if __name__ == "__main__":
    main()
