"""Compression figures on three sentiment files, several seeds (issue 16).

    python -m benchmarks.compression --readme README.md   # long: hours on a 2-core CPU (resumable)
    python -m benchmarks.compression --methods int8,structured --files amazon --seeds 0
    python -m benchmarks.compression --train-size 64 --test-size 64 --transfer-size 64 --files amazon \
        --seeds 0 --runs 1 --no-record --cache /tmp/bench   # smoke run: a few minutes

For each file of `../shared/data/sentiment` (`--files`, default amazon,
tweets, nyt; binary labels, rating > 0, neutral rows dropped;
`bertzoo.datasets.split` with seed 0, 80/20; `--train-size` / `--test-size`
subsample each side with a fixed seed), all-MiniLM-L6-v2 is converted and
fine-tuned as the teacher (3 epochs, batch 32, `bert_optimizer(1e-4)`, seed
0; saved in `--cache/<file>/teacher` and loaded from there when present),
then compressed by each method (`--methods`), once per seed (`--seeds`,
default 0,1,2; `keras.utils.set_random_seed(seed)` first):

- `distill`: a 2-layer student copied from every 3rd teacher layer
  (`init_student_from_teacher`; `--student-layers`) keeping 2/3 of its FFN
  neurons (`--student-ffn`, default 0.67; `--student-heads N` keeps N
  attention heads per layer too; `prune_heads_and_neurons`, scored on the
  labelled training data): a narrower student, as TinyBERT's are. Two of
  six full-width layers are exactly a third of the encoder, so the
  embeddings and head left them just under 3x at batch 32; this one is 26%
  of it. Distilled with `bertzoo.distill` (`--recipe`, default tinybert;
  `--distill-epochs` per stage) on the training texts plus the texts of
  the other files (`--transfer-size`) and 4 perturbed copies of each
  training text (`--augment`, default 4, 0 for none; `augment_texts`).
- `hard`: the same student trained on the hard labels alone (the baseline
  distillation must beat).
- `prune90`: 90% unstructured encoder sparsity (`Pruner` with
  `--prune-scores`, second-order `fisher` by default; `ramp_schedule`:
  a cubic ramp over the first 2/3 of the steps in about 20 pruning steps;
  90% of every weight, or with `--prune-scope global` one threshold across
  the encoder's weights) while distilling the dense teacher's outputs
  (`--prune-epochs`; `bert_optimizer(--prune-lr)`, 3e-4 by default) on the
  training texts plus the other files' texts
  (`distill`'s transfer set without its copies; `--prune-augment N` adds N
  copies; `--no-prune-transfer`: on the labelled training texts, mixed
  with the labels), then `strip()`.
- `structured`: `prune_heads_and_neurons` (`--heads` per layer, `--ffn`
  of the FFN neurons), then distillation of the teacher's predictions
  (`bertzoo.distill`, recipe hinton, `--structured-epochs`) on the same
  texts as `prune90` (`--no-structured-transfer`: on the labelled training
  texts, mixed with the labels).
- `int8`: `bertzoo.quantize(teacher, "int8")`, no training (seed-independent:
  measured once per file, recorded for every seed).
- `int8sq`: `bertzoo.quantize(teacher, "int8", calibration=...)`: the
  Dense layers' inputs smoothed as in SmoothQuant (`--smoothing`, the
  migration strength) from 512 training texts (a seed-0 sample), no
  training (seed-independent, as `int8`).
- `int8st`: `int8sq` with `input_ranges="static"`: each Dense layer's
  int8 input range fixed from the same calibration texts instead of
  measured on every call (seed-independent, as `int8`).
- `int8w`: `bertzoo.quantize(teacher, "int8", weight_only=True)`: int8
  kernels, float inputs and arithmetic (seed-independent, as `int8`).
- `int8qat`: `bertzoo.quantization_aware_training(teacher, ...)`: int8
  rounding simulated while distilling from the teacher on the training
  texts (`--qat-epochs`, `bert_optimizer(2e-5)`), then quantized.

Each (file, method, seed) result (test accuracy, parameters, encoder
sparsity, preset MB, seconds; % of teacher is computed when reporting) is
written to `--cache/<file>/results.json` as soon as it is done, so a rerun
skips what is done with the same settings (`--fresh` ignores the cache).
Then, per file, each method's model of the timing seed (the seed of the
cached timing, else the run's first) is timed against the teacher when it
has no timing for its settings (never timed, retrained since, also under
`--skip-timing`; all of them when the timing settings change), with
`benchmarks.harness.time_interleaved` on tokenized test sentences (batch 1
and 32, `--sequence-length`, medians of `--runs` interleaved rounds, best
of XLA on and off unless `--xla`): speedups are same-run ratios to the
teacher, and each timing records its seed, settings and teacher time.

`--from-results` trains and times nothing and reads no cache: each
(file, method, seed) is the latest line of benchmarks/results.jsonl made
with the current settings, so the README table can be rewritten on any
machine from the committed record (lines of different runs may hold
different teachers: each line's % of teacher is against its own).

Prints a per-file table and an aggregate table (mean ± standard deviation
over seeds, each method's goal and whether the mean meets it), appends one
JSON line per (file, method, seed) to benchmarks/results.jsonl (unless
`--no-record`; a result already recorded with the same figures is not
written again, and a trained result is written as soon as it is measured,
so a run stopped before its timing still leaves its accuracies there),
draws benchmarks/out/compression.png (% of teacher against the batch-32
speedup, error bars over seeds) and, with `--readme README.md`,
rewrites the README's compression table between the
`<!-- compression-table:start -->` and `<!-- compression-table:end -->` lines.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import OUT
from benchmarks.harness import RESULTS_FILE
from benchmarks.harness import SENTIMENT_FILES
from benchmarks.harness import append_results
from benchmarks.harness import chart_or_none
from benchmarks.harness import check_markers
from benchmarks.harness import check_results_file
from benchmarks.harness import comma_choices
from benchmarks.harness import command_line
from benchmarks.harness import machine
from benchmarks.harness import machine_label
from benchmarks.harness import markdown_table
from benchmarks.harness import median_ms
from benchmarks.harness import minilm_path
from benchmarks.harness import print_table
from benchmarks.harness import read_results
from benchmarks.harness import sentiment_path
from benchmarks.harness import time_interleaved
from benchmarks.harness import unrecorded
from benchmarks.harness import write_between_markers

FILES = SENTIMENT_FILES
METHODS = ("distill", "hard", "prune90", "structured", "int8", "int8sq", "int8st", "int8w", "int8qat")
# Seed-independent methods: measured once per file, recorded for every seed.
UNSEEDED = ("int8", "int8sq", "int8st", "int8w")
# The compression issue's goals are means over this many seeds per file.
GOAL_SEEDS = 3
# `int8sq`: training texts it calibrates on (`calibration_sample`, seed 0),
# and its default smoothing (bertzoo's `DEFAULT_SMOOTHING`; a test checks they agree).
CALIBRATION_TEXTS = 512
SMOOTHING = 0.8
# `prune90`'s peak learning rate and scores: bertzoo's `PRUNING_LEARNING_RATE`
# and `PRUNING_SCORES` (`compress`'s prune stage).
PRUNING_LEARNING_RATE = 3e-4
PRUNING_SCORES = "fisher"
README_START = "<!-- compression-table:start -->"
README_END = "<!-- compression-table:end -->"
RESULTS_NAME = "results.json"
TEACHER_RECIPE = {"epochs": 3, "batch_size": 32, "learning_rate": 1e-4, "seed": 0}
CLEAR_MARGIN_POINTS = 2.0  # "distill beats hard by a clear margin": accuracy points.
GOALS = {
    "distill": "≤1/3 encoder params, ≥97% of teacher, ≥3x b32, ≥2 pts over hard",
    "hard": "baseline (no goal)",
    "prune90": "≥97% of teacher",
    "structured": "≥2x b32, ≤1 pt loss",
    "int8": "≥1.8x b1 and b32, ≤0.5 pt loss",
    "int8sq": "≥1.8x b1 and b32, ≤0.5 pt loss",
    "int8st": "≥1.8x b1 and b32, ≤0.5 pt loss",
    "int8w": "≥1.8x b1 and b32, ≤0.5 pt loss",
    "int8qat": "≥1.8x b1 and b32, ≤0.5 pt loss",
}
QAT_LEARNING_RATE = 2e-5
# Labelled batches scoring the FFN neurons of a narrower student (`--student-ffn`).
STUDENT_CALIBRATION_STEPS = 32


# --- Data ---------------------------------------------------------------------


def subsample(texts, labels, size, seed=0):
    """`size` examples drawn with a fixed seed (in their original order), or all."""
    if not size or size >= len(texts):
        return list(texts), np.asarray(labels)
    keep = np.sort(np.random.default_rng(seed).choice(len(texts), size, replace=False))
    return [texts[i] for i in keep], np.asarray(labels)[keep]


def load_data(args, name="amazon"):
    """`(path, (train texts, labels), (test texts, labels))` of one file:
    `split` with seed 0, 80/20, then `args.train_size` / `args.test_size`
    (0: all) drawn with a fixed seed. `args.data` overrides the path."""
    from bertzoo.datasets import load_rated_sentences
    from bertzoo.datasets import split

    path = sentiment_path(name, data=getattr(args, "data", None))
    texts, labels = load_rated_sentences(path)
    (train_x, train_y), (test_x, test_y) = split(texts, labels, test_fraction=0.2, seed=0)
    return path, subsample(train_x, train_y, args.train_size), subsample(test_x, test_y, args.test_size)


def transfer_texts(name, size):
    """The texts of the other sentiment files (all rows), `size` of them drawn with a fixed seed."""
    from bertzoo.datasets import load_rated_sentences

    texts = []
    for other in FILES:
        if other != name:
            texts += load_rated_sentences(sentiment_path(other))[0]
    return subsample(texts, np.zeros(len(texts)), size)[0]


def tokenize(preprocessor, texts, batch=256):
    parts = [preprocessor(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}


# --- Results cache ------------------------------------------------------------


def load_cache(path):
    """A file's results so far (`{"runs": {}, ...}` when there are none)."""
    path = Path(path)
    if not path.is_file():
        return {"runs": {}}
    return json.loads(path.read_text())


def save_cache(path, store):
    """Writes `store` atomically: a temporary file, then `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(store, indent=1, sort_keys=True))
    os.replace(tmp, path)


def run_key(method, seed):
    return f"{method}/{seed}"


def done(store, method, seed, settings):
    """The cached result of (method, seed) when it was made with `settings`, else None."""
    entry = store.get("runs", {}).get(run_key(method, seed))
    return entry if entry is not None and entry.get("settings") == settings else None


def uses_transfer(method, args):
    """Whether `method` trains on the transfer set (the other files' texts)."""
    return (
        method == "distill"
        or (method == "structured" and args.structured_transfer)
        or (method == "prune90" and args.prune_transfer)
    )


def method_settings(method, args, n_train, n_test):
    """What a result depends on: a cached one with other settings is redone."""
    common = {"train": n_train, "test": n_test, "sequence_length": args.sequence_length, "teacher": TEACHER_RECIPE}
    specific = {
        "distill": {
            "recipe": args.recipe,
            "epochs": args.distill_epochs,
            "transfer": args.transfer_size,
            "learning_rate": 2e-4,
        },
        "hard": {"epochs": args.hard_epochs, "learning_rate": 2e-4},
        "prune90": {
            "epochs": args.prune_epochs,
            "sparsity": 0.9,
            "scores": args.prune_scores,
            "learning_rate": args.prune_lr,
        },
        "structured": {"epochs": args.structured_epochs, "heads": args.heads, "ffn": args.ffn, "learning_rate": 1e-4},
        "int8": {},
        "int8sq": {"smoothing": args.smoothing, "calibration": CALIBRATION_TEXTS},
        "int8st": {"smoothing": args.smoothing, "calibration": CALIBRATION_TEXTS, "input_ranges": "static"},
        "int8w": {"weight_only": True},
        "int8qat": {"epochs": args.qat_epochs, "learning_rate": QAT_LEARNING_RATE, "distill": True, "alpha": 0.0},
    }[method]
    # Options added after results were cached count only when set, so those
    # results stay valid: `{setting: (value, the value they were made with)}`.
    student = {
        "student_layers": (args.student_layers, 2),
        "student_heads": (args.student_heads, None),
        "student_ffn": (args.student_ffn, 1.0),
    }
    pruned_augment = {"augment": (args.prune_augment if uses_transfer(method, args) else 0, 0)}
    later_options = {
        "distill": {**student, "augment": (args.augment, 0)},
        "hard": student,
        "prune90": {"scope": (args.prune_scope, "layer"), **pruned_augment},
        "structured": pruned_augment,
    }
    options = later_options.get(method, {})
    specific = {**specific, **{k: value for k, (value, default) in options.items() if value != default}}
    if method in ("structured", "prune90") and uses_transfer(method, args):
        specific = {**specific, "transfer": args.transfer_size}
    return {**common, **specific}


# --- Models -------------------------------------------------------------------


def accuracy(model, x, y, batch=64):
    import tensorflow as tf

    fn = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    predictions = []
    for i in range(0, len(y), batch):
        predictions.append(np.argmax(fn({k: v[i : i + batch] for k, v in x.items()}).numpy(), -1))
    return float(np.mean(np.concatenate(predictions) == np.asarray(y)))


def parameters(model):
    """(all parameters, encoder parameters, encoder non-zero fraction)."""
    from keras import ops

    backbone = model.backbone
    blocks = list(backbone.attention_blocks) + list(backbone.feedforward_blocks)
    values = [ops.convert_to_numpy(w) for block in blocks for w in block.weights]
    encoder = sum(v.size for v in values)
    nonzero = sum(int(np.count_nonzero(v)) for v in values)
    return int(model.count_params()), int(encoder), nonzero / max(1, encoder)


def save_plain(model, directory):
    """Saves `model` without optimizer slots (a compiled model's weights
    hold them); returns the preset's megabytes."""
    plain = model
    if getattr(model, "optimizer", None) is not None:
        plain = type(model).from_config(model.get_config())
        plain.set_weights(model.get_weights())
        plain.source_preset = getattr(model, "source_preset", None)
    plain.save_to_preset(directory)
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file()) / 1e6


# Next to each file's cached teacher: the settings it was fine-tuned with (a
# cache from before this record is trusted as it is).
TEACHER_SETTINGS_NAME = "teacher-settings.json"


def teacher_model(args, cache, name, train):
    """The fine-tuned teacher of one file: loaded from `cache/<name>/teacher`,
    else converted, fine-tuned (`TEACHER_RECIPE`) and saved there."""
    import keras

    import bertzoo
    from bertzoo.models.task import bert_optimizer

    directory = cache / name / "teacher"
    # What the cached teacher was fine-tuned with: every row's "% of teacher"
    # and the distillation targets come from it, and the rows say they were
    # made with this run's training set, length and recipe.
    wanted = {"train": len(train[0]), "sequence_length": args.sequence_length, **TEACHER_RECIPE}
    recorded = cache / name / TEACHER_SETTINGS_NAME
    if (directory / "config.json").is_file() and recorded.is_file():
        found = json.loads(recorded.read_text())
        if found != wanted:
            raise SystemExit(
                f"The cached teacher {directory} was fine-tuned with {found}, this run asks for {wanted}: "
                "use another --cache, or delete that directory to fine-tune it again."
            )
    if not (directory / "config.json").is_file():
        minilm = cache / "minilm"
        if not (minilm / "config.json").is_file():
            bertzoo.convert_checkpoint(minilm_path(purpose="the teacher is the fine-tuned MiniLM"), minilm)
        keras.utils.set_random_seed(TEACHER_RECIPE["seed"])
        model = bertzoo.BertClassifier.from_preset(minilm, num_classes=2, sequence_length=args.sequence_length)
        model.compile(optimizer=bert_optimizer(TEACHER_RECIPE["learning_rate"]), jit_compile=False)
        print(f"[{name}] fine-tuning the teacher ...", flush=True)
        model.fit(*train, batch_size=TEACHER_RECIPE["batch_size"], epochs=TEACHER_RECIPE["epochs"], verbose=2)
        save_plain(model, directory)
        recorded.write_text(json.dumps(wanted, sort_keys=True))
    return bertzoo.BertClassifier.from_preset(directory, sequence_length=args.sequence_length)


# Pruned models keep the teacher's layers, so they distill on its outputs
# alone (Hinton; as movement pruning and oBERT do), without the slower
# attention-map path.
def compress(method, teacher, train, transfer, seed, args):
    """The compressed model of one method (trained with `seed` already set)."""
    import bertzoo
    from bertzoo.compression.model_copy import copy_model
    from bertzoo.compression.recipes import transfer_pool
    from bertzoo.models.task import bert_optimizer

    texts, labels = train
    if method in ("distill", "hard"):
        student = bertzoo.init_student_from_teacher(teacher, {"num_layers": args.student_layers})
        if args.student_heads or args.student_ffn < 1.0:  # A narrower student too (TinyBERT's are).
            student = bertzoo.prune_heads_and_neurons(
                student,
                heads_to_keep=args.student_heads,
                ffn_keep_ratio=args.student_ffn if args.student_ffn < 1.0 else None,
                data=(texts, labels),
                steps=STUDENT_CALIBRATION_STEPS,
            )
        if method == "distill":
            epochs = tuple(int(e) for e in args.distill_epochs.split(","))
            bertzoo.distill(
                teacher,
                student,
                texts,
                labels,
                recipe=args.recipe,
                transfer=transfer,
                augment=args.augment,
                epochs=epochs if len(epochs) > 1 else epochs[0],
                learning_rate=2e-4,
                seed=seed,
                verbose=2,
            )
        else:
            student.compile(optimizer=bert_optimizer(2e-4), jit_compile=False)
            student.fit(texts, labels, batch_size=32, epochs=args.hard_epochs, verbose=2)
        return student
    if method == "prune90":
        model = copy_model(teacher)
        # Soft targets on the transfer set (`--prune-transfer`), or on the
        # labelled texts mixed with the labels.
        data = (
            (transfer_pool(texts, transfer, augment=args.prune_augment, seed=seed),)
            if uses_transfer(method, args)
            else (texts, labels)
        )
        steps = max(1, math.ceil(len(data[0]) / 32)) * args.prune_epochs
        schedule = bertzoo.compression.ramp_schedule(steps, 0.9, prunings=20)
        pruner = bertzoo.Pruner(model, schedule, scores=args.prune_scores, scope=args.prune_scope)
        model.compile(optimizer=bert_optimizer(args.prune_lr))
        pruner.fit(
            *data,
            batch_size=32,
            epochs=args.prune_epochs,
            verbose=2,
            teacher=teacher,
        )
        return pruner.strip()
    if method == "structured":
        model = bertzoo.prune_heads_and_neurons(
            copy_model(teacher), heads_to_keep=args.heads, ffn_keep_ratio=args.ffn, data=(texts, labels)
        )
        # Soft targets (Hinton): on the labelled texts mixed with the labels,
        # or on the transfer set (`--structured-transfer`) alone.
        bertzoo.distill(
            teacher,
            model,
            texts,
            labels,
            recipe="hinton",
            transfer=transfer if args.structured_transfer else None,
            augment=args.prune_augment if args.structured_transfer else 0,
            epochs=args.structured_epochs,
            learning_rate=1e-4,
            seed=seed,
            verbose=2,
        )
        return model
    if method in ("int8", "int8w"):
        return bertzoo.quantize(copy_model(teacher), "int8", weight_only=method == "int8w")
    if method in ("int8sq", "int8st"):
        from bertzoo.compression.calibration import calibration_sample

        calibration = calibration_sample(texts, CALIBRATION_TEXTS)
        return bertzoo.quantize(
            teacher,
            "int8",
            calibration=calibration,
            smoothing=args.smoothing,
            calibration_steps=None,
            input_ranges="static" if method == "int8st" else "dynamic",
        )
    if method == "int8qat":
        return bertzoo.quantization_aware_training(
            teacher, texts, labels, epochs=args.qat_epochs, batch_size=32, learning_rate=QAT_LEARNING_RATE, verbose=2
        )
    raise ValueError(f"Unknown method {method!r}.")


def measure(model, directory, test_x, test_y):
    total, encoder, nonzero = parameters(model)
    return {
        "accuracy": accuracy(model, test_x, test_y),
        "parameters": total,
        "encoder_parameters": encoder,
        "encoder_nonzero": round(nonzero, 4),
        "preset_mb": round(save_plain(model, directory), 3),
    }


# --- Latency ------------------------------------------------------------------


def time_models(models, inputs, runs, xla_modes):
    """Median ms per (name, xla, batch) of every model on `inputs` (`{batch:
    features}`), all interleaved in one `time_interleaved` loop."""
    import tensorflow as tf

    calls = {}
    for name, model in models.items():
        for xla in xla_modes:
            fn = tf.function(lambda x, model=model: model(x, training=False), jit_compile=xla)
            for n, x in inputs.items():
                calls[(name, xla, n)] = lambda fn=fn, x=x: fn(x).numpy()

    def compiled(key, seconds):
        print(f"  warmed up {key[0]} xla={key[1]} batch={key[2]} in {seconds:.1f}s", flush=True)

    return median_ms(time_interleaved(calls, runs, warmup=2, on_warm=compiled))


def latencies(models, test_x, runs, xla_modes):
    """`{name: {"ms_b1", "ms_b32", "mode_b1", "mode_b32", "speedup_b1",
    "speedup_b32"}}`: each model's best XLA mode, speedups over "teacher",
    whose times and modes of this run the others keep ("teacher_ms_b1",
    "teacher_mode_b1", ...)."""
    import tensorflow as tf

    n_test = len(next(iter(test_x.values())))
    inputs = {}
    for n in (1, 32):
        rows = [i % n_test for i in range(n)]
        inputs[n] = {k: tf.constant(v[rows]) for k, v in test_x.items()}
    ms = time_models(models, inputs, runs, xla_modes)
    result = {}
    for name in models:
        result[name] = {}
        for n in inputs:
            best = min(xla_modes, key=lambda xla: ms[(name, xla, n)])
            result[name][f"ms_b{n}"] = round(ms[(name, best, n)], 3)
            result[name][f"mode_b{n}"] = "XLA" if best else "no XLA"
    for name in models:
        for n in inputs:
            result[name][f"speedup_b{n}"] = round(result["teacher"][f"ms_b{n}"] / result[name][f"ms_b{n}"], 3)
            if name != "teacher":  # The teacher time of this run, which the speedup is against.
                result[name][f"teacher_ms_b{n}"] = result["teacher"][f"ms_b{n}"]
                result[name][f"teacher_mode_b{n}"] = result["teacher"][f"mode_b{n}"]
    return result


# --- Aggregation --------------------------------------------------------------


def mean_std(values):
    """`(mean, standard deviation)`; the deviation is None for a single value."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def measured_runs(rows, method):
    """The rows of `method` that are separate measurements: a seed-independent
    method (`UNSEEDED`) is measured once per file and recorded for every seed,
    so only its first seed's row counts."""
    mine = [r for r in rows if r["method"] == method]
    if method not in UNSEEDED:
        return mine
    first = {}
    for r in sorted(mine, key=lambda r: r["seed"]):
        first.setdefault(r["file"], r)
    return list(first.values())


def aggregate(rows, files):
    """Per method (in `METHODS` order): mean ± std over seeds of accuracy and
    % of teacher per file and over files (per seed, the mean over the files;
    only seeds that every file has count there, unless none does), accuracy
    loss in points, mean speedups, parameters, and the goal verdict. The
    goals hold per file, so `met` is True only when every file's own figures
    (its mean over seeds, its speedups) meet the goal, False when one does not
    (`failed`: those files), None when a figure is missing.

    `rows`: dicts with file, method, seed, accuracy, teacher_accuracy and
    optionally speedup_b1, speedup_b32, parameters, encoder_parameters."""
    summary = []
    for method in [m for m in METHODS if any(r["method"] == m for r in rows)]:
        mine = measured_runs(rows, method)
        entry = {"method": method, "files": {}, "goal": GOALS[method]}
        for name in files:
            found = [r for r in mine if r["file"] == name]
            if found:
                timed = [r for r in found if r.get("speedup_b32") is not None]
                entry["files"][name] = {
                    "method": method,
                    "accuracy": mean_std([r["accuracy"] for r in found]),
                    "percent": mean_std([100 * r["accuracy"] / r["teacher_accuracy"] for r in found]),
                    "loss_points": mean_std([100 * (r["teacher_accuracy"] - r["accuracy"]) for r in found]),
                    "speedup_b1": timed[0].get("speedup_b1") if timed else None,
                    "speedup_b32": timed[0]["speedup_b32"] if timed else None,
                    "encoder_share": _encoder_share(found[0]),
                    "seeds": len(found),
                }
        seeds = sorted({r["seed"] for r in mine})
        # A seed missing on one file would average the other files alone.
        complete = [s for s in seeds if {r["file"] for r in mine if r["seed"] == s} >= entry["files"].keys()]
        seeds = complete or seeds

        def over_files(seed, value, mine=mine):
            return statistics.fmean([value(r) for r in mine if r["seed"] == seed])

        entry["accuracy"] = mean_std([over_files(s, lambda r: r["accuracy"]) for s in seeds])
        entry["percent"] = mean_std(
            [over_files(s, lambda r: 100 * r["accuracy"] / r["teacher_accuracy"]) for s in seeds]
        )
        entry["loss_points"] = mean_std(
            [over_files(s, lambda r: 100 * (r["teacher_accuracy"] - r["accuracy"])) for s in seeds]
        )
        for key in ("speedup_b1", "speedup_b32", "parameters", "encoder_parameters"):
            by_file = {}
            for r in mine:
                if r.get(key) is not None:
                    by_file.setdefault(r["file"], r[key])
            entry[key] = statistics.fmean(by_file.values()) if by_file else None
        summary.append(entry)
    hard = next((e for e in summary if e["method"] == "hard"), None)
    for entry in summary:
        verdicts = {
            name: verdict(figures, hard["files"].get(name) if hard else None)
            for name, figures in entry["files"].items()
        }
        entry["failed"] = [name for name, met in verdicts.items() if met is False]
        entry["met"] = False if entry["failed"] else (None if None in verdicts.values() else True)
    return summary


def _encoder_share(row):
    """The model's encoder parameters as a fraction of its teacher's (None if unknown)."""
    mine, teachers = row.get("encoder_parameters"), row.get("teacher_encoder_parameters")
    return mine / teachers if mine is not None and teachers else None


def verdict(entry, hard=None):
    """Whether one file's figures (or any entry with the same keys) meet the
    method's goal (None: a figure is missing)."""
    method, percent, loss = entry["method"], entry["percent"][0], entry["loss_points"][0]
    b1, b32 = entry.get("speedup_b1"), entry.get("speedup_b32")
    if method == "hard":
        return None
    if method == "prune90":
        return percent >= 97.0
    if method == "distill":
        share = entry.get("encoder_share")
        if b32 is None or hard is None or share is None:
            return None
        return (
            share <= 1 / 3 + 1e-9
            and percent >= 97.0
            and b32 >= 3.0
            and entry["accuracy"][0] - hard["accuracy"][0] >= CLEAR_MARGIN_POINTS / 100
        )
    if b32 is None or (method.startswith("int8") and b1 is None):
        return None
    if method == "structured":
        return b32 >= 2.0 and loss <= 1.0
    return b1 >= 1.8 and b32 >= 1.8 and loss <= 0.5  # int8, int8sq, int8st, int8w, int8qat


def _pm(pair, scale=1.0, digits=1, suffix=""):
    mean, std = pair
    if mean is None:
        return "-"
    if std is None:  # One measurement.
        return f"{scale * mean:.{digits}f}{suffix}"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}{suffix}"


def _x(value):
    return "-" if value is None else f"{value:.2f}x"


def _millions(value):
    return "-" if value is None else f"{value / 1e6:.1f}M"


def _met(entry):
    if entry["met"] is False:
        return f"no ({', '.join(entry['failed'])})"
    if entry["met"] is None:
        return "?"
    # A seeded method's pass on fewer seeds than the goal asks is provisional.
    fewest = min(f["seeds"] for f in entry["files"].values())
    if entry["method"] not in UNSEEDED and fewest < GOAL_SEEDS:
        return f"yes on {fewest} seed{'s' * (fewest > 1)} ({GOAL_SEEDS} asked)"
    return "yes"


def aggregate_table(summary, files):
    """(rows, columns) of the aggregate table (one row per method)."""
    columns = ["method"] + [f"{name} acc (% of teacher)" for name in files]
    columns += ["mean acc", "% of teacher", "b1 speedup", "b32 speedup", "params (encoder)", "goal", "met"]
    rows = []
    for e in summary:
        row = {"method": e["method"]}
        for name in files:
            f = e["files"].get(name)
            cell = f"{_pm(f['accuracy'], 100)} ({f['percent'][0]:.1f}%, n={f['seeds']})" if f else "-"
            row[f"{name} acc (% of teacher)"] = cell
        row.update(
            {
                "mean acc": _pm(e["accuracy"], 100),
                "% of teacher": _pm(e["percent"], suffix="%"),
                "b1 speedup": _x(e["speedup_b1"]),
                "b32 speedup": _x(e["speedup_b32"]),
                "params (encoder)": f"{_millions(e['parameters'])} ({_millions(e['encoder_parameters'])})",
                "goal": e["goal"],
                "met": "-" if e["method"] == "hard" else _met(e),
            }
        )
        rows.append(row)
    return rows, columns


FILE_COLUMNS = [
    "file",
    "method",
    "seeds",
    "accuracy",
    "% of teacher",
    "params",
    "encoder params",
    "encoder non-zero",
    "preset MB",
    "b1 ms",
    "b32 ms",
    "b1 speedup",
    "b32 speedup",
    "train s",
]


def file_table(rows, teachers):
    """Rows of the per-file table: the teacher, then each method (mean ± std over seeds)."""
    table = []
    for name, teacher in teachers.items():
        table.append(
            {
                "file": name,
                "method": "teacher",
                "seeds": 1,
                "accuracy": _number(teacher.get("accuracy"), "{:.1f}", 100),
                "% of teacher": "100%",
                "params": _millions(teacher.get("parameters")),
                "encoder params": _millions(teacher.get("encoder_parameters")),
                "encoder non-zero": _number(teacher.get("encoder_nonzero"), "{:.0%}"),
                "preset MB": _number(teacher.get("preset_mb"), "{:.1f}"),
                "b1 ms": _ms(teacher.get("ms_b1")),
                "b32 ms": _ms(teacher.get("ms_b32")),
            }
        )
        for method in METHODS:
            found = [r for r in measured_runs(rows, method) if r["file"] == name]
            if not found:
                continue
            first = min(found, key=lambda r: r["seed"])
            table.append(
                {
                    "file": name,
                    "method": method,
                    "seeds": len(found),
                    "accuracy": _pm(mean_std([r["accuracy"] for r in found]), 100),
                    "% of teacher": _pm(
                        mean_std([100 * r["accuracy"] / r["teacher_accuracy"] for r in found]), suffix="%"
                    ),
                    "params": _millions(first["parameters"]),
                    "encoder params": _millions(first["encoder_parameters"]),
                    "encoder non-zero": f"{first['encoder_nonzero']:.0%}",
                    "preset MB": f"{first['preset_mb']:.1f}",
                    "b1 ms": _ms(first.get("ms_b1")),
                    "b32 ms": _ms(first.get("ms_b32")),
                    "b1 speedup": _x(first.get("speedup_b1")),
                    "b32 speedup": _x(first.get("speedup_b32")),
                    "train s": f"{statistics.fmean(r['seconds'] for r in found):.0f}",
                }
            )
    return table


def _number(value, spec, scale=1):
    return "-" if value is None else spec.format(scale * value)


def _ms(value):
    return "-" if value is None else f"{value:.1f}"


def readme_section(summary, files, header):
    """The README's compression section: a header line, the aggregate table
    and the goals' fine print."""
    rows, columns = aggregate_table(summary, files)
    lines = [header, ""] + markdown_table(rows, columns)
    lines += [
        "",
        "Accuracy in % (mean ± standard deviation over seeds; per file, the share of that file's teacher and "
        "the number of seeds n in brackets; over files, only the seeds every file has). Speedups: the first seed's model against the teacher in the same interleaved timing run, "
        "mean over files. `met`: whether every file meets the goal with its own mean over seeds and its own speedups "
        f"(`no`: the files that miss it; `?`: a figure is missing; `yes on n seeds`: fewer than the {GOAL_SEEDS} "
        "the goal asks for); "
        f"distillation must also beat `hard` by {CLEAR_MARGIN_POINTS:g} accuracy points. "
        "Parameters: `model.count_params()`, so the int8 rows count their quantization scales too "
        "(`bertzoo compress` reports them as the float model's count).",
    ]
    return "\n".join(lines)


# --- Chart --------------------------------------------------------------------


def chart(summary, path, title):
    """% of teacher (error bars over seeds) against the batch-32 speedup, one marker per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {
        "distill": "o",
        "hard": "v",
        "prune90": "s",
        "structured": "D",
        "int8": "^",
        "int8sq": ">",
        "int8st": "P",
        "int8w": "x",
        "int8qat": "<",
    }
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for e in summary:
        if e["speedup_b32"] is None:  # No timing (a pruned model runs at dense speed): nothing to place.
            print(f"chart: {e['method']} has no batch-32 speedup (not plotted)")
            continue
        x = e["speedup_b32"]
        ax.errorbar(
            x, e["percent"][0], yerr=e["percent"][1] or 0.0, fmt=markers[e["method"]], capsize=4, label=e["method"]
        )
        ax.annotate(f" {e['method']}", (x, e["percent"][0]), fontsize=8)
    ax.scatter([1.0], [100.0], marker="*", s=120, color="black", label="teacher")
    ax.axhline(97, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("CPU speedup over the teacher, batch 32 (same run)")
    ax.set_ylabel("test accuracy, % of teacher (mean over files)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"chart: {path}")


# --- Main ---------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", default=",".join(FILES), help="comma list of amazon, tweets, nyt")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma list of seeds")
    parser.add_argument("--train-size", type=int, default=0, help="0: the whole train split")
    parser.add_argument("--test-size", type=int, default=0, help="0: the whole test split")
    parser.add_argument(
        "--transfer-size",
        type=int,
        default=0,
        help="texts of the other files for the transfer set (distill, structured, prune90); 0: all",
    )
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--recipe", default="tinybert", help="bertzoo.distill recipe")
    parser.add_argument("--distill-epochs", default="1,2", help="epochs per recipe stage")
    parser.add_argument(
        "--augment",
        type=int,
        default=4,
        help="distill: perturbed copies of each training text added to the transfer set (augment_texts)",
    )
    parser.add_argument(
        "--prune-augment",
        type=int,
        default=0,
        help="prune90, structured: the same copies in their transfer set",
    )
    parser.add_argument("--hard-epochs", type=int, default=3)
    parser.add_argument("--student-layers", type=int, default=2, help="distill/hard: the student's layers")
    parser.add_argument(
        "--student-heads", type=int, default=None, help="distill/hard: attention heads kept per student layer"
    )
    parser.add_argument(
        "--student-ffn",
        type=float,
        default=0.67,
        help="distill/hard: fraction of the student's FFN neurons kept (pruned before training; 1: all)",
    )
    parser.add_argument("--prune-epochs", type=int, default=3)
    parser.add_argument(
        "--prune-lr", type=float, default=PRUNING_LEARNING_RATE, help="prune90: peak learning rate (bert_optimizer)"
    )
    parser.add_argument(
        "--prune-scores", default=PRUNING_SCORES, help="prune90: Pruner scores (fisher, magnitude or movement)"
    )
    parser.add_argument(
        "--prune-scope",
        choices=("layer", "global"),
        default="layer",
        help="prune90: 90%% of every weight (layer) or one score threshold across the encoder (global); "
        "a global result replaces the layer one in the cache: give it its own --cache to keep both",
    )
    parser.add_argument(
        "--prune-transfer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prune90: distill on the transfer set (distill's texts without its copies); --no-prune-transfer: "
        "on the labelled "
        "texts, mixed with the labels",
    )
    parser.add_argument("--structured-epochs", type=int, default=1)
    parser.add_argument(
        "--structured-transfer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="structured: distill on the transfer set (distill's texts without its copies); "
        "--no-structured-transfer: on the "
        "labelled texts, mixed with the labels",
    )
    parser.add_argument("--heads", type=int, default=6, help="heads kept per layer (of 12)")
    parser.add_argument("--ffn", type=float, default=0.3, help="fraction of FFN neurons kept")
    parser.add_argument("--qat-epochs", type=int, default=1, help="int8qat: quantization-aware training epochs")
    parser.add_argument(
        "--smoothing", type=float, default=SMOOTHING, help="int8sq, int8st: SmoothQuant migration strength"
    )
    parser.add_argument("--runs", type=int, default=7, help="timing rounds (medians)")
    parser.add_argument("--xla", choices=("both", "on", "off"), default="both", help="timed XLA modes (best kept)")
    parser.add_argument("--cache", default=str(OUT / "compression_cache"))
    parser.add_argument("--fresh", action="store_true", help="ignore cached results (teachers are kept)")
    parser.add_argument("--chart", default=str(OUT / "compression.png"), help="PNG to draw ('' for none)")
    parser.add_argument("--readme", type=Path, default=None, help="rewrite the compression table in this file")
    parser.add_argument("--no-record", action="store_true", help="do not append to results.jsonl")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_FILE, help="results file to append to and, with --from-results, read"
    )
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="train and time nothing: report the cached results made with these settings",
    )
    parser.add_argument(
        "--skip-timing", action="store_true", help="train and measure accuracy only (time later, on a quiet machine)"
    )
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="train and time nothing, read no cache: report the latest results.jsonl line of each "
        "(file, method, seed) made with these settings",
    )
    args = parser.parse_args(argv)
    args.files = comma_choices(args.files, FILES, "--files")
    args.methods = comma_choices(args.methods, METHODS, "--methods")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds takes integers separated by commas (e.g. 0,1,2), got {args.seeds!r}.") from None
    if not args.seeds or args.runs < 1:
        raise SystemExit("--seeds must name a seed and --runs be positive.")
    if len(set(args.seeds)) < len(args.seeds):  # Each seed's result would count once per mention.
        raise SystemExit(f"--seeds names a seed twice ({','.join(map(str, args.seeds))}); name each once.")
    epochs = [("--hard-epochs", args.hard_epochs), ("--prune-epochs", args.prune_epochs)]
    epochs += [("--structured-epochs", args.structured_epochs), ("--qat-epochs", args.qat_epochs)]
    for flag, value in epochs:
        if value < 1:
            raise SystemExit(f"{flag} must be a positive number of epochs, got {value}.")
    stages = args.distill_epochs.split(",")
    if not all(s.strip().isdigit() and int(s) >= 1 for s in stages):
        raise SystemExit(
            f"--distill-epochs takes positive integers, one per recipe stage (e.g. 1,2), got {args.distill_epochs!r}."
        )
    if args.heads < 1 or not 0.0 < args.ffn <= 1.0:
        raise SystemExit(
            f"--heads must be positive and --ffn in (0, 1] (the fraction kept), got {args.heads}, {args.ffn}."
        )
    if not 0.0 <= args.smoothing <= 1.0:
        raise SystemExit(f"--smoothing (SmoothQuant's migration strength) must be in [0, 1], got {args.smoothing}.")
    if args.prune_scores not in ("magnitude", "movement", "fisher"):
        raise SystemExit(f"--prune-scores: unknown {args.prune_scores!r}; choose from magnitude, movement, fisher.")
    if args.transfer_size < 0:
        raise SystemExit(f"--transfer-size must be >= 0 (0: all), got {args.transfer_size}.")
    if "distill" in args.methods and not args.from_results:
        from bertzoo.compression.recipes import RECIPES

        if args.recipe not in RECIPES:
            raise SystemExit(f"--recipe: unknown {args.recipe!r}; choose from {', '.join(sorted(RECIPES))}.")
    if args.from_results or not args.no_record:
        check_results_file(args.results, reading=args.from_results)
    if min(args.train_size, args.test_size) < 0 or args.sequence_length < 1:
        raise SystemExit("--train-size and --test-size must be >= 0 (0: the whole split), --sequence-length positive.")
    if not 0.0 < args.student_ffn <= 1.0:
        raise SystemExit(f"--student-ffn must be in (0, 1] (the fraction of FFN neurons kept), got {args.student_ffn}.")
    if args.student_layers < 1 or (args.student_heads is not None and args.student_heads < 1):
        raise SystemExit("--student-layers and --student-heads must be positive.")
    for flag, value in (("--augment", args.augment), ("--prune-augment", args.prune_augment)):
        if value < 0:
            raise SystemExit(f"{flag} must be >= 0 (perturbed copies of each training text), got {value}.")
    return args


def run_file(name, args, cache, on_trained=None):
    """Trains, measures and times every (method, seed) of one file (skipping
    cached results); returns (result rows, teacher figures). `on_trained`,
    if given, gets each newly trained result's row (untimed) as soon as it
    is measured."""
    import keras

    import bertzoo

    path, train, (test_texts, test_y) = load_data(args, name)
    print(f"[{name}] {path}: {len(train[0])} train / {len(test_y)} test sentences", flush=True)
    results = cache / name / RESULTS_NAME
    store = {"runs": {}} if args.fresh else load_cache(results)
    teacher = teacher_model(args, cache, name, train)
    test_x = tokenize(teacher.preprocessor, test_texts)
    teacher_settings = {"test": len(test_y), "sequence_length": args.sequence_length}
    if store.get("teacher", {}).get("settings") != teacher_settings:
        store["teacher"] = {**measure(teacher, cache / name / "teacher", test_x, test_y), "settings": teacher_settings}
        save_cache(results, store)
    print(f"[{name}] teacher accuracy {store['teacher']['accuracy']:.4f}", flush=True)

    transfer = None
    models = {"teacher": teacher}
    # Timing uses one seed's models: the cached timing's, else this run's first.
    latency_seed = store.get("latency", {}).get("seed", args.seeds[0])
    for method in args.methods:
        settings = method_settings(method, args, len(train[0]), len(test_y))
        for seed in args.seeds:
            if done(store, method, seed, settings):
                print(f"[{name}] {method} seed {seed}: cached", flush=True)
                continue
            if args.cached_only:
                why = "cached with other settings" if run_key(method, seed) in store["runs"] else "not measured yet"
                print(f"[{name}] {method} seed {seed}: {why} (--cached-only: not reported)", flush=True)
                continue
            started = time.time()
            measured = [done(store, method, s, settings) for s in args.seeds]
            measured = [e for e in measured if e is not None]
            if method in UNSEEDED and measured:  # Seed-independent: measured once.
                entry = dict(measured[0])
            else:
                if uses_transfer(method, args) and transfer is None:
                    transfer = transfer_texts(name, args.transfer_size)
                keras.utils.set_random_seed(seed)
                print(f"[{name}] {method} seed {seed} ...", flush=True)
                model = compress(method, teacher, train, transfer, seed, args)
                entry = measure(model, cache / name / f"{method}-s{seed}", test_x, test_y)
                entry.update(seconds=round(time.time() - started, 1), preset=f"{method}-s{seed}")
                if seed == latency_seed:
                    models[method] = model
                cached_timing = store.get("latency", {}).get("models", {})
                if cached_timing.get(method, {}).get("seed", latency_seed) == seed:
                    # It timed the model this one replaces: the next run that
                    # times (not --skip-timing) times this one.
                    cached_timing.pop(method, None)
            entry.update(seed=seed, settings=settings, seed_independent=method in UNSEEDED)
            store["runs"][run_key(method, seed)] = entry
            save_cache(results, store)
            print(f"[{name}] {method} seed {seed}: accuracy {entry['accuracy']:.4f}", flush=True)
            if on_trained is not None:
                on_trained(result_rows(name, {**store, "latency": {}}, [method], [seed], {method: settings})[0])

    settings = {method: method_settings(method, args, len(train[0]), len(test_y)) for method in args.methods}
    latency_settings = timing_settings(args)
    cached = store.get("latency", {})
    # Timed again: models trained in this run for the timing seed, methods
    # never timed or timed with other settings, or everything when the
    # timing settings changed. Each speedup is against the teacher of its
    # own timing run.
    same_settings = cached.get("settings") == latency_settings
    cached_models = cached.get("models", {}) if same_settings else {}
    stale = [m for m in args.methods if m in models or method_timing(cached_models.get(m), settings[m]) is None]
    # --cached-only and --skip-timing keep whatever timing there is.
    if not (args.cached_only or args.skip_timing) and stale:
        timed_seed = {}
        for method in stale:
            if method in models:  # Trained in this run, for the timing seed.
                timed_seed[method] = latency_seed
            else:
                # The timing seed's model if it has these settings, else this run's first.
                seeds = [latency_seed, *args.seeds]
                timed_seed[method] = next(s for s in seeds if done(store, method, s, settings[method]))
                preset = store["runs"][run_key(method, timed_seed[method])]["preset"]
                models[method] = bertzoo.BertClassifier.from_preset(cache / name / preset)
        print(f"[{name}] timing {', '.join(models)} ...", flush=True)
        xla_modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.xla]
        timings = latencies({m: models[m] for m in ["teacher", *stale]}, test_x, args.runs, xla_modes)
        for method in stale:
            timings[method].update(seed=timed_seed[method], settings=settings[method])
        store["latency"] = {
            "settings": latency_settings,
            "seed": latency_seed,
            "models": {**cached_models, **timings},
        }
        save_cache(results, store)
    return result_rows(name, store, args.methods, args.seeds, settings, latency_settings)


# The keys of a row's timing figures (the method's and its teacher's).
TIMING_PREFIXES = ("ms_b", "mode_b", "speedup_b", "teacher_ms_b", "teacher_mode_b", "teacher_speedup_b")


def timing_settings(args):
    """The settings a timing is made with: a timing of other settings is
    neither reused nor reported."""
    return {"runs": args.runs, "xla": args.xla, "sequence_length": args.sequence_length}


def method_timing(timing, settings):
    """The figures of a method's cached `timing` entry if it timed a model
    made with `settings`, else None. An entry cached before timings recorded
    their settings counts as none: the model it timed may have been replaced
    since (results moved between caches), so the next run that times redoes it."""
    if timing is None or timing.get("settings") != settings:
        return None
    return {k: v for k, v in timing.items() if k not in ("seed", "settings")}


def result_rows(name, store, methods, seeds, settings, latency_settings=None):
    """`(rows, teacher figures)` of one file's cache: a row per (method,
    seed) measured with `settings[method]`, with the teacher's figures and
    the method's timing (when it timed a model of those settings, and,
    given `latency_settings`, in a timing run of those settings: a
    `--skip-timing` run after the timing settings changed keeps the old
    figures in the cache but reports none). Results of other settings are
    left out (a rerun replaces them), so a report never mixes recipes."""
    latency = store.get("latency", {})
    if latency_settings is not None and latency.get("settings") != latency_settings:
        latency = {}
    timing = {"teacher": {}, **latency.get("models", {})}
    teacher_figures = {**store["teacher"], **timing["teacher"]}
    rows = []
    for method in methods:
        mine = method_timing(timing.get(method), settings[method]) or {}
        teacher_timing = {f"teacher_{k}": v for k, v in timing["teacher"].items()}
        if not all(mine.get(f"teacher_ms_b{n}") in (None, teacher_timing.get(f"teacher_ms_b{n}")) for n in (1, 32)):
            # Timed in an earlier run: that run's teacher figures (in `mine`), none of this run's.
            teacher_timing = {}
        for seed in seeds:
            entry = done(store, method, seed, settings[method])
            if entry is None:  # --cached-only: not measured yet, or with other settings.
                continue
            rows.append(
                {
                    "file": name,
                    "method": method,
                    "seed": seed,
                    "teacher_accuracy": store["teacher"]["accuracy"],
                    "teacher_encoder_parameters": store["teacher"].get("encoder_parameters"),
                    **{k: v for k, v in entry.items() if k not in ("seed", "settings")},
                    **teacher_timing,
                    **mine,
                    "latency_seed": latency.get("seed"),
                    **({"timing_settings": latency["settings"]} if mine and "settings" in latency else {}),
                    "settings": entry["settings"],
                }
            )
    return rows, teacher_figures


def recorded_rows(name, args, path=RESULTS_FILE):
    """`(rows, teacher figures)` of one file from `path` (results.jsonl):
    for each (method, seed) of `args`, its latest line made with the
    current settings; the teacher figures are those of the latest line."""
    _, train, (_, test_y) = load_data(args, name)
    settings = {method: method_settings(method, args, len(train[0]), len(test_y)) for method in args.methods}
    latest = {}
    for row in read_results(path, "compression"):
        if row.get("file") != name:
            continue
        method, seed = row.get("method"), row.get("seed")
        if method in settings and seed in args.seeds and row.get("settings") == settings[method]:
            if (method, seed) not in latest or row["date"] >= latest[(method, seed)]["date"]:
                latest[(method, seed)] = row
    rows = [latest[(m, s)] for m in args.methods for s in args.seeds if (m, s) in latest]
    for method in args.methods:
        missing = [s for s in args.seeds if (method, s) not in latest]
        if missing:
            print(f"[{name}] {method} seeds {missing}: no line with these settings (not reported)", flush=True)
    # A line timed with other timing settings (a `--runs 1` smoke run, one
    # XLA mode) keeps its accuracy; its timing is not this report's.
    wanted = timing_settings(args)
    for i, row in enumerate(rows):
        if row.get("timing_settings", wanted) != wanted:
            print(f"[{name}] {row['method']} seed {row['seed']}: timed with {row['timing_settings']} (not reported)")
            rows[i] = {k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)}
    newest = max(rows, key=lambda r: r["date"], default={})
    # The teacher's time only when every row was timed against the same one:
    # each speedup is against its own run's teacher.
    teacher_ms = {n: {r[f"teacher_ms_b{n}"] for r in rows if f"teacher_ms_b{n}" in r} for n in (1, 32)}
    teacher = {
        "accuracy": newest.get("teacher_accuracy"),
        "encoder_parameters": newest.get("teacher_encoder_parameters"),
        **{f"ms_b{n}": next(iter(ms)) if len(ms) == 1 else None for n, ms in teacher_ms.items()},
    }
    return rows, teacher


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = command_line("benchmarks.compression", argv)
    started = time.time()
    if args.readme:
        check_markers(args.readme, README_START, README_END)
    args.chart = chart_or_none(args.chart)

    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # Retracing notes from the timing functions.
    cache = Path(args.cache)
    rows, teachers = [], {}
    record = not (args.no_record or args.from_results)

    def record_new(found):
        found = unrecorded("compression", found, path=args.results) if record else []
        if found:
            append_results("compression", found, command, path=args.results)
        return len(found)

    for name in args.files:
        if args.from_results:
            found, teachers[name] = recorded_rows(name, args, path=args.results)
        else:
            found, teachers[name] = run_file(name, args, cache, on_trained=record_new)
        rows += found

    summary = aggregate(rows, args.files)
    print()
    print_table(file_table(rows, teachers), FILE_COLUMNS)
    print()
    table, columns = aggregate_table(summary, args.files)
    print_table(table, columns)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f}, total {time.time() - started:.0f}s")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    if record:
        recorded = record_new(rows)
        print(f"appended {recorded} lines to {args.results} ({len(rows) - recorded} recorded before)")
    if args.readme:
        measured = f"Measured {date} on {machine()}"
        used = [r for method in args.methods for r in measured_runs(rows, method)]
        if not used:
            raise SystemExit(
                f"No results of {', '.join(args.methods)} for these settings (files, seeds, sizes, sequence "
                f"length): {args.readme}'s table is left as it is. Check the arguments against the recorded runs."
            )
        if args.from_results and used:
            # The rows the table shows: a seed-independent method's later seeds are not among them.
            dates = sorted(r["date"][:10] for r in used)
            machines = sorted({machine_label(r) for r in used})
            span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
            measured = f"Measured {span} on {' and '.join(machines)}"
        timing = "timings as recorded" if args.from_results else f"timing medians of {args.runs} interleaved rounds"
        header = (
            f"{measured}: all-MiniLM-L6-v2 fine-tuned per file "
            f"({', '.join(args.files)}), seeds {', '.join(map(str, args.seeds))}"
            f"{' (those measured so far)' if args.cached_only else ''}"
            f"{' (the latest recorded result of each)' if args.from_results else ''}, sequence length "
            f"{args.sequence_length}, {timing}. Command: `{command}`."
        )
        write_between_markers(args.readme, readme_section(summary, args.files, header), README_START, README_END)
        print(f"rewrote the compression table in {args.readme}")
    if args.chart:  # Last: what was measured is recorded and tabled whatever drawing does.
        title = f"bertzoo compression of fine-tuned MiniLM-L6 ({', '.join(args.files)}; seeds {args.seeds}), {date}"
        chart(summary, Path(args.chart), title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
