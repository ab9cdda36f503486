"""One command from teacher to served student: `bertzoo.compress`.

`compress` runs compression stages in order, each on the previous stage's
model, with the library's own building blocks:

- `"distill"`: a shallower student initialised from evenly spaced teacher
  layers (`init_student_from_teacher`), trained by a `Distiller`;
- `"prune"`: gradual unstructured pruning by second-order scores (`Pruner`
  with `scores=PRUNING_SCORES`; `ramp_schedule`: a cubic ramp over the first
  2/3 of the steps) while distilling
  from the stage's dense input (on the training plus transfer texts when
  there are transfer texts or `augment` copies) at a peak learning rate of
  `PRUNING_LEARNING_RATE`, then `strip()`;
- `"prune_structured"`: attention heads and feed-forward neurons removed
  (`prune_heads_and_neurons`), then a short distillation from the stage's
  input to recover (on the transfer set when there is one: transfer texts
  or `augment` copies);
- `"int8"`: post-training quantization (`quantize(model, "int8")`), or
  with `qat_epochs` quantization-aware training from the stage's input
  (`quantization_aware_training`), or with `weight_only` int8 kernels under
  float arithmetic (`quantize(model, "int8", weight_only=True)`).

Each stage writes `OUT/<index>_<stage>/preset` (a preset) and
`OUT/<index>_<stage>/saved_model` (a SavedModel for serving); a stage's
directory appears whole or not at all (`atomic_directory`). A teacher that
is not a classifier preset (a backbone preset, given a new head and
fine-tuned first, or a model) is saved as `OUT/0_teacher/preset`. At the end
`OUT/report.md`, `OUT/report.json` and `OUT/tradeoff.png` compare the teacher
and every stage: accuracy on the evaluation file, % of the teacher's
accuracy, parameters, preset size, and the median latency of
`predict_on_batch` on tokenized batches of 1 and 32 on this machine.
"""

import io
import json
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path

import keras
import numpy as np

from bertzoo.compression.calibration import calibration_sample
from bertzoo.compression.distiller import Distiller
from bertzoo.compression.layer_maps import layer_map_pairs
from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.pruner import Pruner
from bertzoo.compression.quantization import DEFAULT_SMOOTHING
from bertzoo.compression.quantization import check_input_ranges
from bertzoo.compression.quantization import check_smoothing
from bertzoo.compression.quantization import check_weight_only
from bertzoo.compression.quantization import quantization_aware_training
from bertzoo.compression.quantization import quantize
from bertzoo.compression.recipes import RECIPES
from bertzoo.compression.recipes import as_texts
from bertzoo.compression.recipes import distill
from bertzoo.compression.recipes import transfer_pool
from bertzoo.compression.report import gzip_size
from bertzoo.compression.report import sparsity_report
from bertzoo.compression.schedules import check_sparsity
from bertzoo.compression.schedules import ramp_schedule
from bertzoo.compression.structured import check_structured_settings
from bertzoo.compression.structured import heads_per_layer
from bertzoo.compression.structured import prune_heads_and_neurons
from bertzoo.compression.student_init import init_student_from_teacher
from bertzoo.datasets.files import label_ids
from bertzoo.datasets.files import load_labelled_texts
from bertzoo.datasets.files import load_texts
from bertzoo.datasets.files import threshold_labels
from bertzoo.models.bert_classifier import BertClassifier
from bertzoo.models.optimizers import bert_optimizer
from bertzoo.saving.atomic import atomic_directory
from bertzoo.saving.atomic import clean_leftovers
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import enclosing_preset
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import BackendError
from bertzoo.utils.checks import check_positive_int

logger = logging.getLogger("bertzoo")
STAGES = ("distill", "prune", "prune_structured", "int8")
# The prune stage's peak learning rate: 90% sparse, a model must move its
# remaining weights far. In the compression benchmark 3e-4 kept 4 points
# more than 1e-4 on one sentiment file and as much on the other two
# (fine-tuning uses 5e-5).
PRUNING_LEARNING_RATE = 3e-4
# The prune stage's scores: Optimal Brain Damage's saliency from Adam's
# squared-gradient mean. At 90% sparsity in the compression benchmark
# (mean of 3 seeds, same teachers, same 3e-4 schedule) it kept 98.3 / 98.2 /
# 97.8% of the teacher on the three sentiment files, where magnitude kept
# 95.3 / 96.1 / 95.9%.
PRUNING_SCORES = "fisher"
DEFAULT_STAGES = ("distill", "prune", "int8")
DEFAULT_SPARSITY = 0.9
DEFAULT_RECIPE = "tinybert"
REPORT_KEYS = (
    "stage",
    "path",
    "accuracy",
    "percent_of_teacher",
    "parameters",
    "nonzero_parameters",
    "preset_mb",
    "preset_gzip_mb",
    "latency_b1_ms",
    "latency_b32_ms",
    "speedup_b32",
)
_STAGE_DIR = re.compile(rf"^\d+_(teacher|{'|'.join(STAGES)})$")
_OUTPUT_FILES = ("report.md", "report.json", "tradeoff.png")
_STAGE_LEFTOVER = re.compile(rf"^\.(\d+_(?:teacher|{'|'.join(STAGES)}))\.(?:tmp|old)-")


def parse_stages(stages):
    """A tuple of stage names from a list or a comma-separated string; an
    unknown name is a `ValueError` listing the known ones."""
    if isinstance(stages, str):
        stages = [s.strip() for s in stages.split(",") if s.strip()]
    stages = tuple(stages)
    if not stages:
        raise ValueError(f"No stages given; choose from {list(STAGES)}.")
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"Unknown stage {stage!r}; choose from {list(STAGES)} (comma-separated, in order).")
    repeated = sorted({stage for stage in stages if stages.count(stage) > 1})
    if repeated:
        raise ValueError(
            f"Stage(s) {repeated} appear more than once in {list(stages)}; give each stage once (to prune "
            "further, raise the sparsity or run compress again on this run's preset)."
        )
    if "int8" in stages and stages.index("int8") != len(stages) - 1:
        raise ValueError("'int8' must be the last stage: a quantized model cannot be distilled or pruned further.")
    return stages


def student_layers(teacher_layers, target_speedup=None):
    """Teacher layers (from 1) a distilled student copies: every 3rd by
    default, or `teacher_layers / target_speedup` evenly spaced ones; the
    layers the `"uniform"` layer map then distills each student layer from,
    so each starts from the layer it learns to imitate.

    Example:
    ```python
    student_layers(12, target_speedup=2.4)  # [3, 5, 8, 10, 12]
    ```
    """
    if target_speedup is None:
        count = max(1, teacher_layers // 3)
    else:
        check_target_speedup(target_speedup)
        count = max(1, int(math.floor(teacher_layers / target_speedup)))
    count = min(count, teacher_layers)
    return [teacher for _, teacher in layer_map_pairs("uniform", count, teacher_layers)]


def check_target_speedup(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        raise ValueError(f"`target_speedup` (CLI: --target-speedup) must be a finite number >= 1, got {value!r}.")
    return float(value)


def _check_output(out, overwrite, inputs=()):
    """`out`, created, after removing a previous run's outputs (`overwrite`).
    `inputs` (the teacher preset, data files) must not lie inside what would
    be removed: a run that reuses a previous run's preset as its teacher
    would delete it before reading it."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory; choose another --out.")
    outer = enclosing_preset(out, include_self=True)
    if outer is not None:  # Each stage's preset would be saved inside it, once trained.
        raise FileExistsError(f"--out {out} lies inside the preset {outer}: choose a directory outside it.")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{out} already exists and is not empty. Pass --overwrite (Python: overwrite=True) to "
                "replace a previous run's outputs, or choose a new directory."
            )
        # Half-written stages of a killed run (hidden, of processes that are gone) go too.
        for name in {m.group(1) for m in map(_STAGE_LEFTOVER.match, (e.name for e in out.iterdir())) if m}:
            clean_leftovers(out / name)
        # Only a previous run's outputs go; anything else the user put there stays.
        doomed = [
            entry
            for entry in out.iterdir()
            if (entry.is_dir() and not entry.is_symlink() and _STAGE_DIR.match(entry.name))
            or entry.name in _OUTPUT_FILES
        ]
        for path in inputs:
            resolved = Path(path).expanduser().resolve()
            for entry in doomed:
                if resolved.is_relative_to(entry.resolve()):
                    raise ValueError(
                        f"{path} lies inside {entry}, which --overwrite (overwrite=True) would remove before "
                        f"this run reads it. Copy it out of {out} first, or choose another --out."
                    )
        for entry in doomed:
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_file(path, data):
    """Writes `path` whole or not at all (a temporary file, then `os.replace`)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def _load_teacher(teacher, classes, sequence_length):
    """`(model, source directory or None, needs fine-tuning)`."""
    num_classes = len(classes)
    new_head = False
    if isinstance(teacher, keras.Model):
        if not isinstance(teacher, BertClassifier):
            raise ValueError(f"The teacher must be a bertzoo.BertClassifier, got {type(teacher).__name__}.")
        model, directory = teacher, None
    else:
        preset = Preset.resolve(teacher)
        if preset.directory is None:
            raise ValueError(
                f"{teacher!r} is a built-in preset definition without weights; pass a preset directory "
                "(a fine-tuned classifier written by save_to_preset, or a converted checkpoint)."
            )
        kwargs = {"sequence_length": sequence_length} if sequence_length is not None else {}
        new_head = preset.model_class() is not BertClassifier
        if new_head:  # A backbone (e.g. a converted checkpoint): a new head, fine-tuned here.
            kwargs.update(num_classes=num_classes, class_names=[str(c) for c in classes])
        model = BertClassifier.from_preset(preset, **kwargs)
        directory = None if new_head else preset.directory
    if quantization_mode(model) is not None:
        raise ValueError(
            f"The teacher is quantized ({quantization_mode(model)}): it cannot be distilled, pruned or quantized "
            "again. Pass the float model's preset (the stage before the int8 one)."
        )
    if model.preprocessor is None:
        raise ValueError(
            "The teacher needs a preprocessor (tokenizer) to read raw text, and this preset has none: pass a "
            "preset saved with its vocabulary (save_to_preset(..., tokenizer=...), or a converted checkpoint "
            "that had one)."
        )
    if new_head:
        return model, None, True
    named = _names_the_labels(model, classes)  # Checked name by name, once mapped.
    if model.num_classes != num_classes and not named:
        raise ValueError(
            f"The teacher classifies {model.num_classes} classes, but the training file has {num_classes}: "
            f"{classes[:20]}{' ...' if num_classes > 20 else ''}. Numeric ratings need a label threshold "
            "(--label-threshold / `label_threshold`) to become two classes."
        )
    return model, directory, False


def _names_the_labels(teacher, labels):
    """Whether the file's labels are names the teacher's `class_names` give
    ids to (a fine-tuned classifier saved with names)."""
    return teacher.class_names is not None and any(isinstance(label, str) for label in labels)


def _accuracy(model, texts, labels, batch_size):
    logits = model.predict(texts, batch_size=batch_size, verbose=0)
    return float(np.mean(np.argmax(np.asarray(logits), axis=-1) == np.asarray(labels)))


def _latency_ms(model, features, repeats):
    model.predict_on_batch(features)  # Traces and warms up.
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.predict_on_batch(features)
        times.append(time.perf_counter() - start)
    return 1000.0 * float(np.median(times))


def _batch(preprocessor, texts, size):
    chosen = [texts[i % len(texts)] for i in range(size)]
    return {k: np.asarray(v) for k, v in preprocessor(chosen).items()}


def _directory_mb(path):
    """The size of the files directly in `path` (a preset's own), in MB."""
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file()) / 1e6


def _measure(name, model, preset_dir, eval_data, batches, batch_size, repeats, parameters=None):
    """One report row. `parameters`: the model's weights counted as in the
    float model it was quantized from (its count, given), so a quantized
    stage's scale variables do not read as extra parameters."""
    # int8 kernels keep a pruned weight's zero (symmetric rounding), so their
    # zeros are counted too; int4 packs two weights a byte.
    report = sparsity_report(model) if quantization_mode(model) in (None, "int8") else None
    parameters = int(model.count_params() if parameters is None else parameters)
    nonzero = parameters - (int(sum(r["zeros"] for r in report.layers)) if report is not None else 0)
    return {
        "stage": name,
        "path": str(preset_dir) if preset_dir is not None else None,
        "accuracy": _accuracy(model, *eval_data, batch_size),
        "parameters": parameters,
        "nonzero_parameters": nonzero,
        "preset_mb": _directory_mb(preset_dir) if preset_dir is not None else None,
        "preset_gzip_mb": gzip_size(preset_dir, recursive=False) / 1e6 if preset_dir is not None else None,
        "latency_b1_ms": _latency_ms(model, batches[0], repeats),
        "latency_b32_ms": _latency_ms(model, batches[1], repeats),
    }


def _fit_distilling(teacher, student, train, epochs, batch_size, verbose, validation, distiller_options, pruner):
    distiller = Distiller(teacher, student, **distiller_options)
    if pruner is not None:
        distiller.compile()
        pruner.prepare_trainer(distiller)
    distiller.fit(*train, validation_data=validation, epochs=epochs, batch_size=batch_size, verbose=verbose)
    return student


def _steps(train, epochs, batch_size):
    return max(1, math.ceil(len(train[0]) / batch_size)) * epochs


def compress(
    teacher,
    train,
    eval,
    out,
    stages=DEFAULT_STAGES,
    target_speedup=None,
    text_column="text",
    label_column="label",
    epochs=1,
    teacher_epochs=None,
    batch_size=32,
    sparsity="auto",
    heads_to_keep=None,
    ffn_keep_ratio=None,
    sequence_length=None,
    distiller_options=None,
    recipe="auto",
    transfer=None,
    transfer_column=None,
    augment=0,
    label_threshold=None,
    qat_epochs="auto",
    smoothing="auto",
    input_ranges="dynamic",
    weight_only=False,
    latency_repeats=10,
    overwrite=False,
    verbose=1,
):
    """Compresses a classifier stage by stage and reports the trade-offs.

    Args:
        teacher: a fine-tuned `BertClassifier` preset directory (or the model
            itself). A backbone preset (e.g. a converted checkpoint) gets a
            new head, fine-tuned on `train` for `teacher_epochs` first.
        train, eval: TSV, CSV or JSONL files with a header (JSONL: keys)
            naming `text_column` and `label_column`. Labels may be ints or
            strings; class ids follow their sorted order (recorded as
            `classes` in `report.json`).
        out: output directory; must be new or empty unless `overwrite`
            (which removes a previous run's stage directories and reports).
        stages: names, in order, from `"distill"`, `"prune"`,
            `"prune_structured"`, `"int8"` (last), as a list or
            comma-separated string.
        target_speedup: the distilled student keeps `L / target_speedup`
            of the teacher's `L` layers, rounded down, at least one (a
            warning says when one is more; default: every 3rd layer). Without
            a distill stage, `"prune_structured"` keeps `1 / target_speedup`
            of the heads and neurons instead (default: half).
        epochs: training epochs of each trained stage (small by default;
            raise it for real runs).
        teacher_epochs: fine-tuning epochs of a new teacher head (default:
            `epochs`).
        sparsity: final encoder sparsity of `"prune"`; `"auto"`:
            `DEFAULT_SPARSITY` (0.9) there. Given without a `"prune"` stage,
            it is refused.
        heads_to_keep, ffn_keep_ratio: `"prune_structured"` settings (see
            `prune_heads_and_neurons`). Without `heads_to_keep`, half of each
            layer's heads (`1 / target_speedup` without a distill stage);
            without `ffn_keep_ratio`, each layer keeps the share of its
            neurons that it keeps of its heads. The report records both as
            used.
        distiller_options: keyword arguments for the `Distiller` of the
            `"prune"` stage (over `PREDICTIONS_ONLY` there: `Pruner.fit`'s
            default) and of the distill stage when `recipe` is None
            (`"prune_structured"` recovers with the `"hinton"` recipe when
            there are transfer texts or `augment` copies). On transfer texts there are no
            labels, so `alpha` has no effect there.
        recipe: how the distill stage trains: a `bertzoo.distill` recipe
            (`"tinybert"`: intermediate layers, then predictions; `"minilm"`;
            `"hinton"`), `epochs` epochs per stage; None: one `Distiller`
            with `distiller_options`; `"auto"`: `DEFAULT_RECIPE`
            (`"tinybert"`). Given without a distill stage, it is refused.
        transfer: unlabelled texts the teacher labels for the distill stage
            (a list, or a TSV/CSV/JSONL file with `transfer_column`), or None.
            The prune stages train on them too, with the training texts
            (soft targets of their input model): `"prune"` while its
            sparsity ramps up, `"prune_structured"` to recover (the
            `"hinton"` recipe).
        transfer_column: the text column of a `transfer` file (default:
            `text_column`).
        augment: perturbed copies of each training text (`augment_texts`)
            added to the transfer texts of the distill stage (with a
            `recipe`; None trains on the labelled texts alone) and of both
            prune stages; 0 adds none. Like transfer texts, the copies make
            those stages train on the teacher's soft targets alone.
        label_threshold: numeric labels (ratings) become binary: 1 above the
            threshold, 0 below, rows at it dropped; None keeps the labels.
        qat_epochs: 0, post-training int8; N > 0, the int8 stage first
            trains N epochs with int8 rounding simulated, distilling from
            its input (`quantization_aware_training`). "auto": 0 where
            there is an int8 stage; given without one (0 too), refused.
        smoothing: post-training int8 smooths the inputs of the Dense layers
            (SmoothQuant's migration strength; `quantize(...,
            calibration=...)`) calibrated on up to 512 training texts
            (a seeded sample); `"auto"` is 0.8 there and nothing where no
            inputs are smoothed (`qat_epochs`, `weight_only`: recorded as
            None); None quantizes without calibration. Any other value
            where no inputs are smoothed (no "int8" stage, `qat_epochs`,
            `weight_only`) is refused.
        input_ranges: post-training int8 with `smoothing`: `"dynamic"`
            (inputs measured on every call) or `"static"` (each layer's
            input range fixed from the same calibration texts; see
            `quantize`).
        weight_only: the int8 stage stores int8 kernels and keeps float
            inputs and arithmetic (`quantize(..., weight_only=True)`).
            Smaller than the float model, but slower on CPUs (every call
            dequantizes the kernels). For GPUs, where integer matmuls are
            slower than bfloat16, load the stage's preset with
            `dtype="bfloat16"` (its SavedModel computes in float32).
            Post-training only: not with `qat_epochs` or
            `input_ranges="static"`.
        verbose: Keras progress bars (0 silent, 1 bars, 2 one line per epoch).

    Returns the report: a dict with `rows` (the teacher, then one per stage,
    keys as in `REPORT_KEYS`), `classes` and the settings.

    Example:
    ```python
    report = bertzoo.compress("runs/teacher", "train.tsv", "test.tsv", "runs/compressed",
                              stages=("distill", "prune", "int8"), epochs=3)
    print(open("runs/compressed/report.md").read())
    ```
    """
    stages = parse_stages(stages)
    if keras.backend.backend() != "tensorflow":  # Before any training: each stage ends in a SavedModel.
        raise BackendError(
            f"compress saves a TensorFlow SavedModel of every stage, so it needs the TensorFlow backend (Keras "
            f"runs on {keras.backend.backend()!r}): run it with KERAS_BACKEND=tensorflow, or call bertzoo.distill, "
            "Pruner and quantize yourself on this backend."
        )
    # Every setting is checked before any work, and one whose stage is absent is refused, not ignored.
    if target_speedup is not None:
        check_target_speedup(target_speedup)
        if not {"distill", "prune_structured"} & set(stages):
            raise ValueError(
                "target_speedup (--target-speedup) sizes the distill stage's student, or without one the "
                f"prune_structured stage; stages {list(stages)} have neither. Leave it out, or add one of them."
            )
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("latency_repeats", latency_repeats)):
        check_positive_int(name, value)
    if teacher_epochs is not None:
        check_positive_int("teacher_epochs", teacher_epochs)
    if (heads_to_keep is not None or ffn_keep_ratio is not None) and "prune_structured" not in stages:
        raise ValueError(
            "heads_to_keep and ffn_keep_ratio set the prune_structured stage, which is not among the stages "
            f"{list(stages)}. Leave them out, or add that stage."
        )
    check_structured_settings(heads_to_keep, ffn_keep_ratio)
    if qat_epochs != "auto" and "int8" not in stages:  # Even 0, the default: given, it would be ignored.
        raise ValueError(
            f"qat_epochs={qat_epochs!r} (--qat-epochs) sets the int8 stage, which is not among the stages "
            f"{list(stages)}. Leave it out, or end the stages with int8."
        )
    qat_epochs = 0 if qat_epochs == "auto" else qat_epochs
    if isinstance(qat_epochs, bool) or not isinstance(qat_epochs, int) or qat_epochs < 0:
        raise ValueError(f"`qat_epochs` must be an integer >= 0 (0: post-training int8), got {qat_epochs!r}.")
    if smoothing != "auto":
        smoothing = check_smoothing(smoothing, allow_none=True)
    check_input_ranges(input_ranges)
    weight_only = check_weight_only(weight_only)
    if weight_only and ("int8" not in stages or qat_epochs or input_ranges == "static"):
        raise ValueError(
            'weight_only=True is post-training int8 of the kernels alone: it needs an "int8" stage, '
            '`qat_epochs` 0 and input_ranges="dynamic" (CLI: --stages ...,int8 --weight-only, without '
            "--qat-epochs or --input-ranges static)."
        )
    if input_ranges == "static" and (smoothing is None or qat_epochs or "int8" not in stages):
        raise ValueError(
            'input_ranges="static" is calibrated with the smoothing of post-training int8: it needs an "int8" '
            "stage, `smoothing` a number and `qat_epochs` 0 (CLI: --stages ...,int8, --smoothing 0.8, "
            '--qat-epochs 0), or use input_ranges="dynamic" (CLI: --input-ranges dynamic).'
        )
    if smoothing != "auto" and ("int8" not in stages or qat_epochs or weight_only):
        raise ValueError(
            f"smoothing={smoothing!r} does not apply: it sets how post-training int8 smooths the Dense layers' "
            'inputs, which needs an "int8" stage, `qat_epochs` 0 and `weight_only` False. Leave `smoothing` '
            "out (CLI: drop --smoothing), or change those."
        )
    if smoothing == "auto":
        smoothing = DEFAULT_SMOOTHING
    # Refused when given without their stage, even at the default value.
    if sparsity != "auto" and "prune" not in stages:
        raise ValueError(
            f"sparsity={sparsity} (--sparsity) sets the prune stage, which is not among the stages "
            f"{list(stages)}. Leave it out, or add that stage."
        )
    sparsity = DEFAULT_SPARSITY if sparsity == "auto" else sparsity
    check_sparsity("sparsity", sparsity)
    if recipe != "auto" and "distill" not in stages:
        raise ValueError(
            f"recipe={recipe!r} (--recipe) sets how the distill stage trains, which is not among the stages "
            f"{list(stages)}. Leave it out, or add that stage."
        )
    recipe = DEFAULT_RECIPE if recipe == "auto" else recipe
    if sequence_length is not None and (
        isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 3
    ):
        raise ValueError(
            "sequence_length (--sequence-length) must be an integer >= 3 (tokens per text, [CLS] and [SEP] "
            f"included), got {sequence_length!r}. Leave it out to keep the teacher's."
        )
    if isinstance(augment, bool) or not isinstance(augment, int) or augment < 0:
        raise ValueError(f"`augment` must be an integer >= 0 (perturbed copies of each text), got {augment!r}.")
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"Unknown recipe {recipe!r}. Choose one of {sorted(RECIPES)}, or None.")
    # The distill stage without a recipe trains on the labelled texts alone.
    uses_transfer_set = bool({"prune", "prune_structured"} & set(stages)) or (
        "distill" in stages and recipe is not None
    )
    if transfer_column is not None and not isinstance(transfer, (str, os.PathLike)):
        raise ValueError("transfer_column (--transfer-column) names a column of a transfer file; no file is given.")
    if (transfer is not None or augment) and not uses_transfer_set:
        raise ValueError(
            f"transfer texts and augment copies train the distill stage (with a recipe) and the prune stages; "
            f"stages {list(stages)}{' with recipe None' if 'distill' in stages else ''} use neither. Leave "
            "--transfer / --augment out, or add such a stage."
        )
    train_texts, train_raw = load_labelled_texts(train, text_column, label_column)
    eval_texts, eval_raw = load_labelled_texts(eval, text_column, label_column)
    if label_threshold is not None:
        rows = len(train_texts)
        train_texts, train_raw = threshold_labels(train_texts, train_raw, label_threshold, source=train)
        eval_texts, eval_raw = threshold_labels(eval_texts, eval_raw, label_threshold, source=eval)
        if len(set(train_raw)) < 2:
            raise ValueError(
                f"{train}: with the label threshold {label_threshold} the training labels have fewer than two "
                f"classes left ({rows - len(train_texts)} of {rows} rows rated exactly {label_threshold} were "
                "dropped). The threshold splits numeric ratings (e.g. 0 for ratings from -2 to 2); labels that "
                "are already classes (0/1, names) need none: leave out --label-threshold (`label_threshold=None`)."
            )
        label_threshold = float(label_threshold)
    if len(set(train_raw)) < 2:
        raise ValueError(
            f"{train}: every training row has the label {train_raw[0]!r} (column {label_column!r}); a classifier "
            "needs at least two classes. Check the label column, and that the file is not a slice of one "
            "sorted by label."
        )
    if not eval_texts:
        raise ValueError(
            f"{eval}: no rows left to evaluate on"
            + (
                f" with the label threshold {label_threshold} (rows rated exactly it are dropped)."
                if label_threshold is not None
                else "."
            )
        )
    transfer_file = transfer if isinstance(transfer, (str, os.PathLike)) else None
    if transfer_file is not None:
        transfer = load_texts(transfer, transfer_column or text_column, option="transfer")
    elif transfer is not None:
        transfer = as_texts(transfer, "transfer")  # Checked before any work.
    train_labels, classes = label_ids(train_raw)
    # The teacher is checked before `out` is touched: a refused run must not
    # have removed a previous run's outputs (`overwrite`) or left a directory.
    model, teacher_dir, fine_tune = _load_teacher(teacher, classes, sequence_length)
    if teacher_epochs is not None and not fine_tune:
        raise ValueError(
            "teacher_epochs (--teacher-epochs) fine-tunes the new head of a backbone teacher, but this teacher "
            "is a classifier, trained already. Leave it out."
        )
    if "prune_structured" in stages:  # Against the model the stage will get, before any training.
        _structured_settings(
            heads_to_keep,
            ffn_keep_ratio,
            _heads_entering_structured(model, stages, target_speedup),
            target_speedup,
            stages,
        )
    of = "the training classes"
    if _names_the_labels(model, train_raw):  # Its ids, not the file's sorted order.
        classes, of = list(model.class_names), "the teacher's class_names"
        train_labels, _ = label_ids(train_raw, classes, source=train, of=of)
    eval_labels, _ = label_ids(eval_raw, classes, source=eval, of=of)
    # A classifier teacher without names, trained on the file's named labels (ids in their sorted order):
    # the students take the names, so their presets and SavedModels serve them (`label_names`).
    student_names = None
    if model.class_names is None and any(isinstance(label, str) for label in train_raw):
        student_names = [str(c) for c in classes]
    train_data = (train_texts, np.asarray(train_labels, dtype="int32"))
    eval_data = (eval_texts, np.asarray(eval_labels, dtype="int32"))
    inputs = [p for p in (teacher, train, eval, transfer_file) if isinstance(p, (str, os.PathLike))]
    out = _check_output(out, overwrite, inputs=inputs)
    distiller_options = dict(distiller_options or {})

    def say(message):
        if verbose:
            print(message, flush=True)

    if fine_tune:
        say(f"Fine-tuning the teacher's new {len(classes)}-class head")
        model.fit(*train_data, epochs=teacher_epochs or epochs, batch_size=batch_size, verbose=verbose)
    if teacher_dir is None:  # Measured (and kept) like the stages.
        teacher_dir = out / "0_teacher" / "preset"
        with atomic_directory(out / "0_teacher") as tmp:
            model.save_to_preset(tmp / "preset")

    preprocessor = model.preprocessor
    batches = (_batch(preprocessor, eval_texts, 1), _batch(preprocessor, eval_texts, 32))
    say("Measuring the teacher")
    rows = [_measure("teacher", model, teacher_dir, eval_data, batches, batch_size, latency_repeats)]
    validation = eval_data if verbose else None

    def train_student(teacher, student, stage_recipe):
        """A `distill` recipe on the training plus transfer texts, or (None)
        one `Distiller` with `distiller_options` on the training texts.
        Returns the trained student; a pruned one (a stage after `prune`)
        keeps its zeros."""
        pruner = Pruner.holding_zeros(student)
        if stage_recipe is None:
            _fit_distilling(
                teacher, student, train_data, epochs, batch_size, verbose, validation, distiller_options, pruner
            )
        else:
            distill(
                teacher,
                student,
                *train_data,
                recipe=stage_recipe,
                transfer=transfer,
                augment=augment,
                epochs=epochs,
                batch_size=batch_size,
                validation_data=validation,
                verbose=verbose,
                pruner=pruner,
            )
        return student if pruner is None else pruner.strip()

    structured_settings = {"heads_to_keep": None, "ffn_keep_ratio": None}  # As used, once that stage runs.
    for index, stage in enumerate(stages, start=1):
        say(f"Stage {index}/{len(stages)}: {stage}")
        parent = model
        if stage == "distill":
            layers = student_layers(parent.backbone.num_layers, target_speedup)
            if target_speedup is not None and parent.backbone.num_layers / target_speedup < 1:
                logger.warning(
                    "target_speedup=%s asks for fewer than one of the model's %d layers: the student keeps 1 "
                    "layer, the fewest it can (about %dx by depth).",
                    target_speedup,
                    parent.backbone.num_layers,
                    parent.backbone.num_layers,
                )
            student = init_student_from_teacher(parent, {"num_layers": len(layers)}, layers=layers)
            model = train_student(parent, student, recipe)
        elif stage == "prune":
            student = copy_model(parent)
            # Soft targets of the dense input on the transfer set, when there is one.
            data = (transfer_pool(train_data[0], transfer, augment),) if transfer or augment else train_data
            student.compile(optimizer=bert_optimizer(PRUNING_LEARNING_RATE))
            schedule = ramp_schedule(_steps(data, epochs, batch_size), sparsity)
            pruner = Pruner(student, schedule, scores=PRUNING_SCORES)
            pruner.fit(
                *data,
                teacher=parent,
                distillation=distiller_options,
                validation_data=validation,
                epochs=epochs,
                batch_size=batch_size,
                verbose=verbose,
            )
            model = pruner.strip()
        elif stage == "prune_structured":
            heads, ratio = _structured_settings(
                heads_to_keep, ffn_keep_ratio, _per_layer(parent.backbone, "num_heads"), target_speedup, stages
            )
            structured_settings = {"heads_to_keep": _plain(heads, int), "ffn_keep_ratio": _plain(ratio, float)}
            student = prune_heads_and_neurons(parent, heads_to_keep=heads, ffn_keep_ratio=ratio, data=train_data)
            # The input's predictions on the transfer set recover far more than the labelled texts alone.
            model = train_student(parent, student, "hinton" if transfer or augment else None)
        elif qat_epochs:  # "int8", trained
            model = quantization_aware_training(
                parent,
                *train_data,
                epochs=qat_epochs,
                batch_size=batch_size,
                validation_data=validation,
                verbose=verbose,
            )
        elif weight_only:  # "int8", the kernels alone
            model = quantize(parent, "int8", weight_only=True)
        elif smoothing is None:  # "int8"
            model = quantize(parent, "int8")
        else:  # "int8", with the inputs smoothed
            calibration = calibration_sample(train_texts)
            model = quantize(
                parent,
                "int8",
                calibration=calibration,
                smoothing=smoothing,
                calibration_steps=None,
                input_ranges=input_ranges,
            )
        if student_names is not None and model.class_names is None:
            model.class_names = student_names
        stage_dir = out / f"{index}_{stage}"
        with atomic_directory(stage_dir) as tmp:
            model.save_to_preset(tmp / "preset")
            model.export(tmp / "saved_model", verbose=False)
        say(f"Measuring {stage}")
        # An int8 stage holds its input's weights (as int8) plus scales: counted as its input's.
        parameters = parent.count_params() if stage == "int8" else None
        rows.append(
            _measure(stage, model, stage_dir / "preset", eval_data, batches, batch_size, latency_repeats, parameters)
        )

    teacher_row = rows[0]
    for row in rows:
        row["percent_of_teacher"] = (
            100.0 * row["accuracy"] / teacher_row["accuracy"] if teacher_row["accuracy"] > 0 else None
        )
        row["speedup_b32"] = teacher_row["latency_b32_ms"] / row["latency_b32_ms"]
    report = {
        "teacher": str(teacher) if not isinstance(teacher, keras.Model) else None,
        "train": str(train),
        "eval": str(eval),
        "stages": list(stages),
        "classes": classes,
        "text_column": text_column,
        "label_column": label_column,
        "epochs": epochs,
        "teacher_epochs": (teacher_epochs or epochs) if fine_tune else None,
        "batch_size": batch_size,
        "sequence_length": int(preprocessor.sequence_length),
        "target_speedup": target_speedup,
        "recipe": recipe if "distill" in stages else None,
        "sparsity": sparsity if "prune" in stages else None,
        **structured_settings,
        "qat_epochs": qat_epochs if "int8" in stages else None,
        "weight_only": weight_only if "int8" in stages else None,
        "smoothing": smoothing if "int8" in stages and not qat_epochs and not weight_only else None,
        "input_ranges": (
            input_ranges if "int8" in stages and not (qat_epochs or weight_only) and smoothing is not None else None
        ),
        "transfer_size": len(transfer) if transfer is not None and uses_transfer_set else 0,
        "augment": augment if uses_transfer_set else 0,
        "label_threshold": label_threshold,
        "train_size": len(train_texts),
        "eval_size": len(eval_texts),
        "backend": keras.backend.backend(),
        "rows": [{key: row[key] for key in REPORT_KEYS} for row in rows],
    }
    _write_file(out / "report.json", json.dumps(report, indent=2) + "\n")
    _write_file(out / "report.md", format_report(report))
    chart = tradeoff_chart(report, out / "tradeoff.png")
    if chart is None:
        say("matplotlib is not installed: no tradeoff.png (pip install matplotlib)")
    say(f"Wrote {out}/report.md, report.json" + (", tradeoff.png" if chart else ""))
    return report


def _structured_settings(heads_to_keep, ffn_keep_ratio, num_heads, target_speedup, stages):
    """`(heads_to_keep, ffn_keep_ratio)` of the prune_structured stage for a
    model with `num_heads` heads per layer, one value per layer: what is
    left out comes from the other (the neurons keep the heads' share) or,
    with neither, from the default share (half; `1 / target_speedup`
    without a distill stage). A ValueError naming the option when the model
    cannot take them."""
    fraction = 0.5 if target_speedup is None or "distill" in stages else 1.0 / target_speedup
    if heads_to_keep is None:
        heads = [max(1, int(round(h * fraction))) for h in num_heads]
    else:
        try:
            heads = heads_per_layer(heads_to_keep, num_heads)
        except ValueError as e:
            message = str(e).rstrip(".")
            raise ValueError(
                f"{message} (--heads-to-keep: heads kept per layer by the prune_structured stage)."
            ) from None
    if ffn_keep_ratio is not None:
        ratio = ffn_keep_ratio
    elif heads_to_keep is None:
        ratio = fraction
    else:
        ratio = [keep / total for keep, total in zip(heads, num_heads)]
    return heads, ratio


def _heads_entering_structured(model, stages, target_speedup):
    """The heads per layer of the model the prune_structured stage gets
    from `model` (the teacher): a distill stage before it keeps every 3rd
    layer, or those `target_speedup` picks."""
    heads = _per_layer(model.backbone, "num_heads")
    if "distill" in stages[: list(stages).index("prune_structured")]:
        heads = [heads[layer - 1] for layer in student_layers(len(heads), target_speedup)]
    return heads


def _plain(value, kind):
    """A per-layer setting (one value or one per layer) as JSON-ready numbers."""
    if value is None:
        return None
    return [kind(v) for v in value] if isinstance(value, (list, tuple)) else kind(value)


def _per_layer(backbone, key):
    value = backbone.get_config()[key]
    return list(value) if isinstance(value, (list, tuple)) else [value] * backbone.num_layers


def stage_label(report, row):
    """A report row's name in the table and chart: its stage, and for a
    weight-only int8 stage "int8 (weight-only)" (slower than dynamic int8 on
    CPUs, so it must not pass for it)."""
    return "int8 (weight-only)" if row["stage"] == "int8" and report.get("weight_only") else row["stage"]


def format_report(report):
    """The trade-off table of a `compress` report, as Markdown."""

    def number(value, spec):
        return "-" if value is None else format(value, spec)

    lines = [
        "# Compression trade-offs",
        "",
        f"Teacher {report['teacher'] or '(in-memory model)'}; train {report['train']} "
        f"({report['train_size']} examples), eval {report['eval']} ({report['eval_size']} examples); "
        f"classes {report['classes']}; {report['epochs']} epoch(s) per stage. Latency: median of "
        "`predict_on_batch` on tokenized batches, this machine.",
        "",
        "| stage | accuracy | % of teacher | parameters | non-zero | preset MB | gzip MB "
        "| latency b1 (ms) | latency b32 (ms) | speedup b32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {stage_label(report, row)} | {row['accuracy']:.4f} | {number(row['percent_of_teacher'], '.1f')} "
            f"| {row['parameters']:,} | {row['nonzero_parameters']:,} | {number(row['preset_mb'], '.2f')} "
            f"| {number(row['preset_gzip_mb'], '.2f')} | {row['latency_b1_ms']:.2f} | {row['latency_b32_ms']:.2f} "
            f"| {row['speedup_b32']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def tradeoff_chart(report, path):
    """Accuracy against batch-32 latency, point area by preset size; writes
    a PNG atomically and returns its path (None without matplotlib)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None

    rows = report["rows"]
    sizes = [row["preset_mb"] or 0.0 for row in rows]
    largest = max(sizes) or 1.0
    # A Figure of its own, not pyplot's: the caller's backend and open figures (a notebook's) stay as they are.
    figure = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for row, size in zip(rows, sizes):
        axes.scatter(row["latency_b32_ms"], row["accuracy"], s=40 + 400 * size / largest, alpha=0.6)
        axes.annotate(
            f"{stage_label(report, row)} ({size:.1f} MB)", (row["latency_b32_ms"], row["accuracy"]), fontsize=8
        )
    axes.set_xlabel("latency, batch 32 (ms, median)")
    axes.set_ylabel("accuracy on eval")
    axes.set_title("bertzoo compress: accuracy vs latency (area: preset MB)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    _write_file(path, buffer.getvalue())
    return Path(path)
