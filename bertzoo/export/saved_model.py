"""TensorFlow SavedModel export for serving: raw strings in, predictions out.

The SavedModel holds the tokenizer and the model in one TensorFlow graph, so a
server needs TensorFlow and the TF Text op kernels, not Keras or bertzoo.

Signatures (all with a variable batch size), for a `BertClassifier`:

    serving_default    text: string [batch]
    serving_pairs      text, text_pair: string [batch]   (backbones with 2+ segments)
    serving_tokenized  token_ids, segment_ids, padding_mask: int32 [batch, length]

returning `logits` and `probabilities` (float32 [batch, num_classes]),
`label_ids` (int32 [batch]) and `label_names` (string [batch], when the model
has `class_names`). Other tasks declare their own raw-text signatures and
outputs (`serving_signatures`; question answering: the answer span, contexts
of any length read in doc-stride windows; token
classification: one label per word; see the task classes and
`bertzoo.models.serving`); `serving_tokenized` always takes the model's own
inputs. Without a preprocessor `serving_default` is the
tokenized signature.

Texts are tokenized and truncated to the preprocessor's `sequence_length`
exactly as in `Task.predict` (empty strings give `[CLS] [SEP]`; invalid UTF-8
bytes are replaced and dropped; an empty batch gives empty outputs); then the
batch is cut to its longest row: trailing padding columns are dropped, which
changes no prediction but saves compute. Text inputs are declared of any
shape (the export's metadata says `"shape": null`) and shaped by the
signature itself: a text input (`text`, `question`, `context`) is
flattened (a scalar string is a batch of one, a `[n, 1]` column `n`
texts); a matrix input (multiple choice's `choices`, `[batch,
num_choices]`; the tagger's `words`, `[batch, words]`) of another shape
fails with an `InvalidArgumentError` naming the shape expected. Tokenized inputs may have any length from 1 to
the backbone's `max_sequence_length`; longer rows, ids outside the
vocabulary, segment ids outside `[0, num_segments)` or mismatched shapes fail
with an `InvalidArgumentError` naming the problem, and the server stays up.
`padding_mask` is 1 on real tokens, 0 on padding.
"""

import contextlib
import json
from pathlib import Path

import keras
import numpy as np

from bertzoo.layers.dense import portable_kernels
from bertzoo.models.serving import LENGTH_MULTIPLE
from bertzoo.models.serving import serving_functions
from bertzoo.models.serving import xla_serving
from bertzoo.saving.atomic import atomic_directory
from bertzoo.saving.atomic import check_directory_target
from bertzoo.saving.atomic import occupied
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.utils import private_api
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import BackendError
from bertzoo.utils.checks import vocabulary_overflow
from bertzoo.utils.device import default_jit_compile
from bertzoo.utils.layers import quantizes_int8_inputs
from bertzoo.utils.onednn import fused_int8_status
from bertzoo.utils.onednn import onednn_int8_available
from bertzoo.utils.optional import tf
from bertzoo.version import __version__

METADATA_PATH = Path("assets.extra") / "bertzoo_export.json"


def export_saved_model(
    model,
    path,
    overwrite=False,
    sequence_length=None,
    pairs="auto",
    preprocessor="auto",
    verbose=False,
    int8_kernels="auto",
    jit_compile="auto",
    **serving_options,
):
    """Writes `model` as a TensorFlow SavedModel for serving (tokenizer included).

    See the module docstring for the signatures and their outputs. The
    directory is written atomically (a failed export leaves nothing at
    `path`), plus `assets.extra/bertzoo_export.json` describing the export
    (class names, lengths, signatures, and the non-core TensorFlow ops a
    server must have: TF Text's tokenizer ops).

    Args:
        model: a `bertzoo.Task` (e.g. `BertClassifier`) or a `BertBackbone`.
        path: the export directory, e.g. `"serving/sentiment/1"` (TensorFlow
            Serving expects numbered version directories).
        overwrite: replace an existing export at `path`; otherwise exporting
            over an existing directory raises `FileExistsError`. Either way
            a directory that is not a SavedModel, or holds files an export
            does not write (e.g. TF Serving's warm-up requests), is refused.
        sequence_length: pack raw text to this many tokens instead of the
            preprocessor's `sequence_length` (at most the backbone's
            `max_sequence_length`).
        pairs: add the `serving_pairs` signature. `"auto"`: as the model
            declares (text tasks: when there is a preprocessor and the
            backbone has at least 2 segments).
        preprocessor: `"auto"` uses `model.preprocessor`; pass a
            `bertzoo.text.BertPreprocessor` to serve a model without one
            (e.g. a backbone), or None for tokenized signatures only.
        verbose: print the signatures written.
        int8_kernels: how int8-quantized layers run in the export.
            `"portable"`: Keras's int8 ops (with a layer's fixed scale when
            it was quantized with static input ranges), standard TensorFlow
            ops that serve anywhere (slow on CPU without XLA). `"onednn"`: TensorFlow's fused
            oneDNN int8 matmul, what `predict` runs on x86 CPUs (several
            times faster; as in `predict`, one input range per batch, so a
            text's outputs move a little with its batch-mates, and a
            batch's outputs may differ from `predict`'s by that much),
            served by x86 TensorFlow
            builds with oneDNN (the default Linux and Windows builds).
            `"auto"`: `"onednn"` when this machine can run it, else
            `"portable"`. Recorded in the metadata as what runs: float,
            int4 and weight-only int8 models ignore it ("portable").
            Under `jit_compile` the int8 layers are Keras's standard int8
            ops, compiled by XLA.
        jit_compile: run the model in the serving graph as one XLA-compiled
            function (`tf.function(jit_compile=True)`, kept in the
            SavedModel). The serving process compiles it once per input
            shape it meets, so shapes are bucketed: batches are padded to
            1, 2, 4, ..., 32 rows, then multiples of 32
            (`bertzoo.models.serving.batch_bucket`); text batches are cut
            to multiples of 16 tokens with or without XLA, as the
            classifier's `predict` cuts them (at most 8 lengths for
            128-token inputs; `serving_tokenized` keeps the length it is
            sent). `"auto"`: XLA
            when the model's `compile()` pinned it, else when bertzoo's
            fast-path measurement on this machine picks it for the model's
            `predict` (`bertzoo.explain_fast_path(model)`; measured here
            unless `predict` ran or a cached choice exists), so the export
            serves the path `predict` runs; a quantized model with an
            explicit `int8_kernels` serves without XLA. True/False pin it.
            Recorded in the metadata.
        **serving_options: export-time settings of the model's own
            `serving_signatures` (e.g. `BertQuestionAnswerer`'s `stride`,
            `max_answer_length`, `null_score_threshold`); recorded in the
            metadata as `serving_options`.

    Returns:
        The export directory as a `Path`.

    Example:

    ```python
    model = bertzoo.BertClassifier.from_preset("runs/sentiment")
    bertzoo.export_saved_model(model, "serving/sentiment/1")
    # On the server (TensorFlow and tensorflow-text only):
    import tensorflow as tf, tensorflow_text  # registers TF Text's ops
    served = tf.saved_model.load("serving/sentiment/1")
    served.signatures["serving_default"](text=tf.constant(["great", "awful"]))
    ```
    """
    if keras.backend.backend() != "tensorflow":
        raise BackendError(
            f"SavedModel export needs the TensorFlow backend, but Keras uses {keras.backend.backend()!r}. "
            "Set KERAS_BACKEND=tensorflow before importing keras."
        )
    if not isinstance(overwrite, bool):
        raise ValueError(f"`overwrite` must be True or False, got {overwrite!r}.")
    backbone = _backbone_of(model)
    chosen = preprocessor is None
    if preprocessor == "auto":
        preprocessor = getattr(model, "preprocessor", None)
    preprocessor = _packing_preprocessor(preprocessor, sequence_length, backbone, chosen=chosen)
    # Recorded in the metadata (JSON): a NumPy scalar is written as the number it holds.
    serving_options = {k: v.item() if isinstance(v, np.generic) else v for k, v in serving_options.items()}
    if int8_kernels not in ("auto", "portable", "onednn"):
        raise ValueError(f"`int8_kernels` must be 'auto', 'portable' or 'onednn', got {int8_kernels!r}.")
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        raise ValueError(f"`jit_compile` must be True, False or 'auto', got {jit_compile!r}.")
    quantized = quantization_mode(model)
    if jit_compile is True and quantized and int8_kernels == "onednn":
        raise ValueError(
            "int8_kernels='onednn' cannot be combined with jit_compile=True: the fused oneDNN kernel does not "
            "run under XLA. Pass one of them (int8_kernels='auto' follows jit_compile)."
        )
    # Float, int4 and weight-only int8 models ignore it (no int8 inputs to multiply).
    if int8_kernels == "onednn" and quantizes_int8_inputs(model) and not onednn_int8_available():
        raise ValueError(
            "int8_kernels='onednn' needs TensorFlow's fused oneDNN int8 kernel, which this machine cannot run "
            f"({fused_int8_status()[1]}). Export with int8_kernels='portable'."
        )
    if not (isinstance(pairs, bool) or pairs == "auto"):
        raise ValueError(f"`pairs` must be True, False or 'auto', got {pairs!r}.")
    path = Path(path).expanduser()
    # Fail before the (slow) tracing when the target is taken.
    check_directory_target(path)
    if occupied(path) and not overwrite:
        raise FileExistsError(
            f"{path} already exists. Pass overwrite=True (CLI: --overwrite) to replace it, or export to a new "
            "version directory (e.g. .../2)."
        )
    if path.is_dir() and not path.is_symlink() and any(path.iterdir()) and not (path / "saved_model.pb").is_file():
        # The export replaces the whole directory: only ever a SavedModel.
        raise FileExistsError(
            f"{path} exists and is not a SavedModel; exporting replaces the whole directory, so it refuses "
            "to delete what is there. Export to a new or empty directory (e.g. serving/my_model/1)."
        )
    others = _files_of_others(path)
    if others:  # E.g. a TF Serving warm-up file, notes: replacing the export would delete them with it.
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise FileExistsError(
            f"{path} holds a SavedModel and other files ({shown}); exporting replaces the whole directory, so it "
            "refuses to delete them. Move them out, or export to a new version directory (e.g. .../2)."
        )

    # Measured (seconds) only now that the target is known to be free.
    jit_compile, int8_kernels = _serving_kernels(model, quantized, jit_compile, int8_kernels)
    functions = serving_functions(model, preprocessor, pairs, **serving_options)
    # A plain trackable root: the signatures (also callable as attributes of
    # the loaded object) and the model's variables, nothing Keras-specific.
    root = tf.Module()
    root.model_variables = list(model.weights)
    if preprocessor is not None:  # E.g. a SentencePiece model, a resource the graph refers to.
        root.text_resources = list(preprocessor.tokenizer.export_resources())
    for name, function in functions.items():
        setattr(root, name, function)

    with atomic_directory(path, overwrite=overwrite) as tmp:
        # Tracing happens here, once per signature; with standard ops only,
        # so that the SavedModel serves on any TensorFlow build.
        kernels = portable_kernels() if int8_kernels == "portable" else contextlib.nullcontext()
        with kernels, xla_serving() if jit_compile else contextlib.nullcontext():
            tf.saved_model.save(root, str(tmp), signatures=functions)
        signatures = _signature_specs(tmp)
        ops = custom_ops(tmp)
        metadata = {
            "bertzoo_version": __version__,
            "tensorflow_version": tf.__version__,
            "keras_version": keras.__version__,
            "class_name": type(model).__name__,
            "source_preset": getattr(model, "source_preset", None),
            "dtype_policy": backbone.dtype_policy.name,
            "quantization": quantized.split("+") if quantized else None,
            "int8_kernels": int8_kernels if quantized else None,
            "jit_compile": jit_compile,
            "xla_length_multiple": LENGTH_MULTIPLE if jit_compile else None,
            "class_names": getattr(model, "class_names", None),
            "sequence_length": preprocessor.sequence_length if preprocessor is not None else None,
            "truncate": preprocessor.truncate if preprocessor is not None else None,
            "max_sequence_length": backbone.max_sequence_length,
            "signatures": signatures,
            "serving_options": serving_options or None,
            "custom_ops": ops,
            "custom_ops_package": "tensorflow-text" if any(not _is_onednn_op(op) for op in ops) else None,
        }
        (tmp / METADATA_PATH).parent.mkdir(exist_ok=True)
        (tmp / METADATA_PATH).write_text(json.dumps(metadata, indent=2) + "\n")
    if verbose:
        print(describe_export(path))
    return path


def _serving_kernels(model, quantized, jit_compile, int8_kernels):
    """`(jit_compile, int8_kernels)` resolved for an export (see
    `export_saved_model`; the arguments are checked already)."""
    if jit_compile == "auto":
        # The export serves the path `predict` takes here (measured, or cached).
        jit_compile = False
        if not quantized or int8_kernels == "auto":
            pinned = getattr(model, "compile_pin", lambda: None)()  # The user's compile() decides predict.
            jit_compile = bool(pinned if pinned is not None else default_jit_compile(model, mode="predict"))
    if jit_compile or not quantizes_int8_inputs(model):
        # What runs: the fused kernel never runs under XLA, nor for int4 or weight-only int8 layers.
        return bool(jit_compile), "portable"
    if int8_kernels == "auto":
        int8_kernels = "onednn" if onednn_int8_available() else "portable"
    return False, int8_kernels


def read_export_metadata(path):
    """The `bertzoo_export.json` written next to an exported SavedModel.

    Example:

    ```python
    read_export_metadata("serving/sentiment/1")["class_names"]  # ['negative', 'positive']
    ```
    """
    file = Path(path).expanduser() / METADATA_PATH
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {path} is not a SavedModel written by bertzoo.")
    return json.loads(file.read_text())


def describe_export(path):
    """A few lines listing an export's signatures, inputs and outputs."""
    metadata = read_export_metadata(path)
    lines = [f"SavedModel at {path}"]

    def described(v):
        return f"{v['dtype']}{'[any shape]' if v['shape'] is None else v['shape']}"

    for name, signature in metadata["signatures"].items():
        inputs = ", ".join(f"{k}: {described(v)}" for k, v in signature["inputs"].items())
        outputs = ", ".join(f"{k}: {described(v)}" for k, v in signature["outputs"].items())
        lines.append(f"  {name}({inputs})\n      -> {outputs}")
    text_ops = [op for op in metadata["custom_ops"] if not _is_onednn_op(op)]
    onednn_ops = [op for op in metadata["custom_ops"] if _is_onednn_op(op)]
    if text_ops:
        lines.append(
            f"  needs TensorFlow plus tensorflow-text ops: {', '.join(text_ops)}"
            " (in Python: `import tensorflow_text` before tf.saved_model.load)"
        )
    if onednn_ops:
        lines.append(
            f"  needs a TensorFlow build with oneDNN (the default x86-64 Linux and Windows builds) for: "
            f"{', '.join(onednn_ops)}"
        )
    if metadata.get("jit_compile"):
        lines.append(
            "  the model runs as one XLA-compiled function: the serving process compiles it once per input "
            f"shape (batches padded to 1, 2, 4, ..., 32 rows, then multiples of 32; text batches cut to "
            f"multiples of {metadata['xla_length_multiple']} tokens)"
        )
    return "\n".join(lines)


def custom_ops(path):
    """Op types used by the SavedModel at `path` that core TensorFlow lacks.

    These must be registered before the model loads (for bertzoo exports:
    TF Text's tokenizer ops, registered by `import tensorflow_text`).

    Example:

    ```python
    custom_ops("serving/sentiment/1")  # ['FastWordpieceTokenizeWithOffsets', 'NormalizeUTF8', ...]
    ```
    """
    saved_model = private_api.read_saved_model_proto(path)
    used = set()
    for graph in saved_model.meta_graphs:
        functions = {f.signature.name for f in graph.graph_def.library.function}
        used.update(node.op for node in graph.graph_def.node)
        for function in graph.graph_def.library.function:
            used.update(node.op for node in function.node_def)
        used -= functions
    # `tf.raw_ops` lists exactly the ops built into TensorFlow.
    return sorted(op for op in used if not hasattr(tf.raw_ops, op))


def _is_onednn_op(op):
    """Whether `custom_ops` lists `op` because it is one of TensorFlow's own
    oneDNN kernels (internal ops are named with a leading underscore, e.g. the
    fused int8 matmul `_QuantizedMatMul`), not a tensorflow-text op."""
    return op.startswith("_")


# What an export writes at its top level, and in `assets.extra` (where TF
# Serving also reads a user's warm-up requests from).
_EXPORT_ENTRIES = {"saved_model.pb", "fingerprint.pb", "variables", "assets", METADATA_PATH.parent.name}


def _files_of_others(path):
    """Entries of the directory `path` that no export writes, as
    `name` or `assets.extra/name` (a trailing `/` for a directory)."""
    if not path.is_dir() or path.is_symlink():
        return []
    found = [p for p in path.iterdir() if p.name not in _EXPORT_ENTRIES]
    extra = path / METADATA_PATH.parent
    if extra.is_dir() and not extra.is_symlink():
        found += [p for p in extra.iterdir() if p.name != METADATA_PATH.name]
    return sorted(str(p.relative_to(path)) + ("/" if p.is_dir() else "") for p in found)


def _backbone_of(model):
    backbone = getattr(model, "backbone", model)
    missing = [a for a in ("vocabulary_size", "max_sequence_length", "num_segments") if not hasattr(backbone, a)]
    if not isinstance(model, keras.Model) or missing:
        raise ValueError(
            f"export_saved_model expects a bertzoo Task (e.g. BertClassifier) or a BertBackbone, "
            f"got {type(model).__name__}."
        )
    if not model.built:
        raise ValueError(f"{type(model).__name__} '{model.name}' is not built yet; build or call it before exporting.")
    return backbone


def _packing_preprocessor(preprocessor, sequence_length, backbone, chosen=False):
    """The preprocessor the text signatures use (with `sequence_length`
    applied); `chosen`: the caller passed `preprocessor=None` itself."""
    if preprocessor is None:
        if sequence_length is not None:
            why = "the export has no text signatures (preprocessor=None)" if chosen else "the model has no preprocessor"
            raise ValueError(
                f"`sequence_length` sets how raw text is packed, but {why}; tokenized inputs may have any length "
                "up to max_sequence_length."
            )
        return None
    if not isinstance(preprocessor, BertPreprocessor):
        raise ValueError(
            f"`preprocessor` must be a bertzoo BertPreprocessor, 'auto' or None, got {type(preprocessor).__name__}."
        )
    if sequence_length is not None and sequence_length != preprocessor.sequence_length:
        preprocessor = BertPreprocessor(
            preprocessor.tokenizer, sequence_length=sequence_length, truncate=preprocessor.truncate
        )
    if preprocessor.sequence_length > backbone.max_sequence_length:
        raise ValueError(
            f"sequence_length={preprocessor.sequence_length} is longer than the backbone's "
            f"max_sequence_length={backbone.max_sequence_length}. Pass sequence_length <= "
            f"{backbone.max_sequence_length}."
        )
    problem = vocabulary_overflow(
        preprocessor.tokenizer.vocabulary_size(), backbone.vocabulary_size, "The preprocessor's vocabulary"
    )
    if problem:
        raise ValueError(problem)
    return preprocessor


def _signature_specs(path):
    """`{signature: {"inputs": {name: spec}, "outputs": {name: spec}}}` as saved (what servers see)."""
    saved_model = private_api.read_saved_model_proto(path)

    def spec(info):
        # None: declared of any shape (text inputs, whose body flattens or checks them; see `string_function`).
        shape = (
            None
            if info.tensor_shape.unknown_rank
            else [-1 if d.size < 0 else int(d.size) for d in info.tensor_shape.dim]
        )
        return {"dtype": tf.dtypes.as_dtype(info.dtype).name, "shape": shape}

    signatures = {}
    for name, signature in sorted(saved_model.meta_graphs[0].signature_def.items()):
        if name.startswith("__"):
            continue  # TensorFlow's own, e.g. __saved_model_init_op.
        signatures[name] = {
            "inputs": {k: spec(v) for k, v in sorted(signature.inputs.items())},
            "outputs": {k: spec(v) for k, v in sorted(signature.outputs.items())},
        }
    return signatures
