"""Where a training step's time goes, on Keras's JAX backend: bertzoo's
classifier against keras-hub's (same configuration and weights), step by
step, so a gap between the two can be placed.

For each library, timed interleaved in one process (`harness.time_interleaved`):
- `train_on_batch`: Keras's whole step with the recipe `benchmarks.run`
  gives keras-hub (Keras's AdamW, weight decay 0.01, global-norm clipping
  at 1, each library's default accuracy metric), for both libraries;
- `gradients`: the model's forward and backward pass alone, one jitted
  `jax.value_and_grad` of the loss over `stateless_call(training=True)`
  (dropout on), inputs already on the device: no optimizer, no metric, no
  Keras state round trip;
- `gradients_no_dropout`: the same with `training=False` (BERT has no other
  training-only layer, so this is the step without dropout);
- `forward`: the loss alone, `training=True`;
and for bertzoo also `train_on_batch_default`: its own default recipe
(`bert_optimizer`: the same AdamW with a warm-up schedule), what
`benchmarks.run` times for bertzoo.

For each gradient program it records what XLA compiled: its own cost
estimate (FLOPs, bytes accessed) of the operations it emits itself (library
calls such as cuBLAS GEMMs and cuDNN attention are not counted, so compare
it only between programs with the same library calls), the library calls it made (cuBLAS(Lt)
GEMMs, cuDNN attention; `call_overhead.hlo_matmul_summary`) and the number
of fusions. Rows go to `benchmarks/results.jsonl` (benchmark "training_gap").

Usage (from the repository root; it sets `KERAS_BACKEND=jax` itself):
    python -m benchmarks.training_gap --preset base --batch 32 --dtype bfloat16
"""

import argparse
import os
import re
import sys

LIBRARIES = ("bertzoo", "keras_hub")
MEASURES = ("train_on_batch", "train_on_batch_default", "gradients", "gradients_no_dropout", "forward")


def program_summary(compiled):
    """What a compiled JAX program holds: XLA's cost estimate and its
    matmul/attention library calls, as one flat dict."""
    from benchmarks.call_overhead import hlo_matmul_summary

    text = compiled.as_text()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) and cost else cost) or {}
    return {
        "gflops": round(float(cost.get("flops", 0.0)) / 1e9, 2),
        "gb_accessed": round(float(cost.get("bytes accessed", 0.0)) / 1e9, 3),
        "fusions": len(re.findall(r" fusion\(", text)),
        "custom_calls": hlo_matmul_summary(text)["custom_calls"],
    }


def gradient_candidates(library, model, inputs, labels, measures=MEASURES):
    """`(candidates, summaries)`: jitted forward and forward+backward
    passes of `model`'s loss on device-resident inputs (those of `measures`),
    and what each gradient program compiled to."""
    import jax
    import keras

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]  # Includes dropout's seed state.
    x, y = jax.device_put(inputs), jax.device_put(labels)

    def loss(trainable, frozen, x, y, training):
        logits = model.stateless_call(trainable, frozen, x, training=training)[0]
        return loss_fn(y, logits)

    def gradients(training):
        return jax.jit(jax.value_and_grad(lambda t, f, x, y: loss(t, f, x, y, training)))

    programs = {
        "gradients": gradients(True),
        "gradients_no_dropout": gradients(False),
        "forward": jax.jit(lambda t, f, x, y: loss(t, f, x, y, True)),
    }

    def current():
        # The variables' current buffers: `train_on_batch` donates and replaces them.
        return [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]

    candidates, summaries = {}, {}
    for measure, function in programs.items():
        if measure not in measures:
            continue
        compiled = function.lower(trainable, frozen, x, y).compile()
        if measure.startswith("gradients"):
            summaries[measure] = program_summary(compiled)
        candidates[f"{library} {measure}"] = lambda c=compiled: jax.block_until_ready(c(*current(), x, y))
    return candidates, summaries


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16")
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help=f"any of {', '.join(LIBRARIES)}")
    parser.add_argument("--measures", default=",".join(MEASURES), help=f"any of {', '.join(MEASURES)}")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    parser.add_argument(
        "--profile",
        default=None,
        help="folder: after timing, a JAX profiler trace of 3 calls of each library's train_on_batch and gradients",
    )
    args = parser.parse_args(argv)
    from benchmarks.harness import require  # (The harness imports no Keras.)

    require(["jax"], "benchmarks.training_gap (Keras's JAX backend)")
    if "keras" in sys.modules and os.environ.get("KERAS_BACKEND") != "jax":
        raise SystemExit("Run this benchmark in its own process (python -m benchmarks.training_gap): it needs JAX.")
    if args.dtype not in ("float32", "bfloat16", "float16"):
        raise SystemExit(f"--dtype {args.dtype!r}: choose float32, bfloat16 or float16 (int8 models do not train).")
    libraries = [name for name in args.libraries.split(",") if name]
    unknown = sorted(set(libraries) - set(LIBRARIES))
    if unknown or not libraries:
        raise SystemExit(f"--libraries {args.libraries!r}: choose from {list(LIBRARIES)}.")
    measures = [name for name in args.measures.split(",") if name]
    if sorted(set(measures) - set(MEASURES)) or not measures:
        raise SystemExit(f"--measures {args.measures!r}: choose from {list(MEASURES)}.")
    os.environ["KERAS_BACKEND"] = "jax"

    import numpy as np

    from benchmarks import harness
    from benchmarks import peers

    config = peers.backbone_config(args.preset)
    library_classes = {"bertzoo": peers.BertzooJax, "keras_hub": peers.KerasHubJax}
    shared_recipe = peers.KerasHubJax().compile_for_training
    inputs = harness.token_batch(args.batch, args.length, config["vocabulary_size"])
    labels = (np.arange(args.batch) % peers.NUM_CLASSES).astype("int32")
    candidates, summaries = {}, {}
    for name in libraries:
        library = library_classes[name]()
        model = library.prepare("training", args.dtype, config)[1]
        shared_recipe(model, True)
        if "train_on_batch" in measures:
            candidates[f"{name} train_on_batch"] = lambda m=model: m.train_on_batch(inputs, labels)
        found, summaries[name] = gradient_candidates(name, model, inputs, labels, measures)
        candidates.update(found)
        if name == "bertzoo" and "train_on_batch_default" in measures:
            default = library.prepare("training", args.dtype, config)[1]
            library.compile_for_training(default, True)  # bertzoo's own defaults.
            candidates["bertzoo train_on_batch_default"] = lambda m=default: m.train_on_batch(inputs, labels)

    device = peers.BertzooJax().device()
    timings = harness.time_interleaved(candidates, runs=args.runs, warmup=args.warmup)
    fields = {"dtype": args.dtype, "device": device, "preset": args.preset, "batch": args.batch, "length": args.length}
    rows = harness.library_measure_rows(timings, args.runs, **fields)
    for row in rows:
        row.update(summaries[row["library"]].get(row["measure"], {}))
    path = args.results or harness.RESULTS_FILE
    command = harness.command_line("benchmarks.training_gap", sys.argv[1:] if argv is None else argv)
    harness.append_results("training_gap", rows, command, path=path)
    harness.print_table(rows, ["library", "measure", "median_ms", "min_ms", "gflops", "gb_accessed", "fusions"])
    for library, programs in summaries.items():
        for measure, summary in programs.items():
            print(f"{library} {measure} library calls: {summary['custom_calls']}")
    print(f"{len(rows)} rows appended to {path}", flush=True)
    if args.profile:
        import jax

        for name, candidate in candidates.items():
            if name.split(" ")[1] not in ("train_on_batch", "gradients"):
                continue
            with jax.profiler.trace(os.path.join(args.profile, name.replace(" ", "_"))):
                for _ in range(3):
                    candidate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
