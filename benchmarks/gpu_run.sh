#!/bin/bash
# The GPU checks of issue 17 as one prepared script for a lent accelerator
# machine (device tool), most important first, inside a time budget.
#
#   WHEELS=.gpu DEADLINE=540 bash benchmarks/gpu_run.sh
#
# WHEELS: a folder of wheels to install first, without an index (the lent
# image has PyTorch and JAX but not Keras, keras-hub, namex, optree,
# kagglehub, kagglesdk; TensorFlow's wheel is too large to carry, so Keras
# runs on JAX there).
# The image's Python was 3.12 in the 2026-11-27 19:19 UTC session: download
# optree for it too (`pip download --no-deps --only-binary=:all:
# --python-version 312 --platform manylinux_2_28_x86_64 optree`). DEADLINE: seconds for the whole script; each step gets
# at most its budget and what is left, and a step with under 30 s left is
# skipped. Each configuration's line is appended to $OUT/results.jsonl as
# soon as it is timed, so a step cut off keeps the rows it finished.
# Measured there (2026-11-26, H200): about 20-25 s per configuration (a new
# process builds BERT-base twice and compiles).
#
#   WHEELS=.gpu ROUNDS=3 DEADLINE=420 bash benchmarks/gpu_run.sh
#
# ROUNDS=N runs only the goal's comparison instead: N rounds of bertzoo (JAX)
# then PyTorch, bfloat16, inference then training, each configuration in a
# process of its own, so the two libraries alternate and a drift of the host
# lands on both.
#
#   WHEELS=.gpu INT8=1 DEADLINE=540 bash benchmarks/gpu_run.sh
#
# INT8=1 runs only the int8 comparison: bertzoo (JAX) inference in float32,
# bfloat16, int8 and weight-only int8 (float32 and bfloat16 arithmetic) at
# batch 32, then float32 and the bfloat16 ones at batch 1, then keras-hub's int8
# rows.
set -u
OUT=${OUT:-benchmarks/out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=${KERAS_BACKEND:-jax} PYTHONPATH=$PWD
START=$(date +%s)
DEADLINE=${DEADLINE:-540}
PRESET=${PRESET:-base}
say() { echo "[t=$(($(date +%s) - START))s] $*"; }
# budget SECONDS -> the seconds a step may take now (0: skip it).
budget() {
    local left=$((DEADLINE - ($(date +%s) - START)))
    if [ "$left" -lt 30 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
step() {
    local seconds
    seconds=$(budget "$1")
    shift
    if [ "$seconds" -eq 0 ]; then say "skipped (deadline): $*"; return; fi
    say "$* (up to ${seconds} s)"
    timeout "$seconds" "$@" 2>&1 | grep -v "^$" | tail -40
}
bench() {
    local seconds=$1
    shift
    step "$seconds" python3 -m benchmarks.run "$@" --preset "$PRESET" --sequence-length 128 \
        --runs 10 --warmup 2 --chart= --worker-timeout 240 --results "$OUT/results.jsonl" --batch-size "${BATCH:-32}"
}
probe() { step "$2" python3 -m benchmarks.gpu_probe --backend "$1"; }

nvidia-smi -L 2>/dev/null
if [ -n "${WHEELS:-}" ]; then
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    if [ "${#wheels[@]}" -gt 0 ]; then
        # One wheel at a time: a wheel built for another Python (optree's, say)
        # would make pip refuse the whole list; it is skipped instead.
        for wheel in "${wheels[@]}"; do
            python3 -m pip install --no-index --no-deps -q "$wheel" 2>&1 | grep -v "WARNING\|not a supported wheel" | tail -2
        done
    else
        echo "no wheels in $WHEELS"
    fi
fi
python3 -c "import keras, jax; print('keras', keras.__version__, 'jax', jax.__version__, jax.devices())"
python3 -c "import torch, transformers; print('torch', torch.__version__, torch.cuda.is_available(), 'transformers', transformers.__version__)" 2>&1 | tail -1
python3 -c "import tensorflow as tf; print('tensorflow', tf.__version__, tf.config.list_physical_devices('GPU'))" 2>&1 | tail -1
if [ -n "${INT8:-}" ]; then
    int8s=float32,bfloat16,int8,int8_weights,int8_weights_bfloat16
    # About 30 s per configuration on an H100 (2026-11-27): 40 s each here.
    bench 220 --models bertzoo_jax --modes inference --dtypes "$int8s"
    # float32 too: the compression issue's int8 goal is a ratio to it at batch 1 as well.
    BATCH=1 bench 170 --models bertzoo_jax --modes inference --dtypes float32,bfloat16,int8,int8_weights_bfloat16
    bench 130 --models keras_hub_jax --modes inference --dtypes int8,int8_weights,int8_weights_bfloat16
    say done
    exit 0
fi
if [ -n "${ROUNDS:-}" ]; then
    for round in $(seq "$ROUNDS"); do
        say "round $round of $ROUNDS"
        bench 200 --models bertzoo_jax,transformers --modes inference --dtypes bfloat16
        bench 240 --models bertzoo_jax,transformers --modes training --dtypes bfloat16
    done
    say done
    exit 0
fi
probe jax 60
step 120 python3 -m benchmarks.call_overhead --preset "$PRESET" --batches 32,256 --dtypes bfloat16 --runs 10 \
    --results "$OUT/results.jsonl"
# The GPU's kernel time per call (PyTorch's profiler in its own run: it blocks JAX's).
step 80 python3 -m benchmarks.call_overhead --preset "$PRESET" --batches 32 --dtypes bfloat16 --runs 10 --kernels 5 \
    --libraries bertzoo,keras_hub --results "$OUT/results.jsonl"
step 40 python3 -m benchmarks.call_overhead --preset "$PRESET" --batches 32 --dtypes bfloat16 --runs 10 --kernels 5 \
    --libraries transformers --results "$OUT/results.jsonl"
bench 150 --models bertzoo_jax,keras_hub_jax,transformers --modes inference --dtypes float32,bfloat16
bench 100 --models bertzoo_jax,keras_hub_jax,transformers --modes training --dtypes bfloat16
step 200 python3 -m benchmarks.training_gap --preset "$PRESET" --batch 32 --dtype bfloat16 --runs 10 \
    --measures train_on_batch,train_on_batch_default,gradients --results "$OUT/results.jsonl"
probe torch 60
bench 100 --models bertzoo_torch --modes inference,training --dtypes bfloat16
bench 70 --models bertzoo_jax,keras_hub_jax --modes inference --dtypes int8
say done
