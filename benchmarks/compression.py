"""Compression figures (issue 6): unstructured pruning, structured pruning, int8.

    python -m benchmarks.compression                # long (many minutes on a CPU; faster once cached)
    python -m benchmarks.compression --time-only --runs 15   # re-time the saved variants when it is quieter
    python -m benchmarks.compression --train-size 96 --test-size 64 --prune-steps 2 --structured-steps 2 \
        --runs 1 --no-record --cache /tmp/bench   # smoke run

On `../shared/data/sentiment/amazon.tsv` (binary: rating > 0, neutral rows
dropped; `bertzoo.datasets.split` with seed 0, 80/20, then the first
`--train-size` / `--test-size` examples of each side), a classifier built on
the converted all-MiniLM-L6-v2 checkpoint is fine-tuned (the "dense"
reference; cached in `--cache` so re-runs skip it), then compressed:

- unstructured: gradual magnitude pruning with fine-tuning, one `Pruner` run
  stepping through 50%, 80% and 90% encoder sparsity (`--prune-steps`
  updates per level: a polynomial ramp over the first half, recovery over
  the rest); each level is stripped and measured.
- structured: heads and FFN neurons scored on calibration batches
  (`head_and_neuron_importance`), removed, and the smaller dense model
  fine-tuned for `--structured-steps` updates.
- int8: `bertzoo.quantize(dense, "int8")` (and int8 on top of the chosen
  structured model), no training.

Training steps run without XLA (bertzoo's CPU float32 default; the masks
run inside the compiled step either way). For each variant: test accuracy, weight-file size raw and gzip-compressed,
and CPU latency (batch 1 and batch `--batch`, sequence `--sequence-length`)
with and without XLA, as medians of `--runs` rounds that interleave the
variants (so load changes hit all of them alike). Unstructured sparsity keeps
dense kernels, so those models run at the dense speed (not re-timed).

Prints a Markdown table, writes the chart to benchmarks/out/compression.png,
and appends one JSON line per variant to benchmarks/results.jsonl.
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import OUT
from benchmarks.harness import append_results
from benchmarks.harness import command_line
from benchmarks.harness import median_ms
from benchmarks.harness import minilm_path
from benchmarks.harness import print_table
from benchmarks.harness import sentiment_path
from benchmarks.harness import time_interleaved
from benchmarks.harness import token_batch

FIGURES_FILE = "figures.json"
COLUMNS = [
    "variant",
    "encoder sparsity",
    "overall sparsity",
    "accuracy",
    "Δ acc (pts)",
    "weights MB",
    "gzip MB",
    "gzip vs dense",
    "b1 ms",
    "b1 speedup",
    "b32 ms",
    "b32 speedup",
    "timed with",
]


def staircase_schedule(levels, steps, frequency):
    """Sparsity levels reached one after the other, `steps` updates each: a
    cubic ramp from the previous level over the first half, then fixed."""
    from keras import ops

    from bertzoo.compression import PruningSchedule

    class Staircase(PruningSchedule):
        def __init__(self):
            self.begin_step, self.end_step, self.frequency = 0, -1, frequency
            self.final_sparsity = levels[-1]

        def sparsity_at(self, step):
            step = ops.cast(step, "float32")
            result = ops.zeros((), "float32")
            previous = 0.0
            for i, level in enumerate(levels):
                start = i * steps
                progress = ops.clip((step - start) / max(1, steps // 2), 0.0, 1.0)
                value = level + (previous - level) * (1.0 - progress) ** 3
                result = ops.where(step >= start, value, result)
                previous = level
            return result

        def get_config(self):
            return {"levels": levels, "steps": steps, "frequency": frequency}

    return Staircase()


def load_data(args):
    from bertzoo.datasets import load_rated_sentences
    from bertzoo.datasets import split

    path = sentiment_path("amazon", data=args.data)
    texts, labels = load_rated_sentences(path)
    (train_x, train_y), (test_x, test_y) = split(texts, labels, test_fraction=0.2, seed=0)
    n_train = args.train_size or len(train_x)
    n_test = args.test_size or len(test_x)
    return path, (train_x[:n_train], train_y[:n_train]), (test_x[:n_test], test_y[:n_test])


def tokenize(preprocessor, texts, batch=256):
    parts = [preprocessor(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}


def accuracy(model, x, y, batch=64):
    import tensorflow as tf

    fn = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    predictions = []
    for i in range(0, len(y), batch):
        predictions.append(np.argmax(fn({k: v[i : i + batch] for k, v in x.items()}).numpy(), -1))
    return float(np.mean(np.concatenate(predictions) == y))


def fine_tune(model, x, y, steps, learning_rate, batch_size=32):
    import keras

    if not getattr(model, "compiled", False):
        model.compile(optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.01), jit_compile=False)
    model.fit(x, y, batch_size=batch_size, epochs=1, steps_per_epoch=steps, verbose=2)


def sizes(model, directory):
    """Weight-file bytes raw and gzipped, and the saved preset directory's."""
    import bertzoo
    from bertzoo.compression import gzip_size

    report = bertzoo.sparsity_report(model)
    # A compiled model's `save_weights` (hence its preset) also holds the
    # optimizer's slots: save a plain copy to measure the model itself.
    plain = model
    if getattr(model, "optimizer", None) is not None:
        plain = type(model).from_config(model.get_config())
        plain.set_weights(model.get_weights())
        plain.source_preset = model.source_preset
    plain.save_to_preset(directory)
    preset_raw = sum(p.stat().st_size for p in Path(directory).iterdir())
    return report, {"preset_bytes": preset_raw, "preset_gzip_bytes": gzip_size(directory)}


def encoder_sparsity(report):
    rows = [r for r in report.layers if r["path"].startswith(("attention_", "feedforward_"))]
    return sum(r["zeros"] for r in rows) / sum(r["parameters"] for r in rows)


def time_variants(models, length, batch, runs, vocabulary_size):
    """Median ms per call for every (variant, XLA?, batch size), interleaved."""
    import tensorflow as tf

    inputs = {n: {k: tf.constant(v) for k, v in token_batch(n, length, vocabulary_size).items()} for n in (1, batch)}
    calls = {}
    for name, model in models.items():
        for xla in (False, True):
            fn = tf.function(lambda x, model=model: model(x, training=False), jit_compile=xla)
            for n in (1, batch):
                calls[(name, xla, n)] = lambda fn=fn, x=inputs[n]: fn(x).numpy()

    def compiled(key, seconds):
        name, xla, n = key
        print(f"  compiled {name} xla={xla} batch={n} in {seconds:.1f}s", flush=True)

    # Two untimed calls each: the first traces and compiles.
    return median_ms(time_interleaved(calls, runs, warmup=2, on_warm=compiled))


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    panels = [
        ("gzip MB", "Weights on disk, gzip (MB)", None),
        ("b32 speedup", "CPU speedup vs dense (batch 32, best of XLA / no XLA)", 1.0),
        ("accuracy", "Test accuracy", None),
    ]
    for ax, (key, title, line) in zip(axes, panels):
        values = [r.get(key) if r.get(key) not in ("", None) else 0 for r in rows]
        colors = [
            "#777777"
            if n == "dense"
            else "#3b7dd8"
            if n.startswith("unstructured")
            else "#d8843b"
            if n.startswith("structured") and "int8" not in n
            else "#3bb273"
            for n in names
        ]
        bars = ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        for bar, v in zip(bars, values):
            if v:
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.3g}", va="center", fontsize=8)
        if line is not None:
            ax.axvline(line, color="black", linewidth=0.8)
        if key != "accuracy":
            ax.set_xlim(0, max(values) * 1.15)
        if key == "accuracy":
            low = min(v for v in values if v) - 0.05
            ax.set_xlim(max(0.0, low), 1.0)
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.suptitle("bertzoo compression of a fine-tuned MiniLM-L6 sentiment classifier (CPU)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="rated-sentences TSV (default: shared amazon.tsv)")
    parser.add_argument("--train-size", type=int, default=0, help="0: the whole train split (2888)")
    parser.add_argument("--test-size", type=int, default=0, help="0: the whole test split (722)")
    parser.add_argument("--sequence-length", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=2, help="dense fine-tuning epochs")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="dense fine-tuning peak rate")
    parser.add_argument(
        "--prune-learning-rate", type=float, default=1e-4, help="constant AdamW rate while pruning / after head removal"
    )
    parser.add_argument("--prune-steps", type=int, default=100, help="updates per unstructured level")
    parser.add_argument("--structured-steps", type=int, default=60, help="fine-tuning updates after head removal")
    parser.add_argument("--calibration-batches", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32, help="batch size of the throughput timing")
    parser.add_argument("--runs", type=int, default=7, help="timing rounds (medians)")
    parser.add_argument("--cache", default=str(OUT / "compression_cache"))
    parser.add_argument("--chart", default=str(OUT / "compression.png"))
    parser.add_argument("--no-record", action="store_true", help="do not append to results.jsonl")
    parser.add_argument(
        "--time-only",
        action="store_true",
        help="re-time the variants the last full run saved in --cache (keeps its accuracies)",
    )
    args = parser.parse_args(argv)
    command = command_line("benchmarks.compression", argv if argv is not None else sys.argv[1:])
    started = time.time()
    if args.time_only:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
        return retime(args, command, started)

    import keras
    import tensorflow as tf

    import bertzoo
    from bertzoo.compression import head_and_neuron_importance
    from bertzoo.models.task import bert_optimizer

    tf.get_logger().setLevel("ERROR")  # Retracing notes from the per-variant timing functions.
    keras.utils.set_random_seed(0)
    data_path, (train_texts, train_y), (test_texts, test_y) = load_data(args)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    print(
        f"data: {data_path}: {len(train_y)} train / {len(test_y)} test (seed 0 split), "
        f"sequence length {args.sequence_length}",
        flush=True,
    )

    # --- Dense reference ------------------------------------------------------
    key = f"dense-n{len(train_y)}-e{args.epochs}-L{args.sequence_length}-lr{args.learning_rate:g}"
    dense_dir = cache / key
    if not (dense_dir / "config.json").is_file():
        minilm = minilm_path(purpose="the benchmark fine-tunes the converted MiniLM")
        if not (cache / "minilm" / "config.json").is_file():
            bertzoo.convert_checkpoint(minilm, cache / "minilm")
        model = bertzoo.BertClassifier.from_preset(
            cache / "minilm", num_classes=2, sequence_length=args.sequence_length
        )
        model.compile(optimizer=bert_optimizer(args.learning_rate), jit_compile=False)
        print("fine-tuning the dense model ...", flush=True)
        model.fit(train_texts, train_y, batch_size=32, epochs=args.epochs, verbose=2)
        model.save_to_preset(dense_dir)
    dense = bertzoo.BertClassifier.from_preset(dense_dir)
    train_x = tokenize(dense.preprocessor, train_texts)
    test_x = tokenize(dense.preprocessor, test_texts)
    vocabulary_size = dense.backbone.vocabulary_size

    variants = {}  # name -> dict of figures (and "model" for timing)
    work = cache / "variants"
    shutil.rmtree(work, ignore_errors=True)

    def measure(name, model, timed=True, **extra):
        directory = name.replace(" ", "_").replace("/", "-").replace(",", "")
        report, preset = sizes(model, work / directory)
        figures = {
            "variant": name,
            "preset": directory,
            "timed": timed,
            "encoder sparsity": round(encoder_sparsity(report), 4),
            "overall sparsity": round(report.overall_sparsity, 4),
            "accuracy": accuracy(model, test_x, test_y),
            "weights_bytes": report.dense_bytes,
            "weights_gzip_bytes": report.compressed_bytes,
            "parameters": report.parameters,
            **preset,
            **extra,
        }
        variants[name] = {"figures": figures, "model": model if timed else None}
        print(f"{name}: accuracy {figures['accuracy']:.4f}, gzip {report.compressed_bytes / 1e6:.2f} MB", flush=True)
        return figures

    measure("dense", dense)

    # --- Unstructured ---------------------------------------------------------
    levels = [0.5, 0.8, 0.9]
    model = bertzoo.BertClassifier.from_preset(dense_dir, preprocessor=None)
    schedule = staircase_schedule(levels, args.prune_steps, frequency=max(1, args.prune_steps // 10))
    pruner = bertzoo.Pruner(model, schedule)
    model.compile(optimizer=keras.optimizers.AdamW(args.prune_learning_rate, weight_decay=0.01), jit_compile=False)
    for level in levels:
        print(f"pruning to {level:.0%} ...", flush=True)
        pruner.fit(train_x, train_y, batch_size=32, epochs=1, steps_per_epoch=args.prune_steps, verbose=2)
        measure(f"unstructured {level:.0%}", pruner.strip(), timed=False, pruning_steps=pruner.step)

    # --- Structured -----------------------------------------------------------
    calibration = args.calibration_batches * 32
    importance = head_and_neuron_importance(
        dense, ({k: v[:calibration] for k, v in train_x.items()}, train_y[:calibration])
    )
    structured = []
    for heads, ratio in ((12, 0.5), (8, 0.5), (6, 0.25)):
        name = f"structured {heads}/12 heads, FFN x{ratio:g}"
        print(f"{name} ...", flush=True)
        small = bertzoo.prune_heads_and_neurons(dense, heads_to_keep=heads, ffn_keep_ratio=ratio, importance=importance)
        before = accuracy(small, test_x, test_y)
        fine_tune(small, train_x, train_y, args.structured_steps, args.prune_learning_rate)
        measure(name, small, accuracy_before_fine_tuning=before, fine_tuning_steps=args.structured_steps)
        structured.append(name)

    # --- int8 -----------------------------------------------------------------
    measure("int8", bertzoo.quantize(dense, "int8"))
    dense_accuracy = variants["dense"]["figures"]["accuracy"]
    within = [n for n in structured if variants[n]["figures"]["accuracy"] >= dense_accuracy - 0.01]
    best_structured = within[-1] if within else structured[0]
    measure(f"{best_structured} + int8", bertzoo.quantize(variants[best_structured]["model"], "int8"))

    setup = {
        "data": str(data_path.name),
        "train_size": len(train_y),
        "test_size": len(test_y),
        "sequence_length": args.sequence_length,
        "dense_epochs": args.epochs,
        "prune_steps_per_level": args.prune_steps,
        "structured_steps": args.structured_steps,
        "vocabulary_size": vocabulary_size,
    }
    figures = [v["figures"] for v in variants.values()]
    (cache / FIGURES_FILE).write_text(json.dumps({"setup": setup, "variants": figures}, indent=1))
    timed = {n: v["model"] for n, v in variants.items() if v["model"] is not None}
    finish(figures, timed, setup, args, command, started)


def retime(args, command, started):
    """Times the variants saved by the last full run again (e.g. at a
    quieter moment), keeping its accuracy and size figures."""
    import bertzoo

    saved = Path(args.cache) / FIGURES_FILE
    if not saved.is_file():
        raise SystemExit(f"{saved} is missing: run the full benchmark first.")
    record = json.loads(saved.read_text())
    timed = {}
    for f in record["variants"]:
        if f.get("timed"):
            timed[f["variant"]] = bertzoo.BertClassifier.from_preset(Path(args.cache) / "variants" / f["preset"])
    finish(record["variants"], timed, {**record["setup"], "timing_only": True}, args, command, started)


def finish(figures, timed, setup, args, command, started):
    """Times the `timed` models, prints the table, draws the chart, records."""
    print("timing ...", flush=True)
    ms = time_variants(timed, setup["sequence_length"], args.batch, args.runs, setup["vocabulary_size"])
    dense = next(f for f in figures if f["variant"] == "dense")
    rows = []
    for f in figures:
        f = dict(f)
        name = f["variant"]
        f["accuracy_change_points"] = round(100 * (f["accuracy"] - dense["accuracy"]), 2)
        f["gzip_vs_dense"] = round(f["weights_gzip_bytes"] / dense["weights_gzip_bytes"], 4)
        if name in timed:
            for n in (1, args.batch):
                for xla in (False, True):
                    f[f"ms_batch{n}_{'xla' if xla else 'graph'}"] = round(ms[(name, xla, n)], 2)
                best = min(ms[(name, False, n)], ms[(name, True, n)])
                dense_best = min(ms[("dense", False, n)], ms[("dense", True, n)])
                f[f"ms_batch{n}_best"] = round(best, 2)
                f[f"speedup_batch{n}"] = round(dense_best / best, 3)
        rows.append(f)

    table = []
    for f in rows:
        timedrow = "ms_batch1_best" in f
        table.append(
            {
                "variant": f["variant"],
                "encoder sparsity": f"{f['encoder sparsity']:.0%}",
                "overall sparsity": f"{f['overall sparsity']:.0%}",
                "accuracy": f"{f['accuracy']:.4f}",
                "Δ acc (pts)": f"{f['accuracy_change_points']:+.2f}",
                "weights MB": f"{f['weights_bytes'] / 1e6:.1f}",
                "gzip MB": f"{f['weights_gzip_bytes'] / 1e6:.1f}",
                "gzip vs dense": f"{f['gzip_vs_dense']:.2f}",
                "b1 ms": f"{f['ms_batch1_best']:.1f}" if timedrow else "= dense",
                "b1 speedup": f"{f['speedup_batch1']:.2f}x" if timedrow else "1x (dense kernels)",
                "b32 ms": f"{f[f'ms_batch{args.batch}_best']:.0f}" if timedrow else "= dense",
                "b32 speedup": f"{f[f'speedup_batch{args.batch}']:.2f}x" if timedrow else "1x (dense kernels)",
                "timed with": _modes(f, args.batch) if timedrow else "",
            }
        )
    print()
    print_table(table, COLUMNS)
    print(f"\nload average {os.getloadavg()}, total {time.time() - started:.0f}s")

    chart_rows = [
        {
            "variant": f["variant"],
            "gzip MB": f["weights_gzip_bytes"] / 1e6,
            "accuracy": f["accuracy"],
            "b32 speedup": f.get(f"speedup_batch{args.batch}", 1.0),
        }
        for f in rows
    ]
    chart(chart_rows, Path(args.chart))
    if not args.no_record:
        setup = {**setup, "timing_runs": args.runs, "timing_batch": args.batch, "seconds": round(time.time() - started)}
        append_results("compression", [{"setup": setup, **f} for f in rows], command)
        print("appended to benchmarks/results.jsonl")


def _modes(f, batch):
    def mode(n):
        return "XLA" if f[f"ms_batch{n}_xla"] <= f[f"ms_batch{n}_graph"] else "no XLA"

    return f"b1: {mode(1)}, b{batch}: {mode(batch)}"


if __name__ == "__main__":
    main()
