"""ONNX and LiteRT export of the tokenized model (through Keras's exporters).

These formats cannot hold the tokenizer (its TF Text string ops have no
ONNX / LiteRT builtin equivalent), so the exported model takes
`token_ids`, `segment_ids`, `padding_mask` (int32, `[batch, length]`)
and returns the model's raw outputs (a classifier: logits). The batch size and
the length are free: one file serves any length up to the backbone's
`max_sequence_length` (or a fixed length chosen at export, see
`export_portable`). Tokenize with `bertzoo.text.BertPreprocessor` (or any
WordPiece tokenizer with the same vocabulary) on the client.

A dynamic length works because the model takes every length-dependent shape
from the tensors at run time (the attention's head split reshapes with
`ops.shape(x)`, position embeddings are sliced to the input's length, the
attention mask is expanded with `expand_dims`, which LiteRT has builtin
kernels for), and the exported input signature leaves the token axis `None`.

What converts: float32 models to both formats; Keras int8 and int4 models
(`model.quantize("int8")`) to ONNX. LiteRT files hold builtin ops only
(Keras's exporter would let TensorFlow "select" ops in, which a standard
LiteRT runtime refuses to run), unless the caller's `target_spec` names
its own `supported_ops`. Refused with an explanation:
mixed-precision (bfloat16/float16) models (export the float32 model), other
Keras quantization modes (float8) to ONNX, Keras int8 models to LiteRT (use
LiteRT's own dynamic-range quantization,
`optimizations=[tf.lite.Optimize.DEFAULT]`, on the float32 model), and any
Keras backend but TensorFlow (save a preset, export it under TensorFlow).
"""

import contextlib
import importlib.util
import numbers
import os
import re
import shutil
from pathlib import Path

import keras

from bertzoo.export.saved_model import _backbone_of
from bertzoo.layers.activations import exact_gelu_as_erf
from bertzoo.layers.dense import portable_kernels
from bertzoo.models.serving import TOKENIZED_KEYS
from bertzoo.saving.atomic import clean_leftovers
from bertzoo.saving.atomic import hidden_sibling
from bertzoo.saving.atomic import make_parent_directories
from bertzoo.saving.atomic import remove_empty_directories
from bertzoo.saving.atomic import sync_directory
from bertzoo.saving.atomic import sync_tree
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import BackendError
from bertzoo.utils.layers import quantizes_int8_inputs
from bertzoo.utils.optional import tf

PORTABLE_FORMATS = {
    "onnx": {"suffix": ".onnx", "modules": ("tf2onnx", "onnx")},
    "litert": {"suffix": ".tflite", "modules": ()},
}


def _holds_a_portable_export(path, format):
    """Whether the file at `path` is a `format` export: a `.tflite` file's
    identifier `TFL3` at bytes 4-8; an ONNX model's protobuf, parsed without
    its external data."""
    if format == "litert":
        with open(path, "rb") as f:
            return f.read(8)[4:8] == b"TFL3"
    import onnx

    try:
        return bool(onnx.load(str(path), load_external_data=False).graph.node)
    except Exception:  # Any other file: not a model protobuf (DecodeError and kin).
        return False


def export_portable(model, path, format, overwrite=False, sequence_length=None, verbose=False, **kwargs):
    """Writes the tokenized model as one ONNX (`.onnx`) or LiteRT (`.tflite`) file.

    By default the inputs are `[batch, length]` with both dimensions free:
    clients send each batch padded to its own longest row, any length up to
    the backbone's `max_sequence_length` (longer inputs fail in the runtime:
    the position table has no rows for them). ONNX Runtime takes any shape
    as is; LiteRT's signature runner resizes the inputs itself (with the
    plain interpreter, call `resize_tensor_input` and `allocate_tensors`).

    Args:
        model: a `bertzoo.Task` or `BertBackbone`.
        path: the file to write; written atomically.
        format: `"onnx"` (needs `pip install "bertzoo[export]"`: tf2onnx and
            onnx) or `"litert"` (TensorFlow's converter; nothing extra).
        overwrite: replace an existing file.
        sequence_length: fix the token axis to this length (for runtimes or
            accelerators that need static shapes; clients then pad or
            truncate every row to it). Default None: any length.
        verbose: let Keras's exporter print what it does.
        **kwargs: passed to `keras.Model.export` (e.g. `opset_version` for
            ONNX, `optimizations` for LiteRT).

    Example:

    ```python
    model.export("sentiment.onnx", format="onnx")
    import onnxruntime
    session = onnxruntime.InferenceSession("sentiment.onnx")
    features = model.preprocessor(["great", "awful"])
    (logits,) = session.run(None, {k: v.numpy().astype("int32") for k, v in features.items()})
    ```
    """
    if format not in PORTABLE_FORMATS:
        raise ValueError(f"Unknown portable format {format!r}; use one of {sorted(PORTABLE_FORMATS)}.")
    if keras.backend.backend() != "tensorflow":
        # Keras's JAX and torch exporters need other packages (jax2onnx, litert-torch) and, for
        # torch ONNX, fail on the free batch axis; bertzoo converts through TensorFlow only.
        raise BackendError(
            f"{format} export needs the TensorFlow backend (tf2onnx / TensorFlow's LiteRT converter), but "
            f"Keras uses {keras.backend.backend()!r}. Save a preset and export it in a process started with "
            "KERAS_BACKEND=tensorflow."
        )
    if not isinstance(overwrite, bool):
        raise ValueError(f"`overwrite` must be True or False, got {overwrite!r}.")
    backbone = _backbone_of(model)
    _check_convertible(model, backbone, format)
    missing = [m for m in PORTABLE_FORMATS[format]["modules"] if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f'{format} export needs {" and ".join(missing)}: pip install "bertzoo[export]" '
            f"(or pip install {' '.join(missing)})."
        )
    if sequence_length is not None and (
        isinstance(sequence_length, bool) or not isinstance(sequence_length, numbers.Integral) or sequence_length < 1
    ):
        raise ValueError(
            f"`sequence_length` must be a positive integer (a fixed length) or None (any length), "
            f"got {sequence_length!r}."
        )
    sequence_length = None if sequence_length is None else int(sequence_length)
    if sequence_length is not None and sequence_length > backbone.max_sequence_length:
        raise ValueError(
            f"sequence_length={sequence_length} is longer than the backbone's max_sequence_length="
            f"{backbone.max_sequence_length}."
        )
    suffix = PORTABLE_FORMATS[format]["suffix"]
    if os.fspath(path).endswith(("/", os.sep)):  # Path() drops the slash: the file would take the folder's name.
        raise IsADirectoryError(
            f"{os.fspath(path)} names a directory; {format} export writes one file: give its name "
            f"(e.g. {os.path.join(os.fspath(path), 'model' + suffix)})."
        )
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; {format} export writes one file (e.g. model{suffix}).")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{path} already exists. Pass overwrite=True (CLI: --overwrite) to replace it, or choose a new path."
        )
    if path.exists() and not _holds_a_portable_export(path, format):
        raise FileExistsError(
            f"{path} exists and is not an earlier {format} export, which is all overwrite=True replaces: choose "
            "another path."
        )
    # The model's own inputs, the token axis of the BERT inputs free (None) or fixed.
    signature = [
        {
            name: keras.InputSpec(
                shape=tuple(tensor.shape[:-1]) + ((sequence_length,) if name in TOKENIZED_KEYS else tensor.shape[-1:]),
                dtype=tensor.dtype,
                name=name,
            )
            for name, tensor in model.input.items()
        }
    ]
    created = make_parent_directories(path)
    clean_leftovers(path)  # Of an export killed before it finished.
    tmp = hidden_sibling(path)
    try:
        # Keras's exporters insist on the format's suffix; the file then takes the name asked for.
        written = tmp / f"model{suffix}"
        # Standard ops only: the converters know no others (tf2onnx has no `Erfc`, TensorFlow's exact GELU).
        gelu = exact_gelu_as_erf() if format == "onnx" else contextlib.nullcontext()
        if format == "litert":
            # Keras lets TensorFlow ops the LiteRT runtime lacks into the file ("select" ops), which a
            # standard LiteRT interpreter then refuses to run: builtins only, unless asked otherwise.
            target_spec = dict(kwargs.get("target_spec") or {})  # A copy: the caller's dict stays as given.
            target_spec.setdefault("supported_ops", [tf.lite.OpsSet.TFLITE_BUILTINS])
            kwargs["target_spec"] = target_spec
        with portable_kernels(), gelu:
            try:
                keras.Model.export(
                    model, str(written), format=format, verbose=verbose, input_signature=signature, **kwargs
                )
            except Exception as error:
                _raise_for_select_ops(error)
                raise
        if format == "onnx":
            _check_onnx_graph(written)
        sync_tree(tmp)  # On disk before the rename makes it the export (power loss, not only kill -9).
        os.replace(written, path)
        sync_directory(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.exists():
            remove_empty_directories(created)
    return path


def _raise_for_select_ops(error):
    """A ValueError naming the TensorFlow ops LiteRT has no builtin kernel
    for, when the converter's `error` says so (its "TF Select ops:" line)."""
    found = re.search(r"TF Select ops: ([^\n]+)", str(error))
    if found is None:
        return
    raise ValueError(
        f"LiteRT has no builtin kernel for the TensorFlow op(s) {found.group(1).strip()} in this model, so nothing "
        "was written: a standard LiteRT runtime could not run the file. Export format='onnx' or a SavedModel "
        "(`export`), or, for a runtime linked with TensorFlow's Flex delegate, allow those ops: "
        "target_spec={'supported_ops': [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]}."
    ) from None


def _check_onnx_graph(path):
    """Raises a ValueError when the ONNX file at `path` is not a valid graph:
    tf2onnx writes ops it could not convert as they were, with a log line,
    and ONNX runtimes then refuse the whole file."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as error:
        problem = str(error).strip().splitlines()[0]
        raise ValueError(
            f"tf2onnx converted this model to an invalid ONNX graph ({problem}), so nothing was written. "
            "Export format='litert', or a SavedModel (`export`), which run every TensorFlow op."
        ) from None


def _check_convertible(model, backbone, format):
    """Refuses, with the way out, the model kinds the converters are known to fail on."""
    compute_dtype = backbone.dtype_policy.compute_dtype
    if compute_dtype in ("bfloat16", "float16"):
        raise ValueError(
            f"{format} export of a {backbone.dtype_policy.name} model fails (tf2onnx mixes float16 and "
            "bfloat16 types; LiteRT needs TF 'select' ops for bfloat16). Export the float32 model "
            "instead, e.g. BertClassifier.from_preset(preset_dir, dtype='float32')."
        )
    mode = quantization_mode(model)
    unconverted = sorted(set(mode.split("+")) - {"int8", "int4"}) if mode else []
    if format == "onnx" and unconverted:
        raise ValueError(
            f"ONNX export of a Keras-quantized ({mode}) model is not supported: tf2onnx converts int8 and int4 "
            f"layers, not {' or '.join(unconverted)} (float8 fails with a KeyError). Export the float32 model, or "
            "one quantized with model.quantize('int8')."
        )
    if format == "litert" and mode and (mode != "int8" or quantizes_int8_inputs(model)):  # Weight-only int8 converts.
        raise ValueError(
            f"LiteRT export of a Keras-quantized ({mode}) model fails: the converter has no kernel for "
            f"Keras's {mode} matmuls. Export the float32 model with LiteRT's own int8 "
            "quantization instead: model.export(path, format='litert', "
            "optimizations=[tf.lite.Optimize.DEFAULT]). (ONNX export handles Keras int8 models.)"
        )
