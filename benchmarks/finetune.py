"""Fine-tuning figures on real sentiment data (issue: text pipeline & classifier).

    python -m benchmarks.finetune [--data ../shared/data/sentiment/amazon.tsv] [--epochs 3]

Fine-tunes a randomly initialized built-in preset and, when the real
all-MiniLM-L6-v2 checkpoint is next to the checkout, the converted MiniLM,
on one file with a fixed seeded 80/20 split. Prints accuracy and training
examples/second, and appends the rows to benchmarks/results.jsonl.
"""

import argparse
import importlib.util
import tempfile
from pathlib import Path

from benchmarks.results import append_results
from benchmarks.results import print_table
from bertzoo.datasets import find_shared_sentiment

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2"


def _example():
    spec = importlib.util.spec_from_file_location("finetune_example", ROOT / "examples" / "finetune_classifier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--builtin", default="mini",
                        help="built-in preset to fine-tune from scratch ('none' to skip)")
    args = parser.parse_args(argv)
    data = args.data or find_shared_sentiment("amazon")
    if data is None:
        raise SystemExit("No data: pass --data or put ../shared/data/sentiment next to the checkout.")
    example = _example()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        presets = [] if args.builtin == "none" else [(args.builtin, args.builtin, 1e-3)]
        if MINILM.is_dir():
            import bertzoo

            bertzoo.convert_checkpoint(MINILM, Path(tmp) / "minilm")
            presets.append(("all-MiniLM-L6-v2 (converted)", str(Path(tmp) / "minilm"), 5e-5))
        for label, preset, lr in presets:
            result = example.main([
                "--preset", preset, "--data", str(data), "--epochs", str(args.epochs),
                "--learning-rate", str(lr), "--output", str(Path(tmp) / "out"),
            ])
            result["preset"] = label
            rows.append(result)
    columns = ["preset", "train_examples", "test_examples", "epochs", "sequence_length",
               "peak_learning_rate", "accuracy", "train_examples_per_second"]
    print_table(rows, columns)
    append_results("finetune", rows, command="python -m benchmarks.finetune " + " ".join(argv or []))


if __name__ == "__main__":
    main()
