"""Base class for task models: a backbone, a head, and raw-text handling."""

import inspect
import logging
import numbers
import weakref

import keras
import numpy as np

from bertzoo.models.compile_defaults import DefaultCompileMixin
from bertzoo.models.early_attributes import EarlyAttributesMixin
from bertzoo.models.head_utils import check_two_segments
from bertzoo.models.input_keys import DeclaredInputsMixin
from bertzoo.models.jax_predict import JaxPredictOnBatchMixin
from bertzoo.models.optimizers import bert_optimizer
from bertzoo.models.raw_inputs import DEFAULT_BATCH_SIZE
from bertzoo.models.raw_inputs import RawInputsMixin
from bertzoo.models.raw_inputs import check_dataset_carries_targets
from bertzoo.models.raw_inputs import eager_strings_as_arrays
from bertzoo.models.raw_inputs import holds_no_examples
from bertzoo.models.raw_inputs import holds_text
from bertzoo.models.raw_inputs import is_stream
from bertzoo.models.raw_inputs import is_tokenized
from bertzoo.models.raw_inputs import validation_parts
from bertzoo.models.resumable import EpochOrder
from bertzoo.models.serving import LENGTH_MULTIPLE
from bertzoo.models.serving import ExportMixin
from bertzoo.models.serving import TextServing
from bertzoo.models.serving import named_outputs
from bertzoo.models.serving import trim_padding
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import save_preset
from bertzoo.saving.serialization import quantize_layers
from bertzoo.saving.serialization import quantized_policy_map
from bertzoo.text.normalization import non_text_message
from bertzoo.utils.checks import check_config_keys
from bertzoo.utils.checks import check_keyword_arguments
from bertzoo.utils.checks import constructor_arguments
from bertzoo.utils.checks import public_settings
from bertzoo.utils.checks import vocabulary_overflow
from bertzoo.utils.device import strategy_scope_of
from bertzoo.utils.layers import assign_copy
from bertzoo.utils.optional import is_tf_dataset
from bertzoo.utils.optional import tf
from bertzoo.utils.private_api import deferred_initialization
from bertzoo.utils.private_api import flatten_layers

# `predict`, `fit` and `evaluate` tokenize in-memory inputs up to this many
# examples eagerly, larger ones stream through tf.data (see
# `Task._preprocess_in_memory` and `Task._as_dataset`).
EAGER_PREPROCESS_LIMIT = 4096

# `Task._graph_preprocess`: {task: {trim: (settings, tf.function)}}.
_GRAPH_PREPROCESS = weakref.WeakKeyDictionary()

_NOT_HEAD_ARGUMENTS = ("name", "trainable", "dtype", "backbone", "preprocessor")
# Keras Model arguments `from_preset` passes on (not compared with the saved head's).
_MODEL_ARGUMENTS = ("name", "trainable")
logger = logging.getLogger("bertzoo")


def _as_saved(value):
    """`value` as a config saved to JSON holds it (tuples become lists)."""
    if isinstance(value, (list, tuple)):
        return [_as_saved(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_saved(v) for k, v in value.items()}
    return value


def _takes_seed(preprocess):
    """Whether a task's `preprocess` takes `seed=` (by name, or through `**kwargs`)."""
    parameters = inspect.signature(preprocess).parameters
    return "seed" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _int_features(data, trim=False):
    """Casts bool features (the preprocessor's `padding_mask`) to int32, the
    dtype the models' inputs declare. Under a multi-replica `tf.distribute`
    strategy Keras builds the model from the first batch averaged across
    replicas, which TensorFlow cannot do for bool tensors. With `trim`, the
    padding columns no row of the batch uses are dropped (`trim_padding`,
    in steps of `LENGTH_MULTIPLE`, as serving graphs cut them)."""

    def cast(features):
        features = tf.nest.map_structure(lambda t: tf.cast(t, tf.int32) if t.dtype == tf.bool else t, features)
        return trim_padding(features, multiple=LENGTH_MULTIPLE) if trim else features

    if isinstance(data, tuple):
        return (cast(data[0]),) + data[1:]
    return cast(data)


def deterministic_preprocess(preprocess):
    """Marks a task's `preprocess` as a function of each example alone that
    gives the same result on every call (no random draws, no statistics of
    the batch): `fit` and `evaluate` may then tokenize up to
    `EAGER_PREPROCESS_LIMIT` in-memory examples in one call, once for all
    epochs (`Task._as_dataset`). A subclass that overrides `preprocess` is
    run batch by batch in `tf.data`, every epoch, unless it marks its own.

    Example:
    ```python
    class LowercasingClassifier(bertzoo.BertClassifier):
        @deterministic_preprocess
        def preprocess(self, x, y=None, sample_weight=None, preprocessor=None):
            return super().preprocess(tf.strings.lower(x), y, sample_weight, preprocessor)
    ```
    """
    preprocess.deterministic = True
    return preprocess


def _num_examples(x):
    """The number of in-memory examples in `x` (tensors from
    `_raw_to_tensors`; a tuple of them for pairs)."""
    return int(tf.nest.flatten(x)[0].shape[0])


def _computes_in_float16(task):
    """True when the task's backbone computes in float16 (`"mixed_float16"`
    or `"float16"`)."""
    backbone = getattr(task, "backbone", None)
    return backbone is not None and backbone.dtype_policy.compute_dtype == "float16"


def loss_scaled(optimizer, task):
    """`optimizer` wrapped in a `keras.optimizers.LossScaleOptimizer` when
    `task`'s backbone computes in float16, else unchanged. Keras adds loss
    scaling only when the trained model's own policy is mixed_float16; a
    float16 backbone under a float32 task (or a student under a float32
    `Distiller`) needs it as much: small gradients underflow to zero in
    float16.

    Example:
    ```python
    optimizer = loss_scaled(bert_optimizer(), student)
    ```
    """
    if not _computes_in_float16(task) or optimizer is None:
        return optimizer
    optimizer = keras.optimizers.get(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer)


def _without_labels(dataset):
    """`predict`'s raw-text dataset without its labels and weights (Keras
    ignores them; here they would be preprocessed and checked). Elements of
    two string tensors are refused: by Keras's convention they read as
    (texts, labels), so a pair's second texts would be dropped silently."""
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) < 2:
        return dataset
    if len(spec) == 2 and all(isinstance(s, tf.TensorSpec) and s.dtype == tf.string for s in spec):
        raise ValueError(
            "The dataset's elements are two string tensors, which read as (texts, labels): predict would ignore "
            "the second. For sentence pairs, nest them: `dataset.map(lambda a, b: ((a, b),))`; for texts with "
            "string labels, drop the labels: `dataset.map(lambda texts, labels: texts)`."
        )
    return dataset.map(lambda inputs, *labels_and_weights: (inputs,))  # A 1-tuple keeps a pair nested.


def _is_auto(value):
    return isinstance(value, str) and value == "auto"


def _loss_name(loss):
    """A loss's name, lower case without underscores ("" when it has none):
    `keras.losses.get` resolves strings ("kld" -> kl_divergence)."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return ""
    name = type(loss).__name__ if isinstance(loss, keras.losses.Loss) else getattr(loss, "__name__", "")
    return name.lower().replace("_", "")


def _fits_default_metrics(loss, default):
    """False only for a loss known to read one-hot or soft targets
    (categorical cross-entropy, KL divergence) where the default loss reads
    class ids: the default metrics (class-id accuracy) would fail on those
    labels. Every other loss keeps them."""
    if "sparse" not in _loss_name(default):
        return True
    name = _loss_name(loss)
    # "kld" also starts "kldivergence" (the function and `KLDivergence`).
    return not (("categorical" in name and "sparse" not in name) or name.startswith("kld"))


def _check_examples_pair_up(x, y, sample_weight):
    """Raw inputs (after `_raw_to_tensors`) and their labels and weights hold
    one entry per example: a ValueError naming the lengths otherwise (from
    `tf.data` it reads "Dimensions 3 and 2 are not compatible")."""
    parts = tf.nest.flatten(x)
    examples = int(parts[0].shape[0])
    if any(int(part.shape[0]) != examples for part in parts[1:]):
        lengths = [int(part.shape[0]) for part in parts]
        raise ValueError(f"The parts of `x` (e.g. the two texts of each pair) have different lengths {lengths}.")
    for name, values in (("y", y), ("sample_weight", sample_weight)):
        if values is None:
            continue
        shape = np.shape(values)
        if not shape:
            raise ValueError(f"`{name}` must hold one entry per example, got the single value {values!r}.")
        if shape[0] != examples:
            raise ValueError(f"`x` has {examples} examples but `{name}` has {shape[0]}: give one per example.")


def check_preprocessor_fits(backbone, preprocessor):
    """Raises a ValueError naming the fix when `preprocessor` makes inputs
    `backbone` cannot read: sequences longer than its position embeddings,
    or token ids past its embedding table (which TensorFlow on a CPU only
    reports, as a bare gather error, once such a token appears)."""
    if preprocessor is None:
        return
    length, longest = getattr(preprocessor, "sequence_length", None), getattr(backbone, "max_sequence_length", None)
    if length is not None and longest is not None and length > longest:
        raise ValueError(
            f"The preprocessor packs sequences of {length} tokens but the backbone has position embeddings "
            f"for {longest}: build the preprocessor with sequence_length={longest} or less (from a preset: "
            f"from_preset(..., sequence_length={longest}))."
        )
    tokenizer, rows = getattr(preprocessor, "tokenizer", None), getattr(backbone, "vocabulary_size", None)
    if tokenizer is not None and rows is not None and hasattr(tokenizer, "vocabulary_size"):
        problem = vocabulary_overflow(tokenizer.vocabulary_size(), rows, "The preprocessor's tokenizer")
        if problem:
            raise ValueError(
                f"{problem} Use the tokenizer the backbone was trained with (from a preset: both come from it), "
                "or a backbone with a table as large as the vocabulary."
            )


class Task(
    DefaultCompileMixin,
    RawInputsMixin,
    ExportMixin,
    DeclaredInputsMixin,
    EarlyAttributesMixin,
    JaxPredictOnBatchMixin,
    keras.Model,
):
    """A functional model around a backbone, with an optional preprocessor.

    With a preprocessor attached, `fit`, `evaluate` and `predict` accept raw
    strings (a list, a NumPy array, or a `tf.data.Dataset`), string pairs as a
    tuple `(first_segments, second_segments)`, or already tokenized dicts; the
    text is tokenized outside the compiled (XLA) step: in `tf.data`, or for up
    to `EAGER_PREPROCESS_LIMIT` in-memory examples once, eagerly.

    Each task owns its preprocessing and its serving: `preprocess` turns raw
    inputs (and labels) into the model's features, the same code
    in `fit`, `evaluate`, `predict` and the exported signatures;
    `serving_signatures` declares what `export` writes.

    Subclasses build their graph in `__init__`, call
    `super().__init__(inputs=..., outputs=..., backbone=..., preprocessor=...)`
    and add their own arguments to `get_config()`. A quantized task's config
    holds, as its `dtype`, a `keras.dtype_policies.DTypePolicyMap` of its
    quantized head layers (the backbone's config has its own), and a task
    built with it quantizes those layers. Tasks whose raw inputs are not text
    (or text pairs) override `preprocess`, `_raw_to_tensors` and
    `serving_signatures`.
    """

    source_preset = None
    # Head arguments that shape no weight: changing one in `from_preset`
    # keeps the saved head.
    weightless_head_arguments = ("dropout",)

    def __init__(self, *args, backbone, preprocessor=None, **kwargs):
        check_keyword_arguments(type(self), kwargs, also=("inputs", "outputs"))
        check_preprocessor_fits(backbone, preprocessor)
        head_dtype = kwargs.get("dtype")
        if isinstance(head_dtype, dict) and head_dtype.get("class_name") == "DTypePolicyMap":
            head_dtype = kwargs["dtype"] = keras.dtype_policies.deserialize(head_dtype)
        if isinstance(head_dtype, keras.dtype_policies.DTypePolicyMap):
            kwargs.pop("dtype")
        super().__init__(*args, **kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor
        if isinstance(head_dtype, keras.dtype_policies.DTypePolicyMap):
            quantize_layers(self._head_layers(), head_dtype)

    def _head_layers(self):
        """The task's layers outside its backbone and preprocessor."""
        skip = {id(layer) for layer in flatten_layers(self.backbone)}
        if self.preprocessor is not None:
            skip.update(id(layer) for layer in flatten_layers(self.preprocessor))
        return [layer for layer in flatten_layers(self, include_self=False) if id(layer) not in skip]

    # --- Configuration ----------------------------------------------------
    def get_config(self):
        """The task's constructor arguments; subclasses add their own."""
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.layers.serialize(self.backbone),
            "preprocessor": keras.layers.serialize(self.preprocessor) if self.preprocessor else None,
        }
        head_dtype = quantized_policy_map(self._head_layers(), self.dtype_policy)
        if head_dtype is not None:
            config["dtype"] = keras.dtype_policies.serialize(head_dtype)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        if isinstance(config.get("preprocessor"), dict):
            config["preprocessor"] = keras.layers.deserialize(config["preprocessor"])
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    # --- Backbone and head ------------------------------------------------
    # True for heads with one row of outputs per token (a tagger): padding
    # rows then carry no prediction (see `compute_features`).
    per_token_outputs = False
    # Raw-text batches drop the padding no example uses (the outputs do not
    # depend on it): a head whose outputs and labels do not follow the
    # sequence length sets it.
    trims_padding = False

    def with_backbone(self, backbone):
        """A new task of this class and head config around `backbone`.

        The one way bertzoo rebuilds a task (copies, structured pruning,
        distillation students). The preprocessor is kept (as a copy, so the
        two tasks share no layer). Head weights are copied when every head
        weight of the new task has the shape of this one's (a backbone of the
        same hidden size); otherwise the whole head keeps its fresh
        initialization, as `from_preset` gives a new head. (Keras's
        `clone_model` rebuilds a task as a plain functional model with new
        layers of the same configuration (fresh weights), without its
        preprocessor; for a copy that stays a task:
        `type(model).from_config(model.get_config())`, then `set_weights`.)

        Example:
        ```python
        small = model.with_backbone(bertzoo.BertBackbone(**smaller_config))
        ```
        """
        preprocessor = None
        if self.preprocessor is not None:
            preprocessor = keras.layers.deserialize(keras.layers.serialize(self.preprocessor))
        task = type(self).from_config({**self.get_config(), "backbone": backbone, "preprocessor": preprocessor})

        def head_weights(model):
            skip = {id(v) for v in model.backbone.weights}
            weights = []
            for layer in task.layers:  # The new task's head layers, found by name in `model`.
                if layer is task.backbone or layer is task.preprocessor or not layer.weights:
                    continue
                weights += [v for v in model.get_layer(layer.name).weights if id(v) not in skip]
            return weights

        sources, targets = head_weights(self), head_weights(task)
        if len(sources) == len(targets) and all(tuple(s.shape) == tuple(t.shape) for s, t in zip(sources, targets)):
            for source, target in zip(sources, targets):
                assign_copy(target, source)
        return task

    def compute_head_outputs(self, inputs, features, training=None):
        """The head: this task's outputs (logits) from its `inputs` and the
        backbone's `features` (`sequence_output`, `pooled_output`, as
        `BertBackbone.compute_features` returns them for `inputs`).

        The task's graph is built with it, so custom training loops (e.g.
        `bertzoo.Distiller`) compute exactly what the model computes.
        """
        raise NotImplementedError(f"{type(self).__name__} does not expose its head as compute_head_outputs().")

    def _backbone_inputs(self, inputs):
        """Hook: the task's inputs -> the backbone's (tasks that reshape
        their inputs, e.g. multiple choice, override it)."""
        return inputs

    def compute_features(self, inputs, training=None, return_attention_scores=False, return_value_states=False):
        """One forward pass that keeps the backbone's intermediates.

        Returns `BertBackbone.compute_features`'s dict for the sequences the
        backbone encodes (`hidden_states`, optionally `attention_scores`,
        ...), plus `padding_mask` (theirs: one row per choice for multiple
        choice), `logits` (the task's outputs, `compute_head_outputs`) and,
        for heads with one output row per token (`per_token_outputs`),
        `logits_mask`: which rows are real tokens.

        Example:
        ```python
        features = model.compute_features(model.preprocessor(texts), return_attention_scores=True)
        features["logits"], features["hidden_states"][-1]
        ```
        """
        encoded = self._backbone_inputs(inputs)
        features = self.backbone.compute_features(
            encoded,
            training=training,
            return_attention_scores=return_attention_scores,
            return_value_states=return_value_states,
        )
        features["padding_mask"] = encoded["padding_mask"]
        features["logits"] = self.compute_head_outputs(inputs, features, training=training)
        if self.per_token_outputs:
            features["logits_mask"] = encoded["padding_mask"]
        return features

    # --- Presets ----------------------------------------------------------
    @classmethod
    def validate_config(cls, config):
        """Raises ValueError naming the first bad entry of a head config (the
        constructor's arguments without `backbone` and `preprocessor`),
        without building anything: the checks the constructor runs
        (`check_head_arguments`). Preset loading calls it before building."""
        check_config_keys(cls, config, provided=("backbone", "preprocessor"))
        cls.check_head_arguments(**{k: v for k, v in config.items() if k not in _NOT_HEAD_ARGUMENTS})

    @classmethod
    def check_head_arguments(cls, **kwargs):
        """Hook: checks the head's own constructor arguments (raising
        ValueError naming the argument), without building anything; the
        constructor and `validate_config` both call it. Accepts all by
        default."""

    @classmethod
    def from_preset(
        cls,
        preset,
        load_weights=True,
        preprocessor="auto",
        sequence_length=None,
        dtype=None,
        verify_checksums=True,
        **kwargs,
    ):
        """Builds this task from a built-in preset name or a preset directory.

        Weights: a preset saved from the same task class restores the whole
        model, head included; its `task.weights.h5` must then be present and
        intact (a missing or unreadable head is a `bertzoo.PresetError`, never
        a random head). A new head on purpose: load the preset into another
        task class, or pass head arguments that differ from the saved ones
        (e.g. `num_classes=5`, or `class_names` of another length, which
        set `num_classes` as in the constructor; not `weightless_head_arguments` such as
        `dropout`, which keep the saved head); then only the backbone weights load, the head
        is freshly initialized (a `BertPretrainer` whose `sentence_objective` or `tie_weights`
        changed keeps its masked-LM head), and a warning on the "bertzoo" logger says so
        (a backbone preset, the usual start of fine-tuning, loads silently).
        Precision is not restored: without `dtype` the model computes in
        Keras's global policy, whatever it was saved in.
        `preprocessor="auto"` builds the preset's tokenizer and packer;
        `preprocessor=None` means inputs arrive tokenized.

        The whole preset is validated before anything is built; every problem
        raises `bertzoo.PresetError`. `verify_checksums=False` loads weights
        that `metadata.json` holds no checksum for (e.g. a preset without
        `metadata.json`), unverified.

        Example:
        ```python
        model = bertzoo.BertClassifier.from_preset("tiny", num_classes=2)
        ```
        """
        preset = Preset.resolve(preset, verify_checksums=verify_checksums)
        same_task = preset.class_name == cls.__name__
        task_config = preset.head_config if same_task else {}
        cls._check_from_preset_arguments(kwargs, task_config)
        names = kwargs.get("class_names")
        if isinstance(names, (list, tuple)) and "num_classes" in task_config and "num_classes" not in kwargs:
            # As the constructor reads it: `num_classes` defaults to the number of names.
            kwargs["num_classes"] = len(names)
        # The model's own name and trainable flag are no head arguments: they keep the saved head.
        model_kwargs = {k: kwargs.pop(k) for k in _MODEL_ARGUMENTS if k in kwargs}
        changed = {
            k: v
            for k, v in kwargs.items()
            if k not in cls.weightless_head_arguments and _as_saved(task_config.get(k)) != _as_saved(v)
        }
        keeps_head = same_task and not changed
        kept_part = cls._kept_head_part(changed, task_config) if same_task and changed else None
        if load_weights:
            preset.check_weights(task=keeps_head or kept_part is not None)  # Before building anything.
        if preset.config.get("task") is not None and not keeps_head:
            changed = changed if same_task else {}
            logger.warning(
                "%s.from_preset(%r): the preset holds a %s%s; %s.",
                cls.__name__,
                preset.name,
                preset.class_name,
                f" and the head arguments {changed} differ from the saved ones" if changed else "",
                f"building a new, randomly initialized {cls.__name__} head on its backbone (the saved head's "
                "weights are not used)"
                if kept_part is None
                else kept_part,
            )
        saved_names = task_config.get("class_names")
        if keeps_head and isinstance(names, (list, tuple)) and saved_names and list(names) != list(saved_names):
            if sorted(map(str, names)) == sorted(map(str, saved_names)):
                # Names follow the saved head's outputs by position: a reorder relabels every prediction.
                logger.warning(
                    "%s.from_preset(%r, class_names=%s): the saved head's classes are %s, in this order; the "
                    "head is kept, so each output now gets another name. Pass the saved order to keep what "
                    "the model predicts, or leave class_names out.",
                    cls.__name__,
                    preset.name,
                    list(names),
                    list(saved_names),
                )
        if not keeps_head:
            task_config.pop("dtype", None)  # The old head's quantization.
            if "class_names" not in kwargs:
                task_config.pop("class_names", None)  # Names of the old head's classes.
        task_config.update(kwargs, **model_kwargs)
        if sequence_length is not None:
            longest = preset.backbone_config.get("max_sequence_length")
            if (
                isinstance(sequence_length, bool)
                or not isinstance(sequence_length, numbers.Integral)
                or sequence_length < 1
            ):
                raise ValueError(f"`sequence_length` must be a positive integer, got {sequence_length!r}.")
            if longest is not None and sequence_length > longest:
                raise ValueError(
                    f"`sequence_length`={sequence_length} is longer than the backbone's "
                    f"max_sequence_length={longest} (its position embeddings); use at most {longest}."
                )
            if preprocessor != "auto":
                raise ValueError(
                    "`sequence_length` sets the preset's preprocessor; with `preprocessor=` given it would be "
                    "ignored: build that preprocessor with the length instead."
                )
        if preprocessor == "auto" and not preset.tokenizes_text:
            if sequence_length is not None:
                raise ValueError(
                    f"Preset {preset.name!r} has no tokenizer (it was saved without one), so `sequence_length` "
                    "has no preprocessor to set: pass tokenized inputs of that length instead."
                )
            preprocessor = None
        if preprocessor == "auto":
            overrides = {"sequence_length": int(sequence_length)} if sequence_length is not None else {}
            preprocessor = preset.build_preprocessor(**overrides)
        # Backbone weights about to be loaded are not drawn at random first (seconds for BERT-base). The
        # head, small, is built outside: a new head initializes as usual.
        with deferred_initialization(enabled=load_weights and preset.has_weights()) as deferred:
            backbone = preset.build_backbone(**({"dtype": dtype} if dtype is not None else {}))
        try:
            model = cls(backbone=backbone, preprocessor=preprocessor, **task_config)
        except TypeError as e:
            raise TypeError(
                f"{cls.__name__}.from_preset({preset.name!r}) could not build the task head: {e}. "
                f"Preset {preset.name!r} holds a {preset.class_name}, so pass the head's "
                f"arguments (e.g. num_classes=2)."
            ) from e
        if load_weights:
            if keeps_head and preset.directory is not None:
                deferred.fill(lambda: preset.load_task_weights(model), model)
            else:
                deferred.fill(lambda: preset.load_backbone_weights(backbone), model)
                model._load_preset_extras(preset, kept_part)
        model.source_preset = preset.name
        return model

    @classmethod
    def _check_from_preset_arguments(cls, kwargs, saved_head_config):
        """TypeError naming any `from_preset` keyword that is neither one of
        this task's head arguments nor the model's `name`/`trainable` (the
        constructor would otherwise swallow it, and a typo go unnoticed)."""
        head = (set(constructor_arguments(cls)) | set(saved_head_config)) - {"backbone", "preprocessor"}
        unknown = sorted(set(kwargs) - head - set(_MODEL_ARGUMENTS))
        if unknown:
            raise TypeError(
                f"{cls.__name__}.from_preset got unexpected keyword argument(s) {unknown}. It takes the "
                f"head's arguments {sorted(head)}, `name`, `trainable`, and its own (`sequence_length`, "
                "`dtype`, `preprocessor`, `load_weights`, `verify_checksums`); tokenizer settings belong to "
                "the preprocessor: pass `preprocessor=` a BertPreprocessor built with them."
            )

    @classmethod
    def _kept_head_part(cls, changed, saved_head_config):
        """Hook: when the head arguments `changed` (a dict) differ from those
        of a saved head of this class (`saved_head_config`), None for a new
        head (the default), or a sentence for the warning saying which part
        of the saved head `_load_preset_extras` still loads."""
        return None

    def _load_preset_extras(self, preset, kept_part=None):
        """Hook: loads head weights a preset keeps beside the backbone (e.g.
        converted pre-training heads, or the part of a saved head that
        `_kept_head_part` described as `kept_part`) when the task weights are
        not restored. Does nothing by default."""

    def save_to_preset(self, directory, metadata=None):
        """Writes the task, its backbone and its vocabulary as a preset directory.

        Example:
        ```python
        model.save_to_preset("runs/sentiment")
        again = bertzoo.BertClassifier.from_preset("runs/sentiment")
        ```
        """
        return save_preset(directory, self.backbone, task=self, metadata=metadata)

    def serving_signatures(self, preprocessor=None, pairs="auto"):
        """`{signature name: tf.function}`: what `export` writes for this task.

        Text tasks (this default): `serving_default(text)`, `serving_pairs(text,
        text_pair)` (with `pairs`; `"auto"`: when the backbone has 2+
        segments) and `serving_tokenized` (the model's inputs), returning
        `serving_outputs`. Without a preprocessor, `serving_default` takes
        token ids. Raw text goes through `preprocess`, as in `predict`.

        Args:
            preprocessor: the `BertPreprocessor` the export packs text with
                (the model's own, or one with another `sequence_length`), or
                None for tokenized signatures only.
            pairs: True, False or `"auto"`.
        """
        serving = TextServing(
            self,
            preprocessor,
            preprocess=lambda x: self.preprocess(x, preprocessor=preprocessor),
            outputs=lambda outputs, features: self.serving_outputs(outputs),
        )
        return serving.signatures(pairs)

    def serving_outputs(self, outputs):
        """The exported signatures' outputs, a dict of tensors, from the
        model's outputs. Default: the outputs by name
        (`bertzoo.models.serving.named_outputs`); subclasses return their
        post-processed predictions (e.g. `classification_outputs`)."""
        return named_outputs(outputs)

    # --- Training defaults ------------------------------------------------
    def compile(
        self,
        optimizer="auto",
        loss="auto",
        metrics="auto",
        jit_compile="auto",
        **kwargs,
    ):
        """Compiles with BERT fine-tuning defaults (construction already
        did; call it to change them).

        `optimizer="auto"`: AdamW (weight decay 0.01, not on biases and
        LayerNorm), peak learning rate 5e-5 with 10% linear warm-up then linear
        decay to zero over the `fit()` run, global gradient-norm clipping at 1.
        `jit_compile="auto"`: XLA where it is faster (see
        `bertzoo.utils.device.resolve_jit_compile`), decided when the model
        first runs; never under a multi-replica `tf.distribute` strategy,
        where Keras cannot use it. `metrics="auto"`: the task's default
        metrics, or none under a loss of your own that reads one-hot or soft
        targets (categorical cross-entropy, KL divergence) where the default
        loss reads class ids: they need another accuracy (e.g.
        `metrics=["categorical_accuracy"]`).
        """
        if optimizer == "auto":
            with strategy_scope_of(self):  # Its slots are made in the strategy this model was built under.
                optimizer = bert_optimizer()
        optimizer = loss_scaled(optimizer, self)
        if metrics == "auto":
            metrics = (
                self.default_metrics() if _is_auto(loss) or _fits_default_metrics(loss, self.default_loss()) else []
            )
        if _is_auto(loss):
            loss = self.default_loss()
        # The model, not `self.dtype_policy`: a bfloat16 or int8 backbone sits
        # under a float32 task policy, and the strategy decides too.
        jit_compile = self._provisional_jit_compile(jit_compile, self)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=jit_compile, **kwargs)

    def default_loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss_sample_weight(self, sample_weight):
        """`sample_weight` (one per example, or as the labels) shaped for this
        task's loss, for trainers that call the loss themselves (the
        `Distiller`). Unchanged by default.

        Example:
        ```python
        loss = model.default_loss()(y, logits, model.loss_sample_weight(weights))
        ```
        """
        return sample_weight

    def default_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    # --- Raw inputs -------------------------------------------------------
    fit_needs_labels = True  # A task whose `fit` makes its own labels says False.

    def _check_fit_inputs(self, x, y, method="fit", validation_data=None, batch_size=None):
        super()._check_fit_inputs(x, y, method, validation_data=validation_data, batch_size=batch_size)
        # Texts, pairs or feature dicts carry no labels: without `y`, Keras
        # would fail deep in the loss ("None values not supported"). So do
        # datasets of inputs alone (or of 1-tuples).
        unlabelled = y is None and isinstance(x, (str, bytes, list, tuple, np.ndarray, dict))
        if is_tf_dataset(x) and y is None:  # With `y`, `check_dataset_carries_targets` says what to do.
            spec = x.element_spec
            unlabelled = not (isinstance(spec, tuple) and len(spec) >= 2)
        if self.fit_needs_labels and unlabelled:
            raise ValueError(
                f"{type(self).__name__}.{method} got no labels: pass `y` (or a tf.data.Dataset of (inputs, "
                "labels)). To learn from unlabelled texts, distill a teacher's predictions instead: "
                "`bertzoo.distill`, or `Pruner.fit(texts, teacher=...)` while pruning."
            )
        parts = validation_parts(validation_data) if validation_data is not None else ()
        if self.fit_needs_labels and len(parts) == 1 and isinstance(parts[0], (list, tuple, np.ndarray, dict)):
            # Refused before training, not by the evaluation after the first epoch.
            raise ValueError(
                f"{type(self).__name__}.{method} got `validation_data` without labels: pass "
                "validation_data=(texts, labels)."
            )

    def _as_dataset(self, x, y=None, sample_weight=None, batch_size=None, shuffle=False, training=False):
        """Returns a batched, preprocessed `tf.data.Dataset`, or None when `x`
        needs no preprocessing (no preprocessor, or already tokenized).

        `training`: `fit`'s data, for a `preprocess` that draws random numbers
        (`_batch_seed_drawer`): fresh draws on every batch of every epoch;
        otherwise the same draws on every pass.

        `shuffle`: a bool, or a `bertzoo.models.resumable.EpochOrder` (from
        `ResumableTraining`): then the dataset holds the batches of all the
        epochs still to run, each epoch in its seeded order."""

        if self.preprocessor is None or is_tokenized(x) or is_stream(x):
            return None
        batch_size = batch_size or DEFAULT_BATCH_SIZE
        trim = self.trims_padding
        eager = False
        if is_tf_dataset(x):
            check_dataset_carries_targets(y, sample_weight)
            dataset = x
            dataset = self._batched(dataset, batch_size)
            spec = dataset.element_spec
            if isinstance(spec, tuple) and len(spec) > 1:  # (inputs, labels[, weights])
                check = self._labels_checked_in_graph
                # Not converted by AutoGraph (the checks are graph code): a label
                # error at trace time reads as itself, not "in user code: ...".
                dataset = dataset.map(
                    tf.autograph.experimental.do_not_convert(
                        lambda inputs, labels, *weights: (inputs, check(labels), *weights)
                    )
                )
            if isinstance(shuffle, EpochOrder):  # `ResumableTraining`: one pass per epoch, resumed.
                dataset = shuffle.repeat(dataset)
        else:
            x, y = self._raw_to_tensors(eager_strings_as_arrays(x), y)
            sample_weight = self._raw_sample_weight(sample_weight, x)
            data = (x,) + tuple(v for v in (y, sample_weight) if v is not None)
            if sample_weight is not None and y is None:
                raise ValueError("`sample_weight` needs `y`.")
            _check_examples_pair_up(x, y, sample_weight)
            # Up to the limit, tokenized once, eagerly: a tf.data map of the
            # preprocessor costs a trace per dataset and about 0.3 s per
            # iterator (each epoch), where a short list tokenizes in
            # milliseconds. Columns are still trimmed batch by batch.
            deterministic = getattr(type(self).preprocess, "deterministic", False)
            eager = deterministic and _num_examples(x) <= EAGER_PREPROCESS_LIMIT

            def tokenize_all(examples):
                return _int_features(self.preprocess(*examples))

            if isinstance(shuffle, EpochOrder):  # `ResumableTraining`: a seeded order per epoch, resumed.
                examples = tf.data.Dataset.from_tensor_slices(data)
                dataset = shuffle.batches(examples, batch_size, prepare=tokenize_all if eager else None)
            else:
                dataset = tf.data.Dataset.from_tensor_slices(tokenize_all(data) if eager else data)
                if shuffle:
                    dataset = dataset.shuffle(int(dataset.cardinality()), reshuffle_each_iteration=True)
                dataset = dataset.batch(batch_size)
        if eager:
            if trim:
                dataset = dataset.map(lambda *d: _int_features(d if len(d) > 1 else d[0], trim))
            return dataset.prefetch(tf.data.AUTOTUNE)
        # (Not for a subclass's own `preprocess` that takes no seed.)
        draw_seed = self._batch_seed_drawer(training) if _takes_seed(self.preprocess) else None
        if draw_seed is None:
            preprocess = self._graph_preprocess(trim)
            if preprocess is None:  # Traced in each pipeline.
                preprocess = lambda *d: _int_features(self.preprocess(*d), trim)  # noqa: E731
            # `*d` keeps pairs whole: element ((a, b), y) -> preprocess((a, b), y).
            dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        else:
            # Seeds drawn in batch order (a sequential map, counting this pass's
            # batches), used by the parallel one: a seeded run treats each batch
            # the same however tf.data schedules the parallel calls.
            dataset = dataset.enumerate().map(lambda index, d: (d if isinstance(d, tuple) else (d,), draw_seed(index)))
            dataset = dataset.map(
                lambda d, seed: _int_features(self.preprocess(*d, seed=seed), trim),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
        return dataset.prefetch(tf.data.AUTOTUNE)

    def _graph_preprocess(self, trim):
        """`preprocess` (then `_int_features(..., trim)`) as one `tf.function`
        per task, traced once per input signature. Each `fit`, `evaluate` or
        `predict` on a `tf.data.Dataset` builds a new pipeline, whose map
        would trace the task's preprocessing again: 1.4 s a pipeline for the
        `tiny` question answerer's (spans to tokens) on a 2-core AMD EPYC
        (docs/performance.md).

        None (trace in each pipeline) unless `preprocess` is a
        `@deterministic_preprocess` (nothing drawn at random) and the
        preprocessor says what its traces read (`graph_settings`). Traced
        again when the preprocessor, one of its settings or one of the
        task's constructor settings changed since, as an eager
        call would follow the change."""
        graph_settings = getattr(self.preprocessor, "graph_settings", None)
        if graph_settings is None or not getattr(type(self).preprocess, "deterministic", False):
            return None
        # The task's own settings: its constructor's (not Keras's `train_function`, `stop_training`, ...).
        own = public_settings(self, names=constructor_arguments(type(self)))
        settings = (self.preprocessor, graph_settings(), own)
        functions = _GRAPH_PREPROCESS.setdefault(self, {})
        cached = functions.get(trim)
        if cached is None or cached[0] != settings:
            # A weak reference: the function must not keep its own key alive.
            task = weakref.ref(self)
            function = tf.function(lambda *d: _int_features(task().preprocess(*d), trim))
            cached = functions[trim] = (settings, function)
        return cached[1]

    def _batch_seed_drawer(self, training):
        """Hook: None, or a function of a batch's index in the current pass
        (an int64 scalar tensor) giving its stateless seed (a shape-(2,)
        tensor), for a `preprocess` that draws random numbers and takes
        `seed=`; called once per dataset, so that each dataset can have a
        stream of its own. `training`: `fit`'s data, else evaluation's (see
        `_as_dataset`). None by default."""
        return None

    def _batched(self, dataset, batch_size):
        """A raw-input `tf.data.Dataset` in batches: one of unbatched
        elements (single strings) is batched here. Hook: a task whose one
        example is more than a string (the tagger's word list) overrides it."""
        if tf.nest.flatten(dataset.element_spec)[0].shape.rank == 0:
            return dataset.batch(batch_size)
        return dataset

    def _labels_checked_in_graph(self, labels):
        """Hook: one batch of labels from a `tf.data.Dataset`, behind the
        in-graph checks a task runs on labels it cannot see up front.
        Unchanged by default."""
        return labels

    def _raw_to_tensors(self, x, y):
        """Hook: raw Python inputs (and labels) -> values for
        `tf.data.Dataset.from_tensor_slices`. Tasks whose raw inputs have
        another shape (lists of words, lists of choices) override it."""

        def strings(values):
            # An empty list is a batch of no strings (not float32, TensorFlow's default).
            values = list(values)
            try:
                return tf.constant(values, dtype=tf.string) if not values else tf.constant(values)
            except (TypeError, ValueError) as e:
                raise ValueError(non_text_message(f"{type(self).__name__}'s text input", values) or str(e)) from None

        if isinstance(x, tuple) and len(x) == 1:  # `(texts,)`: the texts.
            x = x[0]
        if isinstance(x, (str, bytes)):
            x = [x]
        if isinstance(x, tuple) and len(x) != 2:
            raise ValueError(
                f"{type(self).__name__} takes texts as a list of strings, or sentence pairs as a tuple of two "
                f"lists (first texts, second texts); got a tuple of {len(x)}. Pass single texts as a list."
            )
        if isinstance(x, tuple) and len(x) == 2:  # Sentence pairs; two strings are one pair.
            x = tuple(strings([part] if isinstance(part, (str, bytes)) else part) for part in x)
        elif isinstance(x, list) or (isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 1):
            x = strings(x)  # An object array is how pandas hands over a text column (`df[col].values`).
        return x, y

    def _raw_sample_weight(self, sample_weight, x):
        """Hook: in-memory sample weights for the raw inputs `x` as
        `_raw_to_tensors` returned them. Unchanged by default (one weight per
        example); a tagger pads per-word weights as it padded the words."""
        return sample_weight

    @deterministic_preprocess
    def preprocess(self, x, y=None, sample_weight=None, preprocessor=None):
        """Raw inputs (tensors, a batch or all the examples) -> the model's
        features, packed with `y` and `sample_weight` as
        `keras.utils.pack_x_y_sample_weight` does (features alone without `y`).

        The task's preprocessing: `fit` and `evaluate` run it once on all of
        up to `EAGER_PREPROCESS_LIMIT` in-memory examples, else batch by batch
        in `tf.data`; `predict` eagerly, the exported signatures in their
        graph. Tasks that build inputs or labels differently (span labels,
        masking, choices, word alignment) override it; an override that is
        row by row and draws nothing random can say so with
        `@deterministic_preprocess`. `preprocessor`: the `BertPreprocessor`
        to pack with; default `self.preprocessor`.
        """
        if isinstance(x, tuple) and len(x) == 2:
            check_two_segments(self.backbone, "Sentence pairs")
        preprocessor = self.preprocessor if preprocessor is None else preprocessor
        return preprocessor(x, y, sample_weight)

    def _check_text_has_a_preprocessor(self, method, x):
        super()._check_text_has_a_preprocessor(method, x)
        if self.preprocessor is not None and holds_text(x, datasets=True):
            # Again at each use: `model.preprocessor.sequence_length` may have grown since construction.
            check_preprocessor_fits(self.backbone, self.preprocessor)

    def predict(self, x, batch_size=None, **kwargs):
        if self.preprocessor is not None and holds_no_examples(x):
            # Keras cannot predict on zero batches; an empty input gives empty outputs.
            return keras.tree.map_structure(
                lambda t: np.zeros((0,) + tuple(d or 0 for d in t.shape[1:]), t.dtype), self.output
            )
        if x is None:
            raise ValueError(f"{type(self).__name__}.predict got no inputs (x=None): pass the texts to predict on.")
        x = self._checked_stream("predict", x)
        self._check_text_has_a_preprocessor("predict", x)
        features = self._preprocess_in_memory(x)
        if features is not None:
            return super().predict(features, batch_size=batch_size or DEFAULT_BATCH_SIZE, **kwargs)
        if is_tf_dataset(x) and self.preprocessor is not None and not is_tokenized(x):
            x = _without_labels(x)
        dataset = self._as_dataset(x, batch_size=batch_size)
        if dataset is not None:
            x, batch_size = dataset, None
        return super().predict(x, batch_size=batch_size, **kwargs)

    def _preprocess_in_memory(self, x):
        """Tokenizes up to `EAGER_PREPROCESS_LIMIT` raw in-memory examples in
        one eager call, or returns None (larger inputs, datasets, tokenized
        inputs): building a `tf.data` map traces the whole preprocessor, about
        0.5 s per `predict` call, where a short list tokenizes in milliseconds."""

        if self.preprocessor is None or is_tokenized(x) or is_tf_dataset(x) or is_stream(x):
            return None
        x = eager_strings_as_arrays(x)
        # Counted on the raw input (a list, or a tuple of lists for pairs and
        # questions with contexts), so large inputs are converted only once,
        # by `_as_dataset`.
        first = x[0] if isinstance(x, tuple) else x
        if not isinstance(first, (str, bytes)):
            if not hasattr(first, "__len__") or len(first) > EAGER_PREPROCESS_LIMIT:
                return None
        x, _ = self._raw_to_tensors(x, None)
        draw_seed = self._batch_seed_drawer(False) if _takes_seed(self.preprocess) else None
        features = self.preprocess(x) if draw_seed is None else self.preprocess(x, seed=draw_seed(0))
        features, _, _ = keras.utils.unpack_x_y_sample_weight(features)
        return _int_features(features, self.trims_padding)
