"""Fine-tuning figures on real sentiment data (issue: text pipeline & classifier).

    python -m benchmarks.finetune [--data ../shared/data/sentiment/amazon.tsv] [--epochs 3]

Fine-tunes a randomly initialized built-in preset and, when the real
all-MiniLM-L6-v2 checkpoint is next to the checkout, the converted MiniLM,
on one file with a fixed seeded 80/20 split. Prints accuracy and training
examples/second, and appends the rows to benchmarks/results.jsonl.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import minilm_path
from benchmarks.harness import print_table
from benchmarks.harness import record
from benchmarks.harness import sentiment_path
from examples import finetune_classifier


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--builtin", default="mini", help="built-in preset to fine-tune from scratch ('none' to skip)")
    argv = sys.argv[1:] if argv is None else argv
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    args = parser.parse_args(argv)
    data = sentiment_path("amazon", data=args.data)
    minilm = minilm_path(required=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        presets = [] if args.builtin == "none" else [(args.builtin, args.builtin, 1e-3)]
        if minilm is not None:
            import bertzoo

            bertzoo.convert_checkpoint(minilm, Path(tmp) / "minilm")
            presets.append(("all-MiniLM-L6-v2 (converted)", str(Path(tmp) / "minilm"), 5e-5))
        for label, preset, lr in presets:
            result = finetune_classifier.run(
                preset=preset, data=str(data), epochs=args.epochs, learning_rate=lr, output=str(Path(tmp) / "out")
            )
            result["preset"] = label
            rows.append(result)
    columns = [
        "preset",
        "train_examples",
        "test_examples",
        "epochs",
        "sequence_length",
        "peak_learning_rate",
        "accuracy",
        "train_examples_per_second",
    ]
    print_table(rows, columns)
    record("finetune", rows, "benchmarks.finetune", argv, args.results)


if __name__ == "__main__":
    main()
