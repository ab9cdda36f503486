"""Calibration data as batches: what the compression steps that look at a
model's activations or gradients before changing it (structured pruning's
importance scores, int8's input smoothing) iterate over."""


def calibration_batches(model, data, steps=None, labelled=True, batch_size=32):
    """`data` as a `tf.data.Dataset` of batches for `model`.

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
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset) or labelled:
        parts = data if isinstance(data, tuple) else (data,)
    else:
        parts = (data,)
    if hasattr(model, "_as_dataset"):
        dataset = model._as_dataset(*parts, batch_size=batch_size)
        if dataset is not None:
            data = dataset
    if not isinstance(data, tf.data.Dataset):
        if labelled and isinstance(data, tuple) and len(data) in (2, 3):
            data = tf.data.Dataset.from_tensor_slices(data).batch(batch_size)
        elif not labelled and isinstance(data, dict):
            data = tf.data.Dataset.from_tensor_slices(data).batch(batch_size)
        elif labelled:
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
