"""Serving signatures: what an export writes, for any Keras model.

A model declares what it serves with a method
`serving_signatures(preprocessor, pairs) -> {signature name: tf.function}`
(bertzoo's tasks do, see `bertzoo.Task.serving_signatures`);
`serving_functions` calls it. A model that declares none (e.g. a
`BertBackbone` exported alone) is served by `TextServing`: text (and text
pairs) in when a preprocessor is given, token ids in always, and its outputs
by name out. This module names no model class: the pieces a task's own
signatures are built from (`TextServing`, `string_function`,
`classification_outputs`, ...) live here, the tasks' choices in their modules.

Every export has `serving_tokenized`, the model's own inputs (names, ranks and
dtypes as the model declares them), and a `serving_default`. Floating outputs
are float32.

Signatures call the model through `serving_call`; inside `xla_serving()` that
call is one XLA-compiled function (compiled per input shape by the serving
process): batches are padded to `batch_bucket` rows, so that few shapes
arise. Text batches are cut to a multiple of `LENGTH_MULTIPLE` tokens, with
or without XLA, as `Task.predict` cuts those of the tasks with one output
row per example (`trims_padding`: classifier, multiple choice).

Writing the files (SavedModel, ONNX, LiteRT) is `bertzoo.export`'s job, which
sits above the models in the package order; it registers its writer here with
`register_exporter`, and `export` (`ExportMixin`: tasks and backbones) calls it
through `exporter()`.
"""

import contextlib
import inspect
import threading

from bertzoo.utils.optional import tf

TOKENIZED_KEYS = ("token_ids", "segment_ids", "padding_mask")
# Trimmed text batches keep a multiple of this many tokens, in serving graphs
# and in `Task.predict` (tasks with `trims_padding`) alike: few shapes for XLA
# to compile (at most 8 lengths per batch size for 128-token inputs), and the
# same inputs in both, which dynamic int8 needs for the same outputs (its
# per-tensor input range covers the padding positions).
LENGTH_MULTIPLE = 16

_tracing = threading.local()
_exporter = None


def register_exporter(function):
    """Makes `function(model, path, format=..., **options)` the writer that
    `export` (`ExportMixin`) calls; `bertzoo.export` registers `export_model` on import."""
    global _exporter
    _exporter = function


def exporter():
    """The writer `register_exporter` set; a clear error when there is none."""
    if _exporter is None:
        raise RuntimeError("No exporter is registered: import bertzoo (or bertzoo.export) before calling export.")
    return _exporter


class ExportMixin:
    """`export` (overriding `keras.Model.export`) through the registered
    exporter: bertzoo's serving signatures, written atomically. Mixed into
    the tasks and the backbones, before the Keras model class."""

    def export(
        self,
        filepath,
        format="tf_saved_model",
        verbose=None,
        input_signature=None,
        overwrite=False,
        sequence_length=None,
        **kwargs,
    ):
        """Exports the model for serving (overrides `keras.Model.export`).

        `format="tf_saved_model"`: a SavedModel whose `serving_default`
        signature takes raw strings (the tokenizer is in the graph) and
        returns predictions, plus `serving_pairs` and `serving_tokenized`;
        see `bertzoo.export_saved_model` (a model without a preprocessor,
        e.g. a backbone, serves token ids: `serving_default` and
        `serving_tokenized`). `"onnx"` / `"litert"`: one file taking token
        ids of any length; see `bertzoo.export.export_portable`. Writes
        atomically and refuses to replace `filepath` unless
        `overwrite=True`. `input_signature` is not accepted: the signatures
        are fixed (use `keras.export.ExportArchive` for custom ones).

        Example:

        ```python
        model.export("serving/sentiment/1")
        model.export("sentiment.onnx", format="onnx")
        ```
        """
        if input_signature is not None:
            raise ValueError(
                f"{type(self).__name__}.export writes fixed serving signatures and takes no `input_signature`; "
                "for a custom one use keras.export.ExportArchive, or keras.Model.export(model, ...)."
            )
        return exporter()(
            self,
            filepath,
            format=format,
            overwrite=overwrite,
            sequence_length=sequence_length,
            verbose=bool(verbose),
            **kwargs,
        )


@contextlib.contextmanager
def xla_serving(length_multiple=LENGTH_MULTIPLE):
    """Serving graphs traced inside run each model call as one XLA-compiled
    function (`tf.function(jit_compile=True)`, kept as such in a SavedModel)
    and trim text batches to a multiple of `length_multiple` tokens.

    Example:
    ```python
    with xla_serving():
        tf.saved_model.save(root, path, signatures=serving_functions(model, preprocessor))
    ```
    """
    previous = getattr(_tracing, "xla", None)
    _tracing.xla = {"length_multiple": length_multiple, "functions": {}}
    try:
        yield
    finally:
        _tracing.xla = previous


def serving_call(model, features):
    """`model(features, training=False)` in a serving graph; inside
    `xla_serving()` through one XLA-compiled function per model, shared by
    all the signatures traced there.

    Example (inside a signature's body):
    ```python
    logits = serving_call(model, trim_padding(as_int32(features)))
    ```
    """
    state = getattr(_tracing, "xla", None)
    if state is None:
        return model(features, training=False)
    function = state["functions"].get(id(model))
    if function is None:
        function = tf.function(lambda inputs: model(inputs, training=False), jit_compile=True, autograph=False)
        state["functions"][id(model)] = function
    # Each batch size is a shape XLA compiles for: rows of zeros (padding
    # only) fill the batch up to `batch_bucket`, and their outputs are dropped.
    batch = tf.shape(tf.nest.flatten(features)[0])[0]
    extra = batch_bucket(batch) - batch

    def pad(t):
        return tf.pad(t, tf.concat([[[0, extra]], tf.zeros([tf.rank(t) - 1, 2], tf.int32)], axis=0))

    outputs = function(tf.nest.map_structure(pad, features))
    return tf.nest.map_structure(lambda t: t[:batch], outputs)


def batch_bucket(batch):
    """The batch size an XLA serving call runs `batch` rows as: the next
    power of two up to 32, then the next multiple of 32 (so a server
    compiles for few batch sizes; at most 2x the rows below 32, a few
    percent above).

    Example:
    ```python
    [int(batch_bucket(tf.constant(n))) for n in (1, 3, 24, 33)]
    # [1, 4, 32, 64]
    ```
    """
    powers = tf.constant([1, 2, 4, 8, 16, 32])
    batch = tf.maximum(tf.cast(batch, tf.int32), 1)
    smallest_power = tf.gather(powers, tf.minimum(tf.searchsorted(powers, tf.reshape(batch, [1]))[0], 5))
    return tf.where(batch <= 32, smallest_power, (batch + 31) // 32 * 32)


def classification_outputs(outputs, class_names=None, activation=None):
    """Serving outputs of a classification head, as a dict of tensors.

    `logits` and `probabilities` (float32, softmax over the last axis),
    `label_ids` (int32 argmax) and, with `class_names`, `label_names` (the
    name of each predicted class). `activation` is the head's output
    activation: None (the outputs are logits) or `"softmax"` (they are
    probabilities; `logits` are then their logarithm, which has the same
    softmax).

    Example, a task's serving hook:

    ```python
    def serving_outputs(self, outputs):
        return classification_outputs(outputs, self.class_names)
    ```
    """
    scores = tf.cast(outputs, tf.float32)
    if activation in (None, "linear"):
        logits, probabilities = scores, tf.nn.softmax(scores, axis=-1)
    elif activation == "softmax":
        probabilities, logits = scores, tf.math.log(scores)
    else:
        raise ValueError(
            f"classification_outputs supports heads with no activation (logits) or 'softmax', "
            f"got activation={activation!r}."
        )
    label_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
    result = {"logits": logits, "probabilities": probabilities, "label_ids": label_ids}
    if class_names is not None:
        result["label_names"] = tf.gather(tf.constant([str(n) for n in class_names]), label_ids)
    return result


def named_outputs(outputs):
    """A model's outputs as a dict: by name when they are a dict, `output_0`,
    `output_1`, ... when a list or tuple, else `{"outputs": outputs}`."""
    if isinstance(outputs, dict):
        return dict(outputs)
    if isinstance(outputs, (list, tuple)):
        return {f"output_{i}": o for i, o in enumerate(outputs)}
    return {"outputs": outputs}


def serving_functions(model, preprocessor, pairs="auto", **options):
    """`{signature name: tf.function with an input signature}` for `model`.

    The model's own `serving_signatures(preprocessor, pairs=pairs,
    **options)` when it declares one, else
    `TextServing(model, preprocessor).signatures(pairs)`. `pairs`: True,
    False or `"auto"` (the model's choice); True fails when the model serves
    no `serving_pairs`. `options`: export-time settings the model's
    `serving_signatures` takes as keyword arguments (e.g. a question
    answerer's `stride`); others are refused with the ones it takes.
    """
    declared = getattr(model, "serving_signatures", None)
    if options:
        parameters = inspect.signature(declared).parameters if callable(declared) else {}
        accepted = sorted(k for k in parameters if k not in ("preprocessor", "pairs"))
        unknown = sorted(k for k in options if k not in accepted)
        if unknown:
            raise ValueError(
                f"Unknown export option(s) {', '.join(unknown)} for {type(model).__name__}; its serving "
                f"signatures take {', '.join(accepted) if accepted else 'no options'}."
            )
    if callable(declared):
        functions = dict(declared(preprocessor, pairs=pairs, **options))
    else:
        functions = TextServing(model, preprocessor).signatures(pairs)
    if pairs is True and "serving_pairs" not in functions:
        backbone = getattr(model, "backbone", model)
        raise ValueError(
            f"`pairs=True` needs a model that serves text pairs ({type(model).__name__} serves "
            f"{', '.join(sorted(functions))}), a preprocessor and a backbone with 2 segments "
            f"(num_segments={getattr(backbone, 'num_segments', None)})."
        )
    if "serving_tokenized" not in functions or "serving_default" not in functions:
        raise ValueError(
            f"{type(model).__name__}.serving_signatures must return `serving_default` and "
            f"`serving_tokenized` among its signatures, got {sorted(functions)}."
        )
    return functions


class TextServing:
    """The signatures of a model over BERT inputs, and the steps they share.

    `signatures(pairs)` gives `serving_default(text)`, with `pairs`
    `serving_pairs(text, text_pair)` (when a preprocessor is given), and
    `serving_tokenized` (the model's own inputs, checked at run time; also
    `serving_default` without a preprocessor). A task builds other
    signatures from `tokenized_function`, `run` and `string_function`.

    Args:
        model: a built Keras model with `token_ids`/`segment_ids`/
            `padding_mask` inputs; its `backbone` (or the model itself) gives
            `vocabulary_size`, `max_sequence_length`, `num_segments`.
        preprocessor: the `BertPreprocessor` packing raw text, or None.
        preprocess: `x -> features` for one batch of raw inputs; default: the
            preprocessor. Tasks pass their own preprocessing (the code `fit`
            and `predict` run).
        outputs: `(model outputs, features) -> dict of tensors`; default:
            `named_outputs`.
    """

    def __init__(self, model, preprocessor=None, preprocess=None, outputs=None):
        self.model = model
        self.backbone = getattr(model, "backbone", model)
        self.preprocessor = preprocessor
        self.preprocess = preprocessor if preprocess is None else preprocess
        self.outputs = outputs or (lambda outputs, features: named_outputs(outputs))

    @property
    def pairs_supported(self):
        return self.preprocessor is not None and self.backbone.num_segments >= 2

    def signatures(self, pairs="auto"):
        """`serving_default`, `serving_pairs` (if `pairs`, or `"auto"` and
        supported) and `serving_tokenized`."""
        functions = self.tokenized_signatures()
        if self.preprocessor is not None:
            functions["serving_default"] = string_function(self.text, text=[None])
            if pairs in (True, "auto") and self.pairs_supported:
                functions["serving_pairs"] = string_function(self.pairs, text=[None], text_pair=[None])
        return functions

    def tokenized_signatures(self):
        """`serving_tokenized`, and `serving_default` the same (TensorFlow
        Serving needs a `serving_default`; a task with a preprocessor replaces
        it with its raw-input signature)."""
        return {"serving_default": self.tokenized_function(), "serving_tokenized": self.tokenized_function()}

    # --- Bodies -----------------------------------------------------------
    # `string_function` hands them 1-D string inputs (other ranks flattened).
    def text(self, text):
        return self.run(self.preprocess(text))

    def pairs(self, text, text_pair):
        text, text_pair = same_size(text, text_pair, "text", "text_pair")
        return self.run(self.preprocess((text, text_pair)))

    def run(self, features):
        """Preprocessed features -> the outputs dict, with the padding no row
        uses cut off first (see `trim_padding`)."""
        features = trim_padding(as_int32(features))
        return self.finish(self.outputs(serving_call(self.model, features), features))

    def tokenized_function(self):
        """`serving_tokenized`: the model's own inputs, checked at run time."""
        names = sorted(self.model.input)
        specs = [
            tf.TensorSpec(tuple(self.model.input[n].shape), tf.as_dtype(self.model.input[n].dtype), name=n)
            for n in names
        ]
        return named_function("tokenized", lambda *values: self.tokenized(dict(zip(names, values))), specs)

    def tokenized(self, inputs):
        # A loaded signature takes tensors of any rank, and in-graph rank checks fold to the traced
        # rank: `ensure_shape` is checked by its kernel ("Shape of tensor token_ids [3] is not
        # compatible with expected shape [?,?]").
        inputs = {k: tf.ensure_shape(v, self.model.input[k].shape) for k, v in inputs.items()}
        with tf.control_dependencies(self._checks(inputs)):
            features = {k: tf.identity(v) for k, v in inputs.items()}
        if "padding_mask" in features:
            features["padding_mask"] = tf.cast(tf.not_equal(features["padding_mask"], 0), tf.int32)
        return self.finish(self.outputs(serving_call(self.model, features), features))

    def finish(self, result):
        if not isinstance(result, dict) or not result:
            raise ValueError(
                f"The serving outputs of {type(self.model).__name__} must be a non-empty dict of tensors, "
                f"got {result!r}."
            )
        return {k: tf.cast(v, tf.float32) if v.dtype.is_floating else v for k, v in result.items()}

    def _checks(self, inputs):
        """Run-time checks of tokenized inputs: clear errors instead of wrong results."""
        backbone = self.backbone
        token_ids = inputs["token_ids"]
        shape = tf.shape(token_ids)
        length = shape[-1]
        checks = [
            tf.debugging.assert_less_equal(
                length,
                backbone.max_sequence_length,
                message=f"sequences are longer than the model's max_sequence_length="
                f"{backbone.max_sequence_length}; truncate them (keeping the final [SEP])",
            ),
            tf.debugging.Assert(
                tf.logical_or(tf.equal(tf.reduce_prod(shape[:-1]), 0), tf.greater(length, 0)),
                ["sequences need at least one token ([CLS]); got length 0"],
            ),
            tf.debugging.assert_non_negative(token_ids, message="`token_ids` must be >= 0"),
            tf.debugging.assert_less(
                token_ids,
                backbone.vocabulary_size,
                message=f"`token_ids` must be < vocabulary_size={backbone.vocabulary_size}",
            ),
        ]
        for name in ("segment_ids", "padding_mask"):
            if name in inputs:
                checks.append(
                    tf.debugging.assert_equal(
                        tf.shape(inputs[name]), shape, message=f"`{name}` must have the shape of `token_ids`"
                    )
                )
        if "segment_ids" in inputs:
            checks += [
                tf.debugging.assert_non_negative(inputs["segment_ids"], message="`segment_ids` must be >= 0"),
                tf.debugging.assert_less(
                    inputs["segment_ids"],
                    backbone.num_segments,
                    message=f"`segment_ids` must be < num_segments={backbone.num_segments}",
                ),
            ]
        return checks


def as_int32(features):
    """The BERT inputs of `features`, as int32 (the preprocessor's `padding_mask` is bool)."""
    return {k: tf.cast(features[k], tf.int32) for k in TOKENIZED_KEYS}


def trim_padding(features, *others, multiple=None):
    """Drops the trailing padding columns no row uses (last axis).

    Position embeddings are absolute and padding is masked, so predictions do
    not change; the compute shrinks to the longest text in the batch. The `1`
    keeps `[CLS]` when the batch is empty. `others` (e.g. per-token labels)
    are cut the same way. `multiple`: keep a multiple of this many columns
    (at most all of them), so a compiler (XLA) sees few distinct lengths;
    default `LENGTH_MULTIPLE`, or `xla_serving`'s `length_multiple` inside it.
    """
    if multiple is None:
        state = getattr(_tracing, "xla", None)
        multiple = state["length_multiple"] if state is not None else LENGTH_MULTIPLE
    lengths = tf.reshape(tf.reduce_sum(tf.cast(features["padding_mask"], tf.int32), axis=-1), [-1])
    longest = tf.reduce_max(tf.concat([lengths, [1]], axis=0))
    if multiple > 1:
        full = tf.shape(features["padding_mask"])[-1]
        longest = tf.minimum((longest + multiple - 1) // multiple * multiple, full)
    trimmed = {k: v[..., :longest] for k, v in features.items()}
    return (trimmed,) + tuple(o[..., :longest] for o in others) if others else trimmed


def string_function(body, **inputs):
    """`tf.function(body)` over string inputs of the given names and shapes,
    e.g. `string_function(answer, question=[None], context=[None])`.

    The signature declares the inputs of any rank and `body` gets them in the
    shapes given: a 1-D input flattened (a scalar is a batch of one), a
    higher-rank one checked, with an error naming the shape expected. (A
    loaded signature does not check the declared shapes, and with a declared
    `[None]` TensorFlow's graph optimizer drops a `reshape(x, [-1])` as a
    no-op, so a `[n, 1]` input reached the body unflattened.)"""
    names = list(inputs)
    specs = [tf.TensorSpec(None, tf.string, name=name) for name in names]

    def shaped(*values):
        return body(*(_as_shape(value, inputs[name], name) for name, value in zip(names, values)))

    return named_function(body.__name__, shaped, specs)


def _as_shape(value, shape, name):
    if len(shape) == 1:
        return tf.reshape(value, [-1])
    expected = "[" + ", ".join("batch" if i == 0 else "n" if d is None else str(d) for i, d in enumerate(shape)) + "]"
    message = f"`{name}` must be a string tensor of shape {expected}"
    if len(shape) == 2:
        message += f" (one row per example: a single example is [[...]], shape {expected.replace('batch', '1')})"
    # The sizes are compared only where the rank is right (`tf.shape(value)[i]` would fail first otherwise).
    actual = tf.shape(value)
    fits = tf.equal(tf.size(actual), len(shape))
    for i, d in enumerate(shape):
        if d is not None:
            fits = tf.logical_and(
                fits, tf.equal(tf.gather(tf.concat([actual, tf.zeros([len(shape)], actual.dtype)], 0), i), d)
            )
    check = tf.debugging.Assert(fits, [message, "got shape", actual])
    with tf.control_dependencies([check]):
        return tf.ensure_shape(tf.identity(value), shape)


def named_function(name, body, specs):
    """A `tf.function` of positional inputs; the signature's inputs are named
    after `specs`, and errors name the function `name`."""

    def function(*values):
        return body(*values)

    function.__name__ = name
    return tf.function(function, input_signature=specs, autograph=False)


def same_size(first, second, first_name, second_name, rows=False):
    """`first`, `second` after checking they hold one row each per example
    (`rows=True`: `second` has one row per element of `first`)."""
    size = tf.shape(second)[0] if rows else tf.size(second)
    check = tf.debugging.assert_equal(
        tf.size(first),
        size,
        message=f"`{first_name}` and `{second_name}` must have the same number of rows (one per example)",
    )
    with tf.control_dependencies([check]):
        return tf.identity(first), tf.identity(second)
