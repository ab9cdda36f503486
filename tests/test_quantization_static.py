"""int8 with static input ranges: `bertzoo.quantize(..., input_ranges="static")`."""

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.compression.quantization import static_input_range
from bertzoo.layers import dense as dense_module
from bertzoo.layers.dense import Dense
from bertzoo.layers.dense import InputSmoothingInt8Policy
from bertzoo.layers.dense import observe_inputs
from bertzoo.layers.dense import onednn_int8_available
from bertzoo.layers.dense import portable_kernels
from bertzoo.utils.private_api import flatten_layers

TEXTS = ["a gripping, funny film", "dull and far too long", "fine", "what a lovely day out", "not for me", "superb"]


@pytest.fixture(scope="module")
def model(outlier_classifier):
    return outlier_classifier()


@pytest.fixture(scope="module")
def static(model):
    return bertzoo.quantize(model, "int8", calibration=TEXTS, smoothing=0.5, input_ranges="static")


def logits(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def relative_error(got, expected):
    return np.linalg.norm(got - expected) / np.linalg.norm(expected)


def static_reference(x, layer):
    """A static int8 Dense layer computed by hand in NumPy (float64)."""
    smoothed = x * keras.ops.convert_to_numpy(layer.input_scale)
    scale = 127.0 / float(keras.ops.convert_to_numpy(layer.input_range))
    quantized = np.clip(np.round(smoothed * scale), -127, 127)
    kernel = keras.ops.convert_to_numpy(layer._kernel).astype("float64")
    kernel_scale = keras.ops.convert_to_numpy(layer.kernel_scale)
    return np.tanh(quantized @ kernel / (kernel_scale * scale) + keras.ops.convert_to_numpy(layer.bias))


def static_layer(activation="tanh"):
    keras.utils.set_random_seed(3)
    layer = Dense(5, activation=activation, bias_initializer="random_normal")
    layer.build((None, 4))
    layer.smooth_inputs(np.array([1.0, 2.0, 0.5, 4.0]), input_range=1.5)
    return layer


@pytest.fixture
def layer():
    return static_layer()


# Smoothed (times 1 / [1, 2, 0.5, 4]), the second and third rows go beyond
# the range 1.5 on both sides (4, -3, 2, 2): those entries are clipped.
X = np.array([[0.3, -1.2, 0.2, 2.0], [4.0, 0.1, -0.4, -5.0], [-3.0, 0.5, 1.0, 8.0]], "float32")


def test_static_input_range_is_the_largest_smoothed_peak():
    assert static_input_range([4.0, 1.0], [2.0, 0.5]) == 2.0
    assert static_input_range([4.0, 3.0], [8.0, 1.0]) == 3.0
    assert static_input_range([0.0, 0.0], [1.0, 1.0]) == 1.0  # All-zero inputs: any range is exact.


def test_each_layer_keeps_the_largest_smoothed_input_of_the_calibration_pass(model, static):
    # The float model's inputs to each Dense layer, times the static copy's smoothing.
    static_layers = {layer.path: layer for layer in flatten_layers(static) if isinstance(layer, Dense)}
    assert len(static_layers) == 2 * 6 + 2
    largest = {}
    features = model.preprocessor(TEXTS)
    real = keras.ops.convert_to_numpy(features["padding_mask"]).astype(bool).reshape(-1)
    assert not real.all()  # Padded: the ranges must come from the real tokens' rows only.

    def observe(layer, inputs):
        smoothed = np.abs(
            keras.ops.convert_to_numpy(inputs) * keras.ops.convert_to_numpy(static_layers[layer.path].input_scale)
        )
        if smoothed.shape[0] == real.size:  # One row per token (the encoder's layers).
            smoothed = smoothed[real]
        largest[layer.path] = max(largest.get(layer.path, 0.0), float(smoothed.max()))

    with observe_inputs(observe):
        model(features, training=False)
    assert set(largest) == set(static_layers)
    for path, layer in static_layers.items():
        np.testing.assert_allclose(float(keras.ops.convert_to_numpy(layer.input_range)), largest[path], rtol=1e-5)
    assert model.output_dense.input_range is None  # The original is untouched.


@pytest.mark.parametrize("path", ["eager", "xla", "portable"])
def test_a_static_layer_computes_the_hand_written_arithmetic(layer, path):
    import tensorflow as tf

    x = X
    expected = static_reference(x.astype("float64"), layer)
    if path == "xla":
        got = tf.function(lambda x: layer(x, training=False), jit_compile=True)(tf.constant(x)).numpy()
    elif path == "portable":
        with portable_kernels():
            got = keras.ops.convert_to_numpy(layer(x, training=False))
    else:  # TensorFlow's fused oneDNN kernel where it runs, with the same range.
        got = keras.ops.convert_to_numpy(layer(x, training=False))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_xla_portable_and_gradient_calls_take_the_static_path_and_training_does_not(monkeypatch):
    import tensorflow as tf

    layer = static_layer(activation=None)
    calls = []
    static_dense = dense_module._static_int8_dense
    monkeypatch.setattr(dense_module, "_static_int8_dense", lambda *a: calls.append(1) or static_dense(*a))
    x = tf.constant(X)
    tf.function(lambda x: layer(x, training=False), jit_compile=True)(x)
    with portable_kernels():
        layer(x, training=False)
    assert len(calls) == 2
    # Gradients pass the rounding straight through (Keras's int8 rule): for
    # sum(y), each input's gradient is its smoothing times the dequantized kernel's row sum.
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=False)
    assert len(calls) == 3
    kernel = keras.ops.convert_to_numpy(layer._kernel) / keras.ops.convert_to_numpy(layer.kernel_scale)
    row_sums = keras.ops.convert_to_numpy(layer.input_scale) * kernel.sum(axis=1)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), np.tile(row_sums, (3, 1)), rtol=1e-5)
    layer(x, training=True)  # Training calls take Keras's per-token path.
    assert len(calls) == 3


def test_static_layers_compute_in_the_models_dtype(tmp_path, static):
    import tensorflow as tf

    static.save_to_preset(tmp_path / "q")
    again = bertzoo.BertClassifier.from_preset(tmp_path / "q", dtype="bfloat16")
    x = {k: tf.constant(v) for k, v in again.preprocessor(TEXTS).items()}
    assert again.backbone.pooler.input_range is not None
    for jit_compile in (True, False):  # XLA: the static path; without: the fused kernel where it runs.
        outputs = tf.function(lambda x: again.backbone(x, training=False), jit_compile=jit_compile)(x)
        assert outputs["sequence_output"].dtype == outputs["pooled_output"].dtype == tf.bfloat16


@pytest.mark.skipif(not onednn_int8_available(), reason="needs TensorFlow's oneDNN CPU build (x86-64, no GPU)")
def test_the_fused_kernel_uses_the_static_range(layer, monkeypatch):
    fused_calls = []
    fused = dense_module._fused_int8_dense
    monkeypatch.setattr(dense_module, "_fused_int8_dense", lambda *a: fused_calls.append(1) or fused(*a))
    got = keras.ops.convert_to_numpy(layer(X, training=False))
    assert fused_calls == [1]
    # The reference clips at the static range; a range measured per call would not clip, and would not match.
    np.testing.assert_allclose(got, static_reference(X.astype("float64"), layer), rtol=1e-4, atol=1e-4)


def test_static_model_stays_close_to_float(model, static):
    x = static.preprocessor(TEXTS)
    expected = logits(model, x)
    got = logits(static, x)
    assert not np.allclose(got, logits(bertzoo.quantize(model, "int8", calibration=TEXTS, smoothing=0.5), x))
    assert relative_error(got, expected) < 0.15


@pytest.mark.parametrize("dtype", [None, "bfloat16"], ids=["same", "retargeted"])
def test_static_presets_load_back_with_their_ranges(static, dtype, tmp_path):
    x = static.preprocessor(TEXTS)
    static.save_to_preset(tmp_path / "q")
    assert '"static_inputs": true' in (tmp_path / "q" / "config.json").read_text()
    kwargs = {} if dtype is None else {"dtype": dtype}
    again = bertzoo.BertClassifier.from_preset(tmp_path / "q", **kwargs)
    layer = again.backbone.attention_blocks[1].output_dense
    policy = layer.dtype_policy
    policy = policy[layer.path] if isinstance(policy, keras.dtype_policies.DTypePolicyMap) else policy
    assert isinstance(policy, InputSmoothingInt8Policy) and policy.static_inputs
    pairs = zip(flatten_layers(static), flatten_layers(again), strict=True)
    for a, b in ((a, b) for a, b in pairs if isinstance(a, Dense)):
        assert float(keras.ops.convert_to_numpy(a.input_range)) == float(keras.ops.convert_to_numpy(b.input_range))
    if dtype is None:
        np.testing.assert_allclose(logits(again, x), logits(static, x), atol=1e-6)
    else:
        # bfloat16 rounds the int32 sums and the outlier inputs (0.11 measured);
        # ranges lost on loading (all 1) would clip the outlier channels far more.
        got = keras.ops.convert_to_numpy(keras.ops.cast(again(x, training=False), "float32"))
        assert relative_error(got, logits(static, x)) < 0.2


def test_static_model_exports_to_a_saved_model(static, tmp_path):
    import tensorflow as tf

    static.export(tmp_path / "serving", format="tf_saved_model", int8_kernels="portable")
    served = tf.saved_model.load(str(tmp_path / "serving"))
    got = served.signatures["serving_default"](text=tf.constant(TEXTS))["logits"].numpy()
    with portable_kernels():
        expected = static.predict(TEXTS, verbose=0)
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_bad_static_requests(model, layer):
    with pytest.raises(ValueError, match="pass `calibration`"):
        bertzoo.quantize(model, "int8", input_ranges="static")
    with pytest.raises(ValueError, match="`input_ranges` must be one of"):
        bertzoo.quantize(model, "int8", calibration=TEXTS, input_ranges="fixed")
    fresh = Dense(3)
    fresh.build((None, 2))
    with pytest.raises(ValueError, match="positive finite"):
        fresh.smooth_inputs(np.ones(2), input_range=0.0)
    with pytest.raises(ValueError, match="needs finite activations"):
        static_input_range([1.0, np.inf], [1.0, 1.0])
