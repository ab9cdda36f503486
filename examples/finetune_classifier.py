"""Fine-tune a BERT classifier on raw strings and save it as a preset.

    python examples/finetune_classifier.py                      # built-in default, offline
    python examples/finetune_classifier.py --preset mini --data ../shared/data/sentiment/amazon.tsv

With no `--data`, it uses `../shared/data/sentiment/amazon.tsv` when that file
is next to the checkout, otherwise a small generated sentiment set
(`--data synthetic` asks for that set).

From Python, `run(...)` takes the same settings as keyword arguments
(underscores for dashes) and returns the figures:

```python
from examples import finetune_classifier

result = finetune_classifier.run(preset="tiny", epochs=1, output="runs/classifier")
print(result["accuracy"], result["train_examples_per_second"])
```
"""

import argparse
import time
from pathlib import Path

import keras
import numpy as np

import bertzoo
from bertzoo.datasets import find_shared_sentiment
from bertzoo.datasets import load_rated_sentences
from bertzoo.datasets import split
from bertzoo.datasets import synthetic_sentiment
from bertzoo.models.task import bert_optimizer
from bertzoo.saving.preset import check_preset_target
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_positive_number


class EpochTimer(keras.callbacks.Callback):
    """Training time of each epoch, up to its last training batch: not the
    validation Keras runs before `on_epoch_end` (the first epoch includes
    graph compilation)."""

    def on_train_begin(self, logs=None):
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._last_batch_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(self._last_batch_end - self._start)


def parse_args(argv):
    """The example's settings from command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", help="built-in preset name or preset directory")
    parser.add_argument(
        "--data",
        default=None,
        help="TSV file id<TAB>rating<TAB>text, or 'synthetic' for the generated set (default: the shared "
        "amazon.tsv when present, else the generated set)",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="peak learning rate (default: BERT's 5e-5 for pretrained presets, "
        "1e-3 for randomly initialized built-ins)",
    )
    parser.add_argument("--output", default="runs/classifier", help="where to save the preset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-examples",
        type=int,
        default=None,
        help="use a seeded random sample of this many sentences (rows of a file are often grouped, so not its first N)",
    )
    return parser.parse_args(argv)


def check_settings(args):
    """Raises a ValueError naming the first bad setting, before any work:
    a value that would fail (or train nothing) only after loading data and
    model, or a `--output` no save could replace."""
    for name in ("epochs", "batch_size", "sequence_length"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.learning_rate is not None:
        check_positive_number("--learning-rate", args.learning_rate)
    if args.max_examples is not None and (
        isinstance(args.max_examples, bool) or not isinstance(args.max_examples, int) or args.max_examples < 3
    ):
        raise ValueError(
            f"--max-examples must be an integer of at least 3 (an 80/20 split needs a test sentence), "
            f"got {args.max_examples!r}."
        )
    preset = bertzoo.Preset.resolve(args.preset)  # A mistyped name fails now.
    if args.sequence_length < 3:
        raise ValueError(f"--sequence-length must be at least 3 ([CLS], a token, [SEP]), got {args.sequence_length}.")
    longest = preset.backbone_config.get("max_sequence_length")
    if longest is not None and args.sequence_length > longest:
        raise ValueError(
            f"--sequence-length {args.sequence_length} is longer than the {args.preset} preset's {longest} "
            f"positions; use at most {longest}."
        )
    if args.data not in (None, "synthetic") and not Path(args.data).is_file():
        raise ValueError(f"--data {args.data}: no such file. Pass a TSV file, or 'synthetic' for the generated set.")
    check_preset_target(args.output)  # A file, or a folder that is not a preset: no save could replace it.


def settings(**overrides):
    """The example's settings: the command line's defaults, with `overrides`
    (keyword names are the flags with underscores, e.g. `learning_rate=1e-4`)."""
    args = parse_args([])
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"Unknown setting(s) {unknown}; known: {sorted(vars(args))}.")
    vars(args).update(overrides)
    return args


def run(**overrides):
    """Fine-tunes with `settings(**overrides)`; returns the figures (data,
    sizes, settings, accuracy, training examples per second)."""
    args = settings(**overrides)
    check_settings(args)
    return _run(args)


def main(argv=None):
    """The command line: `run` with the settings parsed from `argv`."""
    args = parse_args(argv)
    try:
        check_settings(args)
    except (ValueError, FileExistsError) as e:  # Bad settings: a message, as argparse gives.
        raise SystemExit(f"finetune_classifier.py: error: {e}") from None
    return _run(args)


def _run(args):
    keras.utils.set_random_seed(args.seed)
    data = None if args.data == "synthetic" else args.data or find_shared_sentiment("amazon")
    if data:
        texts, labels = load_rated_sentences(data)
        source = f"{data} ({len(texts)} rated sentences, neutral dropped)"
    else:
        texts, labels = synthetic_sentiment(2048, seed=args.seed)
        source = f"generated sentiment sentences ({'as asked' if args.data else 'no data file found'})"
    if args.max_examples is not None and args.max_examples < len(texts):
        keep = np.sort(np.random.default_rng(args.seed).choice(len(texts), args.max_examples, replace=False))
        texts, labels = [texts[i] for i in keep], np.asarray(labels)[keep]
        source += f", a seeded sample of {args.max_examples}"
    (train_x, train_y), (test_x, test_y) = split(texts, labels, test_fraction=0.2, seed=args.seed)
    print(f"Data: {source}; split seed {args.seed}: {len(train_x)} train / {len(test_x)} test")

    model = bertzoo.BertClassifier.from_preset(
        args.preset,
        num_classes=2,
        sequence_length=args.sequence_length,
        class_names=["negative", "positive"],
    )
    pretrained = bertzoo.Preset.resolve(args.preset).has_weights()
    peak = args.learning_rate or (5e-5 if pretrained else 1e-3)
    # AdamW without decay on biases and LayerNorm, warm-up, clipping at norm 1: BERT's fine-tuning recipe.
    model.compile(optimizer=bert_optimizer(peak))
    timer = EpochTimer()
    model.fit(
        train_x,
        train_y,
        validation_data=(test_x, test_y),
        epochs=args.epochs,
        batch_size=args.batch_size,
        callbacks=[timer],
    )
    _, accuracy = model.evaluate(test_x, test_y, verbose=0)
    # Epochs after the first exclude compilation time.
    steady = timer.seconds[1:] or timer.seconds
    examples_per_second = len(train_x) / float(np.median(steady))
    print(
        f"Test accuracy {accuracy:.4f}; training {examples_per_second:.1f} examples/s "
        f"(median over epochs {f'2..{len(timer.seconds)}' if len(timer.seconds) > 1 else '1'})"
    )
    model.save_to_preset(args.output)
    print(f"Saved the fine-tuned preset to {args.output}")
    return {
        "preset": str(args.preset),
        "data": source,
        "train_examples": len(train_x),
        "test_examples": len(test_x),
        "epochs": args.epochs,
        "sequence_length": args.sequence_length,
        "peak_learning_rate": peak,
        "accuracy": float(accuracy),
        "train_examples_per_second": examples_per_second,
    }


if __name__ == "__main__":
    main()
