#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one run, on a machine with one GPU, PyTorch and
# no Ray (the project's other needs installed beside it, e.g. from carried wheels):
#   bash bench/gpu_figures.sh OUT_DIR          (SPEC=... for another spec than the 1b one)
# Each bench is capped by its own time limit, most wanted first, so a slow one costs only
# itself. Results: OUT_DIR/*.json (one line each), the CLI's metrics, and log.txt.
set -u
out=${1:?usage: bench/gpu_figures.sh OUT_DIR}
spec=${SPEC:-examples/bench-1b.yaml}
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
log=$out/log.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'; } >>"$log" 2>&1

run() {  # name, limit in seconds, command...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@" >"$out/$name.json" 2>>"$log"
    local code=$?
    echo "== $name: exit $code after $((SECONDS - start)) s: $(tail -c 1500 "$out/$name.json")" | tee -a "$log"
}

eager=$out/spec-eager.yaml
sed 's/^\( *\)compile: true.*/\1compile: false/' "$spec" >"$eager"
# `shardline train` as a user runs it, eager: its summary, and every step's metrics with
# the step-time breakdown (CUDA events).
run train_eager 100 python3 -m shardline.api.cli train "$eager" --nproc 1 --metrics-out "$out/train_eager.jsonl"
# The engine's step against a plain PyTorch loop over the same model, eager.
run vs_plain_eager 110 python3 -m bench.vs_plain "$spec" --no-compile --steps 10 --rounds 3
# Tokens/s and MFU with each block compiled (the spec's setting).
run mfu_compiled 150 python3 -m bench.mfu "$spec"
run vs_plain_compiled 120 python3 -m bench.vs_plain "$spec" --compile --steps 10 --rounds 3
rm -f "$eager"
