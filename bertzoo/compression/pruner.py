"""Magnitude pruning for Keras 3 models: unstructured, block and N:M.

Design: each pruned weight gets a mask (a non-trainable variable) and a
Keras variable constraint. Keras optimizers apply variable constraints inside
`optimizer.apply()`, right after the update, in the compiled train step. The
constraint (a) recomputes the mask from the weight magnitudes on the steps
the schedule says, and (b) multiplies the weight by its mask. So pruned
weights are exactly zero after every step, the forward pass needs no wrapper
layer (the model's graph is unchanged), and pruning composes with any
trainer that updates weights through a Keras optimizer: `model.fit`, a
`bertzoo.Distiller`, or a custom `train_step`.

The masks and step counters live in a `PruningState` layer attached to the
model, so `model.save_weights()`, `ModelCheckpoint` and `BackupAndRestore`
checkpoint them with the weights (and optimizer), and training resumes on
schedule after `load_weights()` into a model with the same `Pruner`.
"""

import difflib
import re

import keras
import numpy as np
from keras import ops

from bertzoo.compression.masks import block_scores
from bertzoo.compression.masks import expand_blocks
from bertzoo.compression.masks import magnitude_threshold
from bertzoo.compression.masks import n_of_m_mask
from bertzoo.compression.masks import parse_pattern
from bertzoo.compression.masks import prunable_weights
from bertzoo.compression.model_copy import PRUNING_STATE_ATTR
from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.model_copy import pruning_state
from bertzoo.compression.schedules import check_schedule
from bertzoo.utils import quantization_mode

SCOPES = ("layer", "global")
# Canonical names (`BertBackbone.named_weights()`) of the weights
# `layers="encoder"` and `include_embeddings=True` select.
_ENCODER_KERNELS = re.compile(r"(attention_\d+/(query|key|value|output)|feedforward_\d+/(intermediate|output))/kernel")
_EMBEDDING_TABLES = ("embeddings/token", "embeddings/position", "embeddings/segment", "embeddings/projection/kernel")


# --- State and constraint ---------------------------------------------------
class _Target:
    """One pruned weight: the layer path, the variable, the input axis."""

    def __init__(self, path, layer, variable, input_axis):
        self.path = path
        self.layer = layer
        self.variable = variable
        self.input_axis = input_axis


@keras.saving.register_keras_serializable(package="bertzoo")
class PruningState(keras.layers.Layer):
    """Non-trainable pruning state: one mask and one step counter per pruned
    weight, and the cached global threshold. Built by `Pruner`; saved with
    the model's weights.

    `steps[i]` counts the optimizer updates weight `i` received, i.e. the
    schedule's step. Each weight keeps its own counter so that the state never
    depends on the order in which the optimizer visits variables.
    """

    def __init__(self, shapes, names, variable_dtype="float32", **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.names = list(names)
        self.variable_dtype = variable_dtype
        self.masks, self.steps = [], []
        for shape, name in zip(self.shapes, self.names):
            self.masks.append(
                self.add_weight(
                    shape=shape,
                    dtype=variable_dtype,
                    initializer="ones",
                    trainable=False,
                    name=f"{name}_mask",
                )
            )
            self.steps.append(
                self.add_weight(shape=(), dtype="int64", initializer="zeros", trainable=False, name=f"{name}_step")
            )
        self.global_threshold = self.add_weight(
            shape=(), dtype="float32", initializer="zeros", trainable=False, name="global_threshold"
        )
        self.global_step = self.add_weight(
            shape=(),
            dtype="int64",
            initializer=keras.initializers.Constant(-1),
            trainable=False,
            name="global_threshold_step",
        )
        self.built = True

    def call(self, inputs):
        return inputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {"shapes": [list(s) for s in self.shapes], "names": self.names, "variable_dtype": self.variable_dtype}
        )
        return config


class _MaskConstraint(keras.constraints.Constraint):
    """Updates weight `index`'s mask on schedule and applies it. Attached to
    the variable (not to the layer's config), so model configs stay clean."""

    def __init__(self, pruner, index, inner=None):
        self.pruner = pruner
        self.index = index
        self.inner = inner

    def __call__(self, w):
        if self.inner is not None:
            w = self.inner(w)
        state = self.pruner.state
        mask = state.masks[self.index]
        step = state.steps[self.index]
        current = ops.convert_to_tensor(mask)
        should_prune, sparsity = self.pruner.schedule(ops.convert_to_tensor(step))
        new_mask = self.pruner._new_mask(self.index, w, should_prune, sparsity, current)
        mask.assign(new_mask)
        step.assign(step + 1)
        return w * ops.cast(new_mask, w.dtype)

    def get_config(self):
        # The masks live in the model's PruningState, not in this object.
        return {"index": self.index}


# --- Pruner -----------------------------------------------------------------
class Pruner:
    """Magnitude pruning during training, on a schedule (tfmot semantics).

    Selected weights get masks that are recomputed from weight magnitudes on
    the schedule's steps and re-applied after every optimizer update, inside
    the compiled train step. The model's graph is unchanged; `strip()` gives
    an ordinary copy with the zeros baked in.

    Args:
        model: a bertzoo task or backbone (or any built Keras model, with
            `layers` given as paths or a callable).
        schedule: `bertzoo.PolynomialDecay(...)` or `bertzoo.ConstantSparsity(...)`.
        layers: `"encoder"` (default: every dense kernel of the attention and
            feed-forward blocks), a list of layer paths such as
            `["attention_0/query", "feedforward_1/intermediate"]`, or a
            callable `fn(layer) -> bool` over the model's Dense and Embedding
            layers.
        include_embeddings: also prune the token, position and segment tables
            (and ALBERT's embedding projection).
        scope: `"layer"`: each weight reaches the target sparsity;
            `"global"`: one magnitude threshold across all pruned weights.
        pattern: None (unstructured), a block shape `"RxC"` (`"1x4"`,
            `"4x1"`: blocks of R input rows by C output columns, scored by
            mean magnitude), or `"N:M"` (`"2:4"`: N of every M consecutive
            weights along the input dimension kept; the schedule then decides
            only when, and its final sparsity must be `1 - N/M`).

    The schedule's step is the number of optimizer updates since the Pruner
    was attached; masks are computed after the update of that step. Attach
    the Pruner before compiling any trainer that should prune (a trainer
    compiled earlier must be compiled again).

    Checkpoints: `model.save_weights()` (and so `ModelCheckpoint` /
    `BackupAndRestore`) holds the masks and step counters with the weights
    and optimizer state. To resume: build the model, attach a `Pruner` with
    the same arguments, compile, `model.optimizer.build(model.trainable_variables)`,
    `model.load_weights(path)`, and fit on. To resume a `fit` interrupted
    mid-epoch exactly (same data order, dropout and masks as an uninterrupted
    run), pass `callbacks=[bertzoo.ResumableTraining(backup_dir)]` to
    `pruner.fit`. Save whole models (`.keras`, presets) from `strip()`.

    Example:
    ```python
    model = bertzoo.BertClassifier.from_preset("tiny", num_classes=2)
    pruner = bertzoo.Pruner(model, bertzoo.PolynomialDecay(
        initial_sparsity=0.0, final_sparsity=0.9, begin_step=0, end_step=2000, frequency=100))
    pruner.fit(texts, labels, epochs=3)  # A bertzoo task comes compiled with its defaults.
    pruned = pruner.strip()
    print(bertzoo.sparsity_report(pruned))
    ```
    """

    def __init__(self, model, schedule, layers="encoder", include_embeddings=False, scope="layer", pattern=None):
        if not isinstance(model, keras.Model):
            raise ValueError(f"`model` must be a Keras model, got {type(model).__name__}.")
        if not model.built:
            raise ValueError(f"{type(model).__name__} '{model.name}' is not built: call it on data first.")
        if pruning_state(model) is not None:
            raise ValueError(
                f"{type(model).__name__} '{model.name}' already has a Pruner attached. Keep using "
                "that Pruner, or prune `pruner.strip()` (a plain copy) instead."
            )
        if quantization_mode(model):
            raise ValueError(
                f"{type(model).__name__} '{model.name}' is quantized ({quantization_mode(model)}): "
                "prune the float model first, then quantize the stripped result."
            )
        self.schedule = check_schedule(schedule)
        if scope not in SCOPES:
            raise ValueError(f"Unknown `scope`={scope!r}. Expected 'layer' or 'global'.")
        self.scope = scope
        self.pattern = pattern
        self._pattern = parse_pattern(pattern)
        if self._pattern and self._pattern[0] == "n:m":
            _, n, m = self._pattern
            if scope == "global":
                raise ValueError(
                    f"pattern={pattern!r} keeps {n} of every {m} weights everywhere, so it has no "
                    "global threshold: use scope='layer'."
                )
            if not np.isclose(self.schedule.final_sparsity, 1 - n / m):
                raise ValueError(
                    f"pattern={pattern!r} prunes exactly {1 - n / m:g} of the weights, but the "
                    f"schedule's final sparsity is {self.schedule.final_sparsity:g}. Use e.g. "
                    f"bertzoo.ConstantSparsity({1 - n / m:g}, begin_step=0)."
                )
        self.layers = layers
        self.include_embeddings = bool(include_embeddings)
        self._model = model
        self.targets = self._select(model, layers, self.include_embeddings)

        variable_dtype = self.targets[0].variable.dtype
        self.state = PruningState(
            [t.variable.shape for t in self.targets],
            [re.sub(r"[^0-9A-Za-z_]", "_", t.path) for t in self.targets],
            variable_dtype=variable_dtype,
            name="pruning_state",
        )
        setattr(model, PRUNING_STATE_ATTR, self.state)
        for index, target in enumerate(self.targets):
            target.variable.constraint = _MaskConstraint(self, index, inner=target.variable.constraint)
        # Steps traced before the constraints existed would not prune.
        model.train_function = None

    # --- Selection --------------------------------------------------------
    @staticmethod
    def _encoder_and_embedding_paths(model, candidates):
        """The layer paths `layers="encoder"` and `include_embeddings` stand
        for, from the backbone's canonical weight names; None without one."""
        backbone = getattr(model, "backbone", model)
        if not hasattr(backbone, "named_weights"):
            return None, None
        path_of = {id(variable): path for path, (_, variable, _) in candidates.items()}
        named = backbone.named_weights()
        encoder = [path_of[id(v)] for name, v in named.items() if _ENCODER_KERNELS.fullmatch(name)]
        embeddings = [path_of[id(named[name])] for name in _EMBEDDING_TABLES if name in named]
        return encoder, embeddings

    def _select(self, model, layers, include_embeddings):
        candidates = prunable_weights(model)
        encoder, embeddings = self._encoder_and_embedding_paths(model, candidates)
        if isinstance(layers, str) and layers == "encoder":
            if encoder is None:
                raise ValueError(
                    f"layers='encoder' needs a bertzoo backbone or task; {type(model).__name__} "
                    "has none. Pass a list of layer paths or a callable."
                )
            paths = list(encoder)
        elif callable(layers) and not isinstance(layers, str):
            paths = [path for path, (layer, _, _) in candidates.items() if layers(layer)]
        elif isinstance(layers, (list, tuple)) and all(isinstance(p, str) for p in layers):
            paths = list(dict.fromkeys(layers))
            for path in paths:
                if path not in candidates:
                    close = difflib.get_close_matches(path, list(candidates), n=3)
                    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                    raise ValueError(
                        f"Cannot prune layer {path!r}: {type(model).__name__} '{model.name}' has "
                        f"no Dense or Embedding layer with that path.{hint} Prunable layers: "
                        f"{', '.join(list(candidates)[:12])}{', ...' if len(candidates) > 12 else ''}."
                    )
        else:
            raise ValueError(f"`layers` must be 'encoder', a list of layer paths or a callable, got {layers!r}.")
        if include_embeddings:
            if embeddings is None:
                raise ValueError(
                    "include_embeddings=True needs a bertzoo backbone or task; list the embedding "
                    "layers' paths in `layers` instead."
                )
            paths += [p for p in embeddings if p not in paths]
        if not paths:
            raise ValueError("No layer selected for pruning: `layers` matched nothing.")

        targets = []
        for path in paths:
            layer, variable, axis = candidates[path]
            if getattr(layer, "lora_enabled", False):
                raise ValueError(f"Layer {path!r} has LoRA enabled: its kernel is frozen and cannot be pruned.")
            if not variable.trainable:
                raise ValueError(
                    f"Layer {path!r} is frozen (trainable=False): masks are applied in the optimizer "
                    "update, which never touches it. Unfreeze it or leave it out of `layers`."
                )
            if self._pattern and self._pattern[0] == "n:m" and variable.shape[axis] % self._pattern[2]:
                raise ValueError(
                    f"pattern={self.pattern!r} needs the input dimension of {path!r} "
                    f"({variable.shape[axis]}) to be a multiple of {self._pattern[2]}."
                )
            targets.append(_Target(path, layer, variable, axis))
        # One target per variable (shared ALBERT blocks appear once anyway).
        unique = {}
        for t in targets:
            unique.setdefault(id(t.variable), t)
        return list(unique.values())

    # --- Masks (run inside the train step) --------------------------------
    def _scores(self, index, w):
        magnitudes = ops.abs(ops.cast(w, "float32"))
        if self._pattern and self._pattern[0] == "block":
            return block_scores(magnitudes, self._pattern[1], self._pattern[2])
        return magnitudes

    def _mask_from_scores(self, index, scores, threshold):
        keep = ops.cast(scores > threshold, self.state.masks[index].dtype)
        if self._pattern and self._pattern[0] == "block":
            keep = expand_blocks(keep, self.targets[index].variable.shape, self._pattern[1], self._pattern[2])
        return keep

    def _global_threshold(self, index, w, sparsity):
        scores = []
        for i, target in enumerate(self.targets):
            value = w if i == index else ops.convert_to_tensor(target.variable)
            scores.append(ops.reshape(self._scores(i, value), (-1,)))
        return magnitude_threshold(ops.concatenate(scores, axis=0), sparsity)

    def _new_mask(self, index, w, should_prune, sparsity, current):
        dtype = current.dtype
        if self._pattern and self._pattern[0] == "n:m":
            _, n, m = self._pattern
            axis = self.targets[index].input_axis
            active = ops.logical_and(should_prune, sparsity > 0)
            return ops.cond(
                active,
                lambda: ops.cast(n_of_m_mask(ops.abs(w), n, m, axis), dtype),
                lambda: current,
            )
        if self.scope == "layer":

            def prune():
                scores = self._scores(index, w)
                return self._mask_from_scores(index, scores, magnitude_threshold(scores, sparsity))

            return ops.cond(should_prune, prune, lambda: current)
        # Global: the first weight updated in a pruning step computes the
        # threshold over all pruned weights; the others reuse it.
        state = self.state
        step = ops.convert_to_tensor(state.steps[index])
        cached = ops.convert_to_tensor(state.global_threshold)
        need = ops.logical_and(should_prune, ops.not_equal(ops.convert_to_tensor(state.global_step), step))
        threshold = ops.cond(need, lambda: self._global_threshold(index, w, sparsity), lambda: cached)
        state.global_threshold.assign(threshold)
        state.global_step.assign(ops.where(should_prune, step, ops.convert_to_tensor(state.global_step)))
        return ops.cond(
            should_prune,
            lambda: self._mask_from_scores(index, self._scores(index, w), threshold),
            lambda: current,
        )

    # --- Training ---------------------------------------------------------
    @property
    def model(self):
        """The model being pruned (it trains in place)."""
        return self._model

    @property
    def step(self):
        """The schedule's current step (optimizer updates so far)."""
        return int(max(int(ops.convert_to_numpy(s)) for s in self.state.steps))

    def compile(self, *args, **kwargs):
        """Compiles the model (a bertzoo task fills in its fine-tuning defaults)."""
        return self._model.compile(*args, **kwargs)

    def fit(self, *args, callbacks=None, **kwargs):
        """Trains the model with `model.fit` (raw strings, pairs, datasets:
        whatever the model accepts); the epoch logs gain `sparsity`."""
        if not self._model.compiled:
            raise ValueError(
                f"{type(self._model).__name__} '{self._model.name}' is not compiled: call "
                "pruner.compile(optimizer=..., loss=...) first (bertzoo tasks come compiled with their "
                "fine-tuning defaults)."
            )
        callbacks = list(callbacks or []) + [_SparsityLogger(self)]
        return self._model.fit(*args, callbacks=callbacks, **kwargs)

    def sparsity(self):
        """The current fraction of zeros across the pruned weights."""
        zeros = total = 0
        for target in self.targets:
            value = ops.convert_to_numpy(target.variable)
            zeros += int(np.sum(value == 0))
            total += value.size
        return zeros / total

    def strip(self):
        """Returns an ordinary copy of the model (same class, no masks or
        constraints) with the pruned weights set to zero.

        Example:
        ```python
        pruned = pruner.strip()
        pruned.save_to_preset("runs/pruned")
        ```
        """
        masks = {id(t.variable): ops.convert_to_numpy(self.state.masks[i]) for i, t in enumerate(self.targets)}

        def apply_mask(variable, value):
            mask = masks.get(id(variable))
            return value if mask is None else value * mask.astype(value.dtype)

        return copy_model(self._model, transform=apply_mask)

    def get_config(self):
        return {
            "schedule": keras.saving.serialize_keras_object(self.schedule),
            "layers": [t.path for t in self.targets],
            "include_embeddings": self.include_embeddings,
            "scope": self.scope,
            "pattern": self.pattern,
        }

    def __repr__(self):
        return (
            f"Pruner({type(self._model).__name__} '{self._model.name}', {self.schedule!r}, "
            f"{len(self.targets)} weights, scope={self.scope!r}, pattern={self.pattern!r})"
        )


class _SparsityLogger(keras.callbacks.Callback):
    def __init__(self, pruner):
        super().__init__()
        self.pruner = pruner

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["sparsity"] = round(self.pruner.sparsity(), 4)
