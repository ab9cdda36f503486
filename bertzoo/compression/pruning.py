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
import gzip
import os
import re
import tempfile

import keras
import numpy as np
from keras import ops

from bertzoo.compression.model_copy import PRUNING_STATE_ATTR
from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.model_copy import leaf_layers
from bertzoo.compression.model_copy import model_weights
from bertzoo.compression.model_copy import pruning_state
from bertzoo.compression.model_copy import quantization_mode
from bertzoo.compression.schedules import check_schedule
from bertzoo.layers.embeddings import PositionEmbedding

SCOPES = ("layer", "global")


# --- Patterns ---------------------------------------------------------------
def parse_pattern(pattern):
    """Returns `None`, `("block", rows, cols)` or `("n:m", n, m)`."""
    if pattern is None:
        return None
    text = str(pattern).strip().lower()
    block = re.fullmatch(r"(\d+)x(\d+)", text)
    if block:
        rows, cols = int(block.group(1)), int(block.group(2))
        if rows >= 1 and cols >= 1 and rows * cols > 1:
            return ("block", rows, cols)
    nm = re.fullmatch(r"(\d+):(\d+)", text)
    if nm:
        n, m = int(nm.group(1)), int(nm.group(2))
        if 1 <= n < m:
            return ("n:m", n, m)
    raise ValueError(
        f"Unknown pruning `pattern`={pattern!r}. Use None (unstructured), a block "
        "shape 'RxC' such as '1x4' or '4x1' (R rows of the input dimension by C columns "
        "of the output dimension), or 'N:M' such as '2:4' (N of every M consecutive "
        "weights along the input dimension are kept)."
    )


def _block_scores(magnitudes, rows, cols):
    """Mean magnitude of each `rows x cols` block (edges padded with zeros)."""
    height, width = magnitudes.shape
    pad_h, pad_w = -height % rows, -width % cols
    padded = ops.pad(magnitudes, [[0, pad_h], [0, pad_w]])
    blocks = ops.reshape(padded, ((height + pad_h) // rows, rows, (width + pad_w) // cols, cols))
    return ops.mean(blocks, axis=(1, 3))


def _expand_blocks(block_mask, shape, rows, cols):
    expanded = ops.repeat(ops.repeat(block_mask, rows, axis=0), cols, axis=1)
    return expanded[: shape[0], : shape[1]]


def _threshold(scores, sparsity):
    """The k-th smallest of the (non-negative) `scores`, k = round(sparsity * n):
    pruning every score <= it prunes k of them. -1 (below every score) when
    k is 0.

    Found by bisection on the float32 bit patterns (which order non-negative
    floats like their values): 32 counting passes, exact. Sorting would do,
    but XLA's CPU sort inside a train step is slow (seconds per kernel).
    """
    flat = ops.reshape(ops.cast(scores, "float32"), (-1,))
    size = flat.shape[0]
    count = ops.cast(ops.round(ops.cast(sparsity, "float32") * size), "int32")
    bits = ops.view(flat, "int32")
    low = ops.convert_to_tensor(-1, "int32")  # count(bits <= low) = 0 < k
    high = ops.max(bits)  # count(bits <= high) = n >= k
    for _ in range(32):
        middle = low + (high - low) // 2
        enough = ops.sum(ops.cast(bits <= middle, "int32")) >= count
        high = ops.where(enough, middle, high)
        low = ops.where(enough, low, middle)
    return ops.where(count > 0, ops.view(high, "float32"), ops.convert_to_tensor(-1.0, "float32"))


def _n_of_m_mask(magnitudes, n, m, axis):
    """Keeps the `n` largest of every `m` consecutive entries along `axis`."""
    moved = ops.moveaxis(magnitudes, axis, -1)
    lead, length = tuple(moved.shape[:-1]), moved.shape[-1]
    groups = ops.reshape(moved, lead + (length // m, m))
    # Rank within the group (0 = largest; ties go to the earlier entry), by
    # pairwise comparison: m is small, and it avoids a sort under XLA.
    a, b = groups[..., :, None], groups[..., None, :]
    earlier = np.tril(np.ones((m, m), bool), k=-1)[None, :]  # [i, j]: j < i
    beats = ops.logical_or(b > a, ops.logical_and(ops.equal(b, a), earlier))
    ranks = ops.sum(ops.cast(beats, "int32"), axis=-1)
    keep = ops.reshape(ranks < n, lead + (length,))
    return ops.moveaxis(keep, -1, axis)


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
                    shape=shape, dtype=variable_dtype, initializer="ones", trainable=False,
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
            shape=(), dtype="int64", initializer=keras.initializers.Constant(-1), trainable=False,
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
    `model.load_weights(path)`, and fit on. Save whole models (`.keras`,
    presets) from `strip()`.

    Example:
    >>> model = bertzoo.BertClassifier.from_preset("tiny", num_classes=2)
    >>> pruner = bertzoo.Pruner(model, bertzoo.PolynomialDecay(
    ...     initial_sparsity=0.0, final_sparsity=0.9, begin_step=0, end_step=2000, frequency=100))
    >>> pruner.compile()
    >>> pruner.fit(texts, labels, epochs=3)
    >>> pruned = pruner.strip()
    >>> print(bertzoo.sparsity_report(pruned))
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
    def _candidates(model):
        """`{path: (layer, variable, input_axis)}` for every prunable weight."""
        found = {}
        for layer in leaf_layers(model):
            if isinstance(layer, keras.layers.Dense):
                found[layer.path] = (layer, layer._kernel, 0)
            elif isinstance(layer, keras.layers.Embedding):
                found[layer.path] = (layer, layer._embeddings, 1)
            elif isinstance(layer, PositionEmbedding):
                found[layer.path] = (layer, layer.embeddings, 1)
        return found

    @staticmethod
    def _encoder_and_embedding_paths(model):
        backbone = getattr(model, "backbone", model)
        if not hasattr(backbone, "attention_blocks"):
            return None, None
        encoder = []
        for block in backbone.attention_blocks:
            encoder += [block.query_dense, block.key_dense, block.value_dense, block.output_dense]
        for block in backbone.feedforward_blocks:
            encoder += [block.intermediate_dense, block.output_dense]
        emb = backbone.embeddings
        embeddings = [emb.token_embedding, emb.position_embedding, emb.segment_embedding]
        if emb.projection is not None:
            embeddings.append(emb.projection)
        return [layer.path for layer in encoder], [layer.path for layer in embeddings]

    def _select(self, model, layers, include_embeddings):
        candidates = self._candidates(model)
        encoder, embeddings = self._encoder_and_embedding_paths(model)
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
            raise ValueError(
                f"`layers` must be 'encoder', a list of layer paths or a callable, got {layers!r}."
            )
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
            return _block_scores(magnitudes, self._pattern[1], self._pattern[2])
        return magnitudes

    def _mask_from_scores(self, index, scores, threshold):
        keep = ops.cast(scores > threshold, self.state.masks[index].dtype)
        if self._pattern and self._pattern[0] == "block":
            keep = _expand_blocks(keep, self.targets[index].variable.shape, self._pattern[1], self._pattern[2])
        return keep

    def _global_threshold(self, index, w, sparsity):
        scores = []
        for i, target in enumerate(self.targets):
            value = w if i == index else ops.convert_to_tensor(target.variable)
            scores.append(ops.reshape(self._scores(i, value), (-1,)))
        return _threshold(ops.concatenate(scores, axis=0), sparsity)

    def _new_mask(self, index, w, should_prune, sparsity, current):
        dtype = current.dtype
        if self._pattern and self._pattern[0] == "n:m":
            _, n, m = self._pattern
            axis = self.targets[index].input_axis
            active = ops.logical_and(should_prune, sparsity > 0)
            return ops.cond(
                active,
                lambda: ops.cast(_n_of_m_mask(ops.abs(w), n, m, axis), dtype),
                lambda: current,
            )
        if self.scope == "layer":

            def prune():
                scores = self._scores(index, w)
                return self._mask_from_scores(index, scores, _threshold(scores, sparsity))

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
        >>> pruned = pruner.strip()
        >>> pruned.save_to_preset("runs/pruned")
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


# --- Report -----------------------------------------------------------------
class SparsityReport:
    """Per-layer and total sparsity of a model, and its weights' size on disk
    raw and gzip-compressed (zeros compress away; the rest does not).

    Attributes:
        layers: list of dicts `{"path", "shape", "parameters", "zeros", "sparsity"}`
            for every weight matrix (Dense kernels, embedding tables).
        total_sparsity: zeros / parameters over those matrices.
        overall_sparsity: zeros / parameters over all weights (biases, norms too).
        dense_bytes: size of the model's weights in an HDF5 file (as
            `save_weights` writes them, less any optimizer state or masks).
        compressed_bytes: its size after gzip (level 6).
    """

    def __init__(self, layers, total_params, total_zeros, dense_bytes, compressed_bytes):
        self.layers = layers
        matrix_params = sum(row["parameters"] for row in layers)
        matrix_zeros = sum(row["zeros"] for row in layers)
        self.total_sparsity = matrix_zeros / matrix_params if matrix_params else 0.0
        self.overall_sparsity = total_zeros / total_params if total_params else 0.0
        self.parameters = total_params
        self.dense_bytes = dense_bytes
        self.compressed_bytes = compressed_bytes

    @property
    def compression_ratio(self):
        """compressed_bytes / dense_bytes."""
        return self.compressed_bytes / self.dense_bytes

    def to_dict(self):
        return {
            "layers": self.layers,
            "total_sparsity": self.total_sparsity,
            "overall_sparsity": self.overall_sparsity,
            "parameters": self.parameters,
            "dense_bytes": self.dense_bytes,
            "compressed_bytes": self.compressed_bytes,
        }

    def __str__(self):
        width = max([len("layer")] + [len(r["path"]) for r in self.layers])
        lines = [f"{'layer':<{width}}  {'shape':>14}  {'params':>11}  {'sparsity':>8}"]
        for r in self.layers:
            shape = "x".join(str(d) for d in r["shape"])
            lines.append(f"{r['path']:<{width}}  {shape:>14}  {r['parameters']:>11,}  {r['sparsity']:>8.1%}")
        lines.append(f"{'total (weight matrices)':<{width}}  {'':>14}  {'':>11}  {self.total_sparsity:>8.1%}")
        lines.append(
            f"all weights: {self.parameters:,} parameters, {self.overall_sparsity:.1%} zero; "
            f"weights file {self.dense_bytes / 1e6:.2f} MB, gzip {self.compressed_bytes / 1e6:.2f} MB "
            f"({self.compression_ratio:.1%})"
        )
        return "\n".join(lines)

    def __repr__(self):
        return (
            f"SparsityReport(total_sparsity={self.total_sparsity:.4f}, dense_bytes={self.dense_bytes}, "
            f"compressed_bytes={self.compressed_bytes})"
        )


def gzip_size(path, level=6):
    """Bytes of `path` (a file, or every file of a directory) after gzip."""
    path = os.fspath(path)
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names
    )
    total = 0
    for name in files:
        with open(name, "rb") as f:
            total += len(gzip.compress(f.read(), compresslevel=level, mtime=0))
    return total


def sparsity_report(model):
    """Per-layer and total sparsity, and dense vs gzip-compressed weight size.

    Sizes count the model's weights only: not the optimizer state of a
    compiled model, nor the masks of a model with a `Pruner` attached.

    Example:
    >>> report = bertzoo.sparsity_report(pruner.strip())
    >>> print(report)            # a table; report.to_dict() for the figures
    >>> report.total_sparsity
    0.9
    """
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"`sparsity_report` needs a built Keras model, got {model!r}.")
    rows = []
    order = {id(v): i for i, v in enumerate(model.weights)}
    candidates = sorted(Pruner._candidates(model).items(), key=lambda kv: order.get(id(kv[1][1]), len(order)))
    for path, (layer, variable, _) in candidates:
        value = ops.convert_to_numpy(variable)
        zeros = int(np.sum(value == 0))
        rows.append(
            {
                "path": path,
                "shape": list(value.shape),
                "parameters": int(value.size),
                "zeros": zeros,
                "sparsity": zeros / value.size,
            }
        )
    import h5py

    weights = model_weights(model)
    arrays = [ops.convert_to_numpy(v) for v in weights]
    total_params = sum(a.size for a in arrays)
    total_zeros = sum(int(np.sum(a == 0)) for a in arrays)
    # The model's own weights, one HDF5 dataset each as in a Keras weights
    # file, but without what `save_weights` adds for a compiled or pruning
    # model (optimizer slots, masks): those are not the model's size.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.weights.h5")
        with h5py.File(path, "w") as f:
            for index, (variable, array) in enumerate(zip(weights, arrays)):
                f.create_dataset(f"{index}/{variable.path}", data=array)
        dense_bytes = os.path.getsize(path)
        compressed_bytes = gzip_size(path)
    return SparsityReport(rows, total_params, total_zeros, dense_bytes, compressed_bytes)
