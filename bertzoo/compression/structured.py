"""Structured pruning: remove whole attention heads and feed-forward neurons.

Importance follows Michel et al. (2019), "Are Sixteen Heads Really Better
than One?": put a gate `g` (= 1) on each head's output and on each FFN neuron,
and score it by `|dL/dg|` accumulated over calibration batches. A gate
multiplies one block of rows of the following output projection `W`, so
`dL/dg = sum(W * dL/dW)` over those rows: the scores come from ordinary
kernel gradients, with no change to the model.

The least important heads / neurons are removed and a smaller dense
`BertBackbone` is rebuilt (per-layer `num_heads` and `intermediate_dim`,
same `head_dim`) holding slices of the original weights. It computes exactly
what the original model computes with those heads' and neurons' outputs
zeroed, and it is genuinely smaller and faster.
"""

import numbers
import re

import keras
import numpy as np

from bertzoo.compression.calibration import calibration_batches
from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import BackendError
from bertzoo.utils.layers import copy_trainable_flags
from bertzoo.utils.optional import tf
from bertzoo.utils.private_api import deferred_initialization

# Canonical weight names (`BertBackbone.named_weights()`) that slicing cuts.
_SLICED = re.compile(r"(attention|feedforward)_(\d+)/(query|key|value|output|intermediate)/(kernel|bias)")


def _backbone_of(model):
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, BertBackbone):
        raise ValueError(
            f"Structured pruning needs a bertzoo.BertBackbone or a task built on one, got {type(model).__name__}."
        )
    if quantization_mode(model):
        raise ValueError(
            f"{type(model).__name__} '{model.name}' is quantized: prune heads and neurons of the "
            "float model, then quantize the result."
        )
    return backbone


def _block_indices(backbone):
    """For each layer, the index of its attention block and of its
    feed-forward block (shared ALBERT blocks repeat)."""
    blocks = [backbone.layer_blocks(i) for i in range(backbone.num_layers)]
    attention = [backbone.attention_blocks.index(a) for a, _ in blocks]
    feedforward = [backbone.feedforward_blocks.index(f) for _, f in blocks]
    return attention, feedforward


def head_and_neuron_importance(model, data, steps=None):
    """Scores every attention head and FFN neuron of a task model on `data`.

    Returns `{"heads": [...], "neurons": [...]}`: one NumPy array per layer
    (`num_heads[i]` and `intermediate_dim[i]` entries), higher meaning more
    important. Layers sharing weights (ALBERT) share their scores.

    A score is the magnitude of the loss gradient with respect to a gate on
    the head's (or neuron's) output, as in Michel et al. (2019), summed over
    batches; within a batch the gradient is of the batch's loss, so examples
    whose gradients have opposite signs offset each other there (Michel et
    al. take each example's magnitude). Scores therefore depend somewhat on
    the batch size; batches of one give the paper's.

    Args:
        model: a bertzoo task (e.g. `BertClassifier`); its loss (the compiled
            one, or the task's default) is what the scores are gradients of.
        data: labelled calibration data: a `tf.data.Dataset` of
            `(inputs, labels)` batches, or `(inputs, labels)` with raw
            strings or a tokenized dict as inputs.
        steps: number of batches to use (default: all).

    Example:
    ```python
    scores = bertzoo.compression.head_and_neuron_importance(model, (texts, labels), steps=20)
    scores["heads"][0]  # layer 0, one score per head
    ```
    """

    if keras.backend.backend() != "tensorflow":
        raise BackendError(
            f"Scoring heads and neurons takes gradients with TensorFlow's GradientTape, so it needs the TensorFlow "
            f"backend (Keras runs on {keras.backend.backend()!r}): score them in a KERAS_BACKEND=tensorflow process "
            "and pass the scores to prune_heads_and_neurons(..., importance=scores) here."
        )
    backbone = _backbone_of(model)
    if model is backbone or not hasattr(model, "default_loss"):
        raise ValueError(
            "Scoring heads and neurons needs a task model with a loss (e.g. BertClassifier) and "
            "labelled data; for a bare backbone pass precomputed `importance=` instead."
        )
    loss_fn = getattr(model, "loss", None)
    if loss_fn in (None, "auto"):
        loss_fn = model.default_loss()
    elif isinstance(loss_fn, str):
        loss_fn = keras.losses.get(loss_fn)
    if not callable(loss_fn):
        raise ValueError(
            f"Scoring heads and neurons needs one loss for the model's output, but this {type(model).__name__} "
            "has one loss per output (e.g. a BertPretrainer's masked-LM and sentence losses). Score them on a "
            "task with a single output, or pass precomputed `importance=`."
        )
    named = backbone.named_weights()
    attention_kernels = [named[f"attention_{k}/output/kernel"] for k in range(len(backbone.attention_blocks))]
    ffn_kernels = [named[f"feedforward_{k}/output/kernel"] for k in range(len(backbone.feedforward_blocks))]
    kernels = attention_kernels + ffn_kernels

    @tf.function(reduce_retracing=True)
    def gate_gradients(x, y, sample_weight=None):
        with tf.GradientTape() as tape:
            outputs = model(x, training=False)
            loss = loss_fn(y, outputs) if sample_weight is None else loss_fn(y, outputs, sample_weight=sample_weight)
        grads = tape.gradient(loss, kernels)
        return [tf.reduce_sum(tf.cast(k, "float32") * tf.cast(g, "float32"), axis=1) for k, g in zip(kernels, grads)]

    head_scores = [np.zeros(block.num_heads) for block in backbone.attention_blocks]
    neuron_scores = [np.zeros(block.intermediate_dim) for block in backbone.feedforward_blocks]
    batches = 0
    for batch in calibration_batches(model, data, steps):
        if not isinstance(batch, tuple) or len(batch) < 2:
            raise ValueError("Calibration data must yield (inputs, labels) batches: the scores are loss gradients.")
        if len(batch) > 2 and not isinstance(loss_fn, keras.losses.Loss):
            raise ValueError(
                "Calibration data with sample weights needs a keras.losses.Loss to weigh them with (loss_fn=...); "
                f"got {loss_fn!r}. Pass (inputs, labels) batches, or such a loss."
            )
        rows = [r.numpy() for r in gate_gradients(*batch[:3])]
        for k, block in enumerate(backbone.attention_blocks):
            head_scores[k] += np.abs(rows[k].reshape(block.num_heads, block.head_dim).sum(axis=1))
        for k in range(len(ffn_kernels)):
            neuron_scores[k] += np.abs(rows[len(attention_kernels) + k])
        batches += 1
    if batches == 0:
        raise ValueError("`data` yielded no batches: structured pruning needs calibration data.")
    attention_index, ffn_index = _block_indices(backbone)
    return {
        "heads": [head_scores[k].copy() for k in attention_index],
        "neurons": [neuron_scores[k].copy() for k in ffn_index],
    }


def _check_head_count(keep, where):
    if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)):
        raise ValueError(f"`heads_to_keep` must hold integers, got {keep!r}{where}.")
    if keep < 1:
        raise ValueError(
            f"heads_to_keep={keep} would leave {where.removeprefix(' for ') or 'a layer'} with zero attention "
            "heads: keep at least 1 head per layer."
        )


def _check_ffn_ratio(ratio, where):
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0.0 < ratio <= 1.0:
        raise ValueError(
            f"`ffn_keep_ratio` must be in (0, 1] (the fraction of feed-forward neurons kept), got {ratio!r}{where}."
        )


def check_structured_settings(heads_to_keep=None, ffn_keep_ratio=None):
    """Raises a ValueError for a `heads_to_keep` or `ffn_keep_ratio` no model
    could take (a count below 1, a ratio outside (0, 1]), before the model
    to prune exists; what depends on the model (its layers and heads) is
    checked by `prune_heads_and_neurons`.

    Example:
    ```python
    check_structured_settings(heads_to_keep=6, ffn_keep_ratio=0.3)  # Fine.
    ```
    """
    for value, check in ((heads_to_keep, _check_head_count), (ffn_keep_ratio, _check_ffn_ratio)):
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                check(item, f" for layer {i}")
        elif value is not None:
            check(value, "")


def heads_per_layer(heads_to_keep, heads):
    """`heads_to_keep` (one count, or one per layer) as one count per layer
    of a model with `heads` heads per layer; a ValueError naming the layer
    that cannot keep them."""
    num_layers = len(heads)
    if heads_to_keep is None:
        return list(heads)
    if isinstance(heads_to_keep, np.ndarray) and heads_to_keep.ndim == 1:
        heads_to_keep = heads_to_keep.tolist()  # One count per layer, as NumPy holds them.
    values = heads_to_keep if isinstance(heads_to_keep, (list, tuple)) else [heads_to_keep] * num_layers
    if len(values) != num_layers:
        raise ValueError(
            f"`heads_to_keep` has {len(values)} entries but the model has {num_layers} layers: "
            "give one count per layer or a single int."
        )
    for i, (keep, total) in enumerate(zip(values, heads)):
        _check_head_count(keep, f" for layer {i}")
        if keep > total:
            raise ValueError(f"heads_to_keep={keep} for layer {i}, which has only {total} heads: keep at most {total}.")
    return [int(v) for v in values]


def _neurons_per_layer(ffn_keep_ratio, intermediate):
    num_layers = len(intermediate)
    if ffn_keep_ratio is None:
        return list(intermediate)
    ratios = ffn_keep_ratio if isinstance(ffn_keep_ratio, (list, tuple)) else [ffn_keep_ratio] * num_layers
    if len(ratios) != num_layers:
        raise ValueError(
            f"`ffn_keep_ratio` has {len(ratios)} entries but the model has {num_layers} layers: "
            "give one ratio per layer or a single float."
        )
    counts = []
    for i, (ratio, total) in enumerate(zip(ratios, intermediate)):
        _check_ffn_ratio(ratio, f" for layer {i}")
        counts.append(max(1, int(round(ratio * total))))
    return counts


def _check_shared(index, counts, what, num_groups):
    for i, block in enumerate(index):
        first = index.index(block)
        if counts[i] != counts[first]:
            raise ValueError(
                f"Layers {first} and {i} share their {what} weights (ALBERT, num_groups={num_groups}), "
                f"so they must keep the same number of {what} units (got {counts[first]} and {counts[i]})."
            )


def _top(scores, count, what, layer):
    scores = np.asarray(scores, dtype="float64")
    if scores.ndim != 1:
        raise ValueError(f"importance[{what!r}][{layer}] must be a 1-D array, got shape {scores.shape}.")
    return np.sort(np.argsort(-scores, kind="stable")[:count])


def prune_heads_and_neurons(model, heads_to_keep=None, ffn_keep_ratio=None, data=None, importance=None, steps=None):
    """Removes the least important attention heads and FFN neurons and
    returns a smaller dense model of the same class.

    Args:
        model: a bertzoo task or `BertBackbone` (float, not quantized).
        heads_to_keep: heads kept per layer: an int, a list with one int per
            layer, or None (keep all).
        ffn_keep_ratio: fraction of feed-forward neurons kept per layer: a
            float in (0, 1], a per-layer list, or None (keep all).
        data: labelled calibration data for the importance scores (see
            `head_and_neuron_importance`); not needed with `importance`.
        importance: precomputed scores, `{"heads": [...], "neurons": [...]}`
            with one array per layer (e.g. from `head_and_neuron_importance`).
        steps: calibration batches to use (default: all).

    The result's backbone has per-layer `num_heads` / `intermediate_dim`
    lists in its config, so it saves to a preset and loads back like any
    model. Shared-weight (ALBERT) layers are pruned together: layers sharing
    a block must keep the same counts.

    Example:
    ```python
    small = bertzoo.prune_heads_and_neurons(model, heads_to_keep=8, ffn_keep_ratio=0.5, data=(texts, labels))
    small.save_to_preset("runs/pruned")
    ```
    """
    backbone = _backbone_of(model)
    num_layers = backbone.num_layers
    attention_index, ffn_index = _block_indices(backbone)
    heads = [backbone.attention_blocks[k].num_heads for k in attention_index]
    intermediate = [backbone.feedforward_blocks[k].intermediate_dim for k in ffn_index]
    keep_heads = heads_per_layer(heads_to_keep, heads)
    keep_neurons = _neurons_per_layer(ffn_keep_ratio, intermediate)
    _check_shared(attention_index, keep_heads, "attention", backbone.num_groups)
    _check_shared(ffn_index, keep_neurons, "feed-forward", backbone.num_groups)

    if importance is None:
        if keep_heads == heads and keep_neurons == intermediate:
            importance = {"heads": [np.zeros(h) for h in heads], "neurons": [np.zeros(n) for n in intermediate]}
        elif data is None:
            raise ValueError(
                "prune_heads_and_neurons needs calibration `data` (labelled batches) to score "
                "heads and neurons, or precomputed `importance=`."
            )
        else:
            importance = head_and_neuron_importance(model, data, steps=steps)
    for key, sizes in (("heads", heads), ("neurons", intermediate)):
        scores = importance.get(key) if isinstance(importance, dict) else None
        if scores is None or len(scores) != num_layers:
            raise ValueError(f"`importance[{key!r}]` must hold one array per layer ({num_layers}).")
        for i, (s, n) in enumerate(zip(scores, sizes)):
            if np.shape(s) != (n,):
                raise ValueError(f"`importance[{key!r}][{i}]` has shape {np.shape(s)}, expected ({n},).")

    for key in ("heads", "neurons"):
        for i, scores in enumerate(importance[key]):
            if not np.all(np.isfinite(np.asarray(scores, "float64"))):
                raise ValueError(
                    f"`importance[{key!r}][{i}]` holds non-finite scores (NaN or inf: a diverged model's "
                    "gradients?): score a model whose loss is finite, or pass finite scores."
                )
    # Per block: layers that share a block (ALBERT) must agree on its scores,
    # or the heads kept would depend on which layer came first.
    for key, index in (("heads", attention_index), ("neurons", ffn_index)):
        first = {}
        for i, block in enumerate(index):
            j = first.setdefault(block, i)
            if not np.array_equal(np.asarray(importance[key][i]), np.asarray(importance[key][j])):
                raise ValueError(
                    f"Layers {j} and {i} share their {'attention' if key == 'heads' else 'feed-forward'} weights "
                    f"but `importance[{key!r}]` scores them differently: give every layer of a shared block the "
                    "same scores (e.g. their sum), as head_and_neuron_importance does."
                )
    head_keep = {}
    for i, block in enumerate(attention_index):
        head_keep.setdefault(block, _top(importance["heads"][i], keep_heads[i], "heads", i))
    neuron_keep = {}
    for i, block in enumerate(ffn_index):
        neuron_keep.setdefault(block, _top(importance["neurons"][i], keep_neurons[i], "neurons", i))

    config = backbone.get_config()
    config.update(num_heads=keep_heads, intermediate_dim=keep_neurons, head_dim=backbone.head_dim)
    with deferred_initialization() as deferred:  # Every weight is a slice: none is drawn at random first.
        small = type(backbone).from_config(config)
    values = _sliced_weights(backbone, backbone.head_dim, head_keep, neuron_keep)
    deferred.fill(lambda: [v.assign(values[name]) for name, v in small.named_weights().items()], small)

    if model is backbone:
        copy_trainable_flags(backbone, small)
        small.source_preset = getattr(backbone, "source_preset", None)
        return small
    task = model.with_backbone(small)  # Same hidden size: the head weights are copied.
    copy_trainable_flags(model, task)  # The same layers, narrower: the ones the user froze stay frozen.
    task.source_preset = getattr(model, "source_preset", None)
    return task


def _sliced_weights(backbone, head_dim, head_keep, neuron_keep):
    """`backbone`'s weights by canonical name, as NumPy arrays cut to the kept
    heads (query/key/value columns, attention output rows) and neurons
    (intermediate columns, feed-forward output rows) of each block."""
    values = {}
    for name, variable in backbone.named_weights().items():
        value = keras.ops.convert_to_numpy(variable)
        match = _SLICED.fullmatch(name)
        if match:
            kind, k, part, what = match.group(1), int(match.group(2)), match.group(3), match.group(4)
            if kind == "attention":
                keep = (head_keep[k][:, None] * head_dim + np.arange(head_dim)[None, :]).reshape(-1)
            else:
                keep = neuron_keep[k]
            if part == "output":
                value = value[keep, :] if what == "kernel" else value  # Rows of the output projection.
            else:
                value = value[..., keep]  # Columns of the kernel, entries of the bias.
        values[name] = value
    return values
