"""Distill a fine-tuned BERT classifier into a smaller, faster one.

    python examples/distill_to_small.py                 # built-in default, offline, a few minutes
    python examples/distill_to_small.py --train-size 0 --epochs 4    # all the data, longer
    python examples/distill_to_small.py --teacher runs/my_teacher --student mini --data my.tsv

With no arguments it picks what is on this machine:

- data: `../shared/data/sentiment/amazon.tsv` when it is next to the checkout
  (a seeded 80/20 split, training set subsampled to `--train-size`),
  otherwise generated sentiment sentences (`bertzoo.datasets.synthetic_sentiment`);
- teacher: the `../shared/models/all-MiniLM-L6-v2` checkpoint when present
  (converted, then fine-tuned for `--teacher-epochs`), otherwise the built-in
  "mini" preset trained from scratch;
- student: for a pretrained teacher, every k-th of its layers copied into a
  shallower model (DistilBERT), else the built-in "tiny" preset.

Then it distills (soft targets, hidden states, attention, embeddings), prints
a table comparing teacher and student (parameters, preset size on disk, CPU
latency at batch 1 and 32, accuracy, agreement), saves both presets and, when
`bertzoo.export_saved_model` is available, a SavedModel of the student.

From Python, `run(...)` takes the same settings as keyword arguments
(underscores for dashes) and returns the figures:

```python
from examples import distill_to_small

result = distill_to_small.run(data="synthetic", epochs=1, output="runs/distill")
print(result["student"]["accuracy"], result["speedup_b32"])
```
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import keras
import numpy as np

import bertzoo
from bertzoo.compression.distiller import check_loss_settings
from bertzoo.datasets import find_shared
from bertzoo.datasets import find_shared_sentiment
from bertzoo.datasets import load_rated_sentences
from bertzoo.datasets import split
from bertzoo.datasets import synthetic_sentiment
from bertzoo.models.task import bert_optimizer
from bertzoo.saving.preset import check_preset_target
from bertzoo.utils.checks import check_non_negative_int
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_positive_number

ROOT = Path(__file__).resolve().parents[1]
CLASS_NAMES = ["negative", "positive"]


def find_minilm():
    """The shared all-MiniLM-L6-v2 checkpoint (see `find_shared`), or None."""
    path = find_shared("models", "all-MiniLM-L6-v2")
    return path if path is not None and (path / "config.json").is_file() else None


def parse_args(argv):
    """The example's settings from command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    arg = parser.add_argument
    arg(
        "--data",
        default=None,
        help="TSV file id<TAB>rating<TAB>text, or 'synthetic' (default: the shared amazon.tsv if found)",
    )
    arg(
        "--train-size",
        type=int,
        default=None,
        help="subsample the training split (0: all of it; default: 600 sentences of a data file, all generated ones)",
    )
    arg("--test-size", type=int, default=400, help="subsample the test split (0: all of it)")
    arg(
        "--teacher",
        default=None,
        help="fine-tuned classifier preset (used as is), or a backbone preset / built-in name "
        "to fine-tune first (default: converted all-MiniLM-L6-v2 if found, else 'mini')",
    )
    arg(
        "--teacher-epochs",
        type=int,
        default=None,
        help="fine-tuning epochs of a teacher that is not fine-tuned yet (default: 2 for "
        "pretrained weights, 4 from scratch)",
    )
    arg(
        "--teacher-learning-rate",
        type=float,
        default=None,
        help="default: 1e-4 for pretrained weights, 1e-3 from scratch",
    )
    arg(
        "--student",
        default=None,
        help="student preset or built-in name (randomly initialized built-ins take the "
        "teacher's tokenizer); default: copied teacher layers for a pretrained teacher, else 'tiny'",
    )
    arg(
        "--student-layers",
        type=int,
        default=None,
        help="build the student from every k-th teacher layer with this many layers "
        "(default for pretrained teachers: a third of the teacher's)",
    )
    arg(
        "--epochs",
        type=int,
        default=None,
        help="distillation epochs (default: 2 for a student copied from the teacher, 3 for a randomly initialized one)",
    )
    arg(
        "--learning-rate",
        type=float,
        default=None,
        help="distillation peak learning rate (default: 2e-4 for a student copied from "
        "the teacher, 1e-3 for a randomly initialized one)",
    )
    arg("--temperature", type=float, default=2.0)
    arg("--alpha", type=float, default=0.5, help="weight of the hard-label loss")
    arg("--hidden-state-weight", type=float, default=1.0)
    arg("--attention-weight", type=float, default=1.0)
    arg("--embedding-weight", type=float, default=1.0)
    arg("--layer-map", default="uniform", choices=["uniform", "last"])
    arg("--sequence-length", type=int, default=64)
    arg("--batch-size", type=int, default=32)
    arg("--latency-runs", type=int, default=7, help="timed runs per latency figure (median)")
    arg("--jit-compile", default="auto", choices=["auto", "true", "false"], help="XLA for train and predict steps")
    arg("--output", default="runs/distill", help="where the presets (and SavedModel) go")
    arg("--seed", type=int, default=0)
    return parser.parse_args(argv)


def check_settings(args):
    """Raises a ValueError naming the first bad setting, before any work: a
    value that would fail (or be silently replaced) only after the teacher's
    fine-tuning."""
    for name in ("batch_size", "latency_runs", "sequence_length"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("epochs", "teacher_epochs", "student_layers"):  # None: the default.
        if getattr(args, name) is not None:
            check_positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("train_size", "test_size"):  # 0: all of the split.
        if getattr(args, name) is not None:
            check_non_negative_int(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("learning_rate", "teacher_learning_rate"):
        if getattr(args, name) is not None:
            check_positive_number(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.student is not None and args.student_layers is not None:
        raise ValueError(
            "--student-layers builds the student from the teacher's layers, --student names another model: "
            "give one of them."
        )
    check_loss_settings(
        temperature=args.temperature,
        alpha=args.alpha,
        hidden_state_weight=args.hidden_state_weight,
        attention_weight=args.attention_weight,
        embedding_weight=args.embedding_weight,
    )
    # A mistyped preset fails now, not after the teacher's fine-tuning (minutes of work lost).
    for spec in (args.teacher, args.student):
        if spec is not None:
            bertzoo.Preset.resolve(spec)
    layers, longest = teacher_shape(args)
    if args.student_layers is not None and args.student_layers > layers:
        raise ValueError(
            f"--student-layers {args.student_layers} is more than the teacher's {layers} layers: a student copied "
            "from the teacher has at most as many."
        )
    if args.sequence_length < 3:
        raise ValueError(f"--sequence-length must be at least 3 ([CLS], a token, [SEP]), got {args.sequence_length}.")
    if longest is not None and args.sequence_length > longest:
        raise ValueError(
            f"--sequence-length {args.sequence_length} is longer than the teacher's {longest} positions; use at "
            f"most {longest}."
        )
    if args.student is not None:
        student = bertzoo.Preset.resolve(args.student)
        if student.has_weights() and not student.tokenizes_text:
            raise ValueError(
                f"--student {args.student} is a pretrained preset saved without a tokenizer, so it cannot read the "
                "texts: save it with its vocabulary (save_to_preset(..., tokenizer=...)), or pass a built-in "
                "preset name for a randomly initialized student."
            )
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} exists and is not a directory; choose another path.")
    for name in ("teacher", "student"):  # A file there, or a folder that is not a preset: no save could replace it.
        check_preset_target(output / name)


def teacher_shape(args):
    """`(layers, max_sequence_length)` of the teacher `build_teacher` will
    use, read from its config (nothing is built)."""
    if args.teacher is None and find_minilm() is not None:
        config = json.loads((find_minilm() / "config.json").read_text())
        return config["num_hidden_layers"], config.get("max_position_embeddings")
    config = bertzoo.Preset.resolve(args.teacher or "mini").backbone_config
    return config["num_layers"], config.get("max_sequence_length")


def settings(**overrides):
    """The example's settings: the command line's defaults, with `overrides`
    (keyword names are the flags with underscores, e.g. `train_size=0`)."""
    args = parse_args([])
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"Unknown setting(s) {unknown}; known: {sorted(vars(args))}.")
    vars(args).update(overrides)
    return args


# --- Data -------------------------------------------------------------------
def load_data(args):
    rng = np.random.default_rng(args.seed)
    asked = args.data == "synthetic"
    path = None if asked else (args.data or find_shared_sentiment("amazon"))
    if path:
        texts, labels = load_rated_sentences(path)
        source = f"{path} ({len(texts)} human-rated sentences, neutral dropped)"
    else:
        texts, labels = synthetic_sentiment(2000, seed=args.seed)
        why = "as asked" if asked else "no data file found"
        source = f"generated sentiment sentences (bertzoo.datasets.synthetic_sentiment; {why})"
    (train_x, train_y), (test_x, test_y) = split(texts, labels, test_fraction=0.2, seed=args.seed)
    full_train, full_test = len(train_x), len(test_x)

    def subsample(x, y, size):
        if not size or size >= len(x):
            return x, y
        keep = np.sort(rng.choice(len(x), size, replace=False))
        return [x[i] for i in keep], y[keep]

    train_size = args.train_size if args.train_size is not None else (600 if path else 0)
    train_x, train_y = subsample(train_x, train_y, train_size)
    test_x, test_y = subsample(test_x, test_y, args.test_size)
    source += (
        f"; seeded split (seed {args.seed}): {len(train_x)} of {full_train} train, "
        f"{len(test_x)} of {full_test} test sentences"
    )
    return (train_x, train_y), (test_x, test_y), source


# --- Models -----------------------------------------------------------------
def _jit(args):
    return {"auto": "auto", "true": True, "false": False}[args.jit_compile]


def build_teacher(args, train, output):
    """The teacher classifier and a sentence saying where it came from."""
    spec = args.teacher
    if spec is None:
        minilm = find_minilm()
        if minilm is not None:
            spec = output / "minilm"
            if not (spec / "config.json").is_file():
                print(f"Converting {minilm} -> {spec}")
                bertzoo.convert_checkpoint(minilm, spec, overwrite=True)
            origin = f"all-MiniLM-L6-v2 ({minilm}, converted)"
        else:
            spec, origin = "mini", "built-in 'mini' preset, randomly initialized (no MiniLM checkpoint found)"
    else:
        origin = str(spec)
    preset = bertzoo.Preset.resolve(spec)
    if preset.class_name == "BertClassifier" and preset.has_task_weights():
        teacher = bertzoo.BertClassifier.from_preset(spec, sequence_length=args.sequence_length)
        return teacher, f"{origin}: a fine-tuned classifier, used as is", preset.has_weights()
    pretrained = preset.has_weights()
    teacher = bertzoo.BertClassifier.from_preset(
        spec,
        num_classes=2,
        sequence_length=args.sequence_length,
        class_names=CLASS_NAMES,
        load_weights=pretrained,
    )
    epochs = args.teacher_epochs if args.teacher_epochs is not None else (2 if pretrained else 4)
    rate = args.teacher_learning_rate or (1e-4 if pretrained else 1e-3)
    teacher.compile(optimizer=bert_optimizer(rate), jit_compile=_jit(args))
    print(f"Fine-tuning the teacher ({origin}) for {epochs} epoch(s), peak learning rate {rate:g}")
    teacher.fit(*train, epochs=epochs, batch_size=args.batch_size)
    what = "fine-tuned" if pretrained else "trained from scratch"
    return teacher, f"{origin}, {what} for {epochs} epoch(s)", pretrained


def build_student(args, teacher, teacher_pretrained):
    """The student classifier, whether it starts from teacher layers, and where it came from."""
    layers = args.student_layers
    if args.student is None and (layers or teacher_pretrained):
        if layers and layers > teacher.backbone.num_layers:
            raise ValueError(
                f"--student-layers {layers} is more than the teacher's {teacher.backbone.num_layers} layers: a "
                "student copied from the teacher has at most as many."
            )
        layers = layers or max(1, teacher.backbone.num_layers // 3)
        k = teacher.backbone.num_layers // layers
        picked = (
            "every_k"
            if teacher.backbone.num_layers % layers == 0
            else [-(-i * teacher.backbone.num_layers // layers) for i in range(1, layers + 1)]
        )
        student = bertzoo.init_student_from_teacher(teacher, {"num_layers": layers}, layers=picked)
        copied = [k * i for i in range(1, layers + 1)] if picked == "every_k" else picked
        return student, True, f"{layers}-layer copy of the teacher (teacher layers {copied}, DistilBERT-style)"
    spec = args.student or "tiny"
    preset = bertzoo.Preset.resolve(spec)
    if preset.has_weights():
        student = bertzoo.BertClassifier.from_preset(
            spec, num_classes=2, sequence_length=args.sequence_length, class_names=CLASS_NAMES
        )
        return student, True, f"{spec} (pretrained preset)"
    # Random weights: any vocabulary will do, so take the teacher's tokenizer.
    backbone = preset.build_backbone(vocabulary_size=teacher.backbone.vocabulary_size)
    student = bertzoo.BertClassifier(
        backbone, num_classes=2, preprocessor=teacher.preprocessor, class_names=CLASS_NAMES
    )
    return student, False, f"built-in '{spec}' preset, randomly initialized (teacher's tokenizer)"


# --- Measurements -----------------------------------------------------------
def count_parameters(model):
    """(all parameters, parameters outside the token/position/segment tables)."""
    total = model.count_params()
    emb = model.backbone.embeddings
    tables = sum(
        int(np.prod(w.shape))
        for layer in (emb.token_embedding, emb.position_embedding, emb.segment_embedding)
        for w in layer.weights
    )
    return total, total - tables


def directory_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def latencies(models, features, runs):
    """Median seconds of one forward pass of each model on tokenized `features`.

    The runs are interleaved (each round times every model once), so a change
    in machine load affects all models alike and their ratio stays fair.
    """
    for model in models:  # Trace and compile, then one warm run.
        model.predict_on_batch(features)
        model.predict_on_batch(features)
    times = [[] for _ in models]
    for _ in range(runs):
        for model, samples in zip(models, times):
            start = time.perf_counter()
            model.predict_on_batch(features)
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def measure(models, test, preprocessor, batch_size, runs, timer=latencies):
    """Accuracy, predictions and latency (batch 1 and 32) of each classifier;
    `timer(models, features, runs)` gives the median seconds per model."""
    texts, labels = test
    results = []
    for model in models:
        predictions = np.argmax(model.predict(texts, batch_size=batch_size, verbose=0), axis=-1)
        results.append({"accuracy": float(np.mean(predictions == labels)), "predictions": predictions})
    for b in (1, 32):
        features = preprocessor([texts[i % len(texts)] for i in range(b)])
        for result, seconds in zip(results, timer(models, features, runs)):
            result[f"latency_b{b}_ms"] = 1000 * seconds
    return results


def export_student(student, directory):
    """A SavedModel of the student when `bertzoo.export_saved_model` exists."""
    export = getattr(bertzoo, "export_saved_model", None)
    if export is None:
        return "not available yet in this bertzoo (bertzoo.export_saved_model is missing)"
    if keras.backend.backend() != "tensorflow":
        return f"skipped: a SavedModel needs the TensorFlow backend (Keras runs on {keras.backend.backend()})"
    export(student, directory, overwrite=True)
    return str(directory)


def print_table(rows):
    columns = [
        ("", "name"),
        ("parameters", "parameters"),
        ("non-embedding", "non_embedding"),
        ("preset MB", "preset_mb"),
        ("latency b1 ms", "latency_b1_ms"),
        ("latency b32 ms", "latency_b32_ms"),
        ("accuracy", "accuracy"),
    ]

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if v < 1 else f"{v:.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[title for title, _ in columns]] + [[fmt(row[key]) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for n, line in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def run(**overrides):
    """Runs the example with `settings(**overrides)`; returns its figures:
    the data and model sources, `teacher` and `student` rows (parameters,
    preset size, latencies, accuracy), `agreement`, the ratios, and where the
    student was saved."""
    args = settings(**overrides)
    check_settings(args)
    return _run(args)


def main(argv=None):
    """The command line: `run` with the settings parsed from `argv`."""
    args = parse_args(argv)
    try:
        check_settings(args)
    except (ValueError, FileExistsError) as e:  # Bad settings: a message, as argparse gives.
        raise SystemExit(f"distill_to_small.py: error: {e}") from None
    return _run(args)


def _run(args):
    keras.utils.set_random_seed(args.seed)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    train, test, data_source = load_data(args)
    print(f"Data: {data_source}")
    teacher, teacher_source, teacher_pretrained = build_teacher(args, train, output)
    student, student_from_teacher, student_source = build_student(args, teacher, teacher_pretrained)
    print(f"Teacher: {teacher_source}\nStudent: {student_source}")

    distiller = bertzoo.Distiller(
        teacher,
        student,
        temperature=args.temperature,
        alpha=args.alpha,
        hidden_state_weight=args.hidden_state_weight,
        attention_weight=args.attention_weight,
        embedding_weight=args.embedding_weight,
        layer_map=args.layer_map,
    )
    rate = args.learning_rate or (2e-4 if student_from_teacher else 1e-3)
    epochs = args.epochs or (2 if student_from_teacher else 3)
    distiller.compile(optimizer=bert_optimizer(rate), jit_compile=_jit(args))
    print(
        f"Distilling for {epochs} epoch(s), peak learning rate {rate:g}, layer pairs "
        f"(student, teacher) {distiller.layer_pairs}"
    )
    distiller.fit(*train, epochs=epochs, batch_size=args.batch_size)

    teacher_dir, student_dir = output / "teacher", output / "student"
    models = {"teacher": (teacher, teacher_dir), "student": (student, student_dir)}
    for model, directory in models.values():
        # Both predict with the same settings. Compiling afresh also drops the
        # teacher's training optimizer, whose moments `save_to_preset` would
        # otherwise store in task.weights.h5 too (3x the size on disk).
        model.compile(jit_compile=_jit(args))
        model.save_to_preset(directory)
    figures = measure([teacher, student], test, distiller.preprocessor, args.batch_size, args.latency_runs)
    rows = []
    for (name, (model, directory)), measured in zip(models.items(), figures):
        total, non_embedding = count_parameters(model)
        rows.append(
            {
                "name": name,
                "parameters": total,
                "non_embedding": non_embedding,
                "preset_mb": directory_bytes(directory) / 1e6,
                **measured,
            }
        )
    exported = export_student(student, output / "student_savedmodel")
    agreement = float(np.mean(rows[0].pop("predictions") == rows[1].pop("predictions")))

    print(f"\nData: {data_source}")
    print(f"Teacher: {teacher_source}\nStudent: {student_source}")
    print_table(rows)
    t, s = rows
    summary = {
        "agreement": agreement,
        "accuracy_retained": s["accuracy"] / t["accuracy"] if t["accuracy"] else float("nan"),
        "size_ratio": t["parameters"] / s["parameters"],
        "non_embedding_ratio": t["non_embedding"] / s["non_embedding"],
        "speedup_b1": t["latency_b1_ms"] / s["latency_b1_ms"],
        "speedup_b32": t["latency_b32_ms"] / s["latency_b32_ms"],
    }
    print(
        f"Teacher-student agreement on the test set: {agreement:.3f}; the student keeps "
        f"{100 * summary['accuracy_retained']:.1f}% of the teacher's accuracy with "
        f"{summary['size_ratio']:.1f}x fewer parameters ({summary['non_embedding_ratio']:.1f}x fewer "
        f"non-embedding), {summary['speedup_b1']:.1f}x faster at batch 1 and "
        f"{summary['speedup_b32']:.1f}x at batch 32 (CPU, {os.cpu_count()} cores, median of "
        f"{args.latency_runs} runs, tokenization excluded, load average {os.getloadavg()[0]:.1f})."
    )
    print(f"Saved the student preset to {student_dir} (teacher: {teacher_dir}); SavedModel: {exported}")
    print(f"Total time {time.perf_counter() - started:.0f} s")
    return {
        "data": data_source,
        "teacher_source": teacher_source,
        "student_source": student_source,
        "teacher": t,
        "student": s,
        **summary,
        "student_preset": str(student_dir),
        "saved_model": exported,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
