"""The `bertzoo` command line (also `python -m bertzoo`).

    bertzoo convert SRC DEST [--overwrite]   checkpoint -> bertzoo preset
    bertzoo export PRESET_DIR OUT_DIR [--overwrite] [--format tf_saved_model|onnx|litert]
                   [--sequence-length N] [--jit-compile auto|true|false]
                                             preset -> SavedModel (or ONNX / LiteRT file) for serving
    bertzoo quantize PRESET_DIR OUT_DIR [--mode int8] [--weight-only]
                                             float preset -> quantized preset
    bertzoo sparsity PRESET_DIR              per-layer sparsity and compressed size
    bertzoo compress TEACHER --train F --eval F --out DIR [--stages distill,prune,int8]
                                             teacher -> compressed students + trade-off report
    bertzoo presets                          list the built-in presets

Each subcommand is a function decorated with `@command(...)` that receives
the parsed arguments and returns an exit status; its options are declared
with `argument(...)`.
"""

import argparse
import math
import os
import sys
from pathlib import Path

from bertzoo import export
from bertzoo.compression import compress
from bertzoo.compression import gzip_size
from bertzoo.compression import quantize
from bertzoo.compression import sparsity_report
from bertzoo.compression.calibration import calibration_sample
from bertzoo.compression.pipeline import DEFAULT_RECIPE
from bertzoo.compression.pipeline import DEFAULT_SPARSITY
from bertzoo.compression.pipeline import DEFAULT_STAGES
from bertzoo.compression.pipeline import STAGES
from bertzoo.compression.quantization import DEFAULT_SMOOTHING
from bertzoo.compression.quantization import INPUT_RANGES
from bertzoo.compression.recipes import RECIPES
from bertzoo.convert import convert_checkpoint
from bertzoo.datasets.files import load_texts
from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.models.listing import list_presets
from bertzoo.saving.atomic import occupied
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import check_preset_target
from bertzoo.saving.preset import save_preset
from bertzoo.utils.checks import BackendError
from bertzoo.version import __version__

_COMMANDS = []


def argument(*names, **kwargs):
    """An option of a subcommand, as for `ArgumentParser.add_argument`."""
    return names, kwargs


def _path(value):
    """A path argument, `~` expanded: also where the shell left it (quoted,
    or after `--out=`), so every check and write sees the same path."""
    return os.path.expanduser(value)


def _smoothing(value):
    """`--smoothing`: a number in [0, 1], or "none"."""
    if value.lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1] or 'none', got {value!r}") from None


def _finite(value):
    """A finite number (`float()` alone also takes "nan" and "inf")."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def command(name, help, arguments=()):
    """Registers the decorated `function(args) -> exit status` as a subcommand."""

    def register(function):
        _COMMANDS.append((name, help, arguments, function))
        return function

    return register


@command(
    "convert",
    "Convert a Hugging Face, original TF1 BERT/ALBERT or keras-hub checkpoint into a bertzoo preset.",
    arguments=(
        argument("source", type=_path, metavar="SRC", help="checkpoint directory"),
        argument("destination", type=_path, metavar="DEST", help="preset directory to write"),
        argument("--overwrite", action="store_true", help="replace DEST if it exists"),
    ),
)
def _convert(args):
    result = convert_checkpoint(args.source, args.destination, overwrite=args.overwrite)
    print(result.summary())
    return 0


@command(
    "export",
    "Export a task or backbone preset for serving: a TensorFlow SavedModel taking raw strings (where the "
    "preset has a vocabulary), or an ONNX / LiteRT file taking token ids.",
    arguments=(
        argument(
            "preset",
            type=_path,
            metavar="PRESET_DIR",
            help="task or backbone preset directory (from save_to_preset, or `bertzoo convert`)",
        ),
        argument(
            "output",
            type=_path,
            metavar="OUT_DIR",
            help="export directory, e.g. serving/sentiment/1 (a file for onnx/litert)",
        ),
        argument(
            "--format",
            default="tf_saved_model",
            choices=("tf_saved_model", "onnx", "litert"),
            help="export format (default: tf_saved_model)",
        ),
        argument(
            "--sequence-length",
            type=int,
            default=None,
            help="tf_saved_model: raw texts are packed to this many tokens (default: the preset's sequence_length; "
            "refused for a preset without a vocabulary, whose tokenized inputs take any length). onnx/litert: fixes "
            "the token axis to this length (default: any length up to the backbone's max_sequence_length)",
        ),
        argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists"),
        argument(
            "--jit-compile",
            default="auto",
            choices=("auto", "true", "false"),
            help="SavedModel: run the model as one XLA-compiled function (default auto: where bertzoo's "
            "fast-path measurement picks XLA for this model's predict on this machine, float or quantized)",
        ),
    ),
)
def _export(args):
    preset = Preset.resolve(args.preset)
    if preset.directory is None:
        raise ValueError(
            f"{args.preset!r} is a built-in preset definition without weights; export a preset "
            "directory (a fine-tuned task written by save_to_preset, or a converted checkpoint)."
        )
    extra = {}
    if args.format == "tf_saved_model":
        extra["jit_compile"] = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
    elif args.jit_compile != "auto":
        raise ValueError("--jit-compile applies to --format tf_saved_model only.")
    if preset.class_name == "BertBackbone":  # Serves features (sequence/pooled outputs).
        model = BertBackbone.from_preset(preset)
        if args.format == "tf_saved_model" and preset.tokenizes_text:
            extra["preprocessor"] = preset.build_preprocessor()
    else:
        model = preset.model_class().from_preset(preset)
    try:
        path = export.export_model(
            model,
            args.output,
            format=args.format,
            overwrite=args.overwrite,
            sequence_length=args.sequence_length,
            **extra,
        )
    except ImportError as e:  # e.g. ONNX without tf2onnx: a message, not a traceback.
        raise ValueError(str(e)) from e
    print(export.describe_export(path) if args.format == "tf_saved_model" else f"Wrote {path}")
    return 0


def _model_from_preset_directory(path):
    preset = Preset.resolve(path)
    if preset.directory is None:
        raise ValueError(f"{path!r} is a built-in preset definition without weights; pass a preset directory.")
    return preset.model_class().from_preset(preset), preset


@command(
    "quantize",
    "Quantize a preset's weights (post-training, int8 or int4) into a new preset.",
    arguments=(
        argument("preset", type=_path, metavar="PRESET_DIR", help="float task or backbone preset directory"),
        argument("output", type=_path, metavar="OUT_DIR", help="preset directory to write"),
        argument("--mode", default="int8", choices=("int8", "int4"), help="quantization mode (default: int8)"),
        argument("--keep-embeddings", action="store_true", help="leave the embedding tables in float"),
        argument(
            "--calibration",
            type=_path,
            metavar="FILE",
            default=None,
            help="int8: smooth the Dense inputs (SmoothQuant) calibrated on 512 texts of this TSV/CSV/JSONL "
            "file, a seeded sample as `compress` takes (a task preset with a vocabulary)",
        ),
        argument(
            "--text-column",
            default=argparse.SUPPRESS,  # Absent unless given: refused without --calibration.
            help="--calibration: the text column (default: text)",
        ),
        argument(
            "--smoothing",
            type=_smoothing,
            default=argparse.SUPPRESS,  # Absent unless given, as in compress.
            help=f"--calibration: SmoothQuant migration strength in [0, 1] (default: {DEFAULT_SMOOTHING}); "
            "'none': plain int8, without --calibration",
        ),
        argument(
            "--input-ranges",
            choices=INPUT_RANGES,
            default=None,
            help="--calibration: 'dynamic' measures each Dense layer's inputs on every call, 'static' fixes "
            "their int8 range from the calibration texts (default: dynamic)",
        ),
        argument(
            "--weight-only",
            action="store_true",
            help="int8: quantize the kernels only, the Dense inputs stay float (float arithmetic, e.g. for GPUs; "
            "not with --calibration, --smoothing or --input-ranges)",
        ),
        argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists"),
    ),
)
def _quantize(args):
    calibrated = args.calibration is not None
    smoothing_given = hasattr(args, "smoothing")
    smoothing = getattr(args, "smoothing", DEFAULT_SMOOTHING)
    text_column_given = hasattr(args, "text_column")
    # The options first, then the output path: refusals before the preset is read or anything quantized.
    if args.weight_only and (calibrated or smoothing_given or args.input_ranges is not None or text_column_given):
        raise ValueError(
            "--weight-only quantizes no inputs, so --calibration, --smoothing and --input-ranges do not apply "
            "(nor --text-column, the calibration file's column): drop them, or drop --weight-only to quantize the "
            "inputs with them."
        )
    if smoothing is None and calibrated:
        raise ValueError(
            "--smoothing none quantizes without calibration, and --calibration calibrates the smoothing: drop "
            "one of them (plain int8: drop --calibration; smoothed int8: a number such as --smoothing 0.8)."
        )
    if smoothing is not None and smoothing_given and not calibrated:
        raise ValueError("--smoothing sets how --calibration smooths the inputs: pass --calibration FILE too.")
    if args.input_ranges is not None and not calibrated:
        raise ValueError("--input-ranges sets how --calibration quantizes the inputs: pass --calibration FILE too.")
    if text_column_given and not calibrated:
        raise ValueError(
            "--text-column names the text column of the --calibration file: pass --calibration FILE too, or drop "
            "--text-column."
        )
    check_preset_target(args.output)  # A file, a link, a directory that is not a preset: no save could replace it.
    if occupied(args.output) and not args.overwrite:
        raise ValueError(f"{args.output} already exists. Pass --overwrite to replace it, or choose a new path.")
    model, preset = _model_from_preset_directory(args.preset)
    calibration = None
    if calibrated:
        if preset.class_name == "BertBackbone":
            raise ValueError(
                f"--calibration needs a task preset (it runs the texts through the task's preprocessor); "
                f"{args.preset} is a backbone preset. Quantize the fine-tuned task preset, or drop --calibration."
            )
        if getattr(model, "preprocessor", None) is None:
            raise ValueError(
                f"--calibration needs a task preset with a vocabulary (it tokenizes the texts); {args.preset} has none."
            )
        calibration = calibration_sample(load_texts(args.calibration, getattr(args, "text_column", "text")))
    quantized = quantize(
        model,
        args.mode,
        include_embeddings=not args.keep_embeddings,
        calibration=calibration,
        smoothing=DEFAULT_SMOOTHING if smoothing is None else smoothing,
        input_ranges=args.input_ranges or "dynamic",
        weight_only=args.weight_only,
        calibration_steps=None,  # The whole sample.
    )
    before = gzip_size(args.preset, recursive=False)  # Before an --overwrite of the same directory.
    # As save_to_preset, with the save refusing, at the swap, a directory that appeared during the quantization.
    if preset.class_name == "BertBackbone":
        preprocessor = preset.build_preprocessor() if preset.has_tokenizer_files else None
        save_preset(args.output, quantized, preprocessor=preprocessor, overwrite=args.overwrite)
    else:
        save_preset(args.output, quantized.backbone, task=quantized, overwrite=args.overwrite)
    after = gzip_size(args.output, recursive=False)
    mode = f"{args.mode}, weight-only" if args.weight_only else args.mode
    print(f"Wrote {args.output} ({mode}): {after / 1e6:.1f} MB gzipped, was {before / 1e6:.1f} MB")
    return 0


@command(
    "sparsity",
    "Print a preset's per-layer sparsity and its weights' size, raw and gzip-compressed.",
    arguments=(argument("preset", type=_path, metavar="PRESET_DIR", help="task or backbone preset directory"),),
)
def _sparsity(args):
    model, _ = _model_from_preset_directory(args.preset)
    print(sparsity_report(model))
    return 0


@command(
    "compress",
    "Compress a fine-tuned classifier stage by stage (distill, prune, int8); save each stage's preset and "
    "SavedModel and write a trade-off report (report.md, report.json, tradeoff.png).",
    arguments=(
        argument(
            "teacher",
            type=_path,
            metavar="TEACHER_PRESET",
            help="fine-tuned classifier preset directory, or a backbone preset (a converted checkpoint: it gets a "
            "new head, fine-tuned here for --teacher-epochs)",
        ),
        argument("--train", type=_path, required=True, help="training file: .tsv, .csv or .jsonl with a header"),
        argument("--eval", type=_path, required=True, help="evaluation file, same layout"),
        argument("--out", type=_path, required=True, metavar="DIR", help="output directory (new or empty)"),
        argument(
            "--stages",
            default=",".join(DEFAULT_STAGES),
            help=f"comma-separated stages in order, from {','.join(STAGES)} (default: %(default)s)",
        ),
        argument(
            "--target-speedup",
            type=_finite,
            default=None,
            help="distilled student keeps 1/X of the teacher's layers (default: every 3rd layer); without a "
            "distill stage, prune_structured keeps 1/X of the heads and neurons (default: half)",
        ),
        argument("--text-column", default="text", help="text column name (default: %(default)s)"),
        argument("--label-column", default="label", help="label column name (default: %(default)s)"),
        argument("--epochs", type=int, default=1, help="training epochs per stage (default: %(default)s)"),
        argument(
            "--teacher-epochs",
            type=int,
            default=None,
            help="a backbone teacher's new head: fine-tuning epochs (default: --epochs)",
        ),
        argument("--batch-size", type=int, default=32, help="training batch size (default: %(default)s)"),
        argument(
            "--sparsity",
            type=float,
            default=argparse.SUPPRESS,  # Absent unless given: refused without a prune stage.
            help=f"final sparsity of the prune stage (default: {DEFAULT_SPARSITY})",
        ),
        argument(
            "--heads-to-keep",
            type=int,
            default=None,
            help="prune_structured: attention heads kept per layer (default: half, or 1/--target-speedup)",
        ),
        argument(
            "--ffn-keep-ratio",
            type=float,
            default=None,
            help="prune_structured: fraction of feed-forward neurons kept (default: as --heads-to-keep)",
        ),
        argument("--sequence-length", type=int, default=None, help="tokens per text (default: the teacher's)"),
        argument(
            "--recipe",
            default=argparse.SUPPRESS,  # Absent unless given: refused without a distill stage.
            choices=[*sorted(RECIPES), "none"],
            help=f"distill stage: tinybert, minilm, hinton, or none for one Distiller (default: {DEFAULT_RECIPE})",
        ),
        argument(
            "--transfer",
            type=_path,
            default=None,
            help="file of unlabelled texts for the distill (with a recipe, not 'none') and prune stages",
        ),
        argument(
            "--transfer-column",
            default=None,
            help="text column of the --transfer file (default: --text-column)",
        ),
        argument(
            "--augment",
            type=int,
            default=0,
            help="perturbed copies of each training text added to the transfer texts of the distill (with a "
            "recipe) and prune stages (default: %(default)s)",
        ),
        argument(
            "--label-threshold",
            type=_finite,
            default=None,
            help="numeric labels become 1 above / 0 below this value; rows at it are dropped",
        ),
        argument(
            "--qat-epochs",
            type=int,
            default=argparse.SUPPRESS,  # Absent unless given: refused without an int8 stage.
            help="int8 stage: epochs of quantization-aware training first (default: 0, post-training)",
        ),
        argument(
            "--smoothing",
            type=_smoothing,
            default=argparse.SUPPRESS,  # Absent unless given: compress refuses it where it does nothing.
            help="post-training int8: SmoothQuant migration strength in [0, 1] for the Dense inputs, "
            "calibrated on the training texts, or 'none'; refused with --qat-epochs or --weight-only or "
            f"without an int8 stage (default: {DEFAULT_SMOOTHING} where it applies)",
        ),
        argument(
            "--input-ranges",
            choices=INPUT_RANGES,
            default="dynamic",
            help="post-training int8 with --smoothing: 'dynamic' measures each Dense layer's inputs on every "
            "call, 'static' fixes their int8 range from the same calibration texts (default: %(default)s)",
        ),
        argument(
            "--weight-only",
            action="store_true",
            help="int8 stage: int8 kernels with float inputs and arithmetic (post-training; not with "
            "--qat-epochs, --smoothing or --input-ranges static). Smaller than the float model but slower on "
            "CPUs; on GPUs load the stage's preset with dtype='bfloat16' for bfloat16 arithmetic",
        ),
        argument("--overwrite", action="store_true", help="replace a previous run's outputs in DIR"),
    ),
)
def _compress(args):
    compress(
        args.teacher,
        args.train,
        args.eval,
        args.out,
        stages=args.stages,
        target_speedup=args.target_speedup,
        text_column=args.text_column,
        label_column=args.label_column,
        epochs=args.epochs,
        teacher_epochs=args.teacher_epochs,
        batch_size=args.batch_size,
        sparsity=getattr(args, "sparsity", "auto"),
        heads_to_keep=args.heads_to_keep,
        ffn_keep_ratio=args.ffn_keep_ratio,
        sequence_length=args.sequence_length,
        recipe=None if getattr(args, "recipe", "auto") == "none" else getattr(args, "recipe", "auto"),
        transfer=args.transfer,
        transfer_column=args.transfer_column,
        augment=args.augment,
        label_threshold=args.label_threshold,
        qat_epochs=getattr(args, "qat_epochs", "auto"),
        smoothing=getattr(args, "smoothing", "auto"),
        input_ranges=args.input_ranges,
        weight_only=args.weight_only,
        overwrite=args.overwrite,
        verbose=1,
    )
    print((Path(args.out) / "report.md").read_text(), end="")
    return 0


@command("presets", "List the built-in presets with their sizes.")
def _presets(args):
    list_presets(verbose=True)
    return 0


def build_parser():
    # No abbreviations: `--teacher` would otherwise be taken for `--teacher-epochs`.
    parser = argparse.ArgumentParser(
        prog="bertzoo", description="bertzoo: BERT-family encoders for Keras 3.", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"bertzoo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help, arguments, function in _COMMANDS:
        sub = subparsers.add_parser(name, help=help, description=help, allow_abbrev=False)
        for names, kwargs in arguments:
            sub.add_argument(*names, **kwargs)
        sub.set_defaults(run=function)
    return parser


def main(argv=None):
    """Entry point of the `bertzoo` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, OSError, BackendError) as e:  # Bad input or setup (a backend): a message, not a traceback.
        print(f"bertzoo {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: outputs are written to temporary names first, so none is half-written.
        print(f"bertzoo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
