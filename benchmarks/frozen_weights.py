"""TensorFlow's `TF_ONEDNN_ASSUME_FROZEN_WEIGHTS` switch, measured on bertzoo.

    python -m benchmarks.frozen_weights [--dtypes float32,bfloat16] [--repeats 3] [--runs 7]

bertzoo's Dense layers run, without XLA on TensorFlow's x86 CPU build, as
oneDNN inner products (`_FusedMatMul`: matmul, bias and activation in one
kernel). TensorFlow hands oneDNN a variable's kernel in its plain layout,
and on an Intel Xeon with AMX oneDNN then picks a kernel without AMX
(`x64:gemm:jit` in `ONEDNN_VERBOSE`). With the environment variable
`TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1` (read once, when TensorFlow first builds
such a kernel) the kernel is reordered into oneDNN's blocked layout, the AMX
kernel runs, and the reordered copy is kept: TensorFlow then no longer reads
the variable, so a process that changes its weights (training, `set_weights`,
loading) computes with the old ones.

Each (dtype, setting) runs BERT-base inference (batch 8 x 128, no XLA, the
`base` preset's shape, random weights; `--preset` for another) in a fresh process, `--repeats`
times, alternating the settings; each process reports the median of
`--runs` calls, the table the median over processes. Each process also
gives every Dense kernel new random entries after timing and checks
whether the compiled function still returns what it returned before, or
disagrees with a freshly traced one ("stale outputs": a kept copy of any
kernel).
Rows are appended to `benchmarks/results.jsonl`.
"""

import argparse
import json
import os
import statistics
import sys

from benchmarks.harness import machine
from benchmarks.harness import print_table
from benchmarks.harness import record
from benchmarks.harness import time_interleaved
from benchmarks.harness import token_batch
from benchmarks.harness import worker_result

SWITCH = "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"
SETTINGS = ("unset", "1")


def worker(preset, dtype, runs, batch, length):
    """Times one process's inference and checks for stale outputs; prints one JSON line."""
    import numpy as np
    import tensorflow as tf

    import bertzoo

    backbone = bertzoo.BertBackbone.from_preset(preset, dtype=dtype)
    inputs = {k: tf.constant(v) for k, v in token_batch(batch, length, backbone.vocabulary_size).items()}

    def traced():
        function = tf.function(lambda x: backbone(x, training=False)["sequence_output"], jit_compile=False)
        return lambda: function(inputs).numpy().astype("float32")

    infer = traced()
    timing = time_interleaved({"inference": infer}, runs=runs, warmup=2)["inference"]
    # New random entries in every Dense kernel: no rounding hides the change,
    # nor LayerNorm (which would remove a constant shift). A kept copy of any
    # one kernel makes the compiled function disagree with a freshly traced one.
    before = infer()
    rng = np.random.default_rng(1)
    for variable in backbone.weights:
        if variable.path.endswith("kernel") and len(variable.shape) == 2:
            variable.assign(tf.cast(0.05 * rng.standard_normal(variable.shape), variable.dtype))
    again, fresh = infer(), traced()()

    def close(a, b):
        return np.allclose(a, b, atol=1e-2, rtol=1e-2)

    stale = close(again, before) or not close(again, fresh)
    print(json.dumps({"median_ms": 1000.0 * timing["median_s"], "stale": bool(stale)}), flush=True)


def run_worker(dtype, setting, args):
    # TensorFlow's oneDNN kernels on (the switch means nothing without them).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow", TF_ENABLE_ONEDNN_OPTS="1")
    env.pop(SWITCH, None)
    if setting != "unset":
        env[SWITCH] = setting
    arguments = ["--worker", dtype, "--preset", args.preset, "--runs", args.runs, "--batch-size", args.batch_size]
    arguments = [*arguments, "--sequence-length", args.length]
    return worker_result("benchmarks.frozen_weights", arguments, env, f"{dtype} {SWITCH}={setting}")


def dtype_policies(value):
    """`--dtypes` -> Keras dtype policy names, checked here rather than in
    the first worker (which would fail after TensorFlow's start-up with a
    traceback)."""
    import keras

    names = [d.strip() for d in value.split(",") if d.strip()]
    if not names:
        raise SystemExit(f"--dtypes: no dtype policy in {value!r}; e.g. float32,bfloat16.")
    for name in names:
        try:
            keras.dtype_policies.get(name)
        except ValueError:
            raise SystemExit(
                f"--dtypes: {name!r} is not a Keras dtype policy; e.g. float32, bfloat16, mixed_bfloat16."
            ) from None
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma list of Keras dtype policies")
    parser.add_argument("--repeats", type=int, default=3, help="processes per (dtype, setting)")
    parser.add_argument("--runs", type=int, default=7, help="timed calls per process (median)")
    parser.add_argument("--preset", default="base", help="bertzoo preset giving the model shape")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", dest="length", type=int, default=128)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.preset, args.worker, args.runs, args.batch_size, args.length)
    if args.repeats < 1 or args.runs < 1:
        raise SystemExit("--repeats and --runs must be positive.")
    dtypes = dtype_policies(args.dtypes)
    print(f"{machine()}; {args.preset} inference, batch {args.batch_size} x {args.length}, no XLA", flush=True)
    rows = []
    for dtype in dtypes:
        results = {setting: [] for setting in SETTINGS}
        for repeat in range(args.repeats):
            for setting in SETTINGS if repeat % 2 == 0 else SETTINGS[::-1]:
                result = run_worker(dtype, setting, args)
                print(
                    f"  {dtype} {SWITCH}={setting}: {result['median_ms']:.1f} ms, stale {result['stale']}", flush=True
                )
                results[setting].append(result)
        medians = {s: statistics.median(r["median_ms"] for r in results[s]) for s in SETTINGS}
        for setting in SETTINGS:
            rows.append(
                {
                    "dtype": dtype,
                    "setting": f"{SWITCH}={setting}",
                    "median_ms": round(medians[setting], 1),
                    "process_medians_ms": [round(r["median_ms"], 1) for r in results[setting]],
                    "speedup_vs_unset": round(medians["unset"] / medians[setting], 3),
                    "stale_outputs": any(r["stale"] for r in results[setting]),
                    "process_stale": [r["stale"] for r in results[setting]],
                    "preset": args.preset,
                    "batch_size": args.batch_size,
                    "sequence_length": args.length,
                }
            )
    print_table(rows, ["dtype", "setting", "median_ms", "process_medians_ms", "speedup_vs_unset", "stale_outputs"])
    record("frozen_weights", rows, "benchmarks.frozen_weights", argv, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
