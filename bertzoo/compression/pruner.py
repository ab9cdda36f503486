"""Magnitude, movement and second-order pruning for Keras 3 models:
unstructured, block and N:M.

Design: each pruned weight gets a mask (a non-trainable variable) and a
Keras variable constraint. Keras optimizers apply variable constraints inside
`optimizer.apply()`, right after the update, in the compiled train step. The
constraint (a) recomputes the mask from the weight magnitudes on the steps
the schedule says, and (b) multiplies the weight by its mask. So pruned
weights are exactly zero after every step, the forward pass needs no wrapper
layer (the model's graph is unchanged), and pruning composes with any
trainer that updates weights through a Keras optimizer: `model.fit`, a
`bertzoo.Distiller`, or a custom `train_step` (on JAX, whose train step is
stateless, through `Pruner.prepare_trainer`, which `Pruner.fit` calls).

The masks and step counters live in a `PruningState` layer attached to the
model, so `model.save_weights()`, `ModelCheckpoint` and `BackupAndRestore`
checkpoint them with the weights (and optimizer), and training resumes on
schedule after `load_weights()` into a model with the same `Pruner`.

Movement scores (Sanh et al., 2020) rank weights by how far training moved
them away from zero, `S = sum over steps of -grad * W` (up to the learning
rate). The constraint sees the updated weight `w_new`; Keras has already
written it into the variable, so the state keeps each pruned weight's
previous value `w_old` and accumulates `S += w_old * (w_new - w_old)`: the
`-grad * W` sum times the learning rate for plain SGD, and the direction the
weight actually moved for adaptive optimizers such as Adam (and for any
optimizer with weight decay, whose pull toward zero counts as movement).

Second-order scores (`scores="fisher"`) are Optimal Brain Damage's (LeCun et
al., 1990) saliency `F_ii * W**2 / 2` with the empirical Fisher's diagonal
for the Hessian's, as oBERT (Kurtic et al., 2022) uses at block size 1. Adam
already keeps a running mean of each weight's squared gradient (its second
moment): that is the Fisher estimate, so these scores cost no extra state.
"""

import contextlib
import difflib
import logging
import numbers
import re
import weakref

import keras
import numpy as np
from keras import ops

from bertzoo.compression.distiller import PREDICTIONS_ONLY
from bertzoo.compression.distiller import Distiller
from bertzoo.compression.masks import block_scores
from bertzoo.compression.masks import expand_blocks
from bertzoo.compression.masks import keep_mask
from bertzoo.compression.masks import n_of_m_mask
from bertzoo.compression.masks import parse_pattern
from bertzoo.compression.masks import prunable_weights
from bertzoo.compression.masks import score_threshold
from bertzoo.compression.masks import threshold_keeping_ties
from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.model_copy import pruning_state
from bertzoo.compression.schedules import check_schedule
from bertzoo.utils import private_api
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import check_bool
from bertzoo.utils.device import strategy_scope_of
from bertzoo.utils.layers import PRUNING_STATE_ATTR
from bertzoo.utils.layers import assign_copy

logger = logging.getLogger("bertzoo")

SCOPES = ("layer", "global")
SCORES = ("magnitude", "movement", "fisher")
# Canonical names (`BertBackbone.named_weights()`) of the weights
# `layers="encoder"` and `include_embeddings=True` select.
_ENCODER_KERNELS = re.compile(r"(attention_\d+/(query|key|value|output)|feedforward_\d+/(intermediate|output))/kernel")
_EMBEDDING_TABLES = ("embeddings/token", "embeddings/position", "embeddings/segment", "embeddings/projection/kernel")


# --- State and constraint ---------------------------------------------------
# On JAX the train step is stateless and its optimizer step (where the
# constraints run) maps only trainable and optimizer variables, so there the
# pruning state is read and written in these dicts, `{id(variable): value}`,
# one per running step, which `Pruner.prepare_trainer` threads through the
# step's state.
_STEP_VALUES = []


@contextlib.contextmanager
def _step_values(values):
    _STEP_VALUES.append(values)
    try:
        yield values
    finally:
        _STEP_VALUES.pop()


def _read(variable):
    for values in reversed(_STEP_VALUES):
        if id(variable) in values:
            return values[id(variable)]
    return ops.convert_to_tensor(variable)


def _write(variable, value):
    for values in reversed(_STEP_VALUES):
        if id(variable) in values:
            values[id(variable)] = ops.cast(value, variable.dtype)
            return
    # A buffer of its own: on JAX `previous` would share the array the weight is then assigned.
    assign_copy(variable, value)


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

    With `scores="movement"` each weight also has `movement[i]` (float32, the
    accumulated `w_old * (w_new - w_old)`) and `previous[i]` (its value after
    the latest update, the next update's `w_old`).
    """

    def __init__(self, shapes, names, variable_dtype="float32", scores="magnitude", **kwargs):
        kwargs.pop("trainable", None)  # Always False (get_config records it).
        super().__init__(trainable=False, **kwargs)
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.names = list(names)
        # Not `self.variable_dtype`: that is Keras's read-only Layer property.
        self.weight_dtype = variable_dtype
        self.scores = scores
        self.masks, self.steps, self.movement, self.previous = [], [], [], []
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
            if scores == "movement":
                self.movement.append(
                    self.add_weight(
                        shape=shape, dtype="float32", initializer="zeros", trainable=False, name=f"{name}_movement"
                    )
                )
                self.previous.append(
                    self.add_weight(
                        shape=shape, dtype=variable_dtype, initializer="zeros", trainable=False, name=f"{name}_previous"
                    )
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
            {
                "shapes": [list(s) for s in self.shapes],
                "names": self.names,
                "variable_dtype": self.weight_dtype,
                "scores": self.scores,
            }
        )
        return config


_UNCARRIED_STATE = (
    "On the JAX backend a pruned model's trainer must carry the pruning state through its train step: train "
    "with pruner.fit(...), or call pruner.prepare_trainer(trainer) before trainer.fit(...)."
)


class _MaskConstraint(keras.constraints.Constraint):
    """Updates weight `index`'s mask on schedule and applies it. Attached to
    the variable (not to the layer's config), so model configs stay clean."""

    def __init__(self, pruner, index, inner=None):
        self.pruner = pruner
        self.index = index
        self.inner = inner

    def check_trainer(self, trainer):
        """Raises the errors below before `trainer.fit` starts its step
        (bertzoo trainers call it): raised inside a JAX step, Keras loses the
        models' variables with it."""
        optimizer = getattr(trainer, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # Under a LossScaleOptimizer (float16).
        if (getattr(optimizer, "gradient_accumulation_steps", None) or 1) > 1:
            # Keras runs constraints on every accumulation call: the schedule would count micro-batches.
            raise ValueError(
                "Pruning counts optimizer updates, and with gradient_accumulation_steps the optimizer's "
                "constraints (the pruning masks) also run on the calls that only accumulate: train a pruned model "
                "without gradient accumulation (a larger batch instead)."
            )
        if getattr(optimizer, "use_ema", False):
            # Keras writes the averages, kept before the masks applied, into the weights at the end of fit.
            raise ValueError(
                "An optimizer with use_ema=True overwrites the pruned weights with their moving averages at the "
                "end of fit, so pruned weights grow back: train a pruned model with use_ema=False."
            )
        if trainer not in self.pruner._retraced:
            # A trainer that ran before the Pruner attached (a Distiller of the model) keeps its traced step,
            # which reads the constraints as they were then: it would train on without ever pruning.
            trainer.train_function = None
            self.pruner._retraced.add(trainer)
        if keras.backend.backend() == "jax" and not private_api.carries_jax_step_values(
            trainer, self.pruner.state.variables
        ):
            raise RuntimeError(_UNCARRIED_STATE)
        if self.pruner.scores == "fisher":
            outer = getattr(trainer, "optimizer", None)
            if outer is not None and not outer.built and trainer.built:
                with strategy_scope_of(trainer):  # Slots mirrored like the variables, as Keras's fit makes them.
                    outer.build(trainer.trainable_variables)  # What Keras's fit does first; the moments exist then.
            if outer is None or outer.built:  # Else the step itself raises the same error.
                self.pruner._adam_second_moment(self.index, trainer)

    def __call__(self, w):
        if self.inner is not None:
            w = self.inner(w)
        pruner, state = self.pruner, self.pruner.state
        mask = state.masks[self.index]
        step = state.steps[self.index]
        carried = any(id(mask) in values for values in _STEP_VALUES)
        if not carried and keras.backend.backend() == "jax" and private_api.in_stateless_scope():
            raise RuntimeError(_UNCARRIED_STATE)
        current = _read(mask)
        if pruner.scores == "movement":
            # The variable already holds `w`; `previous` holds the value before this update.
            old = ops.cast(_read(state.previous[self.index]), "float32")
            moved = old * (ops.cast(w, "float32") - old)
            _write(state.movement[self.index], _read(state.movement[self.index]) + moved)
        if pruner.schedule is None:  # Fixed masks: only `set_masks` changes them.
            new_mask = current
        else:
            should_prune, sparsity = pruner.schedule(_read(step))
            new_mask = pruner._new_mask(self.index, w, should_prune, sparsity, current)
            _write(mask, new_mask)
        _write(step, _read(step) + 1)
        masked = w * ops.cast(new_mask, w.dtype)
        if pruner.scores == "movement":
            _write(state.previous[self.index], masked)
        return masked

    def get_config(self):
        # The masks live in the model's PruningState, not in this object.
        return {"index": self.index}


# --- Pruner -----------------------------------------------------------------
class Pruner:
    """Magnitude or movement pruning during training, on a schedule (tfmot semantics).

    Selected weights get masks that are recomputed from their scores (weight
    magnitudes, or accumulated movement) on the schedule's steps and
    re-applied after every optimizer update, inside the compiled train step.
    The model's graph is unchanged; `strip()` gives an ordinary copy with the
    zeros baked in.

    Args:
        model: a bertzoo task or backbone (or any built Keras model, with
            `layers` given as paths or a callable).
        schedule: `bertzoo.PolynomialDecay(...)` or `bertzoo.ConstantSparsity(...)`;
            None keeps the masks fixed (all ones until `set_masks()` sets
            them), e.g. to train a lottery ticket.
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
        scores: `"magnitude"` (default): keep the largest `|W|`;
            `"movement"` (Sanh et al., 2020): keep the weights that training
            moves away from zero, ranked by `S`, the sum over updates of
            `w_old * (w_new - w_old)` (for SGD the learning rate times the
            sum of `-grad * W`). Blocks are scored by their mean `S`; N:M
            keeps the N largest `S` of every M. Costs two float copies of
            each pruned weight (`S` and the previous value), saved with the
            masks;
            `"fisher"` (second order: Optimal Brain Damage with the
            empirical Fisher, as oBERT at block size 1): keep the largest
            `(v + epsilon**2) * W**2`, `v` the optimizer's running mean of the weight's
            squared gradients (Adam's second moment, so the model's
            optimizer must be Adam-family, as bertzoo tasks' default is; no extra
            state). Blocks and N:M as for movement.

    On a pruning step the masks are recomputed from every weight's score, so
    a pruned weight may come back if its score is among the kept ones (with
    movement scores a pruned weight's `S` stays as it was when it was pruned:
    a zero weight adds nothing to it); between pruning steps pruned weights
    stay exactly zero.

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

    Distillation from the dense model while pruning (the usual recipe for
    high sparsity): `pruner.fit(..., teacher=dense_copy)` trains the model as
    the student of a `bertzoo.Distiller`; see `fit`.

    Example:
    ```python
    model = bertzoo.BertClassifier.from_preset("runs/finetuned")
    teacher = bertzoo.compression.model_copy.copy_model(model)  # the dense model, before pruning
    pruner = bertzoo.Pruner(model, bertzoo.PolynomialDecay(
        initial_sparsity=0.0, final_sparsity=0.9, begin_step=0, end_step=2000, frequency=100),
        scores="movement")
    # A bertzoo task comes compiled with its defaults; the distiller trains with its optimizer.
    pruner.fit(texts, labels, epochs=3, teacher=teacher, distillation={"temperature": 2.0, "alpha": 0.5})
    pruned = pruner.strip()
    print(bertzoo.sparsity_report(pruned))
    ```
    """

    def __init__(
        self,
        model,
        schedule,
        layers="encoder",
        include_embeddings=False,
        scope="layer",
        pattern=None,
        scores="magnitude",
    ):
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
        self.schedule = None if schedule is None else check_schedule(schedule)
        optimizer = getattr(model, "optimizer", None)
        updates = int(optimizer.iterations) if optimizer is not None and optimizer.built else 0
        if updates and self.schedule is not None:
            # TF-MOT steps on optimizer.iterations; this schedule counts from its attachment.
            logger.warning(
                "Pruner: %s's optimizer has made %d updates already; the pruning schedule counts from 0 now. To "
                "resume a pruning run, attach the Pruner before loading its checkpoint (load_weights restores the "
                "schedule's step).",
                model.name,
                updates,
            )
        if scope not in SCOPES:
            raise ValueError(f"Unknown `scope`={scope!r}. Expected 'layer' or 'global'.")
        if not isinstance(scores, str) or scores not in SCORES:
            raise ValueError(
                f"Unknown `scores`={scores!r}. Expected 'magnitude' (keep the largest weights), "
                "'movement' (keep the weights training moves away from zero) or 'fisher' (second order: "
                "keep the weights whose removal raises the loss most)."
            )
        self.scope = scope
        self.scores = scores
        self.pattern = pattern
        self._pattern = parse_pattern(pattern)
        if self._pattern and self._pattern[0] == "n:m" and self.schedule is not None:
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
        self.include_embeddings = check_bool("include_embeddings", include_embeddings)
        self._model = model
        self.targets = self._select(model, layers, self.include_embeddings)

        variable_dtype = self.targets[0].variable.dtype
        self.state = PruningState(
            [t.variable.shape for t in self.targets],
            [re.sub(r"[^0-9A-Za-z_]", "_", t.path) for t in self.targets],
            variable_dtype=variable_dtype,
            scores=scores,
            name="pruning_state",
        )
        for target, previous in zip(self.targets, self.state.previous):
            # A copy: on JAX two variables sharing one buffer fail the train step's buffer donation.
            previous.assign(ops.copy(target.variable))
        self._distiller = None
        self._trainer = None  # A weak reference, from `prepare_trainer`.
        setattr(model, PRUNING_STATE_ATTR, self.state)
        for index, target in enumerate(self.targets):
            target.variable.constraint = _MaskConstraint(self, index, inner=target.variable.constraint)
        # Steps traced before the constraints existed would not prune.
        model.train_function = None
        self._retraced = weakref.WeakSet([model])  # Trainers whose step was traced with the constraints.

    @classmethod
    def holding_zeros(cls, model, min_sparsity=0.01):
        """A `Pruner` with fixed masks that keep a pruned model's zeros while
        it trains on (distillation, quantization-aware training, a structured
        stage after an unstructured one), or None for a dense model.

        The model counts as pruned when one of its encoder kernels (or
        embedding tables: then they are held too) is at least
        `min_sparsity` exact zeros (a trained float weight has almost none
        otherwise). Frozen kernels are left out (nothing changes them). Train
        with the returned pruner attached (on JAX, `prepare_trainer` on the
        trainer), then `strip()` it.

        Example:
        ```python
        pruner = bertzoo.Pruner.holding_zeros(pruned)  # None if `pruned` is dense
        pruned.fit(texts, labels, epochs=1)  # The zeros stay zeros.
        pruned = pruner.strip()
        ```
        """
        if (
            isinstance(min_sparsity, (bool, np.bool_))
            or not isinstance(min_sparsity, numbers.Real)
            or not 0.0 < min_sparsity <= 1.0
        ):
            raise ValueError(
                f"`min_sparsity` must be a fraction in (0, 1] (the share of exact zeros that marks a kernel as "
                f"pruned, e.g. 0.01), got {min_sparsity!r}."
            )
        backbone = getattr(model, "backbone", model)
        named = backbone.named_weights() if hasattr(backbone, "named_weights") else {}

        def pruned(names):
            return any(np.mean(ops.convert_to_numpy(v) == 0) >= min_sparsity for n, v in named.items() if n in names)

        tables = pruned(_EMBEDDING_TABLES)
        if not (tables or pruned([n for n in named if _ENCODER_KERNELS.fullmatch(n)])):
            return None
        # Frozen kernels (trainable=False, LoRA) keep their zeros untouched: only the others are held.
        candidates = prunable_weights(model)
        encoder, embeddings = cls._encoder_and_embedding_paths(model, candidates)
        layers = [
            path
            for path in encoder + (embeddings if tables else [])
            if candidates[path][1].trainable and not getattr(candidates[path][0], "lora_enabled", False)
        ]
        if not layers:
            return None
        pruner = cls(model, schedule=None, layers=layers)
        pruner.set_masks({t.path: ops.convert_to_numpy(t.variable) != 0 for t in pruner.targets})
        return pruner

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
    def _scores(self, index, w, movement=None):
        """Weight `index`'s scores (per block for block patterns), given its
        new value `w`: `|w|`, or the movement accumulated so far (`movement`
        if given; with per-layer thresholds `|w|` while that is all zero)."""
        if self.scores == "movement":
            scores = _read(self.state.movement[index]) if movement is None else movement
            if self.scope == "layer":
                # Before any weight has moved (pruning at step 0, or a warm-up
                # from rate 0) movement ranks nothing: magnitude does, once. (A
                # global threshold keeps the ties instead: one weight's
                # magnitudes would dwarf the others' movements.)
                weight = ops.convert_to_tensor(self.targets[index].variable) if w is None else w
                scores = ops.where(ops.all(ops.equal(scores, 0.0)), ops.abs(ops.cast(weight, "float32")), scores)
        elif self.scores == "fisher":
            w = ops.cast(w, "float32")
            scores = self._squared_gradient_mean(index) * w * w
        else:
            scores = ops.abs(ops.cast(w, "float32"))
        if self._pattern and self._pattern[0] == "block":
            return block_scores(scores, self._pattern[1], self._pattern[2])
        return scores

    def _squared_gradient_mean(self, index):
        """The optimizer's running mean of weight `index`'s squared gradient
        (Adam's second moment, already updated for this step: constraints
        run after every variable's update) plus `epsilon**2`, the floor
        Adam's own step puts under it (so before any gradient the scores
        rank by magnitude instead of all being zero). The optimizer is the
        trainer's (`prepare_trainer`), else the model's."""
        trainer = self._trainer() if self._trainer is not None else None
        return self._adam_second_moment(index, self._model if trainer is None else trainer)

    def _adam_second_moment(self, index, owner):
        """`owner`'s optimizer's second moment of weight `index` plus
        `epsilon**2`; a ValueError naming the fix when it keeps none."""
        optimizer = getattr(owner, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # Under a LossScaleOptimizer.
        variable = self.targets[index].variable
        moments = None if optimizer is None else private_api.adam_moments(optimizer, variable)
        if moments is None:
            raise ValueError(
                f"scores='fisher' reads the squared-gradient mean that Adam keeps for each weight, but the "
                f"{'model' if owner is self._model else 'trainer'}'s optimizer ({type(optimizer).__name__}) has "
                f"none for {self.targets[index].path!r}. "
                "Compile the model with an Adam-family optimizer (bertzoo tasks' default, or "
                "keras.optimizers.Adam / AdamW) and train it with that optimizer; training through another "
                "trainer (a Distiller, your own), call pruner.prepare_trainer(trainer) first."
            )
        floor = float(getattr(optimizer, "epsilon", 0.0) or 0.0) ** 2
        return ops.cast(ops.convert_to_tensor(moments[1]), "float32") + floor

    def _mask_from_scores(self, index, scores, threshold, sparsity=None):
        """Keeps the scores above `threshold`, and with `sparsity` (a weight's
        own threshold) as many equal to it as leave exactly its share pruned
        (`keep_mask`)."""
        keep = scores > threshold if sparsity is None else keep_mask(scores, threshold, sparsity)
        keep = ops.cast(keep, self.state.masks[index].dtype)
        if self._pattern and self._pattern[0] == "block":
            keep = expand_blocks(keep, self.targets[index].variable.shape, self._pattern[1], self._pattern[2])
        return keep

    def _pending_movement(self, i, step):
        """Weight `i`'s accumulated movement including this step's update,
        whether or not its constraint has run yet in this step (the optimizer
        updates every variable before it runs the constraints)."""
        state = self.state
        movement = _read(state.movement[i])
        old = ops.cast(_read(state.previous[i]), "float32")
        new = ops.cast(ops.convert_to_tensor(self.targets[i].variable), "float32")
        pending = ops.equal(_read(state.steps[i]), step)
        return ops.where(pending, movement + old * (new - old), movement)

    def _global_threshold(self, index, w, sparsity):
        step = _read(self.state.steps[index])
        scores = []
        for i, target in enumerate(self.targets):
            if i == index:
                score = self._scores(i, w)
            elif self.scores == "movement":
                score = self._scores(i, None, movement=self._pending_movement(i, step))
            else:
                score = self._scores(i, ops.convert_to_tensor(target.variable))
            scores.append(ops.reshape(score, (-1,)))
        scores = ops.concatenate(scores, axis=0)
        return threshold_keeping_ties(scores, score_threshold(scores, sparsity), sparsity)

    def _new_mask(self, index, w, should_prune, sparsity, current):
        dtype = current.dtype
        if self._pattern and self._pattern[0] == "n:m":
            _, n, m = self._pattern
            axis = self.targets[index].input_axis
            active = ops.logical_and(should_prune, sparsity > 0)
            return ops.cond(
                active,
                lambda: ops.cast(n_of_m_mask(self._scores(index, w), n, m, axis), dtype),
                lambda: current,
            )
        if self.scope == "layer":

            def prune():
                scores = self._scores(index, w)
                return self._mask_from_scores(index, scores, score_threshold(scores, sparsity), sparsity)

            return ops.cond(should_prune, prune, lambda: current)
        # Global: the first weight updated in a pruning step computes the
        # threshold over all pruned weights; the others reuse it.
        state = self.state
        step = _read(state.steps[index])
        cached = _read(state.global_threshold)
        need = ops.logical_and(should_prune, ops.not_equal(_read(state.global_step), step))
        threshold = ops.cond(need, lambda: self._global_threshold(index, w, sparsity), lambda: cached)
        _write(state.global_threshold, threshold)
        _write(state.global_step, ops.where(should_prune, step, _read(state.global_step)))
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

    def fit(self, *args, teacher=None, distillation=None, callbacks=None, **kwargs):
        """Trains the model (raw strings, pairs, datasets: whatever the model
        accepts; `fit`'s arguments); the epoch logs gain `sparsity`.

        Without a `teacher`: `model.fit(...)`. With one: the model is the
        student of a `bertzoo.Distiller(teacher, model, **distillation)`
        (typically the teacher is the dense model, copied before pruning),
        and `distiller.fit(...)` trains it; the logs then also hold the
        distiller's metrics (`distillation_loss`, `agreement`, ...). The
        distiller trains with the model's compiled optimizer, loss and
        `jit_compile` (`pruner.compile(...)` chooses them; bertzoo tasks come
        compiled with their fine-tuning defaults) and the student's default
        metrics. Later calls with the same teacher and options reuse it.
        Only the predictions are distilled unless `distillation` turns
        layer terms on (`bertzoo.compression.PREDICTIONS_ONLY` is under the
        options, as movement pruning and oBERT distill): a student that
        starts as a copy of its teacher starts its layer losses at zero,
        which would set their `normalize_losses` scales from noise.

        Args:
            *args, **kwargs: `fit` arguments (`x`, `y`, `epochs`, ...).
            teacher: None, or a bertzoo task of the model's class to distill from.
            distillation: keyword arguments of `bertzoo.Distiller`
                (`temperature`, `alpha`, `hidden_state_weight`, ...) over
                `PREDICTIONS_ONLY`; only with a `teacher`.
            callbacks: Keras callbacks.

        Example:
        ```python
        teacher = bertzoo.compression.model_copy.copy_model(model)  # before attaching the Pruner
        pruner = bertzoo.Pruner(model, bertzoo.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=3000))
        history = pruner.fit(texts, labels, epochs=3, teacher=teacher, distillation={"alpha": 0.5})
        history.history["sparsity"], history.history["agreement"]
        ```
        """
        if not self._model.compiled:
            raise ValueError(
                f"{type(self._model).__name__} '{self._model.name}' is not compiled: call "
                "pruner.compile(optimizer=..., loss=...) first (bertzoo tasks come compiled with their "
                "fine-tuning defaults)."
            )
        # First, so the user's callbacks (CSVLogger, EarlyStopping(monitor="sparsity"), ...) see `sparsity`.
        callbacks = [_SparsityLogger(self)] + list(callbacks or [])
        if teacher is None:
            if distillation is not None:
                raise ValueError("`distillation` options need a `teacher`: pass teacher=... (e.g. the dense model).")
            trainer = self._model
        else:
            trainer = self._distiller_for(teacher, distillation)
        self.prepare_trainer(trainer)
        return trainer.fit(*args, callbacks=callbacks, **kwargs)

    def prepare_trainer(self, trainer):
        """Makes `trainer` (a Keras model whose `fit` updates the pruned
        weights with its optimizer: the model itself, a `Distiller` of it, a
        custom trainer) carry the pruning state through its train step (the
        JAX backend needs that: its train step is stateless), and makes
        `scores="fisher"` read that trainer's optimizer (on every backend).
        `fit` does it for the trainer it runs; call it before
        `trainer.fit(...)` with a trainer of your own (bertzoo's tasks and
        `Distiller` refuse an unprepared fit before it starts; a plain
        `keras.Model` trainer raises inside its step, where on JAX Keras
        loses the models' variables with the error). On JAX a trainer
        compiled with a `LossScaleOptimizer` (float16) is refused: its update
        runs inside a `lax.cond` the pruning state cannot leave.

        Example:
        ```python
        pruner = bertzoo.Pruner(student, bertzoo.ConstantSparsity(0.5, begin_step=0))
        distiller = bertzoo.Distiller(teacher, student)
        distiller.compile(optimizer=bertzoo.models.optimizers.bert_optimizer(1e-4))
        pruner.prepare_trainer(distiller)
        distiller.fit(texts, epochs=1)
        ```
        """
        prepared = self._trainer is not None and self._trainer() is trainer
        self._trainer = weakref.ref(trainer)
        if not prepared:
            # A trainer that has run keeps its traced step, which reads the
            # optimizer's constraints as they were: without the masks it
            # would never prune. The next `fit` traces the step again; later
            # ones with the same trainer reuse it (a trace costs seconds).
            trainer.train_function = None
            self._retraced.add(trainer)
        if keras.backend.backend() != "jax":
            return
        if isinstance(getattr(trainer, "optimizer", None), keras.optimizers.LossScaleOptimizer):
            # Its update (and so the constraints) runs inside a `lax.cond`, which the carried values cannot leave.
            raise ValueError(
                "Pruning on the JAX backend does not support a LossScaleOptimizer (a float16 model's) yet: "
                "prune in float32 or bfloat16 there, or on the TensorFlow backend."
            )
        private_api.carry_jax_step_values(trainer, self.state.variables, _step_values)

    def _distiller_for(self, teacher, distillation):
        """The `Distiller` that trains the model from `teacher`, compiled with
        the model's compile settings (reused while they stay the same)."""
        if distillation is not None and not isinstance(distillation, dict):
            raise ValueError(
                f"`distillation` must be a dict of bertzoo.Distiller options such as "
                f"{{'temperature': 2.0, 'alpha': 0.5}}, got {distillation!r}."
            )
        options = {**PREDICTIONS_ONLY, **(distillation or {})}
        model = self._model
        cached = self._distiller
        if cached is not None and cached[0] is teacher and cached[1] == options:
            distiller = cached[2]
        else:
            distiller = Distiller(teacher, model, **options)
            self._distiller = (teacher, options, distiller)
        if distiller.optimizer is not model.optimizer:
            # The teacher is frozen only while the distiller trains (fit, train_on_batch).
            known = {id(v) for v in model.trainable_variables + teacher.variables}
            extra = [v.path for v in distiller.trainable_variables if id(v) not in known]
            if extra and model.optimizer.built:
                raise ValueError(
                    f"The distiller trains weights the model's optimizer was not built for ({', '.join(extra)}: "
                    "the teacher's width differs). Give the model a fresh optimizer with "
                    "pruner.compile(optimizer=...) before pruner.fit(..., teacher=...)."
                )
            jit_compile = (model.get_compile_config() or {}).get("jit_compile", "auto")
            distiller.compile(optimizer=model.optimizer, loss=model.loss, jit_compile=jit_compile)
        return distiller

    def set_masks(self, masks):
        """Sets the masks and zeroes the weights they prune.

        With `schedule=None` the masks then stay fixed through training (as a
        lottery ticket's do); with a schedule, until its next pruning step.

        Args:
            masks: `{layer path: mask}` for some of the pruned weights, or a
                list with one mask per weight of `pruner.targets`; each of
                the weight's shape, 1 = kept, 0 = pruned.

        Example:
        ```python
        pruner = bertzoo.Pruner(model, schedule=None)
        pruner.set_masks({"attention_0/query": np.abs(query_kernel) > 0.1})
        ```
        """
        paths = [t.path for t in self.targets]
        if isinstance(masks, dict):
            unknown = [p for p in masks if p not in paths]
            if unknown:
                raise ValueError(
                    f"set_masks: {', '.join(map(repr, unknown))} is not a pruned weight. Pruned: {', '.join(paths)}."
                )
            items = [(paths.index(p), m) for p, m in masks.items()]
        elif isinstance(masks, (list, tuple)) and len(masks) == len(paths):
            items = list(enumerate(masks))
        else:
            raise ValueError(
                f"set_masks needs a dict {{layer path: mask}} or a list of {len(paths)} masks (one per "
                f"`pruner.targets`), got {type(masks).__name__}."
            )
        for index, mask in items:
            target = self.targets[index]
            mask = np.asarray(ops.convert_to_numpy(mask))
            if mask.shape != tuple(target.variable.shape):
                raise ValueError(
                    f"set_masks: the mask of {target.path!r} has shape {mask.shape}, its weight "
                    f"{tuple(target.variable.shape)}."
                )
            mask = (mask != 0).astype(self.state.masks[index].dtype)
            self.state.masks[index].assign(mask)
            masked = ops.convert_to_numpy(target.variable) * mask.astype(target.variable.dtype)
            target.variable.assign(masked)
            if self.scores == "movement":
                self.state.previous[index].assign(masked)

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
            "schedule": None if self.schedule is None else keras.saving.serialize_keras_object(self.schedule),
            "layers": [t.path for t in self.targets],
            "include_embeddings": self.include_embeddings,
            "scope": self.scope,
            "pattern": self.pattern,
            "scores": self.scores,
        }

    @classmethod
    def from_config(cls, config, model):
        """A Pruner with the settings of `config` (from `get_config()`) on `model`.

        Example:
        ```python
        resumed = bertzoo.Pruner.from_config(pruner.get_config(), fresh_model)
        ```
        """
        config = dict(config)
        if config.get("schedule") is not None:
            config["schedule"] = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(model, **config)

    def __repr__(self):
        return (
            f"Pruner({type(self._model).__name__} '{self._model.name}', {self.schedule!r}, "
            f"{len(self.targets)} weights, scope={self.scope!r}, pattern={self.pattern!r}, scores={self.scores!r})"
        )


class _SparsityLogger(keras.callbacks.Callback):
    """Adds `sparsity` to the epoch logs, and warns of pruned weights that
    received no update."""

    def __init__(self, pruner):
        super().__init__()
        self.pruner = pruner

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["sparsity"] = round(self.pruner.sparsity(), 4)
        self._warn_of_weights_without_updates()

    def _warn_of_weights_without_updates(self):
        # Masks advance when the optimizer updates a weight, and Keras skips
        # weights whose gradient is None (the loss does not depend on them).
        pruner = self.pruner
        if getattr(pruner, "_warned_without_updates", False):
            return
        steps = [int(ops.convert_to_numpy(s)) for s in pruner.state.steps]
        idle = [target.path for target, step in zip(pruner.targets, steps) if step == 0]
        if idle and max(steps) > 0:
            pruner._warned_without_updates = True
            logger.warning(
                "Pruner: %d selected weight(s) received no gradient, so they are never pruned and the "
                "sparsity stays below the schedule's: %s. The loss does not depend on them (e.g. the pooler of "
                "a token classifier or question answerer): leave them out of `layers=`.",
                len(idle),
                ", ".join(idle[:5]) + (", ..." if len(idle) > 5 else ""),
            )
