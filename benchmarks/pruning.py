"""What pruning costs a training step: a classifier's step with a `bertzoo.Pruner` against the same step without.

    python -m benchmarks.pruning [--preset small] [--batch-size 8] [--sequence-length 128]
                                 [--frequencies 1,100] [--scores magnitude] [--xla off,on] [--runs 9]

A `Pruner` works through variable constraints: on the steps its schedule
says, each pruned kernel's mask is recomputed (a score threshold per kernel),
and every step multiplies the kernels by their masks. Per (XLA mode, mask
update frequency) this builds two classifiers of the same seeded weights,
one pruned (`PolynomialDecay` from 0 to 90% over 1000 steps, updated every
`frequency` steps, first update at step 0) and one not, and times their
`train_on_batch` interleaved in one process
(`benchmarks.harness.time_interleaved`): the first call (tracing and
compilation) and the median step. Prints the table and appends one row per
configuration to benchmarks/results.jsonl.
"""

import argparse
import sys

import numpy as np

from benchmarks.harness import append_results
from benchmarks.harness import command_line
from benchmarks.harness import print_table
from benchmarks.harness import time_interleaved
from benchmarks.harness import token_batch
from benchmarks.peers import backbone_config


def build(config, xla, frequency=None, scores="magnitude"):
    """A compiled classifier of seeded weights, and its `Pruner` when
    `frequency` is set (else None)."""
    import keras

    import bertzoo

    keras.utils.set_random_seed(0)
    model = bertzoo.BertClassifier(bertzoo.BertBackbone(**config), 2)
    model.compile(optimizer="auto", jit_compile=xla)
    if frequency is None:
        return model, None
    schedule = bertzoo.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=1000, frequency=frequency)
    return model, bertzoo.Pruner(model, schedule, scores=scores)


def measure(preset="small", batch=8, length=128, xla=False, frequency=100, scores="magnitude", runs=9):
    """One row: the first call and median step of the pruned and the dense
    training step, their ratios, and the sparsity the pruned one reached."""
    config = backbone_config(preset)
    x = token_batch(batch, length, config["vocabulary_size"])
    y = np.arange(batch) % 2
    dense, _ = build(config, xla)
    pruned, pruner = build(config, xla, frequency, scores)
    models = {"dense": dense, "pruned": pruned}
    timings = time_interleaved({k: (lambda m=m: m.train_on_batch(x, y)) for k, m in models.items()}, runs, warmup=1)
    row = {"preset": preset, "batch": batch, "length": length, "xla": xla, "frequency": frequency, "scores": scores}
    for name in models:
        row[f"{name}_first_call_s"] = round(timings[name]["first_call_s"], 2)
        row[f"{name}_step_ms"] = round(1000 * timings[name]["median_s"], 1)
    row["first_call_ratio"] = round(row["pruned_first_call_s"] / row["dense_first_call_s"], 2)
    row["step_ratio"] = round(row["pruned_step_ms"] / row["dense_step_ms"], 3)
    row["steps"] = pruner.step
    row["sparsity"] = round(pruner.sparsity(), 4)
    row["runs"] = runs
    return row


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--frequencies", default="1,100", help="mask update every N steps (comma list)")
    parser.add_argument("--scores", default="magnitude", help="Pruner scores (magnitude, movement or fisher)")
    parser.add_argument("--xla", default="off,on", help="comma list of off, on")
    parser.add_argument("--runs", type=int, default=9, help="timing rounds (medians)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)

    frequencies = args.frequencies.split(",")
    if not all(f.isdigit() and int(f) > 0 for f in frequencies):
        parser.error(f"--frequencies takes positive integers, got {args.frequencies!r}")
    modes = args.xla.split(",")
    if not set(modes) <= {"off", "on"}:
        parser.error(f"--xla takes off and on, got {args.xla!r}")
    rows = []
    for xla in modes:
        for frequency in frequencies:
            row = measure(
                args.preset,
                args.batch_size,
                args.sequence_length,
                xla == "on",
                int(frequency),
                args.scores,
                args.runs,
            )
            rows.append(row)
            print_table(rows[-1:], list(row))
    print_table(rows, list(rows[0]))
    if not args.no_record:
        append_results("pruning", rows, command=command_line("benchmarks.pruning", argv))


if __name__ == "__main__":
    main()
