"""Small helpers for argument and input validation."""

import difflib
import inspect
import math
import os

import numpy as np
from keras import ops


class BackendError(RuntimeError):
    """What bertzoo raises when a feature needs another Keras backend than
    the one running (e.g. a SavedModel export off TensorFlow); the CLI
    prints it as a message.

    Example:
    ```python
    raise BackendError("SavedModel export needs the TensorFlow backend ...")
    ```
    """


def concrete_value(x):
    """Returns `x` as a NumPy array when it holds concrete values, else None.

    Symbolic tensors (functional-model construction, `tf.function` graphs, JAX
    tracers) have no values, so eager-only input checks are skipped for them.
    """
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # noqa: BLE001 - any backend's "not concrete" error
        return None


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    return int(value)


def check_rate(name, value):
    if not isinstance(value, (int, float, np.integer, np.floating)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"`{name}` must be a float in [0, 1), got {value!r}.")
    return float(value)


def check_non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}.")
    return int(value)


def check_bool(name, value):
    """`value` as a bool; a ValueError naming `name` unless it is True or
    False (a NumPy bool too): a string such as "no" would read as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def _finite_number(value):
    """Whether `value` is a finite int or float (NumPy's too), not a bool."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float, np.integer, np.floating))
        and math.isfinite(value)
    )


def check_positive_number(name, value):
    if not (_finite_number(value) and value > 0):
        raise ValueError(f"`{name}` must be a finite positive number, got {value!r}.")
    return value


def check_non_negative_number(name, value):
    if not (_finite_number(value) and value >= 0):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return value


def public_settings(obj, names=None):
    """The public attributes of `obj` (those in `names` when given) that
    hold plain values (None, bools, numbers, strings, or lists and tuples of
    them), sorted: what a function traced from `obj` may have read from it,
    to compare before reusing it."""

    def plain(value):
        return value is None or isinstance(value, (bool, int, float, str))

    settings = []
    for name, value in vars(obj).items():
        if isinstance(value, list):
            value = tuple(value)
        if names is not None and name not in names:
            continue
        if not name.startswith("_") and (plain(value) or (isinstance(value, tuple) and all(map(plain, value)))):
            settings.append((name, value))
    return tuple(sorted(settings))


def vocabulary_overflow(tokens, rows, what="The vocabulary"):
    """None when a vocabulary of `tokens` entries fits an embedding table of
    `rows` rows, else the message saying why not. A shorter vocabulary fits:
    checkpoints pad their tables (NVIDIA's BERT to a multiple of 8: 30522
    tokens, 30528 rows), and a tokenizer never looks the extra rows up.

    Example:
    ```python
    vocabulary_overflow(30522, 30528)  # None
    ```
    """
    if tokens <= rows:
        return None
    return (
        f"{what} has {tokens} tokens but the embedding table only {rows} rows (vocabulary_size={rows}): ids "
        f"from {rows} up would index past the table, so they do not belong together."
    )


def constructor_arguments(cls):
    """`{name: inspect.Parameter}` of the arguments `cls.__init__` names
    (not `self`, `*args` or `**kwargs`)."""
    return {
        name: p
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def check_keyword_arguments(cls, kwargs, also=(), base=("name", "trainable", "dtype"), skip=(), caller=None):
    """Raises TypeError for a keyword argument that neither `cls.__init__`
    (nor an `__init__` it extends through `**kwargs`) names, nor `base`
    (Keras's model arguments) or `also` takes: Keras's functional
    constructor drops unknown ones silently, so a misspelled `num_layer=2`
    would build the default model without a word. `skip`: named arguments
    the caller sets itself; `caller`: the name the error gives."""
    named = set()
    for klass in cls.__mro__:  # A subclass's own arguments, and those its **kwargs hand on.
        if "__init__" in vars(klass) and not klass.__module__.startswith(("keras", "builtins", "torch")):
            named |= set(constructor_arguments(klass))
    named = (named | set(base)) - set(skip)
    taken = named | set(also)
    unknown = [key for key in kwargs if key not in taken]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(taken), n=1)
            hints.append(f"`{key}`" + (f" (did you mean `{close[0]}`?)" if close else ""))
        raise TypeError(
            f"{caller or cls.__name__} got unexpected keyword arguments: {', '.join(hints)}. "
            f"It takes {', '.join(sorted(named))}."
        )


def check_config_keys(cls, config, provided=(), common=("name", "trainable", "dtype")):
    """Raises ValueError unless `config` holds every required argument of
    `cls.__init__` (those without a default, less the `provided` ones) and no
    key `cls.__init__` (or `common`, the Keras base arguments) does not take."""
    if not isinstance(config, dict):
        raise ValueError(f"The {cls.__name__} config must be a JSON object, got {type(config).__name__}.")
    named = constructor_arguments(cls)
    for name, p in named.items():
        if p.default is inspect.Parameter.empty and name not in provided and name not in config:
            raise ValueError(f"`{name}` is missing: {cls.__name__} requires it.")
    if "name" in config and config["name"] is not None and not isinstance(config["name"], str):
        raise ValueError(f"`name` must be a string, got {config['name']!r}.")
    if "trainable" in config and not isinstance(config["trainable"], bool):
        raise ValueError(f"`trainable` must be True or False, got {config['trainable']!r}.")
    for key in config:
        if not isinstance(key, str) or (key not in named and key not in common):
            raise ValueError(
                f"`{key}` is not an argument of {cls.__name__} (expected some of {sorted(set(named) | set(common))})."
            )


def memory_limit_bytes():
    """The most bytes a model's weights may take: this machine's physical
    memory (1 TiB where the platform does not tell). Configs describing
    larger models are refused before anything is allocated."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 1 << 40
