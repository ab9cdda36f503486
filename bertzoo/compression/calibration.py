"""Calibration data as batches: what the compression steps that look at a
model's activations or gradients before changing it (structured pruning's
importance scores, int8's input smoothing) iterate over."""

import os

import keras
import numpy as np

from bertzoo.models.raw_inputs import DEFAULT_BATCH_SIZE
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.optional import is_tf_dataset

# Texts int8's input smoothing calibrates on when `compress` (and the
# compression benchmark) pick them from the training texts.
CALIBRATION_TEXTS = 512


def calibration_sample(texts, size=CALIBRATION_TEXTS, seed=0):
    """Up to `size` of `texts`, a seeded sample (a file's order may be sorted
    by label).

    Example:
    ```python
    q = bertzoo.quantize(model, "int8", calibration=calibration_sample(train_texts))
    ```
    """
    order = np.random.default_rng(seed).permutation(len(texts))[:size]
    return [texts[i] for i in order]


def calibration_batches(model, data, steps=None, labelled=True, batch_size=DEFAULT_BATCH_SIZE):
    """`data` as batches for `model`: a `tf.data.Dataset`, or a list of
    NumPy batches for in-memory tokenized arrays.

    `data`: with `labelled`, a `tf.data.Dataset` of `(inputs, labels)`
    batches or a tuple `(inputs, labels)`; without, a `tf.data.Dataset` of
    input batches or the inputs alone. Inputs are raw strings (for a task
    with a preprocessor, which tokenizes them) or a tokenized dict of arrays.
    `steps`: how many batches to keep (None: all).

    Example:
    ```python
    for features in calibration_batches(classifier, ["good", "bad"], labelled=False):
        classifier(features, training=False)
    ```
    """

    if steps is not None:
        check_positive_int("steps", steps)
    if not labelled and isinstance(data, (str, bytes, os.PathLike)):
        raise ValueError(
            f"Calibration data must be the texts themselves, got {data!r}: for a file, pass "
            "bertzoo.datasets.load_texts(path)."
        )
    if not labelled and isinstance(data, tuple) and not all(isinstance(x, str) for x in data):
        raise ValueError(
            "Calibration data must be the inputs alone (raw strings, a tokenized dict or a dataset of input "
            "batches), not an (inputs, labels) tuple: the labels are not used. For inputs that are a tuple "
            "(sentence pairs, a multiple-choice model's contexts and choices), pass them tokenized: "
            "calibration=model.preprocess((firsts, seconds))."
        )
    if is_tf_dataset(data) or labelled:
        parts = data if isinstance(data, tuple) else (data,)
    else:
        parts = (data,)
    if hasattr(model, "_as_dataset"):
        dataset = model._as_dataset(*parts, batch_size=batch_size)
        if dataset is not None:
            data = dataset
    if not is_tf_dataset(data):
        if (labelled and isinstance(data, tuple) and len(data) in (2, 3)) or (not labelled and isinstance(data, dict)):
            if labelled and hasattr(model, "_checked_labels"):
                # Labels as the model's fit takes them with tokenized inputs (class names -> ids, checked).
                data = (data[0], model._checked_labels(data[1], data[0]), *data[2:])
            # In-memory arrays are sliced in NumPy: no TensorFlow needed (the
            # models run on JAX and torch without it).
            batches = _array_batches(data, batch_size)
            return batches if steps is None else batches[:steps]
        if labelled:
            raise ValueError(
                "`data` must be a tf.data.Dataset of (inputs, labels) batches, or a tuple "
                "(inputs, labels) with inputs as raw strings (for a task with a preprocessor) "
                f"or a tokenized dict; got {type(data).__name__}."
            )
        else:
            raise ValueError(
                "Calibration data must be raw strings (for a task with a preprocessor), a tokenized "
                f"dict of arrays, or a tf.data.Dataset of input batches; got {type(data).__name__}."
            )
    if steps is not None:
        data = data.take(steps)
    return data


def _array_batches(data, batch_size):
    """A list of `batch_size`-row slices of a structure of arrays."""
    data = keras.tree.map_structure(np.asarray, data)
    rows = len(keras.tree.flatten(data)[0])
    return [keras.tree.map_structure(lambda a, i=i: a[i : i + batch_size], data) for i in range(0, rows, batch_size)]
