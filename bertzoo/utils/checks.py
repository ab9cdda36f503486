"""Small helpers for argument and input validation."""

import numpy as np
from keras import ops


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
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"`{name}` must be a float in [0, 1), got {value!r}.")
    return float(value)
