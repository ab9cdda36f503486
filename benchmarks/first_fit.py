"""How long a classifier's first `fit` takes, with the optimizer's variables
created before Keras traces the training step (what bertzoo's `fit` does,
`bertzoo.models.raw_inputs.build_optimizer_before_fit`) and inside the
traced step (what Keras alone does).

    python -m benchmarks.first_fit [--preset base] [--repeats 2] [--batch-size 2] [--sequence-length 16]

Each (setting, repeat) runs in a fresh process (the first `fit` of a
process is what a user waits for), alternating the settings: a classifier
of the preset's shape with random weights, compiled with bertzoo's defaults
(`bert_optimizer`, the `"auto"` XLA choice by its rule), fitted on one batch
of token ids twice: the first `fit` (tracing, variable creation, one step)
and the second (one step, traced already). On the TensorFlow backend (the
backend the difference is about). Rows go to `benchmarks/results.jsonl`.
"""

import argparse
import json
import os
import statistics
import sys

from benchmarks.harness import alternating_workers
from benchmarks.harness import machine
from benchmarks.harness import print_table
from benchmarks.harness import record
from benchmarks.harness import token_batch
from benchmarks.harness import worker_result

SETTINGS = ("before_the_step", "inside_the_step")


def worker(preset, setting, batch, length):
    """One process: the first and second `fit` times; prints one JSON line."""
    import time

    import keras
    import numpy as np

    import bertzoo
    from bertzoo.models import raw_inputs

    if setting == "inside_the_step":
        raw_inputs.build_optimizer_before_fit = lambda model: None
    keras.utils.set_random_seed(0)
    backbone = bertzoo.BertBackbone.from_preset(preset, load_weights=False)
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=None)
    model.compile()
    x = token_batch(batch, length, backbone.vocabulary_size)
    y = np.arange(batch) % 2
    built_at_start = []

    class BuiltAtStart(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            built_at_start.append(bool(self.model.optimizer.built))

    times = []
    for _ in range(2):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[BuiltAtStart()])
        times.append(time.perf_counter() - start)
    result = {"first_s": times[0], "second_s": times[1], "optimizer_variables": len(model.optimizer.variables)}
    print(json.dumps({**result, "built_when_first_fit_began": built_at_start[0]}), flush=True)


def run_worker(setting, args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow", BERTZOO_JIT_COMPILE="rule")
    arguments = ["--worker", setting, "--preset", args.preset, "--batch-size", args.batch_size]
    return worker_result("benchmarks.first_fit", [*arguments, "--sequence-length", args.length], env, setting)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", help="bertzoo preset giving the model shape")
    parser.add_argument("--repeats", type=int, default=2, help="processes per setting")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--sequence-length", dest="length", type=int, default=16)
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    parser.add_argument("--worker", default=None, choices=SETTINGS, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.preset, args.worker, args.batch_size, args.length)
    if args.repeats < 1 or args.batch_size < 1 or args.length < 2:
        raise SystemExit("--repeats and --batch-size must be positive and --sequence-length at least 2.")
    print(f"{machine()}; {args.preset} classifier, first fit on {args.batch_size} x {args.length}", flush=True)
    results = alternating_workers(
        SETTINGS,
        args.repeats,
        lambda setting: run_worker(setting, args),
        lambda setting, result: f"optimizer variables {setting}: first fit {result['first_s']:.2f} s",
    )
    first = {s: statistics.median(r["first_s"] for r in results[s]) for s in SETTINGS}
    rows = [
        {
            "setting": f"optimizer variables created {setting.replace('_', ' ')}",
            "preset": args.preset,
            "batch_size": args.batch_size,
            "sequence_length": args.length,
            "first_fit_s": round(first[setting], 2),
            "process_first_fit_s": [round(r["first_s"], 2) for r in results[setting]],
            "second_fit_s": round(statistics.median(r["second_s"] for r in results[setting]), 2),
            "optimizer_variables": results[setting][0]["optimizer_variables"],
            "built_when_first_fit_began": results[setting][0]["built_when_first_fit_began"],
            "speedup_vs_inside_the_step": round(first["inside_the_step"] / first[setting], 2),
        }
        for setting in SETTINGS
    ]
    print_table(rows, ["setting", "first_fit_s", "process_first_fit_s", "second_fit_s", "speedup_vs_inside_the_step"])
    record("first_fit", rows, "benchmarks.first_fit", argv, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
