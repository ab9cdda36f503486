"""Helpers shared by the compression tools: a pruner's state, model copies."""

import keras
import numpy as np

from bertzoo.utils import private_api
from bertzoo.utils.layers import attached_pruning_state
from bertzoo.utils.layers import copy_trainable_flags
from bertzoo.utils.layers import leaf_layers
from bertzoo.utils.private_api import deferred_initialization


def pruning_state(model):
    """The pruning state a `Pruner` attached to `model` or to a model
    inside it (a task's backbone), or None."""
    return attached_pruning_state(model)[1]


def model_weights(model):
    """`model.weights` without a pruner's masks and counters."""
    state = pruning_state(model)
    skip = {id(v) for v in state.weights} if state is not None else set()
    return [v for v in model.weights if id(v) not in skip]


def _lora_layers(model, float_kernels_only=False):
    """`(merged, lora)`: each LoRA layer by the id of its kernel variable, and
    the ids of its two LoRA weights. `float_kernels_only`: only layers whose
    merged `kernel` is a float kernel (not a quantized one's integers plus
    the update, not an Embedding's table)."""
    merged, lora = {}, set()
    for layer in leaf_layers(model):
        if float_kernels_only and (getattr(layer, "quantization_mode", None) or not hasattr(layer, "lora_kernel_a")):
            continue
        if getattr(layer, "lora_enabled", False):
            merged[id(private_api.dense_kernel_variable(layer))] = layer
            lora.update(id(v) for v in (layer.lora_kernel_a, layer.lora_kernel_b))
    return merged, lora


def weight_values(model):
    """NumPy copies of `model_weights(model)`'s values, each LoRA layer's
    kernel with its update merged in: the weights `copy_model` starts from."""
    merged, _ = _lora_layers(model)
    return _merged_values(model_weights(model), merged)


def _merged_values(variables, merged):
    return [np.array(keras.ops.convert_to_numpy(merged[id(v)].kernel if id(v) in merged else v)) for v in variables]


def saved_weights(model):
    """`(variables, values)`: `model_weights(model)` as NumPy arrays, each
    float LoRA layer's kernel with its update merged in and its two factors
    left out (as `save_to_preset` saves it); a quantized LoRA layer, whose
    preset re-quantizes the merged kernel, as its variables."""
    merged, lora = _lora_layers(model, float_kernels_only=True)
    variables = [v for v in model_weights(model) if id(v) not in lora]
    return variables, _merged_values(variables, merged)


def copy_model(model, transform=None):
    """A fresh instance of `model`'s class, rebuilt from its config, holding a
    copy of its weights (optionally mapped by `transform(variable, value)`).

    The copy has none of the extras a `Pruner` attaches (masks, counters,
    constraints): it is the model a user would build themselves, with the
    layers they froze frozen, and each LoRA layer's update merged into its
    kernel (as `save_to_preset` saves it).
    """
    if not model.built:
        raise ValueError(f"{type(model).__name__} '{model.name}' is not built: call it on data first.")
    config = model.get_config()
    # Every weight is copied, so the backbone's are not drawn at random first (seconds for BERT-base). A
    # task is built around it outside: its constructor compiles, which Keras allows only there.
    backbone = getattr(model, "backbone", None)
    with deferred_initialization() as deferred:
        if backbone is None:
            clone = type(model).from_config(config)
        else:
            clone_backbone = type(backbone).from_config(backbone.get_config())
    if backbone is not None:
        clone = type(model).from_config({**config, "backbone": clone_backbone})
    # A LoRA layer's kernel is copied with its update merged in (as `save_to_preset` writes it); its two
    # LoRA weights are not copied: the config rebuilds the layer without them.
    merged, lora = _lora_layers(model)
    sources, targets = [v for v in model_weights(model) if id(v) not in lora], clone.weights
    if len(sources) != len(targets):
        raise ValueError(
            f"Could not copy {type(model).__name__} '{model.name}': its config rebuilds a model "
            f"with {len(targets)} weights, but it has {len(sources)}."
        )
    for source, target in zip(sources, targets):
        if tuple(source.shape) != tuple(target.shape) or source.dtype != target.dtype:
            raise ValueError(
                f"Could not copy {type(model).__name__} '{model.name}': weight {source.path} "
                f"{tuple(source.shape)} does not match the rebuilt {target.path} {tuple(target.shape)}."
            )

    def copy_weights():
        for source, target in zip(sources, targets):
            value = keras.ops.convert_to_numpy(merged[id(source)].kernel if id(source) in merged else source)
            target.assign(transform(source, value) if transform else value)

    deferred.fill(copy_weights, clone)
    copy_trainable_flags(model, clone)
    if hasattr(model, "source_preset"):
        clone.source_preset = model.source_preset
    return clone
