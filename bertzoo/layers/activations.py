"""Activation names understood by bertzoo configs.

BERT checkpoints disagree on GELU: Google's original TensorFlow code used the
tanh approximation, while Hugging Face's `"gelu"` (and Keras's default `gelu`)
is the exact erf form. The plain name `"gelu"` is therefore refused as
ambiguous; configs must say which one they mean.

When gradients are taken on TensorFlow outside XLA (`fit` with the default
`jit_compile="auto"` on CPU), both GELUs run as two small XLA-compiled
kernels, one for the values and one for the gradient (written out by hand,
computed in float32 for float16 and bfloat16 inputs), instead of
TensorFlow's chain of element-wise ops and their automatic gradient, each a
pass over the feed-forward block's largest tensor. The same function and gradient up to rounding (tested against
Keras's GELU; in bfloat16 closer to float32 than Keras's op chain); the
BERT-base training step is faster (docs/performance.md, "Fast paths";
`python -m benchmarks.training_kernels`). Inference keeps Keras's ops, which
oneDNN fuses into the preceding matmul.
"""

import math

import keras

from bertzoo.utils import private_api
from bertzoo.utils.optional import tf
from bertzoo.utils.scopes import ThreadScope

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715  # The tanh approximation's cubic coefficient.


def _gelu_tanh(x):
    if _fused_gradient_applies():
        return _fused_gelu(approximate=True)(x)
    return keras.activations.gelu(x, approximate=True)


def _gelu_exact(x):
    if _ERF_FORM.active():
        return 0.5 * x * (1.0 + keras.ops.erf(x * (1.0 / math.sqrt(2.0))))
    if _fused_gradient_applies():
        return _fused_gelu(approximate=False)(x)
    return keras.activations.gelu(x, approximate=False)


_ERF_FORM = ThreadScope()


def exact_gelu_as_erf():
    """Within this context, the exact GELU is written with `erf` instead of
    TensorFlow's `erfc` (same values up to float rounding), e.g. while
    tracing an ONNX export: tf2onnx has no conversion for `Erfc`.

    Example:
    ```python
    with exact_gelu_as_erf():
        keras.Model.export(model, "model.onnx", format="onnx")
    ```
    """
    return _ERF_FORM()


def _fused_gradient_applies():
    """TensorFlow, a gradient tape that may record, and no enclosing XLA
    computation (which fuses Keras's ops by itself)."""
    if keras.backend.backend() != "tensorflow":
        return False
    return private_api.gradient_tape_active() and not private_api.in_xla_context()


_FUSED = {}


def _fused_gelu(approximate):
    """GELU with a hand-written gradient, each direction one XLA kernel
    (built once per form, then reused)."""
    if approximate in _FUSED:
        return _FUSED[approximate]

    def values_and_slope(x):
        # GELU(x) = x * Phi(x) and its derivative.
        if approximate:
            t = tf.tanh(_SQRT_2_OVER_PI * (x + _CUBIC * x * x * x))
            # d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x), with 1 - t^2 = (1 - t)(1 + t).
            slope = 0.5 * (1.0 + t) * (1.0 + x * (1.0 - t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _CUBIC * x * x))
            return 0.5 * x * (1.0 + t), slope
        cdf = 0.5 * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0))))
        return x * cdf, cdf + x * tf.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))

    def widened(x):
        # float16 and bfloat16 are computed in float32, wider types as they are.
        return tf.cast(x, tf.float32) if x.dtype.size < 4 else x

    @tf.function(jit_compile=True, autograph=False, reduce_retracing=True)
    def forward(x):
        return tf.cast(values_and_slope(widened(x))[0], x.dtype)

    @tf.function(jit_compile=True, autograph=False, reduce_retracing=True)
    def backward(x, upstream):
        x = widened(x)
        slope = values_and_slope(x)[1]
        return tf.cast(tf.cast(upstream, x.dtype) * slope, upstream.dtype)

    @tf.custom_gradient
    def gelu(x):
        return forward(x), lambda upstream: backward(x, upstream)

    _FUSED[approximate] = gelu
    return gelu


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
