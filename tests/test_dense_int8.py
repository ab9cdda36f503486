"""bertzoo's Dense: int8 inference as TensorFlow's fused oneDNN kernel.

The fused kernel is checked against a NumPy computation of the same
arithmetic (symmetric per-tensor int8 inputs, Keras's int8 kernel and
per-channel scales, bias, activation), and the places where Keras's own
int8 path must run instead (XLA, gradients, exports) are checked to use it.
"""

import math
import platform

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.layers import dense as dense_module
from bertzoo.layers import get_activation
from bertzoo.layers.dense import Dense
from bertzoo.layers.dense import onednn_int8_available
from bertzoo.layers.dense import portable_kernels
from bertzoo.utils import cpu
from bertzoo.utils import onednn
from bertzoo.utils import private_api

needs_onednn = pytest.mark.skipif(
    not onednn_int8_available(), reason="needs TensorFlow's oneDNN CPU build (x86-64, no GPU)"
)

_ERF = np.vectorize(math.erf)
NUMPY_ACTIVATIONS = {
    None: lambda y: y,
    "gelu_tanh": lambda y: 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3))),
    "gelu_exact": lambda y: 0.5 * y * (1 + _ERF(y / math.sqrt(2))),
    "relu": lambda y: np.maximum(y, 0),
    "tanh": np.tanh,
    "silu": lambda y: y / (1 + np.exp(-y)),  # Not fused by oneDNN: applied after the kernel.
}


def float_dense(activation=None, units=24, inputs=40, seed=0, asymmetric=False):
    keras.utils.set_random_seed(seed)
    layer = Dense(
        units,
        activation=get_activation(activation) if activation else None,
        asymmetric_int8_inputs=asymmetric,
        bias_initializer="random_normal",
    )
    layer.build((None, inputs))
    return layer


def quantized_dense(activation=None, units=24, inputs=40, seed=0, asymmetric=False):
    layer = float_dense(activation, units, inputs, seed, asymmetric)
    layer.quantize("int8")
    return layer


def numpy_reference(layer, x, activation):
    """What the fused kernel computes, in float64."""
    x = np.asarray(x, "float64").reshape(-1, x.shape[-1])
    kernel = keras.ops.convert_to_numpy(private_api.dense_kernel_variable(layer)).astype("float64")
    scale = keras.ops.convert_to_numpy(layer.kernel_scale).astype("float64")
    bias = keras.ops.convert_to_numpy(layer.bias).astype("float64")
    if layer.asymmetric_int8_inputs:  # uint8 over [min(x, 0), max(x)], the offset folded into the bias.
        low = min(x.min(), 0.0)
        step = (x - low).max() / 255
        q = np.clip(np.round((x - low) / step), 0, 255)
        bias = bias + low * kernel.sum(0) / scale
    else:  # int8 over [-max|x|, max|x|].
        step = np.abs(x).max() / 127
        q = np.clip(np.round(x / step), -127, 127)
    return NUMPY_ACTIVATIONS[activation]((q @ kernel) * step / scale + bias)


def count_fused_calls(monkeypatch):
    calls = []
    fused = dense_module._fused_int8_dense

    def spy(layer, inputs):
        calls.append(layer.name)
        return fused(layer, inputs)

    monkeypatch.setattr(dense_module, "_fused_int8_dense", spy)
    return calls


def inputs(shape=(3, 5, 40), seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


@needs_onednn
@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("activation", list(NUMPY_ACTIVATIONS))
def test_fused_kernel_computes_the_int8_arithmetic(activation, asymmetric, monkeypatch):
    calls = count_fused_calls(monkeypatch)
    layer = quantized_dense(activation, asymmetric=asymmetric)
    x = inputs() + (0.5 if asymmetric else 0.0)  # Off-centre inputs for the zero point to matter.
    expected = numpy_reference(layer, x, activation).reshape(3, 5, -1)
    traced = tf.function(lambda t: layer(t, training=False))(tf.constant(x))
    eager = layer(x)
    assert traced.shape == eager.shape == (3, 5, 24)
    for out in (traced, eager):
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert len(calls) == 2  # Both the graph and the eager call used the fused kernel.


@needs_onednn
@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "asymmetric"])
def test_fused_kernel_gives_empty_outputs_for_an_empty_batch(asymmetric, monkeypatch):
    # An empty batch's max|x| is -inf, which QuantizeV2 refuses.
    calls = count_fused_calls(monkeypatch)
    layer = quantized_dense("gelu_tanh", asymmetric=asymmetric)
    traced = tf.function(lambda t: layer(t, training=False))
    for out in (layer(np.zeros((0, 5, 40), "float32")), traced(tf.zeros((0, 7, 40)))):
        assert out.shape[0] == 0 and out.shape[-1] == 24
    # All-zero inputs have a zero range (QuantizeV2 widens it): activation(bias).
    zeros = layer(np.zeros((2, 3, 40), "float32")).numpy()
    bias = keras.ops.convert_to_numpy(layer.bias).astype("float64")
    np.testing.assert_allclose(zeros, np.broadcast_to(NUMPY_ACTIVATIONS["gelu_tanh"](bias), (2, 3, 24)), atol=1e-6)
    assert len(calls) == 3


@needs_onednn
def test_fused_kernel_is_close_to_the_float_layer_and_keras_int8():
    layer = quantized_dense("gelu_tanh")
    keras.utils.set_random_seed(0)
    float_layer = Dense(24, activation=get_activation("gelu_tanh"), bias_initializer="random_normal")
    float_layer.build((None, 40))
    x = inputs()
    exact = float_layer(x).numpy()
    fused = layer(x).numpy()
    with portable_kernels():
        keras_int8 = layer(x).numpy()

    def relative(a):
        return np.linalg.norm(a - exact) / np.linalg.norm(exact)

    assert relative(fused) < 0.03 and relative(keras_int8) < 0.03
    assert not np.array_equal(fused, keras_int8)  # Per-tensor vs per-token input scales.


@needs_onednn
def test_new_weights_are_used_by_an_already_traced_function():
    # The kernel must not cache its weights: set_weights/load_weights after a
    # first predict would otherwise be ignored.
    layer = quantized_dense("gelu_exact", asymmetric=True)
    call = tf.function(lambda t: layer(t, training=False))
    x = inputs()
    call(x)
    kernel = private_api.dense_kernel_variable(layer)
    kernel.assign(-keras.ops.convert_to_numpy(kernel))
    expected = numpy_reference(layer, x, "gelu_exact").reshape(3, 5, -1)
    np.testing.assert_allclose(call(x).numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@needs_onednn
def test_model_uses_the_fused_kernel_without_xla_and_keras_int8_with_it(monkeypatch):
    calls = count_fused_calls(monkeypatch)
    keras.utils.set_random_seed(2)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=60, num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64, max_sequence_length=16
    )
    model = bertzoo.BertClassifier(backbone, 3)
    x = {
        "token_ids": np.random.default_rng(0).integers(1, 60, (4, 16)).astype("int32"),
        "segment_ids": np.zeros((4, 16), "int32"),
        "padding_mask": np.ones((4, 16), "int32"),
    }
    exact = model.predict_on_batch(x)
    quantized = bertzoo.quantize(model, "int8")
    assert bertzoo.utils.device.default_jit_compile(quantized) is False
    quantized.compile(jit_compile=False)
    fused = quantized.predict_on_batch(x)
    # 2 layers x (Q, K, V, attention output, 2 feed-forward) + pooler + classifier head.
    assert len(calls) == 14
    quantized.compile(jit_compile=True)
    with_xla = quantized.predict_on_batch(x)
    assert len(calls) == 14  # Inside XLA: Keras's int8 ops.
    scale = np.abs(exact).max()
    np.testing.assert_allclose(fused, exact, atol=0.05 * scale)
    np.testing.assert_allclose(with_xla, exact, atol=0.05 * scale)


def test_gradients_flow_through_keras_int8_path(monkeypatch):
    calls = count_fused_calls(monkeypatch)
    layer = quantized_dense("gelu_tanh")
    x = tf.constant(inputs())
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    gradient = tape.gradient(y, x)
    assert gradient is not None and np.abs(gradient.numpy()).max() > 0
    assert calls == []


def test_exports_hold_standard_ops_only(monkeypatch):
    layer = quantized_dense("gelu_tanh")
    spec = tf.TensorSpec((None, 40), tf.float32)

    def op_types():
        graph = tf.function(lambda t: layer(t, training=False)).get_concrete_function(spec).graph
        return {op.type for op in graph.get_operations()}

    with portable_kernels():
        assert "_QuantizedMatMul" not in op_types()
    if onednn_int8_available():
        assert "_QuantizedMatMul" in op_types()


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
def test_keras_quantize_reaches_bertzoo_dense_layers():
    # Keras's Model.quantize skips Dense subclasses unless they opt in.
    backbone = bertzoo.BertBackbone(vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)
    backbone.quantize("int8")
    modes = {
        layer.path: layer.quantization_mode
        for layer in private_api.flatten_layers(backbone)
        if isinstance(layer, Dense)
    }
    assert len(modes) == 7 and set(modes.values()) == {"int8"}
    # Only the matmul after GELU quantizes its inputs with a zero point; the setting round-trips.
    asymmetric = [
        layer.path for layer in private_api.flatten_layers(backbone) if getattr(layer, "asymmetric_int8_inputs", False)
    ]
    assert asymmetric == ["feedforward_0/output"]
    again = Dense.from_config(backbone.get_layer("feedforward_0").output_dense.get_config())
    assert again.asymmetric_int8_inputs is True


def fused_status_with(monkeypatch, op_def):
    """`fused_int8_status()` as it answers when the op registry returns `op_def`."""
    monkeypatch.setattr(private_api, "tensorflow_op_def", lambda name: op_def)
    onednn.fused_int8_status.cache_clear()
    try:
        return onednn.fused_int8_status()
    finally:
        monkeypatch.undo()
        onednn.fused_int8_status.cache_clear()


def test_a_missing_fused_op_falls_back_to_keras_int8_with_a_logged_reason(monkeypatch, caplog):
    layer = quantized_dense("gelu_tanh")
    x = inputs()
    with portable_kernels():
        expected = layer(x).numpy()
    calls = count_fused_calls(monkeypatch)
    monkeypatch.setattr(private_api, "tensorflow_op_def", lambda name: None)
    onednn.fused_int8_status.cache_clear()
    try:
        with caplog.at_level("INFO", logger="bertzoo"):
            available, reason = onednn.fused_int8_status()
            np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-6)
        assert not available
        assert calls == []  # Keras's int8 ops ran: same output as the portable path.
        assert onednn.FUSED_INT8_OP in reason or "oneDNN" in reason or "backend" in reason
        assert any(reason in record.getMessage() for record in caplog.records)
    finally:
        onednn.fused_int8_status.cache_clear()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only")
def test_a_cpu_without_int8_dot_products_does_not_run_the_fused_kernel(monkeypatch):
    # oneDNN's int8 matmul without VNNI or AMX adds pairs of u8 x s8 products in 16 bits, which saturate:
    # with TF_ENABLE_ONEDNN_OPTS=1 on an AVX2-only CPU its logits were 4-15x further from float32 than
    # Keras's int8 ops (the same static input scale).
    monkeypatch.setattr(private_api, "tensorflow_onednn_enabled", lambda: True)
    monkeypatch.setattr(private_api, "unexposed_op_runner_available", lambda: True)
    monkeypatch.setattr(private_api, "tensorflow_op_def", lambda name: None)  # Past the CPU check: no op.
    statuses = {}
    for name, flags in (("avx2", {"avx2", "fma"}), ("vnni", {"avx2", "avx512_vnni"}), ("unknown", None)):
        monkeypatch.setattr(onednn, "cpu_flags", lambda flags=flags: flags)
        onednn.fused_int8_status.cache_clear()
        statuses[name] = onednn.fused_int8_status()
    onednn.fused_int8_status.cache_clear()
    assert statuses["avx2"][0] is False
    assert "none of avx512_vnni, avx_vnni, amx_int8" in statuses["avx2"][1] and "saturate" in statuses["avx2"][1]
    for name in ("vnni", "unknown"):  # Checked further: here the missing op.
        assert statuses[name] == (False, f"TensorFlow has no {onednn.FUSED_INT8_OP} op registered")
    assert cpu.cpu_flags("processor : 0\nflags : fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert cpu.cpu_flags("") is None


@needs_onednn
def test_moved_tensorflow_internals_turn_the_fused_kernel_off(monkeypatch):
    assert private_api.unexposed_op_runner_available()
    monkeypatch.setattr(private_api, "unexposed_op_runner_available", lambda: False)
    onednn.fused_int8_status.cache_clear()
    try:
        available, reason = onednn.fused_int8_status()
    finally:
        monkeypatch.undo()
        onednn.fused_int8_status.cache_clear()
    assert not available and "moved the internals" in reason


@needs_onednn
def test_a_fused_op_with_another_signature_is_not_called(monkeypatch):
    real = private_api.tensorflow_op_def(onednn.FUSED_INT8_OP)
    assert onednn.check_fused_int8_op(real) is None
    assert fused_status_with(monkeypatch, real) == (True, None)

    renamed_attr = type(real)()
    renamed_attr.CopyFrom(real)
    next(a for a in renamed_attr.attr if a.name == "fused_ops").name = "post_ops"
    available, reason = fused_status_with(monkeypatch, renamed_attr)
    assert not available and "fused_ops" in reason

    other_inputs = type(real)()
    other_inputs.CopyFrom(real)
    other_inputs.input_arg[1].name = "min_max"
    available, reason = fused_status_with(monkeypatch, other_inputs)
    assert not available and "min_max" in reason
    assert onednn.check_fused_int8_op(None) == f"TensorFlow has no {onednn.FUSED_INT8_OP} op registered"
