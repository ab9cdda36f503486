"""Walking a model's layers: its leaf layers and its quantization mode."""

import keras

from bertzoo.utils import private_api

# The attribute under which a `bertzoo.Pruner` attaches its state (masks and
# step counters) to the model it prunes. Here, low, so that saving can refuse
# such a model without importing the compression package.
PRUNING_STATE_ATTR = "_pruning_state"


def attached_pruning_state(model):
    """`(owner, state)`: the pruning state a `Pruner` attached to `model` or
    to a model inside it (a task's backbone), and the model holding it; or
    `(None, None)`."""
    for layer in private_api.flatten_layers(model, include_self=True, recursive=True):
        state = getattr(layer, PRUNING_STATE_ATTR, None)
        if state is not None:
            return layer, state
    return None, None


def leaf_layers(model):
    """Every layer of `model` (nested ones included) without sub-layers,
    each once, in the model's order."""
    seen, leaves = set(), []
    for layer in private_api.flatten_layers(model, include_self=False, recursive=True):
        if id(layer) in seen or private_api.flatten_layers(layer, include_self=False, recursive=False):
            continue
        seen.add(id(layer))
        leaves.append(layer)
    return leaves


def copy_trainable_flags(source, target):
    """Freezes (or unfreezes) each layer of `target` as its counterpart in
    `source` is, for `target` rebuilt from `source`'s config (the same
    layers, in the same order): a config holds constructor arguments, not
    which sub-layers a user froze. Layers are paired in order and only
    where their names agree.

    Example:
    ```python
    model.backbone.embeddings.trainable = False
    copy = type(model).from_config(model.get_config())
    copy_trainable_flags(model, copy)  # copy.backbone.embeddings.trainable is False
    ```
    """
    # Depth first, each layer before its sub-layers: setting a layer's flag sets theirs, which come next.
    for original, rebuilt in zip(private_api.flatten_layers(source), private_api.flatten_layers(target)):
        if original.name == rebuilt.name and original.trainable != rebuilt.trainable:
            rebuilt.trainable = original.trainable


def own_dtype_policy(layer):
    """`layer`'s own dtype policy: its entry when it holds a
    `DTypePolicyMap` (layer path -> policy), else its policy.

    Example:
    ```python
    own_dtype_policy(quantized.backbone.pooler).quantization_mode  # "int8"
    ```
    """
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        policy = policy[layer.path]
    return policy


def quantization_mode(model_or_policy):
    """The quantization mode a model, layer or dtype policy computes with:
    None (float), or the mode (`"int8"`, `"int4"`, ...).

    For a model the layers decide: `quantize()` changes the policies of its
    Dense/Embedding layers, not the model's own. A model whose layers use
    several modes gives them sorted and joined by `+` (e.g. `"int4+int8"`).
    A policy name or `None` (the global policy) reads that policy.

    Example:
    ```python
    quantization_mode(bertzoo.quantize(model, "int8"))  # "int8"
    quantization_mode("mixed_bfloat16")  # None
    ```
    """
    if model_or_policy is None or isinstance(model_or_policy, (str, keras.DTypePolicy)):
        policy = keras.dtype_policies.get(model_or_policy or keras.config.dtype_policy())
        return policy.quantization_mode or None
    if not isinstance(model_or_policy, keras.layers.Layer):
        raise TypeError(
            "quantization_mode() takes a Keras model or layer, a dtype policy or a policy name, "
            f"got {type(model_or_policy).__name__}."
        )
    layers = private_api.flatten_layers(model_or_policy, include_self=True, recursive=True)
    modes = sorted({getattr(layer, "quantization_mode", None) for layer in layers} - {None})
    return "+".join(modes) or None


def quantizes_int8_inputs(model):
    """True when an int8 layer of `model` quantizes its inputs on every call
    (Keras's int8 Dense, with dynamic or static ranges: integer matmuls);
    False for float, int4 and weight-only int8 models, whose matmuls are
    float.

    Example:
    ```python
    quantizes_int8_inputs(bertzoo.quantize(model, "int8"))  # True
    quantizes_int8_inputs(bertzoo.quantize(model, "int8", weight_only=True))  # False
    ```
    """
    layers = private_api.flatten_layers(model, include_self=True, recursive=True)
    return any(
        getattr(layer, "quantization_mode", None) == "int8" and getattr(layer, "inputs_quantizer", None) is not None
        for layer in layers
    )


def assign_copy(target, source):
    """`target.assign(source)` in `target`'s dtype, always into a buffer of
    its own. On JAX a variable keeps the very array it is assigned, so taking
    another variable's array would make two models share one buffer, which
    a jitted training step then donates: the other model's weights are gone.

    Example:
    ```python
    assign_copy(student_layer.kernel, teacher_layer.kernel)
    ```
    """
    target.assign(keras.ops.copy(keras.ops.cast(source, target.dtype)))
