#!/usr/bin/env bash
# The GPU checks in one go, each under its own time limit, for a GPU machine lent for minutes:
#   1. the benchmark suite on CUDA, full size, fp32 and bf16 (its reports are rewritten after every
#      group, so a run stopped at its limit keeps what it measured);
#   2. scripts/parity/cuda_resume_check.py (a resumed run equals the uninterrupted one, fp32/fp16/bf16);
#   3. the test suite on a machine where CUDA is available (the tests that take another branch
#      there; packages missing on that machine show up as collection errors, listed, not fatal).
#
#   bash scripts/gpu_checks.sh OUT_DIR          # needs a CUDA GPU; 7 minutes on an H200
#
# Limits in seconds (defaults): BENCH_S=330 RESUME_S=90 TESTS_S=150. The checkout need not be
# installed: src/ goes on PYTHONPATH, so a machine with torch, tokenizers, safetensors, sacrebleu,
# sentencepiece, matplotlib and tqdm runs it as it is. PYTHON picks the interpreter (python3).
set -uo pipefail
out=$(mkdir -p "${1:?usage: bash scripts/gpu_checks.sh OUT_DIR}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0

step() {  # step NAME LIMIT COMMAND...: run it under its limit (its child processes too), then say
    # on stderr how it ended and how long it took; its own output goes where the caller sends it
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "== $name (limit ${limit} s)" >&2
    timeout -k 10 "$limit" "$@"
    rc=$?
    echo "== $name: exit $rc$( ((rc == 124)) && echo ' (stopped at its limit)') in $((SECONDS - start)) s" >&2
    ((rc == 0)) || status=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name())'
step benchmarks "${BENCH_S:-330}" "$py" -m benchmarks.run --device cuda --size full --precision both --out "$out"
step resume "${RESUME_S:-90}" "$py" scripts/parity/cuda_resume_check.py >"$out/resume.jsonl"
cat "$out/resume.jsonl"
# -v: one line per test as it ends, so a suite stopped at its limit still says what ran
step tests "${TESTS_S:-150}" "$py" -m pytest -v -p no:cacheprovider --continue-on-collection-errors \
    -o addopts="-n auto --dist loadfile -rfE" >"$out/tests.txt" 2>&1
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$out/tests.txt" | tail -n 80
exit $status
