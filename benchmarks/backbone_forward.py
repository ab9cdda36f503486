"""Forward-pass time of bertzoo's BertBackbone against keras-hub's.

Builds the `base` preset (random weights) and its keras-hub BertBackbone
twin with the same weights, so both compute the same function (checked),
then times one forward pass of a
(batch, length) batch with and without XLA. Each timed call is a
`predict_on_batch` on a model compiled with `jit_compile=True` or `False`;
after warm-up calls (the first one compiles) the two models are timed in
alternation, so load changes on a shared machine hit both alike, and the
median is reported.

Usage:
    python -m benchmarks.backbone_forward [--runs 5] [--batch 8] [--length 128]

Prints a table and appends one JSON line per (model, XLA) to
benchmarks/results.jsonl (through `benchmarks.results`, which stamps date,
machine, load average and command).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import keras
import keras_hub
import numpy as np

import bertzoo
from bertzoo.saving.preset import builtin_presets
from benchmarks.peers import make_inputs
from benchmarks.results import RESULTS_FILE
from benchmarks.results import append_results
from benchmarks.results import machine
from bertzoo.utils.device import accelerator


def build_models(preset):
    """bertzoo's backbone (random weights) and its keras-hub twin holding the
    same weights (`bertzoo.convert.to_keras_hub`, which refuses presets
    keras-hub cannot express)."""
    ours = bertzoo.BertBackbone.from_preset(preset, load_weights=False)
    try:
        theirs = bertzoo.convert.to_keras_hub(ours)
    except ValueError as e:
        raise SystemExit(f"Preset {preset!r} has no keras-hub BertBackbone twin: {e}")
    return builtin_presets()[preset]["backbone"], ours, theirs


def time_forward(models, inputs, xla, runs, warmup):
    """Median milliseconds of `predict_on_batch` for each model, timed alternately."""
    for model in models.values():
        model.compile(jit_compile=xla)
        for _ in range(warmup):
            model.predict_on_batch(inputs)
    times = {name: [] for name in models}
    for _ in range(runs):
        for name, model in models.items():
            start = time.perf_counter()
            model.predict_on_batch(inputs)  # Returns NumPy arrays: the work is done.
            times[name].append((time.perf_counter() - start) * 1000.0)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed calls per model and mode (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (the first compiles)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--output", type=Path, default=RESULTS_FILE, help="JSON lines file to append to")
    args = parser.parse_args(argv)

    config, ours, theirs = build_models(args.preset)
    inputs = make_inputs(args.batch, args.length, config["vocabulary_size"])
    expected, got = theirs(inputs), ours(inputs)
    max_diff = max(
        float(np.max(np.abs(keras.ops.convert_to_numpy(got[k]) - keras.ops.convert_to_numpy(expected[k]))))
        for k in ("sequence_output", "pooled_output")
    )
    if max_diff > 1e-4:
        raise SystemExit(f"bertzoo and keras-hub disagree (max abs diff {max_diff:.2e}); not timing.")

    models = {"bertzoo": ours, "keras-hub": theirs}
    rows = []
    for xla in (True, False):
        times = time_forward(models, inputs, xla, args.runs, args.warmup)
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name in models:
            rows.append(
                {
                    "config": {
                        "model": name,
                        "preset": args.preset,
                        "batch": args.batch,
                        "length": args.length,
                        "xla": xla,
                        "device": accelerator(),
                        "dtype": keras.config.dtype_policy().name,
                        "backend": keras.backend.backend(),
                        "keras": keras.__version__,
                        "keras_hub": keras_hub.__version__,
                        "bertzoo": bertzoo.__version__,
                        "warmup": args.warmup,
                        "max_abs_diff_vs_keras_hub": max_diff,
                    },
                    "median_ms": round(medians[name], 2),
                    "min_ms": round(min(times[name]), 2),
                    "runs": args.runs,
                    "ratio_to_keras_hub": round(medians[name] / medians["keras-hub"], 3),
                }
            )

    print(f"{args.preset}, batch {args.batch}, length {args.length}, {args.runs} runs; {machine()}")
    print(f"outputs agree: max abs diff {max_diff:.1e}")
    print("| model | XLA | median ms | min ms | ratio to keras-hub |")
    print("|---|---|--:|--:|--:|")
    for r in rows:
        c = r["config"]
        print(
            f"| {c['model']} | {'yes' if c['xla'] else 'no'} | {r['median_ms']:.1f} | "
            f"{r['min_ms']:.1f} | {r['ratio_to_keras_hub']:.3f} |"
        )
    command = "python -m benchmarks.backbone_forward " + " ".join(sys.argv[1:] if argv is None else argv)
    append_results("backbone_forward", rows, command.strip(), path=args.output)
    print(f"appended {len(rows)} lines to {args.output}")
    return rows


if __name__ == "__main__":
    main()
