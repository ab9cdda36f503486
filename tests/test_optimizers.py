"""bertzoo's AdamW: Keras's AdamW arithmetic through one fused kernel per variable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertzoo.models.optimizers import AdamW
from bertzoo.models.task import bert_optimizer


def train(optimizer_class, strategy=None, steps_per_epoch=4, **kwargs):
    """A small model with an embedding, dense layers and LayerNorm, trained
    for 12 steps (batch 8) with `optimizer_class`; returns weights and losses."""
    keras.utils.set_random_seed(0)
    with (strategy or tf.distribute.get_strategy()).scope():
        inputs = keras.Input((6,), dtype="int32")
        h = keras.layers.Embedding(20, 8)(inputs)
        h = keras.layers.LayerNormalization()(keras.layers.Dense(8, activation="gelu")(h))
        outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
        model = keras.Model(inputs, outputs)
        optimizer = optimizer_class(learning_rate=1e-2, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0, **kwargs)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False
        )
    x = np.random.default_rng(1).integers(0, 20, (8 * steps_per_epoch, 6))
    y = np.arange(8 * steps_per_epoch) % 3
    losses = model.fit(x, y, epochs=3, batch_size=8, shuffle=False, verbose=0).history["loss"]
    return model.get_weights(), losses


def assert_same_training(a, b):
    (weights_a, losses_a), (weights_b, losses_b) = a, b
    np.testing.assert_allclose(losses_a, losses_b, rtol=1e-5)
    assert losses_a[-1] < losses_a[0]  # Real updates were compared.
    for wa, wb in zip(weights_a, weights_b):
        np.testing.assert_allclose(wa, wb, rtol=1e-4, atol=2e-6)


@pytest.fixture(scope="module")
def keras_reference():
    return train(keras.optimizers.AdamW)


def test_fused_update_follows_keras_adamw(keras_reference, monkeypatch):
    applied = []
    apply_adam = tf.raw_ops.ResourceApplyAdam
    monkeypatch.setattr(tf.raw_ops, "ResourceApplyAdam", lambda **kw: applied.append(1) or apply_adam(**kw))
    assert_same_training(train(AdamW), keras_reference)
    assert applied, "the fused kernel was not used"


def test_keras_update_inside_a_distribution_strategy(keras_reference, monkeypatch):
    monkeypatch.setattr(tf.raw_ops, "ResourceApplyAdam", None)  # Must not be reached.
    assert_same_training(train(AdamW, strategy=tf.distribute.MirroredStrategy(["CPU:0"])), keras_reference)


def test_amsgrad_takes_the_keras_update(monkeypatch):
    monkeypatch.setattr(tf.raw_ops, "ResourceApplyAdam", None)
    assert_same_training(train(AdamW, amsgrad=True), train(keras.optimizers.AdamW, amsgrad=True))


def test_bert_optimizer_uses_it_and_it_serializes():
    optimizer = bert_optimizer(3e-5)
    assert isinstance(optimizer, AdamW)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is AdamW
    assert again.weight_decay == pytest.approx(0.01) and again.global_clipnorm == pytest.approx(1.0)
    assert again.epsilon == pytest.approx(1e-6)
