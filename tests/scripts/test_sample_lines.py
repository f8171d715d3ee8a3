"""scripts/experiments/sample_lines.py: the seeded test-set sample the MiniLM figure of the pretraining
guide was scored on."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "sample_lines.py"


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_a_seeded_sample_keeps_order_and_repeats(tmp_path):
    source = tmp_path / "all.jsonl.gz"
    with gzip.open(source, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i}) + "\n" for i in range(100))
    picked = []
    for name in ("a", "b"):
        assert _run(source, tmp_path / f"{name}.jsonl", 30, "--seed", 3).returncode == 0
        picked.append(
            [json.loads(line)["id"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        )
    assert picked[0] == picked[1] and len(set(picked[0])) == 30 and picked[0] == sorted(picked[0])
    assert _run(source, tmp_path / "c.jsonl", 30, "--seed", 4).returncode == 0
    assert [json.loads(x)["id"] for x in (tmp_path / "c.jsonl").read_text().splitlines()] != picked[0]


def test_more_lines_than_the_file_holds_is_refused(tmp_path):
    source = tmp_path / "few.jsonl"
    source.write_text('{"id": 0}\n{"id": 1}\n')
    result = _run(source, tmp_path / "out.jsonl", 3)
    assert result.returncode != 0 and "count must be in [1, 2]" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
