"""GELU's training path on TensorFlow: two XLA kernels with a hand-written
gradient (`bertzoo.layers.activations`), checked against Keras's GELU and its
automatic gradient."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertzoo.layers import activations
from bertzoo.layers import get_activation

APPROXIMATE = {"gelu_tanh": True, "gelu_exact": False}
X = np.linspace(-6.0, 6.0, 603, dtype="float32").reshape(3, 201)


def keras_values_and_gradient(name, x, dtype="float32"):
    x = tf.constant(x, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = keras.activations.gelu(x, approximate=APPROXIMATE[name])
        loss = tf.reduce_sum(y * tf.cast(tf.range(y.shape[-1]) % 7 - 3, dtype))
    return y, tape.gradient(loss, x)


def bertzoo_values_and_gradient(name, x, dtype="float32"):
    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = get_activation(name)(x)
            loss = tf.reduce_sum(y * tf.cast(tf.range(y.shape[-1]) % 7 - 3, dtype))
        return y, tape.gradient(loss, x)

    return run(tf.constant(x, dtype))


def xla_calls(fn, *args):
    """The names of the XLA-compiled functions a traced `fn(*args)` calls."""
    graph = tf.function(fn).get_concrete_function(*args).graph
    names = []
    for op in graph.get_operations():
        if op.type in ("PartitionedCall", "StatefulPartitionedCall"):
            try:
                if op.get_attr("_XlaMustCompile"):
                    names.append(op.get_attr("f").name)
            except ValueError:
                pass
    return names


@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_exact"])
def test_training_gelu_matches_keras_values_and_gradient(name):
    expected_y, expected_grad = keras_values_and_gradient(name, X)
    y, grad = bertzoo_values_and_gradient(name, X)
    np.testing.assert_allclose(y.numpy(), expected_y.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad.numpy(), expected_grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_exact"])
def test_training_gelu_in_bfloat16_keeps_the_dtype_and_is_at_least_as_close_to_float32(name):
    reference_y, reference_grad = keras_values_and_gradient(name, X)
    keras_y, keras_grad = keras_values_and_gradient(name, X, "bfloat16")
    y, grad = bertzoo_values_and_gradient(name, X, "bfloat16")
    assert y.dtype == tf.bfloat16 and grad.dtype == tf.bfloat16

    def error(a, b):
        return float(np.max(np.abs(tf.cast(a, tf.float32).numpy() - b.numpy())))

    # float32 inside the kernels: no worse than Keras's bfloat16 op chain.
    assert error(y, reference_y) <= error(keras_y, reference_y) + 1e-6
    assert error(grad, reference_grad) <= error(keras_grad, reference_grad) + 1e-6


def test_float64_is_computed_in_float64():
    x = np.linspace(-3.0, 3.0, 7)
    weights = (np.arange(7) % 7 - 3).astype("float64")  # The loss weights of bertzoo_values_and_gradient.
    cdf = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    density = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    y, grad = bertzoo_values_and_gradient("gelu_exact", x, "float64")
    assert y.dtype == tf.float64
    np.testing.assert_allclose(y.numpy(), x * cdf, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grad.numpy(), weights * (cdf + x * density), rtol=1e-12, atol=1e-15)


def test_the_xla_kernels_run_only_when_gradients_may_be_taken():
    x = tf.TensorSpec((2, 8), tf.float32)
    gelu = get_activation("gelu_tanh")

    def inference(x):
        return gelu(x)

    def training(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = gelu(x)
        return tape.gradient(y, x)

    # Inference keeps Keras's element-wise ops (oneDNN fuses them into the matmul).
    assert xla_calls(inference, x) == []
    # Training: the forward kernel, and the backward kernel in the gradient.
    assert len(xla_calls(training, x)) == 2


def test_inside_xla_gelu_is_keras_own_and_outside_the_kernels_apply():
    seen = []

    def spy(x):
        seen.append(activations._fused_gradient_applies())
        return x

    x = tf.ones((2, 3))
    with tf.GradientTape() as tape:
        tape.watch(x)
        tf.function(spy, jit_compile=True)(x)
        tf.function(spy, jit_compile=False)(x)
    assert seen == [False, True]


def test_a_small_model_trains_the_same_with_either_gelu(monkeypatch, make_bert_inputs):
    import bertzoo

    x = make_bert_inputs(batch=4, length=8)
    y = np.array([0, 1, 0, 1])

    def losses():
        keras.utils.set_random_seed(0)
        backbone = bertzoo.BertBackbone(
            vocabulary_size=50,
            num_layers=1,
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
            max_sequence_length=8,
            dropout=0.0,
            activation="gelu_exact",
        )
        model = bertzoo.BertClassifier(backbone, 2, dropout=0.0)
        model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=False)
        return [float(np.ravel(model.train_on_batch(x, y))[0]) for _ in range(4)]

    fused = losses()
    monkeypatch.setattr(activations, "_fused_gradient_applies", lambda: False)
    plain = losses()
    assert fused[-1] < fused[0]
    np.testing.assert_allclose(fused, plain, rtol=1e-4)
