"""bertzoo's AdamW: Keras's AdamW arithmetic, each variable's whole step one fused kernel."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertzoo.models import optimizers
from bertzoo.models.optimizers import AdamW
from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.models.task import bert_optimizer


def train(optimizer_class, strategy=None, steps_per_epoch=4, jit_compile=False, **kwargs):
    """A small model with an embedding, dense layers and LayerNorm, trained
    for 12 steps (batch 8) with `optimizer_class`; returns weights and losses."""
    keras.utils.set_random_seed(0)
    with (strategy or tf.distribute.get_strategy()).scope():
        inputs = keras.Input((6,), dtype="int32")
        h = keras.layers.Embedding(20, 8)(inputs)
        h = keras.layers.LayerNormalization()(keras.layers.Dense(8, activation="gelu")(h))
        outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
        model = keras.Model(inputs, outputs)
        options = {"learning_rate": 1e-2, "weight_decay": 0.01, "epsilon": 1e-6, "global_clipnorm": 1.0, **kwargs}
        optimizer = optimizer_class(**options)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
    x = np.random.default_rng(1).integers(0, 20, (8 * steps_per_epoch, 6))
    y = np.arange(8 * steps_per_epoch) % 3
    losses = model.fit(x, y, epochs=3, batch_size=8, shuffle=False, verbose=0).history["loss"]
    return model.get_weights(), losses


def assert_same_training(a, b, rtol=1e-4, atol=2e-6):
    (weights_a, losses_a), (weights_b, losses_b) = a, b
    np.testing.assert_allclose(losses_a, losses_b, rtol=min(rtol, 1e-5))
    assert losses_a[-1] < losses_a[0]  # Real updates were compared.
    for wa, wb in zip(weights_a, weights_b):
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=atol)


# The fused step computes Keras's expressions in Keras's order: it stays
# within float32 rounding of Keras's AdamW (one ulp here and there, not the
# 1e-6 a reordered formula drifts to over 12 steps).
EXACT = {"rtol": 1e-6, "atol": 1e-7}


@pytest.fixture(scope="module")
def keras_reference():
    return train(keras.optimizers.AdamW)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The variables the fused step kernel was traced for."""
    calls = []
    build = optimizers._adamw_kernel

    def counting_kernel(optimizer):
        kernel = build(optimizer)

        def counting(*args, **kwargs):
            calls.append(args[0].name)
            return kernel(*args, **kwargs)

        return counting

    monkeypatch.setattr(optimizers, "_adamw_kernel", counting_kernel)
    return calls


def test_fused_step_follows_keras_adamw(keras_reference, kernel_calls):
    # The embedding's gradient is sparse: its clipping norm must be Keras's too.
    assert_same_training(train(AdamW), keras_reference, **EXACT)
    assert len(set(kernel_calls)) == 7, "every variable takes the fused step"


def test_fused_step_with_bert_optimizers_schedule_follows_keras_adamw(kernel_calls):
    schedule = {"learning_rate": WarmupLinearDecay(1e-2, warmup_fraction=0.25, total_steps=12)}
    assert_same_training(train(AdamW, **schedule), train(keras.optimizers.AdamW, **schedule), **EXACT)
    assert kernel_calls


def test_sparse_gradients_without_clipping_take_the_keras_step(kernel_calls):
    # Keras updates the moments from an embedding's sparse gradient slice by slice.
    unclipped = {"global_clipnorm": None}
    assert_same_training(train(AdamW, **unclipped), train(keras.optimizers.AdamW, **unclipped), **EXACT)
    assert kernel_calls == []


def test_a_new_model_trains_after_an_old_one_is_gone(keras_reference):
    # Each optimizer traces its own kernel: a trace shared between
    # optimizers would still refer to the deleted model's variables.
    train(AdamW)
    gc.collect()
    assert_same_training(train(AdamW), keras_reference)


def test_fused_step_inside_xla_follows_keras_adamw(kernel_calls):
    assert_same_training(train(AdamW, jit_compile=True), train(keras.optimizers.AdamW, jit_compile=True))
    assert kernel_calls


def test_keras_step_inside_a_distribution_strategy(keras_reference, kernel_calls):
    assert_same_training(train(AdamW, strategy=tf.distribute.MirroredStrategy(["CPU:0"])), keras_reference)
    assert kernel_calls == []


@pytest.mark.parametrize("option", [{"amsgrad": True}, {"global_clipnorm": None, "clipvalue": 0.01}])
def test_options_the_fused_step_lacks_take_the_keras_step(option, kernel_calls):
    assert_same_training(train(AdamW, **option), train(keras.optimizers.AdamW, **option))
    assert kernel_calls == []


def test_bert_optimizer_uses_it_and_it_serializes():
    optimizer = bert_optimizer(3e-5)
    assert isinstance(optimizer, AdamW)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is AdamW
    assert again.weight_decay == pytest.approx(0.01) and again.global_clipnorm == pytest.approx(1.0)
    assert again.epsilon == pytest.approx(1e-6)


def tiny_classifier(seed=0):
    """A one-layer BertClassifier on token ids, compiled with `bert_optimizer`."""
    from bertzoo.models.bert_backbone import BertBackbone
    from bertzoo.models.bert_classifier import BertClassifier

    keras.utils.set_random_seed(seed)
    backbone = BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    model = BertClassifier(backbone, num_classes=2, preprocessor=None)
    model.compile(optimizer=bert_optimizer(1e-2))
    token_ids = np.random.default_rng(seed).integers(1, 30, (16, 8))
    inputs = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids), "padding_mask": np.ones_like(token_ids)}
    return model, inputs, (token_ids[:, 0] > 15).astype("int32")


def decayed(optimizer, variables):
    """`{path: whether optimizer decays it}` for the variables named bias, gamma or beta, and one kernel."""
    names = ("bias", "gamma", "beta", "kernel")
    return {v.path: bool(optimizer._use_weight_decay(v)) for v in variables if v.name in names}


def test_weight_decay_exclusions_survive_serialization():
    optimizer = bert_optimizer(3e-5)
    assert optimizer.get_config()["exclude_from_weight_decay_names"] == ["beta", "bias", "gamma"]
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    variables = [keras.Variable(np.ones(2, "float32"), name=name) for name in ("bias", "gamma", "beta", "kernel")]
    # Keras's AdamW drops them: the round trip decayed every variable.
    assert decayed(again, variables) == decayed(optimizer, variables)
    assert sorted(decayed(again, variables).values()) == [False, False, False, True]
    assert again.get_config()["exclude_from_weight_decay_names"] == ["beta", "bias", "gamma"]
    # A config without the key (an older save) excludes nothing, as before.
    config = optimizer.get_config()
    del config["exclude_from_weight_decay_names"]
    assert all(decayed(AdamW.from_config(config), variables).values())
    with pytest.raises(ValueError, match=r"`var_names` must be a list of strings"):
        AdamW().exclude_from_weight_decay(var_names="bias")


def test_weight_decay_exclusions_survive_a_saved_model(tmp_path):
    model, inputs, labels = tiny_classifier()
    model.fit(inputs, labels, batch_size=8, epochs=1, verbose=0)
    before = decayed(model.optimizer, model.trainable_variables)
    assert any(before.values()) and not all(before.values())
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is AdamW
    assert decayed(loaded.optimizer, loaded.trainable_variables) == before
    assert not any(v for path, v in before.items() if path.endswith(("bias", "gamma", "beta")))


def test_a_reloaded_models_next_fit_extends_the_schedule_fit_filled_in(tmp_path):
    model, inputs, labels = tiny_classifier()
    model.fit(inputs, labels, batch_size=8, epochs=1, verbose=0)
    assert model.optimizer._learning_rate.total_steps == 2  # Filled in by fit(): 2 batches.
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    schedule = loaded.optimizer._learning_rate
    assert isinstance(schedule, WarmupLinearDecay) and schedule.total_steps == 2
    rates = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: rates.append(float(loaded.optimizer.learning_rate))
    )
    loaded.fit(inputs, labels, batch_size=8, epochs=1, verbose=0, callbacks=[record])
    # Extended from step 2, as the unsaved model's second fit would (it trained at rate 0 before).
    assert schedule.total_steps == 4
    assert rates[0] > 0.0
    # A length the user fixed is kept through a reload and a fit.
    fixed = WarmupLinearDecay(1e-3, total_steps=2)
    assert "total_steps_from_fit" not in fixed.get_config()
    assert WarmupLinearDecay.from_config(fixed.get_config())._length_from_fit is False


def test_an_overflowing_gradient_norm_poisons_the_step_as_in_keras(kernel_calls):
    # Keras's clip factor is NaN when the global norm overflows; the fused
    # step's one-pass norm must not hide it (every variable becomes NaN).
    poisoned = {}
    for optimizer_class in (AdamW, keras.optimizers.AdamW):
        kernel = keras.Variable(np.ones((3, 2), "float32"))
        bias = keras.Variable(np.ones(2, "float32"))
        optimizer = optimizer_class(learning_rate=0.1, global_clipnorm=1.0)
        huge = tf.constant([[1e20, 0.0], [0.0, 0.0], [0.0, 0.0]])  # Its square overflows float32.
        optimizer.apply_gradients([(huge, kernel), (tf.constant([1.0, 2.0]), bias)])
        poisoned[optimizer_class] = [bool(np.isnan(keras.ops.convert_to_numpy(v)).all()) for v in (kernel, bias)]
    assert poisoned[AdamW] == poisoned[keras.optimizers.AdamW] == [True, True]
    assert kernel_calls, "the fused step ran"


def test_a_bfloat16_embeddings_sparse_gradient_is_clipped(kernel_calls):
    # Keras's clipping multiplies a float32 factor into the sparse gradient
    # and fails for bfloat16 ("Incompatible tensor conversion ... IndexedSlices").
    # The clipped step must equal Keras's on the same float32 numbers.
    rows = np.array([[3.0, 0.0], [0.0, 4.0]], "float32")  # Norm 5 with the bias's 0: factor 0.2.
    after = {}
    for dtype, optimizer_class in (("bfloat16", AdamW), ("float32", keras.optimizers.AdamW)):
        table = keras.Variable(np.ones((4, 2), "float32"), dtype=dtype)
        bias = keras.Variable(np.ones(2, "float32"), dtype=dtype)
        optimizer = optimizer_class(learning_rate=0.5, global_clipnorm=1.0, epsilon=1e-3)
        sparse = tf.IndexedSlices(tf.constant(rows, dtype), tf.constant([0, 2]), tf.constant([4, 2]))
        optimizer.apply_gradients([(sparse, table), (tf.zeros(2, dtype), bias)])
        after[dtype] = keras.ops.convert_to_numpy(keras.ops.cast(table, "float32"))
    np.testing.assert_allclose(after["bfloat16"], after["float32"], rtol=1e-2)
    assert not np.allclose(after["float32"], 1.0), "the step moved the table"
    assert kernel_calls == [], "bfloat16 variables take Keras's step"


def test_a_bfloat16_classifier_trains_with_the_default_optimizer():
    from bertzoo.models.bert_backbone import BertBackbone
    from bertzoo.models.bert_classifier import BertClassifier

    keras.utils.set_random_seed(0)
    backbone = BertBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dtype="bfloat16"
    )
    model = BertClassifier(backbone, num_classes=2, preprocessor=None, dtype="bfloat16")
    model.compile(optimizer=bert_optimizer(1e-2))
    token_ids = np.random.default_rng(0).integers(1, 30, (16, 8))
    labels = (token_ids[:, 0] > 15).astype("int32")
    inputs = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids), "padding_mask": np.ones_like(token_ids)}
    losses = model.fit(inputs, labels, epochs=8, batch_size=8, verbose=0).history["loss"]
    assert model.backbone.token_embedding.embeddings.dtype == "bfloat16"
    # Keras's own AdamW here: 0.697 to 0.688 (its Adam steps are zero in bfloat16); bertzoo's: 0.694 to 0.549.
    assert losses[-1] < 0.9 * losses[0]


def test_keras_adam_on_bfloat16_weights_is_refused_before_its_zero_steps():
    from bertzoo.models.bert_backbone import BertBackbone
    from bertzoo.models.bert_classifier import BertClassifier

    backbone = BertBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dtype="bfloat16"
    )
    model = BertClassifier(backbone, num_classes=2, preprocessor=None)
    inputs = {"token_ids": np.ones((4, 8), "int32"), "segment_ids": np.zeros((4, 8), "int32")}
    inputs["padding_mask"] = np.ones((4, 8), "int32")
    before = keras.ops.convert_to_numpy(keras.ops.cast(backbone.pooler.kernel, "float32"))
    # compile(optimizer="adam") trained the float32 head and left every bfloat16 weight as it was, silently.
    for optimizer in ("adam", keras.optimizers.AdamW(1e-3)):
        model.compile(optimizer=optimizer)
        with pytest.raises(ValueError, match=r"bfloat16 weights, and Keras's Adam.* beta_2=0.999 is 1.0"):
            model.fit(inputs, np.zeros(4, "int32"), verbose=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(keras.ops.cast(backbone.pooler.kernel, "float32")), before)
    # 0.99 is 0.98828125 in bfloat16: steps. Adamax has no beta_2 bias correction: steps at 0.999 too.
    for optimizer in (keras.optimizers.Adam(1e-2, beta_2=0.99), keras.optimizers.Adamax(1e-2)):
        model.compile(optimizer=optimizer)
        model.fit(inputs, np.zeros(4, "int32"), verbose=0)
        after = keras.ops.convert_to_numpy(keras.ops.cast(backbone.pooler.kernel, "float32"))
        assert np.any(after != before)
        before = after


def test_a_float16_weights_moments_are_float32_and_its_steps_keras_sized():
    # In float16, (1 - beta_2) * (1e-4)**2 underflows: a zero second moment
    # made every step 1 / epsilon times the gradient (up to ~30x too large here).
    moved = {}
    for dtype in ("float32", "float16"):
        weight = keras.Variable(np.zeros(2, dtype), dtype=dtype)
        optimizer = AdamW(learning_rate=1e-3, weight_decay=0.0, epsilon=1e-6)
        optimizer.build([weight])
        gradient = keras.ops.convert_to_tensor(np.array([1e-4, 1e-2], dtype))
        for _ in range(20):
            optimizer.apply([gradient], [weight])
        momentum, velocity = optimizer._momentums[0], optimizer._velocities[0]
        assert momentum.dtype == velocity.dtype == "float32"
        assert (keras.ops.convert_to_numpy(velocity) > 0).all()
        moved[dtype] = keras.ops.convert_to_numpy(weight).astype("float64")
    np.testing.assert_allclose(moved["float16"], moved["float32"], rtol=0.2)
    assert (moved["float32"] < -0.01).all()  # Both moved ~ -2e-2 (20 steps of the learning rate).


@pytest.mark.parametrize("rate", [-1e-3, float("inf"), float("nan"), "1e-3", True])
def test_bert_optimizer_refuses_a_learning_rate_that_cannot_descend(rate):
    # A negative rate was accepted: AdamW then climbs the loss. (0 trains nothing, on purpose.)
    with pytest.raises(ValueError, match=r"`learning_rate` must be a finite number >= 0"):
        bert_optimizer(rate)
