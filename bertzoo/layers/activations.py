"""Activation names understood by bertzoo configs.

BERT checkpoints disagree on GELU: Google's original TensorFlow code used the
tanh approximation, while Hugging Face's `"gelu"` (and Keras's default `gelu`)
is the exact erf form. The plain name `"gelu"` is therefore refused as
ambiguous; configs must say which one they mean.
"""

import keras


def _gelu_tanh(x):
    return keras.activations.gelu(x, approximate=True)


def _gelu_exact(x):
    return keras.activations.gelu(x, approximate=False)


_ACTIVATIONS = {
    "gelu_tanh": _gelu_tanh,
    "gelu_exact": _gelu_exact,
    "relu": keras.activations.relu,
    "silu": keras.activations.silu,
    "tanh": keras.activations.tanh,
}
SUPPORTED_ACTIVATIONS = tuple(_ACTIVATIONS)


def get_activation(name):
    """Returns the activation function for a bertzoo activation name.

    Example:
    ```python
    get_activation("gelu_exact")(keras.ops.zeros((2,)))
    ```
    """
    if name == "gelu":
        raise ValueError(
            "activation='gelu' is ambiguous: use 'gelu_exact' for the erf form "
            "(Hugging Face 'gelu', Keras's default) or 'gelu_tanh' for the "
            "tanh approximation (Google's original BERT code)."
        )
    if name not in _ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}. Expected one of {list(SUPPORTED_ACTIVATIONS)}.")
    return _ACTIVATIONS[name]
