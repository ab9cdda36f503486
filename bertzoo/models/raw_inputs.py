"""`fit` / `evaluate` on raw text, shared by task models and trainers."""

import collections.abc
import contextlib
import itertools
import math

import keras
import numpy as np

from bertzoo.models.optimizers import AdamW
from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.models.serving import TOKENIZED_KEYS
from bertzoo.utils import private_api
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.optional import is_tf_dataset
from bertzoo.utils.optional import is_tf_ragged
from bertzoo.utils.optional import is_tf_tensor

DEFAULT_BATCH_SIZE = 32


def set_schedule_length(optimizer, x, batch_size, epochs, steps_per_epoch):
    """Sets the length of `optimizer`'s `WarmupLinearDecay` from what `fit()`
    was given, unless the user fixed it. A later `fit()` extends the schedule
    from the current step, so it trains instead of running at rate zero."""

    schedule = private_api.learning_rate_schedule(optimizer)
    if not isinstance(schedule, WarmupLinearDecay):
        return
    if schedule.total_steps is not None and not getattr(schedule, "_length_from_fit", False):
        return
    steps = steps_per_epoch
    if steps is None and is_tf_dataset(x):
        cardinality = int(x.cardinality())
        steps = cardinality if cardinality > 0 else None
    elif steps is None and isinstance(x, keras.utils.PyDataset):
        steps = x.num_batches  # None for an endless one: the schedule stays at its peak, as for such a dataset.
    elif steps is None and x is not None and not is_stream(x):
        first = x[next(iter(x))] if isinstance(x, dict) else x
        steps = -(-len(first) // (batch_size or DEFAULT_BATCH_SIZE))
    if steps:
        schedule.total_steps = int(keras.ops.convert_to_numpy(optimizer.iterations)) + steps * epochs
        schedule._length_from_fit = True


def build_optimizer_before_fit(model):
    """Creates the optimizer's variables (Adam's moments ...) now, eagerly,
    for the variables `fit` or `train_on_batch` will train, unless it has
    them already or the model's variables may not all exist yet
    (`model._variables_complete()`, else `model.built`).

    Keras's TensorFlow trainer (without a strategy) otherwise creates them
    while it traces the first training step: `python -m benchmarks.first_fit`
    on a 2-core CPU, a first `fit` of 4.33 s against 2.75 s (`tiny`), 17.2 s
    against 7.6 s (BERT-base). Its JAX and torch trainers, and TensorFlow's
    under a strategy, build eagerly already; here, under a `tf.distribute`
    strategy, in its scope as they do. Nothing to train (a frozen model):
    left to Keras, whose step then never builds it.
    """
    optimizer = getattr(model, "optimizer", None)
    complete = getattr(model, "_variables_complete", lambda: model.built)()
    if optimizer is None or optimizer.built or not complete or not model.trainable_variables:
        return
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's trainer only.
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        optimizer.build(model.trainable_variables)


def holds_text(x, datasets=False):
    """True for raw text: a string, a string tensor, or a list, tuple or
    array holding strings at any depth (sentence pairs, choices, words);
    with `datasets`, also a `tf.data.Dataset` whose inputs hold strings."""
    if datasets and is_tf_dataset(x):
        spec = x.element_spec
        inputs = spec[0] if isinstance(spec, tuple) and len(spec) > 1 else spec  # (inputs, labels[, weights])
        return any(getattr(s, "dtype", None) == "string" for s in keras.tree.flatten(inputs))
    if isinstance(x, (str, bytes)):
        return True
    if is_tf_tensor(x):
        return x.dtype.name == "string"
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "O":  # Sentences of words, maybe empty ones first: as a list.
            return x.size > 0 and holds_text(list(x.ravel()))
        return x.dtype.kind in "US" and x.size > 0
    if isinstance(x, (list, tuple)):
        # A pair's or a choice list's first parts suffice; empty ones (a tagger's empty sentences) say nothing.
        filled = (v for v in x if not (isinstance(v, (list, tuple, np.ndarray)) and np.ndim(v) > 0 and len(v) == 0))
        return any(holds_text(v) for v in itertools.islice(filled, 2))
    return False


def eager_strings_as_arrays(x):
    """`x` with each eager string tensor in it (the texts, or a part of a
    tuple: sentence pairs, questions and contexts, contexts and choices,
    sentences of words) as a NumPy array of Python `str` (an object
    array), a 0-d one as one `str`: the tasks read raw text as Python
    sequences, as they read lists and arrays; a ragged one (words split
    from sentences) as nested lists of `str`; a 0-d NumPy string array as
    one `str` too. Bytes that are not UTF-8 stay bytes. Anything else comes
    back unchanged.

    Example:
    ```python
    eager_strings_as_arrays((tf.constant(["a premise"]), tf.constant(["a hypothesis"])))
    # (array(['a premise'], dtype=object), array(['a hypothesis'], dtype=object))
    ```
    """

    def decoded(values):
        if isinstance(values, list):
            return [decoded(v) for v in values]
        if not isinstance(values, bytes):
            return values
        try:
            return values.decode("utf-8")
        except UnicodeDecodeError:
            return values

    def convert(part):
        if isinstance(part, np.ndarray) and part.ndim == 0 and isinstance(part.item(), (str, bytes)):
            return decoded(part.item())  # One text, as a 0-d tensor gives it.
        if is_tf_ragged(part) and part.dtype.name == "string":
            return decoded(part.to_list())  # As lists (a tagger's words).
        if not (is_tf_tensor(part) and part.dtype.name == "string" and hasattr(part, "numpy")):
            return part
        values = np.asarray(part.numpy(), dtype=object)  # A 0-d tensor's `numpy()` is bytes, not an array.
        try:
            texts = [value.decode("utf-8") for value in values.reshape(-1).tolist()]
        except UnicodeDecodeError:
            return values if values.ndim else values.item()
        if not values.ndim:
            return texts[0]
        array = np.empty(len(texts), dtype=object)
        array[:] = texts  # Not np.array(texts): a "<U" array is as wide as the longest text.
        return array.reshape(values.shape)

    return tuple(convert(part) for part in x) if isinstance(x, tuple) else convert(x)


def _is_raw_sequence(x):
    # Raw text in memory: a list, array or string tensor of examples, or a
    # tuple of them (pairs, questions and contexts, contexts and choices).
    parts = x if isinstance(x, tuple) else (x,)
    return all(
        isinstance(part, (list, np.ndarray)) or (is_tf_tensor(part) and part.shape.rank) for part in parts
    ) and holds_text(parts[0])


def _is_feature_dict(x):
    # Tokenized features in memory (arrays of one row per example).
    return isinstance(x, dict) and bool(x) and all(hasattr(v, "shape") and len(v.shape) for v in x.values())


def check_dataset_carries_targets(y, sample_weight):
    """A `tf.data.Dataset` `x` brings its own labels and sample weights:
    a ValueError when `fit` is also given them (they would be dropped)."""
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None:
            raise ValueError(
                f"`{name}` must be None when `x` is a tf.data.Dataset: put the labels (and sample weights) in "
                "the dataset, as (inputs, labels, sample_weights) elements."
            )


def holds_no_examples(x):
    """True for inputs with no examples: `[]`, an empty array or tensor
    (`tf.constant([], tf.string)`), a pair (tuple) of them, or a
    `tf.data.Dataset` known to hold no elements."""
    if is_tf_dataset(x):
        return int(x.cardinality()) == 0  # Unknown (-2) for a filtered one: not known to be empty.
    parts = x if isinstance(x, tuple) and x else (x,)
    return all(_is_empty(part) for part in parts)


def _is_empty(part):
    if isinstance(part, np.ndarray):
        return part.ndim > 0 and len(part) == 0  # A 0-d array is one example.
    if isinstance(part, (list, tuple)):
        return len(part) == 0
    return is_tf_tensor(part) and bool(part.shape.rank) and part.shape[0] == 0


def split_for_validation(x, y, sample_weight, validation_split):
    """`fit`'s `validation_split` for raw text (or a dict of tokenized
    arrays), as Keras does it for arrays: the last `validation_split` of the
    examples (before shuffling) are held out. Here, not in Keras, so it
    also works where the examples reach Keras as a `tf.data` stream (raw
    text, `ResumableTraining`). Returns `(x, y, sample_weight,
    validation_data)`.

    Example:
    ```python
    split_for_validation(["a", "b", "c", "d"], [0, 1, 0, 1], None, 0.25)
    # (['a', 'b', 'c'], [0, 1, 0], None, (['d'], [1]))
    ```
    """
    if not 0.0 < validation_split < 1.0:
        raise ValueError(f"`validation_split` must be a fraction in (0, 1), got {validation_split!r}.")
    parts = x if isinstance(x, tuple) else tuple(x.values()) if isinstance(x, dict) else (x,)
    count = len(parts[0])
    keep = int(math.floor(count * (1.0 - validation_split)))
    if keep == 0:
        raise ValueError(
            f"validation_split={validation_split} of {count} examples leaves no training examples: use more "
            "examples or a smaller split."
        )

    def head(values):
        return None if values is None else values[:keep]

    def tail(values):
        return None if values is None else values[keep:]

    def split_inputs(side):
        if isinstance(x, dict):
            return {key: side(value) for key, value in x.items()}
        return tuple(side(part) for part in parts) if isinstance(x, tuple) else side(x)

    validation = tuple(v for v in (split_inputs(tail), tail(y), tail(sample_weight)) if v is not None)
    return split_inputs(head), head(y), head(sample_weight), validation


def _put_back(first, rest):
    """A generator of `first`, then the rest of the iterator `rest` (what
    Keras takes as a stream of batches: a generator, not any iterator)."""
    yield first
    yield from rest


def is_stream(x):
    """True for batches Keras reads one at a time: a Python iterator or
    generator, or a `keras.utils.PyDataset`."""
    return isinstance(x, (collections.abc.Iterator, keras.utils.PyDataset))


def is_tokenized(x):
    """True for feature dicts, and for datasets whose elements are (or start with) one."""

    if is_tf_dataset(x):
        spec = x.element_spec
        x = spec[0] if isinstance(spec, tuple) else spec
    return isinstance(x, dict) and "token_ids" in x


def validation_parts(validation_data):
    """`fit`'s `validation_data` as a tuple `(x[, y[, sample_weight]])`:
    a tuple of those, a list of two or three (Keras reads it as that
    tuple) unless it is a list of texts, or `x` alone."""
    if isinstance(validation_data, list) and len(validation_data) in (2, 3):
        texts = all(isinstance(v, (str, bytes)) for v in validation_data)
        validation_data = validation_data if texts else tuple(validation_data)
    if not isinstance(validation_data, tuple):
        return (validation_data,)
    if len(validation_data) > 3:
        raise ValueError(
            "`validation_data` must be (x, y) or (x, y, sample_weight), got a tuple of "
            f"{len(validation_data)} parts. For sentence pairs, nest them: ((first, second), labels)."
        )
    return validation_data


def _check_gradients_can_be_summed_over_replicas(model):
    """Refuses, before any step, a model TensorFlow cannot train under its
    `tf.distribute` strategy of several replicas: bfloat16 trainable
    variables beside float32 ones (`dtype="bfloat16"`, whose head stays
    float32) fail in the gradients' all-reduce, which packs them into one
    tensor ("Tensors in list passed to 'values' of 'ConcatV2' Op have types
    [bfloat16, ..., float32]"). float16 ones train (under loss scaling)."""
    strategy = getattr(model, "distribute_strategy", None)  # The TensorFlow backend's.
    if strategy is None or strategy.num_replicas_in_sync <= 1:
        return
    dtypes = sorted({keras.backend.standardize_dtype(v.dtype) for v in model.trainable_variables})
    if "bfloat16" in dtypes and len(dtypes) > 1:
        raise ValueError(
            f"{type(model).__name__} cannot train under this tf.distribute strategy of "
            f"{strategy.num_replicas_in_sync} replicas: its trainable variables are {' and '.join(dtypes)} "
            "(dtype='bfloat16' keeps the head in float32), and TensorFlow's all-reduce of the gradients fails on "
            "that mix. Build the model with dtype='mixed_bfloat16' (float32 variables, bfloat16 compute: what "
            "training in bfloat16 usually means), or train it without the strategy."
        )


_BIAS_CORRECTED = ("Adam", "AdamW", "Nadam", "Lamb")


def _check_optimizer_steps_low_precision_weights(model):
    """Refuses, before any step, Keras's Adam-family optimizers on bfloat16
    or float16 trainable weights at a `beta_2` that rounds to 1 in their
    dtype (the default 0.999 does in bfloat16): Keras computes the step in
    the weights' dtype, where `1 - beta_2 ** t` is 0, so Adam's steps are 0
    and the weights never change (keras-hub issue 2629; Nadam's and Lamb's
    are NaN). bertzoo's `AdamW`
    (`compile()`'s default, `bert_optimizer`) steps in float32."""
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # Under a LossScaleOptimizer.
    # Those dividing by (the root of) `1 - beta_2 ** t`; Adamax and Lion use beta_2 otherwise and do step.
    bias_corrected = tuple(getattr(keras.optimizers, n) for n in _BIAS_CORRECTED if hasattr(keras.optimizers, n))
    if not isinstance(optimizer, bias_corrected) or isinstance(optimizer, AdamW):
        return
    beta_2 = optimizer.beta_2
    if isinstance(beta_2, bool) or not isinstance(beta_2, (int, float, np.integer, np.floating)):
        return
    for dtype in sorted({keras.backend.standardize_dtype(v.dtype) for v in model.trainable_variables}):
        if dtype in ("bfloat16", "float16") and float(keras.ops.cast(beta_2, dtype)) == 1.0:
            raise ValueError(
                f"{type(model).__name__} has {dtype} weights, and Keras's {type(optimizer).__name__} computes their "
                f"steps in {dtype}, where beta_2={beta_2} is 1.0: its steps would be 0 (or NaN) and they would "
                "not train. Compile with bertzoo's optimizer (`compile()` without one, or "
                "optimizer=bertzoo.models.optimizers.bert_optimizer(learning_rate)), which steps in float32, or "
                "build the model with dtype='mixed_bfloat16' (float32 weights)."
            )


class RawInputsMixin:
    """Runs `fit` and `evaluate` inputs through `self._as_dataset` first,
    and builds the optimizer before the first training step is traced.

    `_as_dataset(x, y, sample_weight, batch_size, shuffle, training)` returns a batched,
    tokenized `tf.data.Dataset`, or None when `x` needs no preprocessing. The
    default learning-rate schedule's length is filled in from the data.
    Mix it in before the Keras model class.
    """

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        sample_weight=None,
        validation_data=None,
        shuffle=True,
        steps_per_epoch=None,
        **kwargs,
    ):
        x = self._checked_stream("fit", x)
        if is_stream(validation_data):
            validation_data = self._checked_stream("fit (validation_data)", validation_data)
        self._check_fit_inputs(x, y, validation_data=validation_data, batch_size=batch_size)
        _check_gradients_can_be_summed_over_replicas(self)
        _check_optimizer_steps_low_precision_weights(self)
        for variable in self.trainable_variables:  # Before Keras's step: an error inside it loses state on JAX.
            check = getattr(variable.constraint, "check_trainer", None)
            if check is not None:
                check(self)
        split = kwargs.pop("validation_split", 0.0)
        if split and validation_data is None and (_is_raw_sequence(x) or _is_feature_dict(x)):
            x, y, sample_weight, validation_data = split_for_validation(x, y, sample_weight, split)
        elif split:
            if validation_data is None and holds_text(x):  # Keras would split the tf.data stream made of it.
                raise ValueError(
                    f"`validation_split` cannot split raw text given as {type(x).__name__}: pass the texts as a "
                    "list, a NumPy array or a string tensor (a tuple of them for pairs), or split them before "
                    "fit and pass `validation_data=(texts, labels)`."
                )
            kwargs["validation_split"] = split
        keras_fit = super().fit
        callbacks = kwargs.get("callbacks")
        callbacks = getattr(callbacks, "callbacks", callbacks) or []
        resumable = [c for c in callbacks if callable(getattr(c, "run_fit", None))]
        if len(resumable) > 1:  # The second one failed with "fit does not support it".
            raise ValueError(
                f"fit got {len(resumable)} ResumableTraining callbacks: pass one (it checkpoints the whole run)."
            )
        if resumable:  # `bertzoo.ResumableTraining` runs the fit (and checkpoints it).
            return resumable[0].run_fit(
                self,
                keras_fit,
                x=x,
                y=y,
                batch_size=batch_size,
                epochs=epochs,
                sample_weight=sample_weight,
                validation_data=validation_data,
                shuffle=shuffle,
                steps_per_epoch=steps_per_epoch,
                **kwargs,
            )
        validation_data = self._as_validation_data(validation_data, batch_size, kwargs)
        dataset = self._as_dataset(x, y, sample_weight, batch_size, shuffle=shuffle, training=True)
        if dataset is not None:  # Already shuffled, batched and tokenized.
            x, y, sample_weight, batch_size, shuffle = dataset, None, None, None, False
        elif y is not None:
            y = self._checked_labels(y, x)
        if self.optimizer is not None:
            set_schedule_length(self.optimizer, x, batch_size, epochs, steps_per_epoch)
        return keras_fit(
            x=x,
            y=y,
            batch_size=batch_size,
            epochs=epochs,
            sample_weight=sample_weight,
            validation_data=validation_data,
            shuffle=shuffle,
            steps_per_epoch=steps_per_epoch,
            **kwargs,
        )

    def _check_fit_inputs(self, x, y, method="fit", validation_data=None, batch_size=None):
        """Hook: raises a clear error for `fit` (or `evaluate`) inputs it
        cannot train on (no examples; raw text without a preprocessor; tasks:
        no labels where they need them)."""
        if method in ("fit", "evaluate") and holds_no_examples(x):  # Keras: an empty result, or an odd error.
            raise ValueError(f"`x` holds no examples: `{method}` needs at least one.")
        if batch_size is not None:  # Raw text batched with 0 got the default size.
            check_positive_int("batch_size", batch_size)
        self._check_text_has_a_preprocessor(method, x)
        if isinstance(x, dict) and not holds_text(x):
            missing = [name for name in self._feature_names() if name not in x]
            if missing:  # A trainer (a subclassed model) read them as a bare KeyError.
                raise ValueError(
                    f"{type(self).__name__}.{method} got features without {missing}: pass a dict of "
                    f"{', '.join(self._feature_names())} (what the preprocessor returns), or the raw texts."
                )
        if validation_data is not None:
            self._check_text_has_a_preprocessor(f"{method} (validation_data)", validation_parts(validation_data)[0])

    def _feature_names(self):
        """The names of the tokenized inputs (the model's own, where it declares them)."""
        try:
            declared = self.input
        except (AttributeError, ValueError):  # A subclassed model (a trainer) declares none.
            declared = None
        return sorted(declared) if isinstance(declared, dict) else list(TOKENIZED_KEYS)

    def _checked_stream(self, method, x):
        """`x`, and for a stream (`is_stream`) of raw text a clear error:
        bertzoo tokenizes in-memory text and `tf.data` pipelines, not Python
        generators. A stream's first batch is read to tell (a generator's is
        put back in front of the rest); tokenized streams go to Keras."""
        if not is_stream(x) or self.preprocessor is None:
            return x
        kind = type(x).__name__
        if isinstance(x, keras.utils.PyDataset):
            first = x[0] if x.num_batches != 0 else None
        else:
            first = next(x, None)
            x = x if first is None else _put_back(first, x)
        inputs = first[0] if isinstance(first, tuple) else first
        if holds_text(inputs):
            raise ValueError(
                f"{type(self).__name__}.{method} got a {kind} of raw text, which it cannot tokenize "
                "batch by batch: wrap its batches in a tf.data.Dataset, which bertzoo tokenizes in its pipeline, "
                "e.g. tf.data.Dataset.from_generator(make_batches, output_signature=(tf.TensorSpec([None], "
                "tf.string), tf.TensorSpec([None], tf.int32))), or yield model.preprocess(inputs) features."
            )
        return x

    def _check_text_has_a_preprocessor(self, method, x):
        if self.preprocessor is None and holds_text(x, datasets=True):  # Keras: "Unrecognized data type".
            raise ValueError(
                f"{type(self).__name__}.{method} got raw text, but this model has no preprocessor (built with "
                "preprocessor=None, or from a preset saved without a vocabulary): pass the model's inputs, a "
                f"dict of {', '.join(self._feature_names())}, or build the model with a preprocessor."
            )

    def _refuse_raw_batch(self, method, x):
        # Keras's batch methods take the model's features; raw text reached
        # Keras's input check as "received N input tensors".
        if self.preprocessor is not None and not is_tokenized(x) and holds_text(x):
            raise ValueError(
                f"{method} takes the model's features (a dict like model.preprocess(inputs) returns), not raw "
                f"text: call {'predict' if method == 'predict_on_batch' else 'fit or evaluate'} with the texts, "
                f"or pass {method} model.preprocess(inputs) (inputs as predict takes them)."
            )

    def predict_on_batch(self, x):
        self._refuse_raw_batch("predict_on_batch", x)
        return super().predict_on_batch(x)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        self._refuse_raw_batch("train_on_batch", x)
        return super().train_on_batch(x, y, *args, **kwargs)

    def test_on_batch(self, x, y=None, *args, **kwargs):
        self._refuse_raw_batch("test_on_batch", x)
        return super().test_on_batch(x, y, *args, **kwargs)

    def _checked_labels(self, y, features=None):
        """Hook: in-memory labels as the model's loss takes them (one per
        output row), checked: raises a clear error for labels it cannot train
        on. `fit` and `evaluate` run it on the labels of tokenized inputs
        (`features`); tasks run it on those of raw text where those are the
        same labels. Unchanged by default."""
        return y

    def _as_validation_data(self, validation_data, batch_size=None, fit_kwargs=None):
        """`fit`'s `validation_data`, tokenized and batched when it is raw
        (`ResumableTraining.run_fit` calls this once its checks pass).

        Batched as Keras batches validation data: by `fit`'s
        `validation_batch_size` (in `fit_kwargs`, the rest of `fit`'s
        keyword arguments), else its `batch_size`. Once the data is a batched
        dataset, `validation_batch_size` is dropped from `fit_kwargs`. A list
        `[x, y]` reads as the tuple `(x, y)`, as in Keras."""
        if validation_data is None:
            return None
        fit_kwargs = {} if fit_kwargs is None else fit_kwargs
        parts = validation_parts(validation_data)
        dataset = self._as_dataset(*parts, batch_size=fit_kwargs.get("validation_batch_size") or batch_size)
        if dataset is None:
            return validation_data
        fit_kwargs.pop("validation_batch_size", None)
        return dataset

    def make_train_function(self, force=False):
        # Keras's `fit` and `train_on_batch` call this once they have checked
        # their arguments and built the model, before the step is traced: a
        # call refused for its arguments leaves the optimizer as it was.
        build_optimizer_before_fit(self)
        return super().make_train_function(force)

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        x = self._checked_stream("evaluate", x)
        self._check_fit_inputs(x, y, method="evaluate", batch_size=batch_size)
        dataset = self._as_dataset(x, y, sample_weight, batch_size)
        if dataset is not None:
            x, y, sample_weight, batch_size = dataset, None, None, None
        elif y is not None:
            y = self._checked_labels(y, x)
        return super().evaluate(x=x, y=y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)
