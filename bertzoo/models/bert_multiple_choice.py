"""Multiple choice: score each (context, choice) pair, pick the best (SWAG)."""

import keras
import numpy as np
from keras import ops

from bertzoo.layers.dense import Dense
from bertzoo.layers.dropout import Dropout
from bertzoo.models.head_utils import check_class_ids
from bertzoo.models.head_utils import check_classes
from bertzoo.models.head_utils import check_two_segments
from bertzoo.models.head_utils import class_ids_checked_in_graph
from bertzoo.models.head_utils import guarded
from bertzoo.models.head_utils import refuse_one_hot
from bertzoo.models.serving import TextServing
from bertzoo.models.serving import classification_outputs
from bertzoo.models.serving import same_size
from bertzoo.models.serving import string_function
from bertzoo.models.task import Task
from bertzoo.models.task import deterministic_preprocess
from bertzoo.text.normalization import non_text_message
from bertzoo.utils.checks import check_rate
from bertzoo.utils.optional import tf


@keras.saving.register_keras_serializable(package="bertzoo")
class MergeChoices(keras.layers.Layer):
    """`(batch, choices, length)` -> `(batch * choices, length)`."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_shape(self, input_shape):
        return (None, input_shape[-1])


@keras.saving.register_keras_serializable(package="bertzoo")
class SplitChoices(keras.layers.Layer):
    """`(batch * choices, 1)` scores -> `(batch, choices)` logits."""

    def __init__(self, num_choices, **kwargs):
        super().__init__(**kwargs)
        self.num_choices = int(num_choices)

    def call(self, x):
        return ops.reshape(x, (-1, self.num_choices))

    def compute_output_shape(self, input_shape):
        return (None, self.num_choices)

    def get_config(self):
        config = super().get_config()
        config["num_choices"] = self.num_choices
        return config


@keras.saving.register_keras_serializable(package="bertzoo")
class BertMultipleChoice(Task):
    """Multiple choice (BERT paper, section 4.4, SWAG): each `[CLS] context
    [SEP] choice [SEP]` is encoded, a dense layer scores its pooled output,
    and a softmax over the choices picks the answer.

    Raw inputs: `(contexts, choices)` with `contexts` a list of strings and
    `choices` a list of equally long lists of `num_choices` strings; labels
    are the index of the right choice. Tokenized inputs carry a choices axis:
    `token_ids`, `segment_ids`, `padding_mask` of shape
    `(batch, num_choices, length)`. Output: logits `(batch, num_choices)`.

    Args:
        backbone: a `bertzoo.BertBackbone`.
        num_choices: choices per example (fixed, e.g. 4 for SWAG).
        preprocessor: a `bertzoo.text.BertPreprocessor`, or None for
            tokenized inputs.
        dropout: dropout on the pooled output.

    Example:

    ```python
    model = bertzoo.BertMultipleChoice.from_preset("tiny", num_choices=2)
    model.fit((["She opened the umbrella"], [["because it rained.", "because it was dry."]]), [0])
    model.predict((["He was hungry,"], [["so he ate.", "so he slept."]])).shape  # (1, 2)
    ```
    """

    # One score per choice from the same weights, whatever the number of choices.
    weightless_head_arguments = Task.weightless_head_arguments + ("num_choices",)

    def __init__(self, backbone, num_choices, preprocessor=None, dropout=0.1, **kwargs):
        self.check_head_arguments(num_choices, dropout=dropout)
        check_two_segments(backbone, "A context and each choice")
        policy = backbone.dtype_policy
        head_dtype = "float32" if policy.compute_dtype != "float32" else policy
        self.output_dropout = Dropout(dropout, dtype=policy, name="output_dropout")
        self.output_dense = Dense(
            1,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=head_dtype,
            name="choice_scores",
        )
        self.merge_choices = MergeChoices(name="merge_choices")
        self.split_choices = SplitChoices(num_choices, dtype=head_dtype, name="logits")
        inputs = {
            name: keras.Input(shape=(num_choices, None), dtype="int32", name=name)
            for name in ("token_ids", "segment_ids", "padding_mask")
        }
        outputs = self.compute_head_outputs(inputs, backbone(self._backbone_inputs(inputs)))
        super().__init__(inputs=inputs, outputs=outputs, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_choices = num_choices
        self.dropout = float(dropout)

    trims_padding = True  # One output row per example: padding is never read.

    def _backbone_inputs(self, inputs):
        return {name: self.merge_choices(value) for name, value in inputs.items()}

    def compute_head_outputs(self, inputs, features, training=None):
        scores = self.output_dense(self.output_dropout(features["pooled_output"], training=training))
        return self.split_choices(scores)

    @classmethod
    def check_head_arguments(cls, num_choices, dropout=0.1):
        check_classes(num_choices, name="num_choices", minimum=2)
        check_rate("dropout", dropout)

    def get_config(self):
        return {**super().get_config(), "num_choices": self.num_choices, "dropout": self.dropout}

    # --- Raw inputs -------------------------------------------------------
    def _raw_to_tensors(self, x, y):
        if not (isinstance(x, tuple) and len(x) == 2):
            raise ValueError(
                "BertMultipleChoice takes raw text as a tuple (contexts, choices): a list of strings and "
                f"a list of lists of {self.num_choices} strings."
            )
        contexts, choices = x
        if isinstance(choices, (str, bytes)) or (isinstance(choices, np.ndarray) and choices.ndim == 0):
            raise ValueError(
                f"The choices are one string, {choices!r}: give a list of {self.num_choices} strings per example "
                "(for one example, (context, ['choice 1', 'choice 2', ...]))."
            )
        choices = choices.tolist() if isinstance(choices, np.ndarray) else list(choices)
        if isinstance(contexts, np.ndarray) and contexts.ndim == 0:
            contexts = contexts.item()
        if isinstance(contexts, (str, bytes)):  # One example: its context and its list of choices.
            contexts = [contexts]
            if choices and all(isinstance(c, (str, bytes)) for c in choices):
                choices = [choices]
        contexts = list(contexts)
        for i, options in enumerate(choices):
            if isinstance(options, (str, bytes)):  # list() would split it into characters.
                raise ValueError(
                    f"Example {i}'s choices are one string, {options!r}: give each example a list of "
                    f"{self.num_choices} strings, e.g. (['a context'], [['choice 1', 'choice 2', ...]])."
                )
        choices = [list(c) for c in choices]
        if len(contexts) != len(choices):
            raise ValueError(
                f"Got {len(contexts)} contexts but {len(choices)} choice lists: give one list of "
                f"{self.num_choices} choices per context, e.g. (['a context'], [['choice 1', 'choice 2', ...]])."
            )
        problem = non_text_message("BertMultipleChoice's contexts", contexts)
        if problem:
            raise ValueError(problem)
        for i, options in enumerate(choices):
            if len(options) != self.num_choices:
                raise ValueError(
                    f"Example {i} has {len(options)} choices; this model takes exactly "
                    f"num_choices={self.num_choices} strings per example."
                )
            for j, option in enumerate(options):
                options[j] = self._choice_text(option, i)
        return (tf.constant(contexts, tf.string), tf.constant(choices, tf.string)), self._checked_labels(y)

    def _raw_sample_weight(self, sample_weight, x):
        shape = np.shape(sample_weight)
        if len(shape) > 1 and shape[1:] != (1,):  # TensorFlow: "Incompatible shapes", inside the step.
            raise ValueError(
                f"Multiple choice takes one sample weight per example (shape (n,)), got shape {shape}: weigh the "
                "example, e.g. by its right choice's weight, not each choice."
            )
        return sample_weight

    @staticmethod
    def _choice_text(option, example):
        """A choice as `str`: UTF-8 bytes decoded (a string tensor with one
        undecodable entry comes back as bytes throughout), anything else refused."""
        if isinstance(option, bytes):
            try:
                return option.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(
                    f"Example {example} has a choice that is not UTF-8 text: {option!r}. Decode it to a string "
                    "first (e.g. bytes.decode('latin-1') for Latin-1 text)."
                ) from None
        if not isinstance(option, str):
            raise ValueError(
                f"Example {example} has a choice that is not a string: {option!r} ({type(option).__name__}). "
                "Pass each choice as text (fill missing choices, e.g. with '')."
            )
        return option

    def _checked_labels(self, y, features=None):
        """Labels as choice indices, checked up front: one per example
        (shape `(n,)` or `(n, 1)`) whatever the loss; other shapes (soft
        targets under a loss of your own) only with the default sparse
        cross-entropy, which refuses them. Under that loss `(n, 1)` comes
        back as `(n,)`, as the classifier's: Keras retraces its step for
        another label rank with an unknown one, which the loss cannot take.
        A loss of your own gets the labels as given."""
        if y is None:
            return y
        values = np.asarray(y)
        one_per_example = values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)
        sparse = isinstance(getattr(self, "loss", None), keras.losses.SparseCategoricalCrossentropy)
        if not (one_per_example or sparse):
            return y
        if values.dtype.kind not in "iufb":
            raise ValueError(self._text_labels_message(values.ravel()[:3].tolist()))
        refuse_one_hot(values.shape, self.num_choices, what="choice index")
        check_class_ids(values, self.num_choices, what="choices")
        return values.reshape(-1) if sparse and values.ndim == 2 else y

    def _choice_count_message(self, given=None):
        have = (
            "The examples of this tf.data batch have the number of choices below"
            if given is None
            else (f"These examples have {given} choices each")
        )
        return (
            f"{have}, but this model takes exactly num_choices="
            f"{self.num_choices} per example (a model of another number: BertMultipleChoice(backbone, "
            "num_choices=...))."
        )

    def _check_choice_count(self, shape):
        """Refuses choices of a known `shape` `(batch, n)` whose `n` is not `num_choices`."""
        if shape.rank == 2 and shape[1] is not None and shape[1] != self.num_choices:
            raise ValueError(self._choice_count_message(shape[1]))

    def _batched(self, dataset, batch_size):
        dataset = super()._batched(dataset, batch_size)
        parts = tf.nest.flatten(dataset.element_spec)
        if len(parts) > 1:  # (contexts, choices[, labels ...]): a wrong count said before anything runs.
            self._check_choice_count(parts[1].shape)
        return dataset

    def _text_labels_message(self, shown):
        return (
            f"Multiple-choice labels are the index of the right choice (0 to {self.num_choices - 1}), got "
            f"{shown}: pass `choices[i].index(answer)`, not the answer's text."
        )

    def _labels_checked_in_graph(self, labels):
        if labels.dtype == tf.string:  # TensorFlow: "Cast string to float is not supported", mid-step.
            raise ValueError(self._text_labels_message("strings in a tf.data dataset"))
        sparse = isinstance(getattr(self, "loss", None), keras.losses.SparseCategoricalCrossentropy)
        if sparse and labels.shape.rank is not None:
            refuse_one_hot(tuple(labels.shape), self.num_choices, what="choice index")
        rank, last = labels.shape.rank, labels.shape[-1] if labels.shape.rank else None
        if not sparse and rank is not None and rank > 1 and last != 1:
            return labels  # Soft targets under a loss of your own, as `_checked_labels` leaves them.
        return class_ids_checked_in_graph(labels, self.num_choices, what="choices")

    @deterministic_preprocess
    def preprocess(self, x, y=None, sample_weight=None, preprocessor=None):
        """`(contexts, choices)` -> features of shape `(batch, num_choices,
        sequence_length)`: each context packed with each of its choices."""
        preprocessor = self.preprocessor if preprocessor is None else preprocessor
        contexts, choices = x
        choices = tf.convert_to_tensor(choices)
        self._check_choice_count(choices.shape)
        if choices.shape.rank == 2 and choices.shape[1] is None:  # A dataset's batches: checked as each one comes.
            counts = tf.fill([1], tf.shape(choices)[1])
            choices = guarded(choices, (counts == self.num_choices, self._choice_count_message(), counts))
        choices = tf.ensure_shape(choices, [None, self.num_choices])
        # Every context is paired with each of its choices, then regrouped.
        firsts = tf.repeat(contexts, self.num_choices)
        features = preprocessor((firsts, tf.reshape(choices, [-1])))
        length = preprocessor.sequence_length
        features = {k: tf.reshape(v, [-1, self.num_choices, length]) for k, v in features.items()}
        return keras.utils.pack_x_y_sample_weight(features, y, sample_weight)

    # --- Serving ----------------------------------------------------------
    def serving_signatures(self, preprocessor=None, pairs="auto"):
        """`serving_default(context, choices[batch, num_choices])` (with a
        preprocessor) and `serving_tokenized` (a choices axis), returning
        `logits`, `probabilities` and `label_ids`, the chosen index."""
        serving = TextServing(self, preprocessor, outputs=lambda outputs, features: classification_outputs(outputs))
        functions = serving.tokenized_signatures()
        if preprocessor is None:
            return functions

        def choose(context, choices):
            context, choices = same_size(context, choices, "context", "choices", rows=True)
            return serving.run(self.preprocess((context, choices), preprocessor=preprocessor))

        functions["serving_default"] = string_function(choose, context=[None], choices=[None, self.num_choices])
        return functions
