"""Sentence and sentence-pair classification."""

from collections.abc import Mapping

import keras
import numpy as np

from bertzoo.layers.dense import Dense
from bertzoo.layers.dropout import Dropout
from bertzoo.models.head_utils import activation_name
from bertzoo.models.head_utils import check_class_ids
from bertzoo.models.head_utils import check_classes
from bertzoo.models.head_utils import class_ids_checked_in_graph
from bertzoo.models.head_utils import class_ids_of_names
from bertzoo.models.head_utils import class_ids_of_names_in_graph
from bertzoo.models.head_utils import refuse_one_hot
from bertzoo.models.serving import classification_outputs
from bertzoo.models.task import Task
from bertzoo.utils.checks import check_rate
from bertzoo.utils.optional import tf


@keras.saving.register_keras_serializable(package="bertzoo")
class BertClassifier(Task):
    """A BERT classifier: backbone, dropout, and a dense layer over the pooled
    `[CLS]` output, giving logits (BERT paper, Fig. 4a/4b).

    Args:
        backbone: a `bertzoo.BertBackbone`.
        num_classes: number of labels; None (the default) means
            `len(class_names)`, or 2 (binary, e.g. sentiment) without names.
        preprocessor: a `bertzoo.text.BertPreprocessor`, or None for
            tokenized inputs.
        dropout: dropout on the pooled output.
        activation: activation of the output layer; None gives logits. The
            default loss follows it (see `default_loss`). A Keras activation
            name or function, or TensorFlow's (`tf.nn.softmax` is recorded
            as "softmax"); a function of your own is refused, as a preset
            could not load it without running code.
        class_names: optional label names, used by exports.

    Example:

    ```python
    model = bertzoo.BertClassifier.from_preset("tiny")  # 2 classes, compiled with the defaults
    model.fit(["a gripping, funny film", "dull and far too long"], [1, 0])
    model.predict(["one more"]).shape  # (1, 2)
    ```
    """

    # Neither shapes a weight: a loaded head keeps its weights when they change.
    weightless_head_arguments = Task.weightless_head_arguments + ("activation", "class_names")

    def __init__(
        self,
        backbone,
        num_classes=None,
        preprocessor=None,
        dropout=0.1,
        activation=None,
        class_names=None,
        **kwargs,
    ):
        if num_classes is None:
            num_classes = len(class_names) if class_names is not None else 2
        self.check_head_arguments(num_classes, dropout=dropout, activation=activation, class_names=class_names)
        activation = activation_name(activation)
        policy = backbone.dtype_policy
        self.output_dropout = Dropout(dropout, dtype=policy, name="output_dropout")
        # Mixed-precision models emit float32 logits for a stable loss.
        head_dtype = "float32" if policy.compute_dtype != "float32" else policy
        self.output_dense = Dense(
            num_classes,
            activation=activation,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=head_dtype,
            name="logits",
        )
        inputs = backbone.input
        outputs = self.compute_head_outputs(inputs, backbone(inputs))
        super().__init__(inputs=inputs, outputs=outputs, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_classes = num_classes
        self.dropout = float(dropout)
        self.activation = activation
        self.class_names = list(class_names) if class_names is not None else None

    trims_padding = True  # One output row per example: padding is never read.

    def compute_head_outputs(self, inputs, features, training=None):
        pooled = self.output_dropout(features["pooled_output"], training=training)
        return self.output_dense(pooled)

    @classmethod
    def check_head_arguments(cls, num_classes=None, dropout=0.1, activation=None, class_names=None):
        if num_classes is None:  # The constructor's default.
            num_classes = len(class_names) if class_names is not None else 2
        check_classes(num_classes, class_names)
        check_rate("dropout", dropout)
        activation_name(activation)

    def default_loss(self):
        """The loss the head's outputs call for: binary cross-entropy for
        sigmoid (0/1 or multi-hot targets), mean squared error for one output
        otherwise (regression), else cross-entropy on class ids (on logits,
        or on the probabilities of a softmax)."""
        activation = self._activation_name()
        if activation == "sigmoid":
            return keras.losses.BinaryCrossentropy()
        if self.num_classes == 1:
            return keras.losses.MeanSquaredError()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=activation != "softmax")

    def default_metrics(self):
        if self._activation_name() == "sigmoid":
            return [keras.metrics.BinaryAccuracy(name="accuracy")]
        if self.num_classes == 1:
            return [keras.metrics.MeanAbsoluteError(name="mae")]
        return super().default_metrics()

    def _activation_name(self):
        """The output activation by name ("linear" for none)."""
        return self.activation or "linear"

    def fit(self, *args, **kwargs):
        class_weight = kwargs.get("class_weight")
        if isinstance(class_weight, Mapping) and any(isinstance(k, (str, bytes)) for k in class_weight):
            # Keyed by class name, as string labels are: Keras's keys are ids.
            names = [k.decode("utf-8") if isinstance(k, bytes) else k for k in class_weight]
            if not all(isinstance(n, str) for n in names):
                raise ValueError(
                    f"`class_weight` keys must all be class ids or all class names, got {list(class_weight)}."
                )
            ids = class_ids_of_names(names, self.class_names, "classifier", kind="class_weight keys")
            kwargs["class_weight"] = dict(zip(ids, class_weight.values()))
        return super().fit(*args, **kwargs)

    def _raw_to_tensors(self, x, y):
        return super()._raw_to_tensors(x, self._checked_labels(y) if y is not None else None)

    def _checked_labels(self, y, features=None):
        if isinstance(y, Mapping):
            return y
        values = np.asarray(y)
        loss = getattr(self, "loss", None)
        if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
            refuse_one_hot(values.shape, self.num_classes)
        elif isinstance(loss, keras.losses.BinaryCrossentropy) and self.num_classes > 1 and values.ndim == 1:
            raise ValueError(
                f"This sigmoid head scores {self.num_classes} classes independently: its labels are 0/1 rows of "
                f"shape (n, {self.num_classes}) (multi-hot), got shape {values.shape}. For one class id per "
                "example build the head with activation=None (or 'softmax')."
            )
        return self.label_ids(y)

    def label_ids(self, labels):
        """`labels` as class ids: class names (strings, with `class_names`)
        map to their index; ids pass through, once checked to be whole numbers
        in `[0, num_classes)` (one per example, for a head of two classes or
        more that is not a sigmoid one). One label per example comes back as one
        flat column, shape `(n,)`, whether given as `(n,)` or `(n, 1)`: Keras
        retraces its training step for a new label rank with one of unknown
        rank, which its loss cannot take ("Cannot take the length of shape
        with unknown rank"). `fit` and `evaluate` call it on raw labels.

        Example:
        ```python
        model = bertzoo.BertClassifier.from_preset("tiny", class_names=["neg", "pos"])
        model.label_ids(["pos", "neg"])  # array([1, 0], dtype=int32)
        ```
        """
        values = np.asarray(labels)
        if values.dtype.kind not in "USO" or not any(isinstance(v, (str, bytes)) for v in values.ravel()):
            if not self._takes_class_ids(values):
                return labels
            check_class_ids(values, self.num_classes)
            return values.reshape(-1) if values.ndim == 2 else labels
        names = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.ravel()]
        ids = np.asarray(class_ids_of_names(names, self.class_names, "classifier"), "int32")
        return ids.reshape(values.shape[:1] if values.ndim == 2 and values.shape[1] == 1 else values.shape)

    def _labels_checked_in_graph(self, labels):
        if not hasattr(labels, "dtype"):
            return labels
        loss = getattr(self, "loss", None)
        if isinstance(loss, keras.losses.SparseCategoricalCrossentropy) and labels.shape.rank is not None:
            refuse_one_hot(tuple(labels.shape), self.num_classes)  # Keras: "Argument 'output' must have rank ..."
        if not self._takes_class_ids(labels):
            return labels
        if labels.dtype == tf.string:
            labels = class_ids_of_names_in_graph(labels, self.class_names, "classifier")
        return class_ids_checked_in_graph(labels, self.num_classes)

    def _takes_class_ids(self, values):
        # One id per example for a softmax (or logits) head of several
        # classes; a one-class head may regress, other shapes are one-hot or
        # multi-label targets.
        one_per_example = values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)
        return one_per_example and self.num_classes > 1 and self._activation_name() != "sigmoid"

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "dropout": self.dropout,
            "activation": self.activation,
            "class_names": self.class_names,
        }

    def serving_outputs(self, outputs):
        """`logits`, `probabilities`, `label_ids` (and `label_names` with
        `class_names`), see `classification_outputs`; a regression head
        (one output, no activation) or one with another activation (e.g.
        sigmoid, multi-label) serves its `scores`."""
        activation = self._activation_name()
        regression = self.num_classes == 1 and activation == "linear"
        if activation in ("linear", "softmax") and not regression:
            return classification_outputs(outputs, self.class_names, None if activation == "linear" else "softmax")
        return {"scores": outputs}
