"""Keras serialization, restricted to bertzoo's classes and Keras built-ins.

A preset's `config.json` holds `keras.saving.serialize_keras_object` trees.
Before anything is deserialized, `check_config` walks the whole tree: every
object must be a class registered under the `"bertzoo>"` package (with
`keras.saving.register_keras_serializable(package="bertzoo")`, looked up in
Keras's registry, never imported by the module name the file gives) or a Keras
built-in. Anything else is refused, so loading a preset imports no module and
runs no code of the file's choosing (and there is no pickle anywhere).

Quantization travels in the dtype policies, as in keras-hub: a quantized
model's config stores a `keras.dtype_policies.DTypePolicyMap` (layer path ->
quantized policy). Layers built under such a map create int8 / int4 weights
directly (`quantized_policy_map`, `quantize_layers`).
"""

import keras

from bertzoo.layers.dense import InputSmoothingInt8Policy
from bertzoo.layers.dense import WeightOnlyInt8Policy
from bertzoo.utils.layers import own_dtype_policy
from bertzoo.utils.private_api import one_garbage_collection

PACKAGE = "bertzoo"
# Keras's own markers for plain Python values inside a serialized tree.
_KERAS_VALUE_MARKERS = ("__tuple__",)
# Entries `serialize_keras_object` adds that a preset does not keep: a
# preset holds a model's structure and weights, not its build or compile state.
_STATE_KEYS = ("build_config", "compile_config")


def _is_bertzoo_object(obj):
    return obj is not None and getattr(obj, "__module__", "").split(".")[0] == PACKAGE


def _public_keras_module(module):
    # Keras's public namespaces only: a name under `keras.src` reaches
    # internals (file utilities, ...) that no preset needs.
    return isinstance(module, str) and module.split(".")[0] == "keras" and not module.startswith("keras.src")


def _allowed(node):
    class_name = node.get("class_name")
    module = node.get("module")
    registered = node.get("registered_name")
    if isinstance(registered, str) and registered.startswith(f"{PACKAGE}>"):
        if class_name == "function" and node.get("config") != registered:
            return False
        return _is_bertzoo_object(keras.saving.get_registered_object(registered))
    if class_name in _KERAS_VALUE_MARKERS:
        return module is None and registered is None
    if not isinstance(class_name, str) or class_name.startswith("__"):
        return False  # `__lambda__` (code), `__numpy__`, ...
    if class_name == "function":
        # A Keras built-in function (e.g. an activation) is saved as
        # `{"module": "builtins", "config": "gelu", "registered_name": "function"}`.
        name = node.get("config")
        if not isinstance(name, str) or ">" in name or keras.saving.get_registered_object(name) is not None:
            return False
        return module == "builtins" or _public_keras_module(module)
    if registered is not None and registered != class_name:
        return False  # A custom (third-party) registered name.
    return _public_keras_module(module)


def check_config(config, source="the config"):
    """Raises ValueError unless every serialized object in `config` (at any
    depth) is a registered bertzoo class or a Keras built-in."""

    def visit(node, where):
        if isinstance(node, dict):
            if "class_name" in node and not _allowed(node):
                raise ValueError(
                    f"{source} names the class {node.get('class_name')!r} (module {node.get('module')!r}, "
                    f"registered name {node.get('registered_name')!r}) at {where or 'its top level'}: only "
                    f"classes registered under '{PACKAGE}>' (keras.saving.register_keras_serializable("
                    f"package='{PACKAGE}')) and Keras built-ins are loaded, so the file is refused. A preset "
                    "never makes bertzoo import a module or run code."
                )
            for key, value in node.items():
                visit(value, f"{where}.{key}" if where else str(key))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                visit(value, f"{where}[{i}]")

    visit(config, "")


def deserialize(config, source="the config"):
    """`keras.saving.deserialize_keras_object(config)` after `check_config`."""
    check_config(config, source)
    return keras.saving.deserialize_keras_object(config, safe_mode=True)


def serialize(obj):
    """`keras.saving.serialize_keras_object(obj)` without build and compile
    state (at any depth)."""

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not ("class_name" in node and k in _STATE_KEYS)}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(keras.saving.serialize_keras_object(obj))


def registered_node(cls, config):
    """The serialized form of `cls(**config)`, without building it."""
    return {
        "module": cls.__module__,
        "class_name": cls.__name__,
        "config": config,
        "registered_name": keras.saving.get_registered_name(cls),
    }


# --- Quantization as dtype policies ----------------------------------------


def quantized_policy_map(layers, default_policy):
    """A `DTypePolicyMap` from the path of each quantized layer in `layers` to
    its quantized policy, or None when none is quantized."""
    if isinstance(default_policy, keras.dtype_policies.DTypePolicyMap):
        default_policy = default_policy.default_policy
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=default_policy)
    for layer in layers:
        if layer.path and layer.quantization_mode and layer.path not in policy_map:
            policy_map[layer.path] = own_dtype_policy(layer)
    return policy_map if len(policy_map) else None


def policy_map_modes(policy):
    """`{layer path: quantization mode}` of a (deserialized) dtype policy."""
    if not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return {}
    return {path: policy[path].quantization_mode for path in policy if policy[path].quantization_mode}


def retarget_policy_map(policy_map, dtype):
    """`policy_map` for a model built in `dtype` (a policy or its name; None:
    Keras's global policy): same quantized layers, `dtype` as their source."""
    base = keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
    if isinstance(base, keras.dtype_policies.DTypePolicyMap):
        base = base.default_policy
    retargeted = keras.dtype_policies.DTypePolicyMap(default_policy=base)
    for path in policy_map_modes(policy_map):
        policy = policy_map[path]
        if isinstance(policy, InputSmoothingInt8Policy):
            retargeted[path] = InputSmoothingInt8Policy(
                source_name=base.name, group=policy.group, static_inputs=policy.static_inputs
            )
            continue
        if isinstance(policy, WeightOnlyInt8Policy):
            retargeted[path] = WeightOnlyInt8Policy(source_name=base.name)
            continue
        mode = policy.get_config()["mode"]  # With its details, e.g. "int4/128".
        retargeted[path] = keras.dtype_policies.get(f"{mode}_from_{base.name}")
    return retargeted


def quantize_layers(layers, policy_map):
    """Quantizes (Keras's `Layer.quantize`) each built float layer of `layers`
    whose path `policy_map` maps to a quantized policy, so the weights of the
    model that map describes load into them."""
    todo = []
    for layer in layers:
        if layer.built and layer.path and not layer.quantization_mode:
            policy = policy_map[layer.path]
            if policy.quantization_mode:
                todo.append((layer, policy))
    if todo:
        with one_garbage_collection():
            for layer, policy in todo:
                layer.dtype_policy = policy  # Keras quantizes a built layer given a quantized policy.
