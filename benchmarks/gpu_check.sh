#!/usr/bin/env bash
# The CUDA path end to end (issue 28 item 4), from the repository root on a machine with a GPU:
#
#     benchmarks/gpu_check.sh                 # tests/gpu, then profile -> plan -> simulate -> train of gpt1-14
#     benchmarks/gpu_check.sh --cpu-dry-run   # the same commands on the CPU (gpt-tiny, few steps): checks the CLI
#
# 1. prints the device (torch, CUDA, GPU names); 2. runs `pytest -m gpu tests/gpu`; 3. profiles gpt1-14 (the zoo's
# GPT-1 sizes; there is no smaller "gpt1-14-small") on the GPU, plans it on RANKS ranks (one per GPU under NCCL, or
# 2 ranks sharing one GPU over gloo), simulates the plan, trains it, and prints predicted against measured
# iteration time (`pipetrain compare`) and peak memory per stage (train's summary: the memory model against the CUDA
# allocator's peak). Any error stops the script with a non-zero status and the line that failed.
#
# Environment: PYTHON (default .venv/bin/python), OUT (default out/gpu_check), STEPS (default 30), BATCH (default 16).
set -euo pipefail
trap 'echo "gpu_check: FAILED (exit $?) at line $LINENO: ${BASH_COMMAND%%$'"'"'\n'"'"'*}" >&2' ERR

PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/gpu_check}
DRY=0
if [[ $# -gt 0 ]]; then
    if [[ $1 == --cpu-dry-run && $# -eq 1 ]]; then
        DRY=1
    else
        echo "usage: benchmarks/gpu_check.sh [--cpu-dry-run]" >&2
        exit 2
    fi
fi
[[ -x $PYTHON ]] || { echo "gpu_check: no python at $PYTHON; run from the repository root or set PYTHON" >&2; exit 2; }
[[ -d pipetrain ]] || { echo "gpu_check: run from the repository root (no ./pipetrain here)" >&2; exit 2; }

if [[ $DRY == 1 ]]; then
    DEVICE=cpu MODEL=gpt-tiny STEPS=${STEPS:-3} BATCH=${BATCH:-8} REPEATS=1 RANKS=2 BACKEND=gloo
else
    DEVICE=cuda MODEL=gpt1-14 STEPS=${STEPS:-30} BATCH=${BATCH:-16} REPEATS=5
fi

echo "== device"
"$PYTHON" - "$DEVICE" <<'EOF'
import sys

import torch

device = sys.argv[1]
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no GPU (CPU build, no driver, or CUDA_VISIBLE_DEVICES); "
                 "use --cpu-dry-run to check the commands on a CPU")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
else:
    print("CPU dry run: no GPU used")
EOF
if [[ $DEVICE == cuda ]]; then
    GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
    if (( GPUS >= 2 )); then RANKS=2 BACKEND=nccl; else RANKS=2 BACKEND=gloo; fi
    echo "$RANKS ranks over $BACKEND ($GPUS GPU(s); one GPU is shared round-robin by gloo: NCCL refuses that)"
fi

echo "== tests/gpu"
if [[ $DRY == 1 ]]; then
    "$PYTHON" -m pytest -q -p no:cacheprovider --collect-only -m gpu tests/gpu
else
    "$PYTHON" -m pytest -q -p no:cacheprovider -n 0 -m gpu tests/gpu
fi

mkdir -p "$OUT"
echo "== profile $MODEL (batch $BATCH) on $DEVICE"
"$PYTHON" -m pipetrain profile --model "$MODEL" --batch "$BATCH" --device "$DEVICE" --repeats "$REPEATS" \
    --out "$OUT/profile.json"
echo "== plan on $RANKS ranks"
"$PYTHON" -m pipetrain plan --model "$MODEL" --batch "$BATCH" --profile "$OUT/profile.json" --ranks "$RANKS" \
    --method 1f1b --out "$OUT/plan.json"
echo "== simulate"
"$PYTHON" -m pipetrain simulate --plan "$OUT/plan.json" --profile "$OUT/profile.json" --out-dir "$OUT/sim"
echo "== train $STEPS steps on $DEVICE over $BACKEND"
"$PYTHON" -m pipetrain train --plan "$OUT/plan.json" --profile "$OUT/profile.json" --device "$DEVICE" \
    --backend "$BACKEND" --steps "$STEPS" --out-dir "$OUT/run"
echo "== predicted against measured"
"$PYTHON" -m pipetrain compare --plan "$OUT/plan.json" --predicted "$OUT/sim/predicted.json" \
    --measured "$OUT/run/measured.json" --out "$OUT/compare.png"
"$PYTHON" - "$OUT" "$DEVICE" "$BACKEND" <<'EOF'
import sys
from pathlib import Path

from pipetrain.simulate.timeline import Timeline

out, device, backend = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
predicted = Timeline.load(out / "sim" / "predicted.json").iteration_s
measured = Timeline.load(out / "run" / "measured.json").iteration_s
print(f"iteration time on {device} ({backend}): predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
      f"(measured / predicted {measured / predicted:.2f}); peak memory: train's summary line above")
EOF
echo "gpu_check: OK"
