"""SavedModel export: size on disk, load time, and serving latency against Keras.

Builds a `BertClassifier` on a real checkpoint (all-MiniLM-L6-v2 from
../shared/models, converted on the fly; 6 layers, H384) or, when that is
absent, on the `mini` preset, exports it with `bertzoo.export_saved_model`
and measures:

- export time and size on disk (SavedModel directory vs the preset's task
  weights file);
- load time in fresh processes (`import tensorflow, tensorflow_text` then
  `tf.saved_model.load` and the first call), median of `--loads`;
- latency at batch 1 and 32 on real sentences (../shared/data/sentiment, else
  generated ones), median of `--runs` calls after warm-up, of
    * `serving_default(text)`: raw strings in, predictions out;
    * Keras `model.predict(texts)`: the same work through Keras's `predict`
      (a tf.data pipeline per call), and Keras's fastest raw-text path,
      `predict_on_batch(model.preprocessor(texts))`;
    * `serving_tokenized(ids)` and Keras `predict_on_batch(ids)` on the same
      ids padded to `sequence_length`: model only.
  The SavedModel and Keras calls alternate, so load changes on a shared
  machine hit both alike; ratios are SavedModel / Keras from the same run.
  The text signature cuts each batch to its longest row, Keras runs the
  padded `sequence_length`, so on short sentences the text rows differ
  mostly by that; the ids rows compare the same padded work.

`--data tweets` serves another ../shared sentiment file's sentences (default
amazon). `--variants float32,int8,mixed_bfloat16` repeats everything for the int8
(`model.quantize("int8")`) and bfloat16 versions of the same weights.

Usage:
    python -m benchmarks.export [--runs 7] [--variants float32,int8]

Prints a table and appends one JSON line per (variant, batch) to
benchmarks/results.jsonl (date, machine, load average, command).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import bertzoo
from benchmarks.harness import RESULTS_FILE
from benchmarks.harness import SENTIMENT_FILES
from benchmarks.harness import append_results
from benchmarks.harness import comma_choices
from benchmarks.harness import command_line
from benchmarks.harness import minilm_path
from benchmarks.harness import print_table
from benchmarks.harness import sentiment_path
from benchmarks.harness import time_interleaved
from bertzoo.datasets import load_rated_sentences
from bertzoo.datasets import synthetic_sentiment
from bertzoo.export import read_export_metadata

LOAD_SCRIPT = """
import json, sys, time
start = time.perf_counter()
import tensorflow as tf
import tensorflow_text  # registers TF Text's ops
imported = time.perf_counter()
served = tf.saved_model.load(sys.argv[1])
loaded = time.perf_counter()
served.signatures["serving_default"](text=tf.constant(["warming up the graph"]))
called = time.perf_counter()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported, "first_call_s": called - loaded}))
"""


def directory_size(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def build_model(workdir, sequence_length):
    """A classifier (random head) on MiniLM when available, else on `mini`; saved as a preset."""
    minilm = minilm_path(required=False)
    if minilm is not None:
        preset, name = str(bertzoo.convert_checkpoint(minilm, workdir / "minilm").path), "all-MiniLM-L6-v2"
    else:
        preset, name = "mini", "mini (random weights)"
    keras.utils.set_random_seed(0)
    model = bertzoo.BertClassifier.from_preset(
        preset,
        num_classes=2,
        class_names=["negative", "positive"],
        sequence_length=sequence_length,
        load_weights=preset != "mini",
    )
    return model, name


def variant(model, kind, workdir):
    """The same weights as `kind`: float32, int8 (Keras quantization) or mixed_bfloat16."""
    if kind == "float32":
        return model
    model.save_to_preset(workdir / "float32_preset")
    if kind == "mixed_bfloat16":
        return bertzoo.BertClassifier.from_preset(workdir / "float32_preset", dtype="mixed_bfloat16")
    if kind == "int8":
        copy = bertzoo.BertClassifier.from_preset(workdir / "float32_preset")
        copy.predict(["builds the preprocessing layers"], verbose=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Layer X does not have a `quantize` method"
            copy.quantize("int8")
        return copy
    raise ValueError(f"Unknown variant {kind!r}: use float32, int8 or mixed_bfloat16.")


def fresh_loads(path, count):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    results = []
    for _ in range(count):
        out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(path)], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"loading the export in a fresh process failed:\n{out.stderr[-2000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {k: round(statistics.median(r[k] for r in results), 3) for k in results[0]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed calls per method and batch (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    parser.add_argument("--loads", type=int, default=3, help="fresh processes timing the load (default 3)")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batches", default="1,32", help="batch sizes")
    parser.add_argument("--variants", default="float32", help="comma-separated: float32, int8, mixed_bfloat16")
    parser.add_argument("--output", type=Path, default=RESULTS_FILE, help="JSON lines file to append to")
    parser.add_argument(
        "--data",
        default="amazon",
        help=f"sentences served: a ../shared sentiment file ({', '.join(SENTIMENT_FILES)}; synthetic ones where "
        "../shared is missing) or a TSV file's path",
    )
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches takes positive integers separated by commas (e.g. 1,32), got {args.batches!r}.")
    if min(batches) < 1:
        parser.error(f"--batches takes positive integers, got {args.batches!r}.")
    variants = comma_choices(args.variants, ["float32", "int8", "mixed_bfloat16"], "--variants")  # Before the build.

    if args.data in SENTIMENT_FILES:
        sentiment = sentiment_path(args.data, required=False)
    elif Path(args.data).is_file():
        sentiment = sentiment_path(data=args.data)
    else:
        parser.error(f"--data {args.data!r} is neither one of {', '.join(SENTIMENT_FILES)} nor a file.")
    texts = (
        load_rated_sentences(sentiment, max_rows=max(batches))[0] if sentiment else synthetic_sentiment(max(batches))[0]
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        base, model_name = build_model(workdir, args.sequence_length)
        base.save_to_preset(workdir / "preset")
        task_weights = (workdir / "preset" / "task.weights.h5").stat().st_size
        for kind in variants:
            model = variant(base, kind, workdir)
            start = time.perf_counter()
            path = bertzoo.export_saved_model(model, workdir / "export" / kind)
            export_s = time.perf_counter() - start
            exported = read_export_metadata(path)
            size = directory_size(path)
            loads = fresh_loads(path, args.loads)
            served = tf.saved_model.load(str(path))
            text_fn, ids_fn = served.signatures["serving_default"], served.signatures["serving_tokenized"]
            for batch in batches:
                batch_texts = (texts * batch)[:batch]
                strings = tf.constant(batch_texts)
                ids = {k: np.asarray(v).astype("int32") for k, v in model.preprocessor(batch_texts).items()}
                id_tensors = {k: tf.constant(v) for k, v in ids.items()}
                served_logits = text_fn(text=strings)["logits"].numpy()
                keras_logits = model.predict(batch_texts, verbose=0)
                timings = time_interleaved(
                    _candidates(model, text_fn, ids_fn, strings, batch_texts, ids, id_tensors),
                    args.runs,
                    args.warmup,
                )
                medians = {name: round(1000 * t["median_s"], 3) for name, t in timings.items()}
                rows.append(
                    {
                        "config": {
                            "model": model_name,
                            "variant": kind,
                            "batch": batch,
                            "sequence_length": args.sequence_length,
                            "mean_tokens": round(float(ids["padding_mask"].sum(1).mean()), 1),
                            "keras_jit_compile": bool(model.jit_compile),
                            "data": args.data if sentiment else "synthetic",
                            "export_jit_compile": exported.get("jit_compile"),
                            "export_int8_kernels": exported.get("int8_kernels"),
                            "runs": args.runs,
                            "warmup": args.warmup,
                            "tensorflow": tf.__version__,
                            "keras": keras.__version__,
                            "bertzoo": bertzoo.__version__,
                            "max_abs_diff_logits_vs_keras": float(np.abs(served_logits - keras_logits).max()),
                        },
                        "export_s": round(export_s, 2),
                        "saved_model_mb": round(size / 2**20, 2),
                        "task_weights_mb": round(task_weights / 2**20, 2),
                        **{f"fresh_{k}": v for k, v in loads.items()},
                        **{f"{name}_ms": v for name, v in medians.items()},
                        "ratio_text_saved_model_to_keras": round(
                            medians["saved_model_text"] / medians["keras_predict_text"], 3
                        ),
                        "ratio_text_saved_model_to_keras_on_batch": round(
                            medians["saved_model_text"] / medians["keras_preprocess_predict_on_batch_text"], 3
                        ),
                        "ratio_ids_saved_model_to_keras": round(
                            medians["saved_model_ids"] / medians["keras_predict_on_batch_ids"], 3
                        ),
                    }
                )

    flat = [{**r["config"], **{k: v for k, v in r.items() if k != "config"}} for r in rows]
    print_table(
        flat,
        [
            "model",
            "data",
            "variant",
            "export_jit_compile",
            "batch",
            "mean_tokens",
            "saved_model_mb",
            "task_weights_mb",
            "export_s",
            "fresh_import_s",
            "fresh_load_s",
            "fresh_first_call_s",
            "max_abs_diff_logits_vs_keras",
        ],
    )
    print()
    print_table(
        flat,
        [
            "model",
            "variant",
            "batch",
            "saved_model_text_ms",
            "keras_predict_text_ms",
            "keras_preprocess_predict_on_batch_text_ms",
            "ratio_text_saved_model_to_keras",
            "ratio_text_saved_model_to_keras_on_batch",
            "saved_model_ids_ms",
            "keras_predict_on_batch_ids_ms",
            "ratio_ids_saved_model_to_keras",
        ],
    )
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    command = command_line("benchmarks.export", sys.argv[1:] if argv is None else argv)
    append_results("export", rows, command, path=args.output)
    return rows


def _candidates(model, text_fn, ids_fn, strings, batch_texts, ids, id_tensors):
    """The timed calls of one model and batch: the SavedModel against Keras, on text and on ids."""

    def finished(outputs):
        return {k: v.numpy() for k, v in outputs.items()}  # The harness times finished work, not a dispatch.

    return {
        "saved_model_text": lambda: finished(text_fn(text=strings)),
        "keras_predict_text": lambda: model.predict(batch_texts, verbose=0),
        "keras_preprocess_predict_on_batch_text": lambda: model.predict_on_batch(
            {k: tf.cast(v, tf.int32) for k, v in model.preprocessor(strings).items()}
        ),
        "saved_model_ids": lambda: finished(ids_fn(**id_tensors)),
        "keras_predict_on_batch_ids": lambda: model.predict_on_batch(ids),
    }


if __name__ == "__main__":
    main()
