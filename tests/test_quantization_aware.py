"""Quantization-aware training: Dense layers that simulate int8 while they
train, and `bertzoo.quantization_aware_training`.

The simulated rounding is checked against the arithmetic of the int8 layer
it stands for (the NumPy reference of the fused kernel in
`test_dense_int8.py`, and the fused kernel itself where TensorFlow has it),
the straight-through gradient by hand, and the training function by what
it returns."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_dense_int8 import float_dense
from test_dense_int8 import needs_onednn
from test_dense_int8 import numpy_reference

import bertzoo
from bertzoo.layers.dense import Dense
from bertzoo.layers.dense import simulated_int8_inputs
from bertzoo.layers.dense import simulated_int8_kernel
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary
from bertzoo.utils import private_api

TEXTS = ["a gripping, funny film", "dull and far too long", "fine", "what a lovely day out"] * 4
LABELS = [1, 0, 1, 1] * 4


@pytest.mark.parametrize(("activation", "asymmetric"), [(None, False), ("gelu_tanh", False), (None, True)])
def test_simulated_dense_computes_what_the_int8_layer_will(activation, asymmetric):
    layer = float_dense(activation, asymmetric=asymmetric)
    x = np.random.default_rng(1).normal(0.0, 1.5, (3, 5, 40)).astype("float32")
    if asymmetric:
        x = np.maximum(x, -0.17)  # One-sided, as GELU outputs are.
    plain = keras.ops.convert_to_numpy(layer(x))
    layer.simulate_int8 = True
    simulated = keras.ops.convert_to_numpy(layer(x))
    assert np.abs(simulated - plain).max() > 1e-4  # The rounding shows.

    layer.simulate_int8 = False
    layer.quantize("int8")
    expected = numpy_reference(layer, x, activation).reshape(simulated.shape)
    np.testing.assert_allclose(simulated, expected, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_simulated_dense_matches_the_fused_int8_kernel():
    layer = float_dense("gelu_tanh", asymmetric=True)
    x = np.abs(np.random.default_rng(2).normal(0.0, 1.0, (4, 40))).astype("float32") - 0.1
    layer.simulate_int8 = True
    simulated = keras.ops.convert_to_numpy(layer(x))
    layer.simulate_int8 = False
    layer.quantize("int8")
    fused = keras.ops.convert_to_numpy(layer(x, training=False))
    np.testing.assert_allclose(simulated, fused, rtol=1e-4, atol=1e-4)


def test_simulated_kernel_is_keras_int8_kernel_dequantized():
    layer = float_dense()
    simulated = keras.ops.convert_to_numpy(simulated_int8_kernel(layer.kernel))
    layer.quantize("int8")
    int8 = keras.ops.convert_to_numpy(private_api.dense_kernel_variable(layer)).astype("float32")
    np.testing.assert_allclose(simulated, int8 / keras.ops.convert_to_numpy(layer.kernel_scale), rtol=1e-6)


def test_a_mixed_bfloat16_layer_simulates_the_grid_of_its_float32_kernel(monkeypatch):
    """Under autocast the layer reads its kernel in bfloat16, where `kernel *
    scale` has steps of 0.5 above 64: the rounding must start from the stored
    float32 kernel, in float32, as `Model.quantize` does."""
    from bertzoo.layers import dense as dense_module

    layer = Dense(64, dtype="mixed_bfloat16")
    layer.build((None, 128))
    layer.simulate_int8 = True
    seen = []

    def spy(kernel, dtype=None):
        seen.append(keras.ops.convert_to_numpy(kernel))
        return simulated_int8_kernel(kernel, dtype)

    monkeypatch.setattr(dense_module, "simulated_int8_kernel", spy)
    out = layer(np.random.default_rng(0).normal(size=(2, 128)).astype("float32"))
    assert out.dtype == "bfloat16"
    stored = keras.ops.convert_to_numpy(layer.kernel)
    np.testing.assert_array_equal(seen[0], stored)  # float32, not its bfloat16 copy.
    grid = keras.ops.convert_to_numpy(simulated_int8_kernel(keras.ops.convert_to_tensor(stored)))
    scale = 127.0 / (np.abs(stored.astype("float64")).max(axis=0, keepdims=True) + keras.config.epsilon())
    np.testing.assert_array_equal(np.round(grid * scale), np.clip(np.round(stored * scale), -127, 127))
    # In bfloat16 the same kernel rounds to other integers in places: what the spy guards against.
    coarse = keras.ops.convert_to_numpy(
        keras.ops.cast(simulated_int8_kernel(keras.ops.cast(stored, "bfloat16")), "float32")
    )
    assert np.any(np.round(coarse.astype("float64") * scale) != np.round(stored * scale))


def test_simulated_inputs_match_tensorflow_quantize_dequantize():
    x = tf.constant(np.random.default_rng(3).normal(0.0, 2.0, (6, 7)).astype("float32"))
    largest = tf.reduce_max(tf.abs(x))
    q = tf.quantization.quantize(x, -largest, largest, tf.qint8, mode="SCALED", narrow_range=True)
    expected = tf.quantization.dequantize(q.output, q.output_min, q.output_max, mode="SCALED", narrow_range=True)
    np.testing.assert_allclose(simulated_int8_inputs(x).numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)

    y = tf.nn.relu(x) - 0.3
    low = tf.minimum(tf.reduce_min(y), 0.0)
    q = tf.quantization.quantize(y - low, 0.0, tf.reduce_max(y - low), tf.quint8, mode="SCALED")
    expected = tf.quantization.dequantize(q.output, q.output_min, q.output_max, mode="SCALED") + low
    np.testing.assert_allclose(simulated_int8_inputs(y, asymmetric=True).numpy(), expected.numpy(), atol=1e-5)


def test_rounding_passes_gradients_straight_through():
    x = tf.Variable(np.linspace(-2.0, 3.0, 11, dtype="float32"))
    weights = tf.constant(np.arange(11, dtype="float32"))
    for asymmetric in (False, True):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(simulated_int8_inputs(x, asymmetric) * weights)
        np.testing.assert_allclose(tape.gradient(loss, x).numpy(), weights.numpy())
    kernel = tf.Variable(np.random.default_rng(4).normal(size=(5, 3)).astype("float32"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(simulated_int8_kernel(kernel))
    np.testing.assert_allclose(tape.gradient(loss, kernel).numpy(), np.ones((5, 3)))


@pytest.fixture(scope="module")
def classifier():
    keras.utils.set_random_seed(0)
    preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(1200)), sequence_length=16)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=1200, num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64, max_sequence_length=16
    )
    return bertzoo.BertClassifier(backbone, num_classes=2, preprocessor=preprocessor)


def dense_layers(model):
    return [layer for layer in private_api.flatten_layers(model) if isinstance(layer, Dense)]


def int8_kernels(model):
    return [keras.ops.convert_to_numpy(private_api.dense_kernel_variable(layer)) for layer in dense_layers(model)]


def test_without_training_steps_it_is_post_training_quantization(classifier):
    q = bertzoo.quantization_aware_training(classifier, TEXTS, LABELS, learning_rate=0.0, verbose=0)
    expected = bertzoo.quantize(classifier, "int8")
    assert type(q) is bertzoo.BertClassifier and bertzoo.utils.quantization_mode(q) == "int8"
    for got, want in zip(int8_kernels(q), int8_kernels(expected), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("distill", [True, False])
def test_training_moves_the_weights_and_leaves_the_model_alone(classifier, distill):
    before = [keras.ops.convert_to_numpy(v).copy() for v in classifier.weights]
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            student = getattr(self.model, "student", self.model)  # The distiller's, when distilling.
            seen.append(all(layer.simulate_int8 for layer in dense_layers(student)))

    original_fit = bertzoo.Distiller.fit if distill else bertzoo.BertClassifier.fit

    def fit_with_spy(self, *args, **kwargs):
        return original_fit(self, *args, callbacks=[Spy()], **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bertzoo.Distiller if distill else bertzoo.BertClassifier, "fit", fit_with_spy)
        q = bertzoo.quantization_aware_training(
            classifier, TEXTS, LABELS, learning_rate=1e-3, batch_size=8, distill=distill, verbose=0
        )
    # Every Dense layer of the model in training simulated int8; none does now.
    assert seen and all(seen)
    assert not any(layer.simulate_int8 for layer in dense_layers(q))
    ptq = bertzoo.quantize(classifier, "int8")
    assert any(np.any(a != b) for a, b in zip(int8_kernels(q), int8_kernels(ptq), strict=True))
    # The float model is neither trained, nor quantized, nor left simulating.
    for v, old in zip(classifier.weights, before, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), old)
    assert bertzoo.utils.quantization_mode(classifier) is None
    assert not any(layer.simulate_int8 for layer in dense_layers(classifier))
    assert q.predict(TEXTS[:4], verbose=0).shape == (4, 2)


@pytest.mark.parametrize("distill", [True, False])
def test_a_pruned_model_keeps_its_zeros_through_training(classifier, distill):
    pruned = bertzoo.compression.model_copy.copy_model(classifier)
    zeroed = {}
    for layer in dense_layers(pruned.backbone):  # 80% of each encoder kernel set to zero, as strip() leaves it.
        kernel = keras.ops.convert_to_numpy(layer.kernel).copy()
        kernel.flat[np.random.default_rng(0).random(kernel.size) < 0.8] = 0.0
        layer.kernel.assign(kernel)
        zeroed[layer.path] = kernel == 0
    # A high rate: without masks every zero would move (see the fit's gradients).
    q = bertzoo.quantization_aware_training(
        pruned, TEXTS, LABELS, learning_rate=1e-2, batch_size=8, epochs=2, distill=distill, verbose=0
    )
    assert bertzoo.utils.quantization_mode(q) == "int8" and bertzoo.compression.model_copy.pruning_state(q) is None
    kept = {
        layer.path: keras.ops.convert_to_numpy(private_api.dense_kernel_variable(layer)) for layer in dense_layers(q)
    }
    moved = False
    for path, was_zero in zeroed.items():
        if path.startswith("pooler"):
            continue  # Not a pruned encoder matrix.
        assert np.all(kept[path][was_zero] == 0), path
        moved |= bool(np.any(kept[path][~was_zero] != 0))
    assert moved
    assert q.predict(TEXTS[:4], verbose=0).shape == (4, 2)


def test_bad_quantization_aware_training_requests(classifier):
    with pytest.raises(ValueError, match=r"Unknown quantization mode 'int4'.*quantization_aware_training supports"):
        bertzoo.quantization_aware_training(classifier, TEXTS, LABELS, mode="int4")
    with pytest.raises(ValueError, match=r"`epochs` must be an int >= 1, got 0"):
        bertzoo.quantization_aware_training(classifier, TEXTS, LABELS, epochs=0)
    with pytest.raises(ValueError, match=r"already quantized \(int8\)"):
        bertzoo.quantization_aware_training(bertzoo.quantize(classifier), TEXTS, LABELS)


def test_a_head_without_class_logits_is_told_to_pass_distill_false(classifier):
    regression = bertzoo.BertClassifier(classifier.backbone, num_classes=1, preprocessor=classifier.preprocessor)
    with pytest.raises(ValueError, match=r"but the model's head gives one value per example: pass distill=False"):
        bertzoo.quantization_aware_training(regression, TEXTS, [0.5] * len(TEXTS))
