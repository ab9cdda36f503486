"""Helpers shared by the compression tools: leaf layers, copies, checks."""

import keras

# The attribute under which a `bertzoo.Pruner` attaches its state (masks and
# step counters) to the model it prunes; saved with the model's weights.
PRUNING_STATE_ATTR = "_pruning_state"


def leaf_layers(model):
    """Every layer of `model` (nested ones included) without sub-layers,
    each once, in the model's order."""
    seen, leaves = set(), []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if id(layer) in seen or list(layer._flatten_layers(include_self=False, recursive=False)):
            continue
        seen.add(id(layer))
        leaves.append(layer)
    return leaves


def pruning_state(model):
    """The pruning state a `Pruner` attached to `model`, or None."""
    return getattr(model, PRUNING_STATE_ATTR, None)


def quantization_mode(model):
    """The quantization mode of `model`'s layers ("int8", ...), or None."""
    for layer in leaf_layers(model):
        mode = getattr(layer, "quantization_mode", None)
        if mode:
            return mode
    return None


def model_weights(model):
    """`model.weights` without a pruner's masks and counters."""
    state = pruning_state(model)
    skip = {id(v) for v in state.weights} if state is not None else set()
    return [v for v in model.weights if id(v) not in skip]


def copy_model(model, transform=None):
    """A fresh instance of `model`'s class, rebuilt from its config, holding a
    copy of its weights (optionally mapped by `transform(variable, value)`).

    The copy has none of the extras a `Pruner` attaches (masks, counters,
    constraints): it is the model a user would build themselves.
    """
    if not model.built:
        raise ValueError(f"{type(model).__name__} '{model.name}' is not built: call it on data first.")
    config = model.get_config()
    clone = type(model).from_config(config)
    sources, targets = model_weights(model), clone.weights
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
        value = keras.ops.convert_to_numpy(source)
        target.assign(transform(source, value) if transform else value)
    if hasattr(model, "source_preset"):
        clone.source_preset = model.source_preset
    return clone
