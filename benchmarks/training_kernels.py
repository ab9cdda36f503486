"""What bertzoo's fused training kernels buy: the training step with and without each.

    python -m benchmarks.training_kernels [--dtypes float32,bfloat16] [--activations gelu_tanh,gelu_exact]
                                          [--preset base] [--batch-size 8] [--sequence-length 128] [--runs 9]

On TensorFlow outside XLA, bertzoo's training step has two fused kernels of
its own: GELU runs as two XLA kernels while gradients are taken (values, and
a hand-written gradient; `bertzoo.layers.activations`), and `bert_optimizer`'s
AdamW runs each variable's whole step (clip scale, weight decay, Adam) as one
XLA kernel (`bertzoo.models.optimizers`). Per (dtype, activation) this builds
three classifiers of the same seeded weights: bertzoo as it is, one traced
with Keras's GELU (the kernels switched off while it traces), and one
compiled with `keras.optimizers.AdamW` of the same settings instead of
bertzoo's. It records how far apart their first three training losses are
(`loss_rel_diff`; the tests check the arithmetic) and times
`train_on_batch` of all three, interleaved in one process
(`benchmarks.harness.time_interleaved`), on bertzoo's default training path
(no XLA). Prints the table and appends one row per configuration to
benchmarks/results.jsonl.
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

VARIANTS = ("bertzoo", "keras_gelu", "keras_adamw")
DTYPES = ("float32", "bfloat16")  # bfloat16: the mixed_bfloat16 policy.
ACTIVATIONS = ("gelu_tanh", "gelu_exact")  # The GELUs bertzoo fuses.


def keras_adamw():
    """`keras.optimizers.AdamW` set up as `bert_optimizer` sets up bertzoo's."""
    import keras

    from bertzoo.models.optimizers import NO_WEIGHT_DECAY
    from bertzoo.models.optimizers import bert_optimizer

    config = bert_optimizer().get_config()
    config.pop("exclude_from_weight_decay_names")  # bertzoo's own key, set below the Keras way.
    optimizer = keras.optimizers.AdamW.from_config(config)
    optimizer.exclude_from_weight_decay(var_names=list(NO_WEIGHT_DECAY))
    return optimizer


def build(variant, config, policy, x, y):
    """A classifier compiled for `variant`, and its first three losses (the
    first call traces the step: the choice of GELU is made then)."""
    import keras

    import bertzoo
    from bertzoo.layers import activations

    real = activations._fused_gradient_applies
    if variant == "keras_gelu":
        activations._fused_gradient_applies = lambda: False
    try:
        keras.utils.set_random_seed(0)
        model = bertzoo.BertClassifier(bertzoo.BertBackbone(**config, dtype=policy), 2)
        model.compile(optimizer=keras_adamw() if variant == "keras_adamw" else "auto", jit_compile=False)
        losses = [float(np.ravel(model.train_on_batch(x, y))[0]) for _ in range(3)]
    finally:
        activations._fused_gradient_applies = real
    return model, losses


def measure(dtype, activation, preset="base", batch=8, length=128, runs=9):
    """One row: median ms of the training step of each variant, bertzoo's
    speedup over the other two, and the largest relative gap between their
    first three losses and bertzoo's."""
    config = dict(backbone_config(preset), activation=activation)
    policy = "mixed_bfloat16" if dtype == "bfloat16" else dtype
    x = token_batch(batch, length, config["vocabulary_size"])
    y = np.arange(batch) % 2
    models, losses = {}, {}
    for variant in VARIANTS:
        models[variant], losses[variant] = build(variant, config, policy, x, y)
    timings = time_interleaved({k: (lambda m=m: m.train_on_batch(x, y)) for k, m in models.items()}, runs, warmup=1)
    ms = {k: 1000 * timings[k]["median_s"] for k in VARIANTS}
    row = {"preset": preset, "dtype": dtype, "activation": activation, "batch": batch, "length": length, "runs": runs}
    row.update({f"{k}_ms": round(ms[k], 1) for k in VARIANTS})
    for other in VARIANTS[1:]:
        row[f"speedup_over_{other}"] = round(ms[other] / ms["bertzoo"], 3)
    gap = max(abs(a - b) / abs(b) for k in VARIANTS[1:] for a, b in zip(losses[k], losses["bertzoo"]))
    row["loss_rel_diff"] = float(f"{gap:.2g}")
    return row


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--activations", default="gelu_tanh,gelu_exact")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--runs", type=int, default=9, help="timing rounds (medians)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    if min(args.batch_size, args.sequence_length, args.runs) < 1:
        parser.error("--batch-size, --sequence-length and --runs must be positive.")
    for name, values, known in (("dtypes", args.dtypes, DTYPES), ("activations", args.activations, ACTIVATIONS)):
        unknown = sorted(set(values.split(",")) - set(known))
        if unknown:
            parser.error(f"--{name}: unknown {unknown}; choose from {', '.join(known)}.")

    rows = []
    for dtype in args.dtypes.split(","):
        for activation in args.activations.split(","):
            rows.append(measure(dtype, activation, args.preset, args.batch_size, args.sequence_length, args.runs))
            print_table(rows[-1:], list(rows[-1]))
    print_table(rows, list(rows[0]))
    if not args.no_record:
        append_results("training_kernels", rows, command=command_line("benchmarks.training_kernels", argv))


if __name__ == "__main__":
    main()
