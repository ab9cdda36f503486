"""What dropping unused padding buys on real sentences (raw-text fit and predict).

    python -m benchmarks.padding [--files amazon,tweets,nyt] [--runs 5] [--sequence-length 64]

A classifier reading raw strings tokenizes each batch and pads it to
`sequence_length`; `BertClassifier` then drops the padding columns no text
of the batch uses (`Task.trims_padding`, in steps of 16 tokens), which does
not change the outputs. This times, on each file of
`../shared/data/sentiment`, the converted all-MiniLM-L6-v2 classifier
(random head: speed does not depend on the weights) with trimming on and
off, interleaved in one process (`benchmarks.harness.time_interleaved`):
`evaluate` over 512 sentences and `fit` for 16 steps of 32 sentences, both
from raw text in batches of 32, float32, bertzoo's default execution path.
It also checks that both settings give the same logits (`predict` on a
`tf.data` dataset of the sentences). Prints the table and appends one
row per file and mode to benchmarks/results.jsonl.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.harness import SENTIMENT_FILES
from benchmarks.harness import append_results
from benchmarks.harness import command_line
from benchmarks.harness import minilm_path
from benchmarks.harness import print_table
from benchmarks.harness import sentiment_path
from benchmarks.harness import time_interleaved

FILES = SENTIMENT_FILES


def with_trim(model, flag, work):
    """`work` as a no-argument callable that runs with trimming on or off."""

    def call():
        type(model).trims_padding = flag
        try:
            return work()
        finally:
            type(model).trims_padding = True

    return call


def time_file(model, name, texts, labels, lengths, args):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(32)
    logits = [with_trim(model, flag, lambda: model.predict(dataset, verbose=0))() for flag in (True, False)]
    same = float(np.abs(logits[0] - logits[1]).max())
    modes = {
        "evaluate": lambda: model.evaluate(texts, labels, batch_size=32, verbose=0),
        "fit": lambda: model.fit(texts, labels, batch_size=32, epochs=1, steps_per_epoch=16, verbose=0),
    }
    rows = []
    for mode, work in modes.items():
        timings = time_interleaved({flag: with_trim(model, flag, work) for flag in (True, False)}, args.runs, warmup=1)
        trimmed, padded = timings[True]["median_s"], timings[False]["median_s"]
        rows.append(
            {
                "file": name,
                "mode": mode,
                "sequence_length": args.sequence_length,
                "median_tokens": float(np.median(lengths)) + 2,
                "padded_s": round(padded, 3),
                "trimmed_s": round(trimmed, 3),
                "speedup": round(padded / trimmed, 2),
                "max_abs_logit_diff": same,
            }
        )
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("--runs", type=int, default=5, help="timing rounds (medians)")
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)

    import bertzoo
    from bertzoo.datasets import load_rated_sentences

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        preset = Path(tmp) / "minilm"
        bertzoo.convert_checkpoint(minilm_path(purpose="the timed model is MiniLM"), preset)
        model = bertzoo.BertClassifier.from_preset(preset, num_classes=2, sequence_length=args.sequence_length)
        for name in args.files.split(","):
            texts, labels = load_rated_sentences(sentiment_path(name))
            rng = np.random.default_rng(0)
            picked = rng.choice(len(texts), 512, replace=False)
            texts, labels = [texts[i] for i in picked], labels[picked]
            lengths = [len(t) for t in model.preprocessor.tokenizer(texts).to_list()]

            rows += time_file(model, name, texts, labels, lengths, args)
    print_table(rows, list(rows[0]))
    if not args.no_record:
        append_results("padding", rows, command=command_line("benchmarks.padding", argv))


if __name__ == "__main__":
    main()
