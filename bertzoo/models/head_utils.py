"""Losses, metrics and helpers shared by the task heads."""

import contextlib
import warnings

import keras
import numpy as np
from keras import ops

from bertzoo.text.pretraining import IGNORE_LABEL
from bertzoo.utils.optional import tf


@keras.saving.register_keras_serializable(package="bertzoo")
class MaskedAccuracy(keras.metrics.Metric):
    """Accuracy of logits against integer labels, skipping `ignore_class`
    positions (so padding and unlabelled tokens do not count).

    Example:
    ```python
    metric = MaskedAccuracy()
    metric.update_state([[1, -100, 0]], [[[0.0, 1.0], [5.0, 0.0], [0.0, 1.0]]])
    float(metric.result())
    # 0.5
    ```
    """

    def __init__(self, ignore_class=IGNORE_LABEL, name="accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.ignore_class = int(ignore_class)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(ops.convert_to_tensor(y_true), "int32")
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        weight = ops.cast(ops.not_equal(y_true, self.ignore_class), self.dtype)
        if sample_weight is not None:
            sample_weight = ops.cast(ops.convert_to_tensor(sample_weight), self.dtype)
            while len(sample_weight.shape) < len(y_true.shape):  # Per-example weights of per-token labels.
                sample_weight = ops.expand_dims(sample_weight, -1)
            weight = weight * sample_weight
        hits = ops.cast(ops.equal(predicted, y_true), self.dtype) * weight
        self.correct.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "ignore_class": self.ignore_class}


def check_classes(num_classes, class_names=None, name="num_classes", minimum=1):
    """The heads' checks of `num_classes` (an int >= `minimum`) and
    `class_names` (None, or one string per class)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {expected}, got {num_classes!r}.")
    if class_names is not None:
        if not isinstance(class_names, (list, tuple)) or not all(isinstance(n, str) for n in class_names):
            raise ValueError(f"`class_names` must be a list of strings (one per class), got {class_names!r}.")
        if len(class_names) != num_classes:
            raise ValueError(f"`class_names` has {len(class_names)} names but num_classes={num_classes}.")
        repeated = sorted({n for n in class_names if class_names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"`class_names` names {repeated} more than once: each class needs a name of its own (a label "
                "names one class id)."
            )


def check_two_segments(backbone, what):
    """Refuses `backbone` for inputs packed as two segments (`[CLS] A [SEP]
    B [SEP]`, segment ids 0 and 1) when it has one segment embedding
    (`num_segments=1`, as some converted checkpoints have): its lookup of
    segment 1 would fail, or on a GPU read zeros.

    Example:
    ```python
    check_two_segments(backbone, "Sentence pairs")
    ```
    """
    segments = getattr(backbone, "num_segments", 2)
    if segments < 2:
        raise ValueError(
            f"{what} are packed as two segments (segment ids 0 and 1), but the backbone has num_segments="
            f"{segments}: it has no embedding for the second. Use single texts with this backbone, or a backbone "
            "with num_segments=2 (BERT's)."
        )


def class_ids_of_names(names, class_names, head, kind="labels"):
    """String labels -> their index in `class_names`: a ValueError naming
    the fix when the head (`head`: "classifier", "tagger") has no names, or
    naming the labels that are not among them.

    Example:
    ```python
    class_ids_of_names(["pos", "neg"], ["neg", "pos"], "classifier")  # [1, 0]
    ```
    """
    if class_names is None:
        raise ValueError(_no_class_names_message(f"({names[0]!r}, ...)", head, kind))
    index = {str(name): i for i, name in enumerate(class_names)}
    unknown = sorted(set(names) - set(index))
    if unknown:
        raise ValueError(_unknown_names_message(unknown, class_names, head, kind))
    return [index[name] for name in names]


def class_ids_of_names_in_graph(labels, class_names, head, kind="labels"):
    """`class_ids_of_names` on a string tensor (one batch of a
    `tf.data.Dataset`): a batch holding a name not in `class_names` fails
    with the same message, and the names."""
    if class_names is None:
        raise ValueError(_no_class_names_message("in a tf.data.Dataset", head, kind))
    matches = tf.equal(tf.expand_dims(labels, -1), tf.constant([str(name) for name in class_names]))
    ids = tf.argmax(tf.cast(matches, tf.int32), axis=-1, output_type=tf.int32)
    unknown = _unknown_names_message("in this tf.data batch", class_names, head, kind)
    return guarded(ids, (tf.reduce_any(matches, axis=-1), unknown, labels))


def guarded(value, *checks):
    """`value` behind in-graph checks: each `(ok, message, values)` fails the
    step (an `InvalidArgumentError`) with `message` and the entries of
    `values` where `ok` is False, unless `ok` holds everywhere.

    Example:
    ```python
    labels = guarded(labels, (labels >= 0, "Labels must not be negative; these are:", labels))
    ```
    """
    asserts = [
        tf.debugging.Assert(tf.reduce_all(ok), [message, tf.boolean_mask(values, ~ok)], summarize=6)
        for ok, message, values in checks
    ]
    with tf.control_dependencies(asserts):
        return tf.identity(value)


def refuse_one_hot(shape, num_classes, what="class id"):
    """Raises a ValueError for labels of `shape` `(n, num_classes)` where
    the loss takes one `what` per example (Keras's own error, "Argument
    `output` must have rank ...", does not say why)."""
    if len(shape) == 2 and shape[1] == num_classes > 1:
        raise ValueError(
            f"Labels of shape {tuple(shape)} look one-hot, but this model's loss takes one {what} per "
            "example: pass `labels.argmax(-1)` (in a dataset: `.map(lambda x, y: (x, tf.argmax(y, -1)))`), "
            "or compile with `loss=keras.losses.CategoricalCrossentropy(from_logits=True)`."
        )


def _no_class_names_message(which, head, kind):
    return (
        f"The {kind} are strings {which} but this {head} has no `class_names`: build it with "
        "class_names=[...] (their order gives the ids), or pass integer class ids."
    )


def _unknown_names_message(unknown, class_names, head, kind):
    return f"{kind[0].upper()}{kind[1:]} {unknown} are not among the {head}'s class_names {list(class_names)}."


def check_class_ids(labels, num_classes, ignore=None, what="classes"):
    """Raises a ValueError unless every numeric label is a whole-number class
    id in `[0, num_classes)` (`ignore`, e.g. -100 for unlabelled tokens, is
    allowed too). The losses do not check: outside XLA TensorFlow raises
    mid-fit, under XLA an out-of-range id turns the loss, then every weight,
    into NaN without an error. Labels that are not numbers are left alone.

    Example:
    ```python
    check_class_ids([0, 1, 1], num_classes=2)  # passes
    check_class_ids([0, 5], num_classes=2)     # ValueError: labels [5] ...
    ```
    """
    values = np.asarray(labels)
    if values.dtype.kind not in "iuf" or values.size == 0:
        return
    flat = values.ravel()
    if ignore is not None:
        flat = flat[flat != ignore]
    if values.dtype.kind == "f":
        fractional = flat[~(flat == np.round(flat))]  # NaN too.
        if fractional.size:
            raise ValueError(_fractional_labels_message(np.unique(fractional)[:5].tolist()))
    bad = np.unique(flat[(flat < 0) | (flat >= num_classes)])
    if bad.size:
        raise ValueError(_out_of_range_labels_message(bad[:5].tolist(), num_classes, what))


def class_ids_checked_in_graph(labels, num_classes, what="classes", ignore=None):
    """`labels`, one batch of a `tf.data.Dataset`, behind the checks
    `check_class_ids` runs up front on in-memory labels: a dataset's labels
    are only seen batch by batch, so a bad batch stops `fit` there with the
    same message (and the bad values), before its step can turn the weights
    into NaN. `ignore` (e.g. -100) passes too. Labels that are not numbers
    pass unchecked."""
    if not (labels.dtype.is_integer or labels.dtype.is_floating):
        return labels
    where = "in this tf.data batch"
    in_range = (labels >= 0) & (labels < tf.cast(num_classes, labels.dtype))
    if ignore is not None:
        in_range |= tf.equal(labels, tf.cast(ignore, labels.dtype))
    checks = [(in_range, _out_of_range_labels_message(where, num_classes, what), labels)]
    if labels.dtype.is_floating:
        checks.append((tf.equal(labels, tf.round(labels)), _fractional_labels_message(where), labels))
    return guarded(labels, *checks)


def _fractional_labels_message(examples):
    return (
        f"Labels must be whole-number class ids; got {examples}. Soft or regression targets need a loss and a "
        "head made for them (e.g. num_classes=1 with a regression loss), not class ids."
    )


def _out_of_range_labels_message(examples, num_classes, what="classes"):
    return (
        f"Labels {examples} are outside this model's {num_classes} {what}: ids run from 0 to "
        f"{num_classes - 1}. Fix the labels, or build the model with enough {what} for them."
    )


def activation_name(activation):
    """A head's output `activation` as the Keras activation name its config
    (and so a preset) records, or None: a name, a Keras activation function,
    or TensorFlow's function of a Keras activation (`tf.nn.softmax` is
    "softmax"). Anything else is a ValueError: a preset loads without
    running code, so it cannot hold a function of your own.

    Example:
    ```python
    activation_name(tf.nn.softmax)  # 'softmax'
    ```
    """
    if activation is None:
        return None
    if callable(activation):
        # By name, as Keras serializes activations.
        name = getattr(activation, "__name__", "")
        if name.endswith("_v2") and (getattr(activation, "__module__", "") or "").startswith("tensorflow."):
            name = name[: -len("_v2")]  # tf.nn.softmax is softmax_v2.
        if name.isidentifier():
            try:
                keras.activations.get(name)
                return name
            except ValueError:
                pass
        raise ValueError(
            f"`activation`={activation!r} has no Keras activation name, so a saved model could not record it "
            "(presets load without running code): pass a name such as 'softmax' or 'sigmoid', or None and "
            "apply your function to the model's outputs."
        )
    if not isinstance(activation, str):
        raise ValueError(f"`activation` must be None or a Keras activation name, got {activation!r}.")
    try:
        keras.activations.get(activation)
    except ValueError as e:
        raise ValueError(f"`activation`={activation!r} is not a Keras activation name ({e}).") from e
    return activation


def one_weight_per_row(sample_weight):
    """One weight per example as `(batch, 1)`, for a loss of several values
    per example (a span's two ends, masked-LM slots); weights of rank 2 are
    used as given.

    Example:
    ```python
    one_weight_per_row(np.array([1.0, 0.5]))  # shape (2, 1)
    ```
    """
    shape = sample_weight.shape
    rank = shape.rank if hasattr(shape, "rank") else len(shape)  # TensorFlow's may be unknown (None).
    return keras.ops.reshape(sample_weight, (-1, 1)) if rank is None or rank <= 1 else sample_weight


def masked_loss():
    """Sparse cross-entropy on logits, averaged over labelled positions only.

    Averaged per batch: Keras's `evaluate` then averages the batches' losses
    by examples, so a tagger's reported loss moves with how sentences of
    different lengths fall into batches; `MaskedAccuracy` counts tokens
    across batches and does not."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=IGNORE_LABEL)


@contextlib.contextmanager
def unused_pooler_ok():
    """Silences Keras's "Gradients do not exist for variables ['pooler/...']"
    warning for heads that do not use the pooled output (the pooler then
    simply stays as it is, as in BERT's token-level fine-tuning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"Gradients do not exist for variables \['pooler/kernel', "
            r"'pooler/bias'\]",
        )
        yield
