#!/bin/bash
# The GPU checks of issue 17 as one prepared script for a lent accelerator
# machine (device tool), most important first, inside a time budget.
#
#   WHEELS=.gpu DEADLINE=420 bash benchmarks/gpu_run.sh
#
# WHEELS: a folder of wheels to install first, without an index (the lent
# image has PyTorch and JAX but not Keras, keras-hub, namex, optree,
# kagglehub, kagglesdk; TensorFlow's wheel is too large to carry, so Keras
# runs on JAX there). DEADLINE: seconds for the whole script; each step gets
# what is left. Each configuration's line is appended to $OUT/results.jsonl
# as soon as it is timed, so a step cut off by the deadline keeps its rows.
# Measured there (2026-11-26, H200): about 20-25 s per configuration (a new
# process builds BERT-base twice and compiles), so budget accordingly.
set -u
OUT=${OUT:-benchmarks/out/gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=${KERAS_BACKEND:-jax} PYTHONPATH=$PWD
START=$(date +%s); DEADLINE=${DEADLINE:-420}; PRESET=${PRESET:-base}
left() { local l=$((DEADLINE - ($(date +%s) - START))); [ "$l" -gt "$1" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
say() { echo "[t=$(($(date +%s) - START))s] $*"; }
nvidia-smi -L 2>/dev/null
[ -n "${WHEELS:-}" ] && python3 -m pip install --no-index --no-deps -q "$WHEELS"/*.whl 2>&1 | grep -v WARNING | tail -2
python3 -c "import keras, jax; print('keras', keras.__version__, 'jax', jax.__version__, jax.devices())"
python3 -c "import torch, transformers; print('torch', torch.__version__, torch.cuda.is_available(), 'transformers', transformers.__version__)" 2>&1 | tail -1
COMMON="--preset $PRESET --batch-size 32 --sequence-length 128 --runs 10 --warmup 2 --chart= --worker-timeout 120 --results $OUT/results.jsonl"
bench() {
    local budget=$1; shift
    say "bench $*"
    # shellcheck disable=SC2086
    timeout "$(left "$budget")" python3 -m benchmarks.run "$@" $COMMON 2>&1 | grep -v "^$" | tail -30
}
probe() { say "probe $1"; timeout "$(left "$2")" python3 -m benchmarks.gpu_probe --backend "$1" 2>&1 | grep -E "^PROBE|Error" | sort | uniq -c | cut -c1-900; }
probe jax 60
bench 150 --models bertzoo_jax,keras_hub_jax,transformers --modes inference --dtypes float32,bfloat16
bench 100 --models bertzoo_jax,keras_hub_jax,transformers --modes training --dtypes bfloat16
bench 100 --models bertzoo_jax,transformers --modes inference --dtypes int8,float16
probe torch 60
bench 120 --models bertzoo_torch --modes inference,training --dtypes bfloat16
bench 100 --models keras_hub_jax,transformers --modes training --dtypes float32
say done
