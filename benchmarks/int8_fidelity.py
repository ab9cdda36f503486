"""How closely int8 models follow the float model, per int8 path.

    python -m benchmarks.int8_fidelity          # a few minutes, after benchmarks.compression

bertzoo runs int8 Dense layers as TensorFlow's fused oneDNN kernel on CPU
(one input scale per tensor; `bertzoo.layers.dense`) and Keras's own int8
ops elsewhere (one input scale per token). This measures both on a real
fine-tuned model: the dense all-MiniLM-L6-v2 sentiment classifier that
`python -m benchmarks.compression` fine-tunes and caches, on the same 722
test sentences of `../shared/data/sentiment/amazon.tsv`. For each path and
batch size: accuracy, agreement of the predicted labels with the float
model's, and the relative error of the logits. Batch size matters for the
fused kernel only (its input scale covers the whole batch).

Prints a Markdown table and appends one JSON line per row to
benchmarks/results.jsonl.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from benchmarks.compression import load_data
from benchmarks.compression import tokenize
from benchmarks.harness import OUT
from benchmarks.harness import append_results
from benchmarks.harness import command_line
from benchmarks.harness import print_table

DEFAULT_DENSE = OUT / "compression_cache" / "amazon" / "teacher"  # benchmarks.compression's amazon teacher
COLUMNS = ["path", "batch", "accuracy", "Δ acc (pts)", "agreement", "logits rel. error"]


def logits(model, x, batch):
    import tensorflow as tf

    fn = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    n = len(next(iter(x.values())))
    return np.concatenate([fn({k: v[i : i + batch] for k, v in x.items()}).numpy() for i in range(0, n, batch)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dense",
        type=Path,
        default=DEFAULT_DENSE,
        help="the fine-tuned float preset (default: benchmarks.compression's cache)",
    )
    parser.add_argument("--data", default=None, help="rated-sentences TSV (default: shared amazon.tsv)")
    parser.add_argument("--batches", default="1,8,64", help="comma list of batch sizes")
    parser.add_argument("--no-record", action="store_true", help="do not append to results.jsonl")
    args = parser.parse_args(argv)
    if not (args.dense / "config.json").is_file():
        raise SystemExit(
            f"No fine-tuned model at {args.dense}: run `python -m benchmarks.compression` first "
            "(it caches one), or pass --dense PRESET_DIR."
        )
    batches = [int(b) for b in args.batches.split(",")]

    import bertzoo
    from bertzoo.layers.dense import onednn_int8_available
    from bertzoo.layers.dense import portable_kernels

    data_args = argparse.Namespace(data=args.data, train_size=0, test_size=0)
    _, _, (texts, labels) = load_data(data_args)
    labels = np.asarray(labels)
    dense = bertzoo.BertClassifier.from_preset(args.dense)
    x = tokenize(dense.preprocessor, texts)
    reference = logits(dense, x, 64)
    float_accuracy = float(np.mean(reference.argmax(-1) == labels))
    quantized = bertzoo.quantize(dense, "int8")

    rows = [
        {
            "path": "float32",
            "batch": 64,
            "accuracy": float_accuracy,
            "Δ acc (pts)": 0.0,
            "agreement": 1.0,
            "logits rel. error": 0.0,
        }
    ]
    paths = [("Keras int8 (per-token)", portable_kernels)]
    if onednn_int8_available():
        paths.insert(0, ("fused oneDNN int8 (per-tensor)", None))
    for name, context in paths:
        for batch in batches:
            if context is None:
                out = logits(quantized, x, batch)
            else:
                with context():
                    out = logits(quantized, x, batch)
            accuracy = float(np.mean(out.argmax(-1) == labels))
            rows.append(
                {
                    "path": name,
                    "batch": batch,
                    "accuracy": accuracy,
                    "Δ acc (pts)": round(100 * (accuracy - float_accuracy), 2),
                    "agreement": float(np.mean(out.argmax(-1) == reference.argmax(-1))),
                    "logits rel. error": float(np.linalg.norm(out - reference) / np.linalg.norm(reference)),
                }
            )
    print(f"{args.dense.name} on {len(labels)} test sentences")
    print_table(rows, COLUMNS)
    if not args.no_record:
        command = command_line("benchmarks.int8_fidelity", argv if argv is not None else sys.argv[1:])
        append_results("int8_fidelity", [{**r, "model": args.dense.name} for r in rows], command)


if __name__ == "__main__":
    main()
