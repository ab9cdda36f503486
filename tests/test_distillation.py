"""Distillation: each loss against NumPy, layer maps, argument checks,
student initialisation, and a small end-to-end run (jit-compiled)."""

import inspect
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.compression import distiller as distiller_module
from bertzoo.compression.distiller import Distiller
from bertzoo.compression.layer_maps import layer_map_pairs
from bertzoo.compression.losses import AttentionDistillation
from bertzoo.compression.losses import HiddenStateDistillation
from bertzoo.compression.losses import ValueRelationDistillation
from bertzoo.compression.losses import soft_target_loss
from bertzoo.compression.student_init import init_student_from_teacher
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer

POSITIVE = "good great fine nice superb".split()
NEGATIVE = "bad awful dull poor weak".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POSITIVE + NEGATIVE + "the film was a very".split()
SEQUENCE_LENGTH = 8


def preprocessor(vocabulary=VOCAB, lowercase=True):
    return BertPreprocessor(BertTokenizer(vocabulary, lowercase=lowercase), sequence_length=SEQUENCE_LENGTH)


def classifier(num_layers=2, hidden_dim=32, num_heads=4, num_classes=2, vocabulary=VOCAB, dropout=0.0, **kwargs):
    backbone = bertzoo.BertBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        intermediate_dim=2 * hidden_dim,
        max_sequence_length=16,
        dropout=dropout,
        **kwargs,
    )
    return bertzoo.BertClassifier(backbone, num_classes=num_classes, preprocessor=preprocessor(vocabulary))


def sentiment(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    texts = []
    for label in labels:
        words = list(rng.choice(POSITIVE if label else NEGATIVE, size=rng.integers(1, 3)))
        texts.append(" ".join(["the", "film", "was"][: rng.integers(0, 4)] + words))
    return texts, labels.astype("int32")


def weights_of(model):
    return [np.array(w) for w in model.get_weights()]


# --- NumPy references ----------------------------------------------------------
def np_softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_soft_loss(teacher_logits, student_logits, temperature):
    p_t = np_softmax(teacher_logits / temperature)
    p_s = np_softmax(student_logits / temperature)
    return temperature**2 * np.mean(np.sum(p_t * (np.log(p_t) - np.log(p_s)), axis=-1))


def np_hard_loss(labels, logits):
    log_p = np.log(np_softmax(logits))
    return -np.mean(log_p[np.arange(len(labels)), labels])


def np_hidden_loss(teacher, student, pairs, mask, kernel=None, bias=None):
    losses = []
    for s, t in pairs:
        h = student[s] if kernel is None else student[s] @ kernel + bias
        squared = np.sum((h - teacher[t]) ** 2, axis=-1)
        losses.append(np.sum(squared * mask) / (mask.sum() * teacher[t].shape[-1]))
    return float(np.mean(losses))


def np_attention_loss(teacher, student, pairs, mask):
    losses = []
    for s, t in pairs:
        a_t, a_s = teacher[t - 1], student[s - 1]
        groups = math.gcd(a_t.shape[1], a_s.shape[1])
        b, _, q, k = a_t.shape
        a_t = a_t.reshape(b, groups, -1, q, k).mean(axis=2)
        a_s = a_s.reshape(b, groups, -1, q, k).mean(axis=2)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(a_t > 0, a_t * (np.log(a_t) - np.log(np.maximum(a_s, 1e-9))), 0.0)
        kl = terms.sum(axis=-1)  # (batch, groups, queries)
        losses.append(np.sum(kl * mask[:, None, :]) / (mask.sum() * groups))
    return float(np.mean(losses))


def np_features(model, x):
    f = model.backbone.compute_features(x, training=False, return_attention_scores=True)
    return [np.array(h) for h in f["hidden_states"]], [np.array(a) for a in f["attention_scores"]]


# --- Layer maps ----------------------------------------------------------------
def test_layer_maps_give_the_documented_pairs():
    assert layer_map_pairs("uniform", 2, 6) == [(1, 3), (2, 6)]
    assert layer_map_pairs("uniform", 4, 6) == [(1, 2), (2, 3), (3, 5), (4, 6)]
    assert layer_map_pairs("uniform", 4, 2) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    assert layer_map_pairs("uniform", 3, 3) == [(1, 1), (2, 2), (3, 3)]
    assert layer_map_pairs("last", 2, 6) == [(2, 6)]
    assert layer_map_pairs([(1, 2), [2, 5]], 2, 6) == [(1, 2), (2, 5)]


@pytest.mark.parametrize(
    "layer_map, match",
    [
        ("middle", "Unknown `layer_map`"),
        ([], "empty"),
        ([(0, 1)], "layer 0, the embedding output"),
        ([(1, 7)], "teacher layer 7 is out of range"),
        ([(3, 1)], "student layer 3 is out of range"),
        ([(1,)], "not a \\(student_layer, teacher_layer\\) pair"),
        ([(1.0, 2)], "not an integer"),
        (5, "must be 'uniform', 'last' or a list"),
    ],
)
def test_bad_layer_maps_are_rejected(layer_map, match):
    with pytest.raises(ValueError, match=match):
        layer_map_pairs(layer_map, 2, 6)


# --- Each loss against NumPy -----------------------------------------------------
def test_soft_target_loss_is_hinton_kl_scaled_by_t_squared(rng):
    teacher, student = rng.normal(size=(5, 3)) * 2, rng.normal(size=(5, 3))
    loss = soft_target_loss(2.0)
    value = float(loss.compute_loss(teacher.astype("float32"), student.astype("float32")))
    np.testing.assert_allclose(value, np_soft_loss(teacher, student, 2.0), rtol=1e-4)
    # By hand: T=1, teacher probabilities (1/2, 1/2), student (1/4, 3/4).
    hand = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    one = soft_target_loss(1.0)
    value = one.compute_loss(np.log([[0.5, 0.5]]).astype("float32"), np.log([[0.25, 0.75]]).astype("float32"))
    np.testing.assert_allclose(float(value), hand, rtol=1e-4)


def test_hidden_state_loss_with_projection_against_numpy(rng):
    teacher = [rng.normal(size=(2, 5, 6)).astype("float32") for _ in range(4)]
    student = [rng.normal(size=(2, 5, 3)).astype("float32") for _ in range(3)]
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "float32")
    projection = keras.layers.Dense(6)
    projection.build((None, None, 3))
    kernel, bias = (np.array(w) for w in projection.weights)
    pairs = [(1, 2), (2, 3)]
    value = HiddenStateDistillation(pairs, projection).compute_loss(teacher, student, mask)
    np.testing.assert_allclose(float(value), np_hidden_loss(teacher, student, pairs, mask, kernel, bias), rtol=1e-5)
    # By hand, one token, no projection: ((1-0)^2 + (2-0)^2) / 2 features.
    value = HiddenStateDistillation([(0, 0)]).compute_loss(
        [np.array([[[1.0, 2.0]]], "float32")], [np.zeros((1, 1, 2), "float32")]
    )
    assert float(value) == pytest.approx(2.5)
    # Padded positions do not count: changing them leaves the loss unchanged.
    loss = HiddenStateDistillation(pairs, projection)
    moved = [h.copy() for h in teacher]
    moved[2][0, 3:] += 100.0
    np.testing.assert_allclose(
        float(loss.compute_loss(moved, student, mask)), float(loss.compute_loss(teacher, student, mask)), rtol=1e-6
    )


def test_hidden_state_loss_needs_a_projection_for_other_widths(rng):
    teacher = [rng.normal(size=(1, 2, 6)).astype("float32")] * 2
    student = [rng.normal(size=(1, 2, 3)).astype("float32")] * 2
    with pytest.raises(ValueError, match="pass a projection"):
        HiddenStateDistillation([(1, 1)]).compute_loss(teacher, student)


def random_attention(rng, batch, heads, length, mask):
    logits = rng.normal(size=(batch, heads, length, length)) * 2
    logits = np.where(mask[:, None, None, :] > 0, logits, -1e9)
    return np_softmax(logits).astype("float32")


@pytest.mark.parametrize("teacher_heads, student_heads", [(2, 2), (4, 2), (3, 2), (6, 4)])
def test_attention_kl_against_numpy(rng, teacher_heads, student_heads):
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], "float32")
    teacher = [random_attention(rng, 2, teacher_heads, 6, mask) for _ in range(2)]
    student = [random_attention(rng, 2, student_heads, 6, mask)]
    pairs = [(1, 2)]
    value = AttentionDistillation(pairs).compute_loss(teacher, student, mask)
    expected = np_attention_loss(teacher, student, pairs, mask)
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    assert expected > 0


def test_attention_kl_averages_heads_when_counts_differ(rng):
    # Two teacher heads whose mean equals the single student head: zero loss,
    # although neither teacher head equals it.
    mask = np.ones((1, 3), "float32")
    a = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]], "float32")
    b = np.array([[0.2, 0.5, 0.3], [0.5, 0.2, 0.3], [0.3, 0.3, 0.4]], "float32")
    teacher = [np.stack([a, b])[None]]
    student = [((a + b) / 2)[None, None]]
    assert float(AttentionDistillation([(1, 1)]).compute_loss(teacher, student, mask)) == pytest.approx(0, abs=1e-6)
    assert float(AttentionDistillation([(1, 1)]).compute_loss(teacher, [a[None, None]], mask)) > 0.05


# --- The distiller's total loss ------------------------------------------------------
def sharpen(model, rng):
    """Peaked attention and spread-out logits, so that every loss term is far from 0
    (freshly initialized models attend almost uniformly and predict ~50/50)."""
    for block in model.backbone.attention_blocks:
        for dense in (block.query_dense, block.key_dense):
            dense.kernel.assign(np.array(dense.kernel) * 20)
    kernel = model.output_dense.kernel
    kernel.assign(rng.normal(size=kernel.shape).astype("float32"))
    return model


@pytest.fixture(scope="module")
def pair():
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(1)
    teacher = sharpen(classifier(num_layers=4, hidden_dim=32, num_heads=4), rng)
    return teacher, sharpen(classifier(num_layers=2, hidden_dim=16, num_heads=2), rng)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_total_loss_against_numpy(pair, alpha, normalize):
    teacher, student = pair
    d = Distiller(
        teacher,
        student,
        temperature=3.0,
        alpha=alpha,
        hidden_state_weight=0.7,
        attention_weight=1.3,
        embedding_weight=0.4,
        normalize_losses=normalize,
    )
    texts = ["the film was good", "awful", "a very very fine film", "dull"]
    labels = np.array([1, 0, 1, 0])
    x = teacher.preprocessor(texts)
    mask = np.array(x["padding_mask"], "float32")
    t_hidden, t_attention = np_features(teacher, x)
    s_hidden, s_attention = np_features(student, x)
    t_logits = np.array(teacher(x, training=False))
    s_logits = np.array(student(x, training=False))
    pairs = [(1, 2), (2, 4)]
    assert d.layer_pairs == pairs
    kernel, bias = (np.array(w) for w in d.hidden_projection.weights)
    e_kernel, e_bias = (np.array(w) for w in d.embedding_projection.weights)
    soft = np_soft_loss(t_logits, s_logits, 3.0)
    hidden = np_hidden_loss(t_hidden, s_hidden, pairs, mask, kernel, bias)
    attention = np_attention_loss(t_attention, s_attention, pairs, mask)
    embedding = np_hidden_loss(t_hidden, s_hidden, [(0, 0)], mask, e_kernel, e_bias)
    prediction = alpha * np_hard_loss(labels, s_logits) + (1 - alpha) * soft
    others = 0.7 * hidden + 1.3 * attention + 0.4 * embedding
    if normalize:  # Before any training step each term is scaled by this batch's values.
        others = (0.7 + 1.3 + 0.4) * prediction / 3
    total = d.compute_loss(x, labels, training=False)
    np.testing.assert_allclose(float(total), prediction + others, rtol=1e-4)
    # Unlabelled: soft targets take the whole weight, whatever alpha is.
    others = (0.7 + 1.3 + 0.4) * soft / 3 if normalize else 0.7 * hidden + 1.3 * attention + 0.4 * embedding
    unlabelled = d.compute_loss(x, None, training=False)
    np.testing.assert_allclose(float(unlabelled), soft + others, rtol=1e-4)
    terms = d.loss_terms(texts, labels)
    np.testing.assert_allclose(
        [terms["soft"], terms["hidden"], terms["attention"], terms["embedding"]],
        [soft, hidden, attention, embedding],
        rtol=1e-4,
    )
    assert min(soft, hidden, attention, embedding) > 0.01  # Every term is really exercised.
    assert terms["agreement"] == np.mean(t_logits.argmax(-1) == s_logits.argmax(-1))


def test_normalization_means_come_from_the_first_training_steps(pair):
    teacher, student = pair
    d = Distiller(teacher, student, alpha=0.3, value_relation_weight=0.5, attention_weight=0.0)
    d.compile(optimizer=keras.optimizers.SGD(0.0), jit_compile=False)  # Weights stay put: the terms repeat.
    texts = ["the film was good", "awful", "a very very fine film", "dull"]
    labels = np.array([1, 0, 1, 0])
    x = teacher.preprocessor(texts)
    for _ in range(distiller_module.NORMALIZATION_STEPS + 3):
        d.train_on_batch(x, labels)
    assert float(d.normalization_steps) == distiller_module.NORMALIZATION_STEPS  # Then frozen.
    terms = d.loss_terms(x, labels)
    assert sorted(d.loss_means) == ["embedding", "hidden", "value_relation"]
    for key, mean in d.loss_means.items():
        np.testing.assert_allclose(float(mean), terms[key], rtol=1e-4)
    prediction = 0.3 * terms["hard"] + 0.7 * terms["soft"]
    # The head's dropout (training steps) moves the logits a little; the features are exact.
    np.testing.assert_allclose(float(d.prediction_mean), prediction, rtol=0.05)
    # Each weighted term now adds weight * (the prediction loss's mean) / 3 to the loss.
    expected = prediction + (1.0 + 1.0 + 0.5) * float(d.prediction_mean) / 3
    np.testing.assert_allclose(float(d.compute_loss(x, labels, training=False)), expected, rtol=1e-4)


def random_values(rng, batch, length, width):
    return rng.normal(0.0, 1.0, (batch, length, width)).astype("float32")


def np_value_relation_loss(teacher, student, mask, heads):
    def relations(v):
        b, n, w = v.shape
        split = v.reshape(b, n, heads, w // heads)
        logits = np.einsum("bqhd,bkhd->bhqk", split, split) / math.sqrt(w // heads)
        logits = np.where(mask[:, None, None, :] > 0, logits, -1e9)
        return np_softmax(logits)

    t, s = relations(teacher), relations(student)
    kl = np.sum(t * (np.log(np.maximum(t, 1e-9)) - np.log(np.maximum(s, 1e-9))), -1)  # (b, h, q)
    return float(np.sum(kl.sum(1) * mask) / (mask.sum() * heads))


def test_value_relation_kl_against_numpy(rng):
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "float32")
    teacher = [random_values(rng, 2, 5, 12), random_values(rng, 2, 5, 12)]
    student = [random_values(rng, 2, 5, 8)]  # Other width: relations need no projection.
    loss = ValueRelationDistillation([(1, 2)], relation_heads=4)
    got = float(loss.compute_loss(teacher, student, mask))
    np.testing.assert_allclose(got, np_value_relation_loss(teacher[1], student[0], mask, 4), rtol=1e-4)
    assert got > 0.01
    assert float(loss.compute_loss(teacher, [teacher[1]], mask)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="value width 8 is not divisible by relation_heads=3"):
        ValueRelationDistillation([(1, 2)], relation_heads=3).compute_loss([t[..., :9] for t in teacher], student, mask)


def test_value_states_are_the_attention_values(pair):
    teacher, _ = pair
    x = teacher.preprocessor(["the film was good", "dull"])
    features = teacher.compute_features(x, return_value_states=True)
    assert len(features["value_states"]) == teacher.backbone.num_layers
    block = teacher.backbone.attention_blocks[1]
    kernel, bias = (np.array(w) for w in block.value_dense.weights)
    expected = np.array(features["hidden_states"][1]) @ kernel + bias
    np.testing.assert_allclose(np.array(features["value_states"][1]), expected, rtol=1e-4, atol=1e-5)


def test_teacher_is_frozen_only_while_the_distiller_trains(pair):
    teacher, student = pair
    d = Distiller(teacher, student)
    assert teacher.trainable  # Left as it was, so a copy of it made later trains as usual.
    teacher_ids = {id(v) for v in teacher.weights}
    seen = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append((teacher.trainable, bool(teacher_ids & {id(v) for v in d.trainable_variables})))

    d.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=False)
    d.fit(["the film was good", "bad"], np.array([1, 0]), epochs=1, verbose=0, callbacks=[Watch()])
    assert seen == [(False, False)]
    assert teacher.trainable


def test_a_float16_student_trains_under_loss_scaling_as_its_own_compile_would(pair):
    teacher, _ = pair
    half = classifier(num_layers=1, hidden_dim=16, num_heads=2, dtype="mixed_float16")
    assert keras.config.dtype_policy().name == "float32"  # Keras itself scales only under a global mixed_float16.
    distiller = Distiller(teacher, half)
    distiller.compile(jit_compile=False)
    assert isinstance(distiller.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(half.optimizer, keras.optimizers.LossScaleOptimizer)  # The student's own, alike.
    texts, labels = sentiment(8, seed=3)
    assert np.isfinite(distiller.fit(texts, labels, batch_size=4, epochs=1, verbose=0).history["loss"]).all()
    assert distiller.optimizer.iterations.numpy() == 2
    given = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    distiller.compile(optimizer=given, jit_compile=False)
    assert distiller.optimizer is given  # Not wrapped twice.
    float32 = Distiller(teacher, classifier(num_layers=1, hidden_dim=16, num_heads=2))
    float32.compile(jit_compile=False)
    assert not isinstance(float32.optimizer, keras.optimizers.LossScaleOptimizer)


def test_projections_only_when_widths_differ(pair):
    teacher, student = pair
    d = Distiller(teacher, student)
    assert tuple(d.hidden_projection.kernel.shape) == (16, 32)
    projection_vars = {id(v) for v in d.hidden_projection.weights + d.embedding_projection.weights}
    assert projection_vars <= {id(v) for v in d.trainable_variables}
    same_width = Distiller(teacher, classifier(num_layers=1, hidden_dim=32, num_heads=2))
    assert same_width.hidden_projection is None and same_width.embedding_projection is None
    assert Distiller(teacher, student, hidden_state_weight=0, embedding_weight=0).hidden_projection is None


def test_switched_off_losses_are_not_computed(pair):
    teacher, student = pair
    d = Distiller(teacher, student, hidden_state_weight=0, attention_weight=0, embedding_weight=0)
    terms = d.loss_terms(["good film"], [1])
    assert set(terms) == {"hard", "soft", "agreement"}


def test_teacher_gets_no_gradient_and_no_update(pair):
    teacher, student = pair
    d = Distiller(teacher, student)
    x = teacher.preprocessor(["the film was good", "bad"])
    with tf.GradientTape() as tape:
        tape.watch([v.value for v in teacher.weights])
        loss = d.compute_loss(x, np.array([1, 0]), training=True)
    grads = tape.gradient(loss, [v.value for v in teacher.weights] + [v.value for v in student.trainable_weights])
    teacher_grads = grads[: len(teacher.weights)]
    assert all(g is None for g in teacher_grads), "the teacher's forward pass must not be differentiated"
    assert any(g is not None and np.abs(np.array(g)).sum() > 0 for g in grads[len(teacher.weights) :])


def test_the_teachers_pass_is_not_recorded(pair, monkeypatch):
    # Unrecorded, the teacher takes the inference kernels (Keras's GELU, which
    # oneDNN fuses into the matmul) instead of the training ones.
    from bertzoo.layers import activations

    teacher, student = pair
    d = Distiller(teacher, student)
    x = teacher.preprocessor(["the film was good", "bad"])
    seen = []
    real = activations._fused_gradient_applies
    monkeypatch.setattr(activations, "_fused_gradient_applies", lambda: seen.append(real()) or seen[-1])
    with tf.GradientTape() as tape:
        d._teacher_features(x)
    assert seen and not any(seen)
    assert not any(id(v) in {id(t.value) for t in teacher.weights} for v in tape.watched_variables())


# --- Arguments -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": 0}, "`temperature` must be a finite number > 0"),
        ({"temperature": -1.0}, "`temperature` must be a finite number > 0"),
        ({"temperature": True}, "`temperature` must be a finite number > 0"),
        ({"temperature": float("inf")}, "`temperature` must be a finite number > 0"),  # NaN losses otherwise.
        ({"alpha": -0.1}, "`alpha` must be in \\[0, 1\\]"),
        ({"alpha": 1.5}, "`alpha` must be in \\[0, 1\\]"),
        ({"alpha": None}, "`alpha` must be in \\[0, 1\\]"),
        ({"hidden_state_weight": -1}, "`hidden_state_weight` must be a finite number >= 0"),
        ({"attention_weight": float("nan")}, "`attention_weight` must be a finite number >= 0"),
        ({"embedding_weight": "1"}, "`embedding_weight` must be a finite number >= 0"),
        ({"layer_map": [(1, 9)]}, "teacher layer 9 is out of range"),
        ({"layer_map": "first"}, "Unknown `layer_map`"),
        ({"soft_target_weight": -1}, "`soft_target_weight` must be a finite number >= 0"),
        ({"value_relation_weight": 1.0, "relation_heads": 3}, "relation_heads=3 does not divide"),
        ({"value_relation_weight": 1.0, "relation_heads": 0}, "`relation_heads` must be an int >= 1"),
        (
            {"alpha": 0.0, "soft_target_weight": 0.0, **distiller_module.PREDICTIONS_ONLY},
            r"Every loss of this Distiller has weight 0 .*Set soft_target_weight > 0",
        ),
    ],
)
def test_bad_arguments(pair, kwargs, match):
    teacher, student = pair
    with pytest.raises(ValueError, match=match):
        Distiller(teacher, student, **kwargs)


def test_loss_settings_are_checked_before_any_model_with_the_distillers_defaults():
    check = distiller_module.check_loss_settings
    defaults = inspect.signature(Distiller.__init__).parameters
    # An omitted setting takes the Distiller's default: its weights, and its refusals.
    weights = check(alpha=0.25)
    assert weights == {
        "hidden": defaults["hidden_state_weight"].default,
        "attention": defaults["attention_weight"].default,
        "embedding": defaults["embedding_weight"].default,
        "value_relation": defaults["value_relation_weight"].default,
        "soft_target": defaults["soft_target_weight"].default,
    }
    assert set(distiller_module.LOSS_SETTINGS) <= set(defaults)
    with pytest.raises(ValueError, match="`temperature` must be a finite number > 0"):
        check(temperature=0)
    with pytest.raises(TypeError, match=r"takes the Distiller's loss settings \[.*'alpha'.*\], got \['tempreature'\]"):
        check(tempreature=1.0)


def test_unlabelled_training_with_only_the_hard_label_loss_weighted_is_refused(pair):
    teacher, student = pair
    distiller = Distiller(teacher, student, alpha=0.5, soft_target_weight=0.0, **distiller_module.PREDICTIONS_ONLY)
    before = weights_of(student)
    with pytest.raises(ValueError, match=r"unlabelled batches, but its only loss with a weight is the hard-label"):
        distiller.fit(["a good film", "a dull film"], epochs=1, verbose=0)
    for value, old in zip(weights_of(student), before):
        np.testing.assert_array_equal(value, old)
    # The fast path's timing proxy runs unlabelled whatever the weights: it is not refused.
    x = student.preprocessor(["a good film", "a dull film"])
    assert np.isfinite(float(distiller.fast_path_parts()["train_loss"](x)))


def test_bad_models(pair):
    teacher, student = pair
    with pytest.raises(ValueError, match="teacher must be a bertzoo BertClassifier"):
        Distiller(teacher.backbone, student)
    with pytest.raises(ValueError, match="build the student with num_classes=2"):
        Distiller(teacher, classifier(num_classes=3))
    with pytest.raises(ValueError, match="same model"):
        Distiller(teacher, teacher)
    named, reordered = classifier(num_layers=1), classifier(num_layers=1)
    named.class_names, reordered.class_names = ["neg", "pos"], ["pos", "neg"]
    with pytest.raises(ValueError, match=r"class_names are \['neg', 'pos'\] but the student's \['pos', 'neg'\]"):
        Distiller(named, reordered)
    Distiller(named, classifier(num_layers=1))  # A student without names learns the teacher's order.
    # A quantized student's integer kernels cannot train (only its biases would move);
    # a quantized teacher is fine (it only predicts), but no student is copied from it.
    quantized_teacher, quantized_student = bertzoo.quantize(teacher), bertzoo.quantize(student)
    with pytest.raises(ValueError, match=r"The student is quantized \(int8\).*Distill into a float student"):
        Distiller(teacher, quantized_student)
    Distiller(quantized_teacher, student)
    with pytest.raises(ValueError, match=r"The teacher is quantized \(int8\).*from the float teacher"):
        bertzoo.init_student_from_teacher(quantized_teacher, {"num_layers": 1})


def test_the_trainer_names_raw_batches_missing_features_and_text_without_a_preprocessor(pair):
    # As the task models do (these were Keras's positional-argument error, a bare KeyError and
    # "Unrecognized data type").
    teacher, student = pair
    distiller = Distiller(teacher, student)
    texts, labels = ["good film", "bad film"], np.asarray([1, 0])
    for method in ("train_on_batch", "test_on_batch"):
        with pytest.raises(ValueError, match=rf"{method} takes the model's features .* not raw text"):
            getattr(distiller, method)(texts, labels)
    with pytest.raises(ValueError, match=r"Distiller.fit got features without \['padding_mask', 'segment_ids'\]"):
        distiller.fit({"token_ids": np.ones((2, 8), "int32")}, labels, verbose=0)
    bare = Distiller(bertzoo.BertClassifier(teacher.backbone, 2), bertzoo.BertClassifier(student.backbone, 2))
    with pytest.raises(ValueError, match=r"Distiller.fit got raw text, but this model has no preprocessor"):
        bare.fit(texts, labels, verbose=0)


def test_vocabulary_mismatch_is_a_clear_error(pair):
    teacher, _ = pair
    shuffled = VOCAB[:5] + VOCAB[5:][::-1]
    with pytest.raises(ValueError, match="tokenize text differently: the vocabularies differ \\(id 5"):
        Distiller(teacher, classifier(vocabulary=shuffled))
    with pytest.raises(ValueError, match="vocabulary_size=20, the student 21"):
        Distiller(teacher, classifier(vocabulary=VOCAB + ["extra"]))
    other_case = classifier()
    other_case.preprocessor = preprocessor(lowercase=False)
    with pytest.raises(ValueError, match="`lowercase` is True for the teacher, False for the student"):
        Distiller(teacher, other_case)
    # A student without a preprocessor reads the teacher's tokens.
    bare = classifier()
    bare.preprocessor = None
    assert Distiller(teacher, bare).preprocessor is teacher.preprocessor


def test_config_round_trip(pair):
    teacher, student = pair
    d = Distiller(
        teacher,
        student,
        temperature=4.0,
        alpha=0.2,
        attention_weight=0.0,
        value_relation_weight=0.3,
        soft_target_weight=0.5,
        relation_heads=2,
        normalize_losses=False,
        layer_map=[(1, 1), (2, 3)],
    )
    again = Distiller.from_config(d.get_config())
    for name in (*distiller_module.LOSS_SETTINGS, "relation_heads", "normalize_losses", "layer_map", "layer_pairs"):
        assert getattr(again, name) == getattr(d, name), name
    assert again.student.backbone.num_layers == 2 and again.teacher.backbone.num_layers == 4


# --- Student initialisation --------------------------------------------------------------
def assert_same_weights(a, b):
    assert len(a.weights) == len(b.weights)
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.array(x), np.array(y))


@pytest.mark.parametrize("layers, expected", [("every_k", [2, 4]), ([1, 3], [1, 3])])
def test_init_student_copies_the_chosen_teacher_layers(pair, layers, expected):
    teacher, _ = pair
    student = init_student_from_teacher(teacher, {"num_layers": 2}, layers=layers)
    assert isinstance(student, bertzoo.BertClassifier) and student.backbone.num_layers == 2
    for i, t in enumerate(expected):
        for s_block, t_block in zip(student.backbone.layer_blocks(i), teacher.backbone.layer_blocks(t - 1)):
            assert_same_weights(s_block, t_block)
    assert_same_weights(student.backbone.embeddings, teacher.backbone.embeddings)
    assert_same_weights(student.backbone.pooler, teacher.backbone.pooler)
    assert_same_weights(student.output_dense, teacher.output_dense)
    # A different teacher layer would not match: the test can fail.
    other = teacher.backbone.layer_blocks(expected[0] % 4)[1]
    assert not np.array_equal(np.array(student.backbone.layer_blocks(0)[1].weights[0]), np.array(other.weights[0]))


def test_init_student_with_all_layers_reproduces_the_teacher(pair):
    teacher, _ = pair
    student = init_student_from_teacher(teacher, {})
    x = teacher.preprocessor(["the film was good", "awful"])
    np.testing.assert_allclose(
        np.array(student(x, training=False)), np.array(teacher(x, training=False)), rtol=1e-5, atol=1e-6
    )
    backbone = init_student_from_teacher(teacher.backbone, {"num_layers": 1}, layers=[4])
    assert isinstance(backbone, bertzoo.BertBackbone)
    assert_same_weights(backbone.layer_blocks(0)[0], teacher.backbone.layer_blocks(3)[0])


@pytest.mark.parametrize(
    "student, layers, match",
    [
        ({"num_layers": 3}, "every_k", "multiple of the student's \\(3\\)"),
        (
            {"num_layers": 2, "hidden_dim": 16, "num_heads": 2},
            "every_k",
            "student's `hidden_dim` is 16.*For a narrower",
        ),
        # Not a width: the fix is the preprocessor's sequence_length (the message said "distill a narrower one").
        (
            {"num_layers": 2, "max_sequence_length": 8},
            "every_k",
            "`max_sequence_length` is 8.*preprocessor's `sequence_length`",
        ),
        ({"num_layers": 2, "intermediate_dim": 48}, "every_k", "`intermediate_dim` is 48 for the student"),
        ({"num_layers": 2, "num_groups": 1}, "every_k", "shares its weights"),
        ({"num_layers": 2}, [1], "lists 1 teacher layers but the student has 2"),
        ({"num_layers": 2}, [0, 4], "teacher layer 0 is out of range"),
        ("tiny", "every_k", "`vocabulary_size` is 30522"),
        (3, "every_k", "must be a dict of backbone settings"),
    ],
)
def test_init_student_errors(pair, student, layers, match):
    teacher, _ = pair
    with pytest.raises(ValueError, match=match):
        init_student_from_teacher(teacher, student, layers=layers)


def test_a_student_of_a_shared_teacher_keeps_its_sharing():
    keras.utils.set_random_seed(0)
    teacher = classifier(num_layers=4, num_groups=1, embedding_dim=8)  # ALBERT: one block for every layer.
    student = init_student_from_teacher(teacher, {"num_layers": 2})
    assert student.backbone.num_groups == 1
    assert student.count_params() == teacher.count_params()  # Not one copy of the block per layer.
    x = teacher.preprocessor(["the film was good", "awful"])
    # Two passes through the shared block: the teacher's first two layers, exactly.
    truncated = init_student_from_teacher(teacher, {"num_layers": 2, "num_groups": None})
    np.testing.assert_allclose(np.array(student(x)), np.array(truncated(x)), rtol=1e-6, atol=1e-6)
    # Two groups of two: layers 2 and 4 come from different blocks, so two student groups of one.
    grouped = classifier(num_layers=4, num_groups=2)
    assert init_student_from_teacher(grouped, {"num_layers": 2}).backbone.num_groups == 2  # Unshared.
    assert init_student_from_teacher(grouped, {"num_layers": 2}, layers=[1, 2]).backbone.num_groups == 1
    with pytest.warns(UserWarning, match=r"groups of equal size \(\[2, 1\]"):
        unshared = init_student_from_teacher(grouped, {"num_layers": 3}, layers=[1, 2, 3])
    assert unshared.backbone.num_groups == 3


def test_a_student_of_a_structurally_pruned_teacher_keeps_its_head_size(tmp_path):
    keras.utils.set_random_seed(0)
    teacher = classifier(num_layers=2, hidden_dim=32, num_heads=4)  # Heads of 8.
    scores = {"heads": [np.arange(4, 0, -1, dtype="float32")] * 2, "neurons": [np.ones(64, "float32")] * 2}
    pruned = bertzoo.prune_heads_and_neurons(teacher, heads_to_keep=[4, 2], importance=scores)
    assert pruned.backbone.get_config()["head_dim"] is None  # 32 // 4, derived: saved as None.
    # Layer 2 alone has 2 heads, from which a student's config would derive heads of 16.
    for kwargs in ({"layers": [2]}, {}):
        student = init_student_from_teacher(pruned, {"num_layers": 1}, **kwargs)
        assert student.backbone.head_dim == 8 and student.backbone.num_heads == 2
    # A student preset of that head size fits; one whose config derives another is refused plainly.
    BertBackbone = bertzoo.BertBackbone
    common = dict(vocabulary_size=len(VOCAB), num_layers=1, hidden_dim=32, intermediate_dim=64, max_sequence_length=16)
    BertBackbone(**common, num_heads=[2], head_dim=8).save_to_preset(tmp_path / "fits")
    assert init_student_from_teacher(pruned, tmp_path / "fits", layers=[2]).backbone.head_dim == 8
    BertBackbone(**common, num_heads=[2]).save_to_preset(tmp_path / "other")
    with pytest.raises(ValueError, match=r"the student's `head_dim` is 16 but the teacher's is 8"):
        init_student_from_teacher(pruned, tmp_path / "other", layers=[2])


# --- Training -----------------------------------------------------------------------------------
def repeated(texts, labels, times):
    """`times` copies of the examples, for one epoch as long as `times` epochs:
    each epoch's pass over raw text costs seconds of its own (a new iterator
    of the preprocessing), each step only milliseconds."""
    return texts * times, np.tile(labels, times)


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """A teacher trained on a separable task, distilled (XLA) into a fresh smaller student."""
    keras.utils.set_random_seed(0)
    texts, labels = sentiment(96, seed=0)
    teacher = classifier(num_layers=2, hidden_dim=32, num_heads=4)
    teacher.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=False)
    teacher.fit(*repeated(texts, labels, 5), epochs=1, batch_size=16, verbose=0)  # 30 steps.
    before = weights_of(teacher)
    student = classifier(num_layers=1, hidden_dim=16, num_heads=2)
    d = Distiller(teacher, student, temperature=2.0, alpha=0.5)
    d.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=True)
    val = sentiment(48, seed=1)
    # 60 steps in two epochs of 30 (the student starts to follow the teacher after about 40).
    history = d.fit(*repeated(texts, labels, 5), validation_data=val, epochs=2, batch_size=16, verbose=0)
    return {
        "teacher": teacher,
        "student": student,
        "distiller": d,
        "before": before,
        "history": history.history,
        "val": val,
        "tmp": tmp_path_factory.mktemp("distilled"),
    }


def test_jit_compiled_train_step_runs_and_learns(distilled):
    d, history = distilled["distiller"], distilled["history"]
    assert d.jit_compile is True
    assert all(np.isfinite(history["loss"]))
    print(f"loss by epoch {history['loss']}: last/first {history['loss'][-1] / history['loss'][0]:.3f} (< 0.6)")
    assert history["loss"][-1] < 0.6 * history["loss"][0]
    assert {"accuracy", "agreement", "student_loss", "distillation_loss", "val_accuracy"} <= set(history)
    assert "total_loss" not in history


def test_teacher_weights_unchanged_after_fit(distilled):
    for before, after in zip(distilled["before"], weights_of(distilled["teacher"])):
        np.testing.assert_array_equal(before, after)


def test_student_agrees_with_teacher_on_held_out_data(distilled):
    teacher, d = distilled["teacher"], distilled["distiller"]
    texts, labels = distilled["val"]
    teacher_pred = teacher.predict(texts, verbose=0).argmax(-1)
    student_pred = d.predict(texts, verbose=0).argmax(-1)
    print(
        f"teacher accuracy {np.mean(teacher_pred == labels):.3f}, agreement {np.mean(student_pred == teacher_pred):.3f}"
    )
    assert np.mean(teacher_pred == labels) >= 0.9  # The teacher learned the task...
    assert np.mean(student_pred == teacher_pred) >= 0.9  # ...and the student learned the teacher.
    results = d.evaluate(texts, labels, return_dict=True, verbose=0)
    assert results["agreement"] == pytest.approx(np.mean(student_pred == teacher_pred), abs=1e-6)
    assert results["accuracy"] == pytest.approx(np.mean(student_pred == labels), abs=1e-6)


def test_distilled_student_is_an_ordinary_classifier(distilled):
    student, texts = distilled["student"], distilled["val"][0]
    np.testing.assert_allclose(distilled["distiller"].predict(texts, verbose=0), student.predict(texts, verbose=0))
    path = distilled["tmp"] / "student"
    student.save_to_preset(path)
    again = bertzoo.BertClassifier.from_preset(path)
    np.testing.assert_allclose(again.predict(texts, verbose=0), student.predict(texts, verbose=0), rtol=1e-5, atol=1e-6)


def test_unlabelled_text_distills_on_soft_targets(pair):
    teacher, _ = pair
    student = classifier(num_layers=1, hidden_dim=16, num_heads=2)
    d = Distiller(teacher, student, alpha=0.9, hidden_state_weight=0, attention_weight=0, embedding_weight=0)
    d.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    texts, _ = sentiment(32, seed=2)
    before = d.loss_terms(texts)["soft"]
    history = d.fit(texts * 2, epochs=1, batch_size=16, verbose=0).history  # Two passes, one epoch.
    assert "accuracy" not in history and "student_loss" not in history
    np.testing.assert_allclose(history["loss"], history["distillation_loss"], rtol=1e-6)
    assert d.loss_terms(texts)["soft"] < before
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(8)  # tf.data of raw strings, no labels
    assert np.isfinite(d.fit(dataset, epochs=1, verbose=0).history["loss"][0])


# --- Recipes ------------------------------------------------------------------------------------
def test_tinybert_recipe_runs_its_two_stages_on_the_transfer_set(distilled):
    teacher = distilled["teacher"]
    texts, labels = sentiment(64, seed=2)
    transfer, _ = sentiment(64, seed=3)
    keras.utils.set_random_seed(0)
    student = classifier(num_layers=1, hidden_dim=16, num_heads=2)
    # Batches of 8: 16 steps an epoch on the 128 texts of the transfer set.
    histories = bertzoo.distill(
        teacher, student, texts, labels, transfer=transfer, epochs=(2, 4), batch_size=8, learning_rate=5e-3, verbose=0
    )
    assert list(histories) == ["intermediate", "predictions"]
    first, second = histories["intermediate"], histories["predictions"]
    # Transfer texts carry no labels, so both stages train on the teacher alone.
    assert "student_loss" not in first and "student_loss" not in second
    assert first["distillation_loss"][-1] < first["distillation_loss"][0]
    assert second["agreement"][-1] > second["agreement"][0] or second["agreement"][0] == 1.0
    held_out, _ = distilled["val"]
    agreement = np.mean(
        teacher.predict(held_out, verbose=0).argmax(-1) == student.predict(held_out, verbose=0).argmax(-1)
    )
    print(f"first stage {first['distillation_loss']}, agreement {second['agreement']}, held out {agreement:.3f}")
    assert agreement >= 0.85


def test_minilm_recipe_distills_relations_across_widths(distilled):
    teacher = distilled["teacher"]  # Width 32, 4 heads; the student: width 16, 2 heads.
    texts, labels = sentiment(32, seed=4)
    student = classifier(num_layers=1, hidden_dim=16, num_heads=2)
    probe = Distiller(teacher, student, attention_weight=1.0, value_relation_weight=1.0, layer_map="last")
    before = probe.loss_terms(texts)
    histories = bertzoo.distill(
        teacher, student, texts, labels, recipe="minilm", epochs=(4, 1), batch_size=8, learning_rate=5e-3, verbose=0
    )
    assert list(histories) == ["relations", "predictions"]
    after = probe.loss_terms(texts)
    relations = histories["relations"]["distillation_loss"]
    print(
        f"attention {before['attention']:.4f} -> {after['attention']:.4f} (< 0.5x), value relations "
        f"{before['value_relation']:.4f} -> {after['value_relation']:.4f}, relation losses {relations} (< 0.85x)"
    )
    assert after["attention"] < 0.5 * before["attention"]
    assert after["value_relation"] < before["value_relation"]
    assert relations[-1] < 0.85 * relations[0]
    # Without transfer texts the prediction stage also uses the labels.
    assert "student_loss" in histories["predictions"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"recipe": "distilbert"}, "Unknown recipe 'distilbert'. Choose one of \\['hinton', 'minilm', 'tinybert'\\]"),
        ({"epochs": (1, 2, 3)}, "one per stage \\(intermediate, predictions\\)"),
        ({"epochs": -1}, "`epochs` must be an int >= 0"),
        ({"y": [0, 1, 0]}, "`x` has 2 texts but `y` 3 labels"),
        ({"x": "one text"}, "`x` must be a list of strings"),
        ({"transfer": ["fine", 3]}, "`transfer` must hold strings only"),
        # These trained anyway (a negative rate climbs the loss), or failed deep in NumPy or TensorFlow.
        ({"learning_rate": -1.0}, "`learning_rate` must be a finite number >= 0, got -1.0"),
        ({"learning_rate": "1e-3"}, "`learning_rate` must be a finite number >= 0, got '1e-3'"),
        ({"batch_size": 0}, "`batch_size` must be a positive integer, got 0"),
        ({"batch_size": 1.5}, "`batch_size` must be a positive integer, got 1.5"),
        ({"epochs": 1.5}, "`epochs` must be an int >= 0 or one per stage"),
        ({"epochs": np.array(-1)}, "`epochs` must be an int >= 0 or one per stage"),
        ({"seed": "a"}, "`seed` must be an integer >= 0, got 'a'"),
        ({"pruner": "x"}, "`pruner` must be a bertzoo.Pruner of the student"),
        ({"callbacks": ["stop"]}, "`callbacks` must be a list of keras.callbacks.Callback, got 'stop'"),
        ({"callbacks": 5}, "`callbacks` must be a list of keras.callbacks.Callback, got 5"),
        ({"callbacks": [keras.callbacks.BackupAndRestore("never_written")]}, "BackupAndRestore checkpoints one fit"),
        ({"callbacks": bertzoo.ResumableTraining("never_written")}, r"distill\(\) runs one fit per stage"),
        # Multiple choice's (contexts, choices): the recipes read single texts; the message names the way.
        (
            {"x": (["a context"], [["one", "two"]])},
            r"For text pairs, multiple choice .*Distiller\(teacher, student\)\.fit",
        ),
    ],
)
def test_recipe_argument_errors(pair, kwargs, match):
    teacher, student = pair
    arguments = {"x": ["good", "bad"], "y": [1, 0], **kwargs}
    with pytest.raises(ValueError, match=match):
        bertzoo.distill(teacher, student, **arguments)


def test_augmented_copies_are_seeded_perturbations_from_the_texts_words():
    texts = ["a fine and moving film with a great cast", "dull plot and bad acting all the way through"]
    copies = bertzoo.compression.augment_texts(texts, copies=3, seed=7)
    assert len(copies) == 6 and copies == bertzoo.compression.augment_texts(texts, copies=3, seed=7)
    assert copies != bertzoo.compression.augment_texts(texts, copies=3, seed=8)
    vocabulary = {w for t in texts for w in t.split()}
    assert all(c and set(c.split()) <= vocabulary for c in copies)
    assert sum(c not in texts for c in copies) >= 4  # Most copies differ from every original.
    assert bertzoo.compression.augment_texts(texts, copies=2, rate=0.0) == texts * 2
    with pytest.raises(ValueError, match="`copies` must be an integer >= 0"):
        bertzoo.compression.augment_texts(texts, copies=-1)
    with pytest.raises(ValueError, match="`rate` must be a float in \\[0, 1\\)"):
        bertzoo.compression.augment_texts(texts, rate=1.0)
    # NumPy integers are integers; a rate or seed of the wrong type is named (raw TypeErrors and NumPy errors before).
    assert bertzoo.compression.augment_texts(texts, copies=np.int64(2), seed=np.int64(7)) == copies[:4]
    assert len(bertzoo.compression.augment_texts(texts, copies=1, rate=np.float32(0.1), seed=None)) == 2
    assert sorted(bertzoo.compression.transfer_pool(texts, seed=None)) == sorted(texts)  # A fresh order.
    for bad in ({"rate": "0.1"}, {"rate": None}, {"seed": -1}, {"seed": "a"}):
        with pytest.raises(ValueError, match=f"`{next(iter(bad))}` must be"):
            bertzoo.compression.augment_texts(texts, **bad)


def test_the_transfer_pool_is_every_text_once_in_a_seeded_order():
    from bertzoo.compression import transfer_pool

    texts, extra = [f"train {i}" for i in range(6)], [f"other {i}" for i in range(5)]
    pool = transfer_pool(texts, extra, seed=3)
    assert sorted(pool) == sorted(texts + extra)
    assert pool == transfer_pool(texts, extra, seed=3) and pool != transfer_pool(texts, extra, seed=4)
    augmented = transfer_pool(texts, extra, augment=2, seed=3)
    copies = bertzoo.compression.augment_texts(texts, copies=2, seed=3)
    assert sorted(augmented) == sorted(texts + extra + copies)
    assert sorted(transfer_pool(texts)) == sorted(texts)
    with pytest.raises(ValueError, match="`transfer` must be a list of strings"):
        transfer_pool(texts, "one string")


def test_the_soft_target_gradient_survives_a_confidently_wrong_student():
    # Keras's KLDivergence clips probabilities at 1e-7: loss 9.65 and a zero gradient here.
    teacher, student = tf.constant([[0.0, 0.0, 0.0]]), tf.Variable([[40.0, 0.0, 0.0]])
    for temperature in (1.0, 2.0):
        with tf.GradientTape() as tape:
            loss = soft_target_loss(temperature).compute_loss(teacher, student)
        np.testing.assert_allclose(float(loss), np_soft_loss(teacher.numpy(), student.numpy(), temperature), rtol=1e-5)
        q = np_softmax(student.numpy() / temperature)
        np.testing.assert_allclose(tape.gradient(loss, student).numpy(), temperature * (q - 1 / 3), atol=1e-5)


@pytest.mark.parametrize("head", [{"activation": "softmax"}, {"activation": "sigmoid"}, {"num_classes": 1}])
def test_heads_that_give_no_logits_are_refused(head):
    kwargs = {"num_classes": 2, **head}
    teacher = classifier()
    teacher = bertzoo.BertClassifier(teacher.backbone, preprocessor=teacher.preprocessor, **kwargs)
    student = bertzoo.BertClassifier(classifier(num_layers=1).backbone, preprocessor=teacher.preprocessor, **kwargs)
    with pytest.raises(
        ValueError, match=r"The teacher's head gives .*activation=None, the default.*soft_target_weight=0"
    ):
        Distiller(teacher, student)
    Distiller(teacher, student, soft_target_weight=0.0, alpha=1.0)  # Hard labels and layers only: nothing to refuse.


def test_a_recipe_checks_every_stage_before_training_and_passes_distiller_settings_through():
    keras.utils.set_random_seed(2)
    teacher = bertzoo.BertClassifier(classifier().backbone, 1, preprocessor=preprocessor())  # Regression: 1 value.
    student = bertzoo.BertClassifier(classifier(num_layers=1).backbone, 1, preprocessor=preprocessor())
    before = weights_of(student)
    texts, labels = ["good film", "bad film", "great cast", "dull plot"], np.asarray([1.0, 0.0, 1.0, 0.0], "float32")
    # The predictions stage refuses a regression head's soft targets: before the intermediate stage trained
    # (it trained first, then failed, and the error's fix was no argument of distill()).
    with pytest.raises(ValueError, match=r"'tinybert' recipe's predictions stage cannot run, so nothing was trained"):
        bertzoo.distill(teacher, student, texts, labels, epochs=1, batch_size=2, verbose=0)
    for a, b in zip(before, weights_of(student)):
        np.testing.assert_array_equal(a, b)

    # The fix it names, through distill(): the intermediate layers, then the labels (no soft targets).
    class Stages(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append(type(self.model).__name__)

    seen = []
    histories = bertzoo.distill(
        teacher, student, texts, labels, epochs=1, batch_size=2, verbose=0, soft_target_weight=0.0, callbacks=[Stages()]
    )
    assert list(histories) == ["intermediate", "predictions"]
    assert seen == ["Distiller", "Distiller"]  # The callbacks reach every stage's fit.
    assert any(not np.array_equal(a, b) for a, b in zip(before, weights_of(student)))
    # A misspelled setting, a misspelled distill() argument, or Keras's layer arguments (trainable=False
    # trained nothing, silently): refused by name before anything runs.
    for bad, match in [
        (
            {"relation_head": 2},
            r"distill\(\) got unexpected keyword arguments: `relation_head` \(did you mean `relation_heads`\?\)",
        ),
        ({"epoch": 1}, r"distill\(\) got unexpected keyword arguments: `epoch`"),
        ({"trainable": False}, r"distill\(\) got unexpected keyword arguments: `trainable`"),
    ]:
        with pytest.raises(TypeError, match=match):
            bertzoo.distill(teacher, student, texts, labels, verbose=0, soft_target_weight=0.0, **bad)
    # One output has no class to agree on: no `agreement` (it read 1.0 whatever the outputs).
    assert "agreement" not in histories["predictions"]
    terms = Distiller(teacher, student, soft_target_weight=0.0).loss_terms(texts, labels)
    assert "agreement" not in terms and terms["hard"] > 0


def test_log_probabilities_distill_like_logits():
    teacher = classifier()
    teacher = bertzoo.BertClassifier(teacher.backbone, 2, preprocessor=teacher.preprocessor, activation="log_softmax")
    student = bertzoo.BertClassifier(classifier(num_layers=1).backbone, 2, activation="log_softmax")
    Distiller(teacher, student)  # softmax(log p / T) is softmax(logits / T): the shift cancels.


def test_a_teacher_with_per_layer_heads_distills_and_relates_its_last_layers_heads():
    teacher = classifier(num_layers=2, hidden_dim=32, num_heads=[4, 2], head_dim=8)
    student = classifier(num_layers=1, hidden_dim=16, num_heads=2)
    d = Distiller(teacher, student, value_relation_weight=1.0, layer_map=[(1, 2)])
    assert d.relation_heads == 2  # The teacher's heads in layer 2, whose values are 2 * 8 wide.
    with pytest.raises(ValueError, match=r"relation_heads=3 does not divide the width 16 of the teacher's values"):
        Distiller(teacher, student, value_relation_weight=1.0, layer_map=[(1, 2)], relation_heads=3)


def test_the_metrics_average_over_examples_not_batches():
    teacher, student = classifier(), classifier(num_layers=1)
    d = Distiller(teacher, student)
    d.compile(jit_compile=False)
    texts, labels = sentiment(5, seed=3)
    logs = d.evaluate(texts, labels, batch_size=4, return_dict=True, verbose=0)
    x = teacher.preprocessor(texts)
    t_logits, s_logits = np.asarray(teacher(x)), np.asarray(student(x))
    assert logs["agreement"] == pytest.approx(np.mean(t_logits.argmax(-1) == s_logits.argmax(-1)), abs=1e-6)
    assert logs["student_loss"] == pytest.approx(np_hard_loss(np.asarray(labels), s_logits), rel=1e-4)


def test_a_saved_distiller_reloads_compiled_as_it_was(tmp_path):
    keras.utils.set_random_seed(3)
    teacher, student = classifier(num_layers=2, hidden_dim=32), classifier(num_layers=1, hidden_dim=16, num_heads=2)
    distiller = bertzoo.Distiller(teacher, student, alpha=0.3)
    distiller.compile(optimizer=keras.optimizers.SGD(1e-3, momentum=0.5), jit_compile=False)
    texts, labels = sentiment(8, seed=3)
    features = teacher.preprocessor(texts)
    for _ in range(2):
        distiller.train_on_batch(features, labels)
    distiller.save(tmp_path / "distiller.keras")
    again = keras.saving.load_model(tmp_path / "distiller.keras")
    # The optimizer the user compiled with, and its state: not the defaults, restarted.
    assert isinstance(again.optimizer, keras.optimizers.SGD) and int(again.optimizer.iterations) == 2
    assert float(again.optimizer.learning_rate) == pytest.approx(1e-3)
    momenta = [np.asarray(v) for v in distiller.optimizer.variables[1:]]
    np.testing.assert_allclose([np.asarray(v) for v in again.optimizer.variables[1:]][0], momenta[0])
    np.testing.assert_allclose(
        again.evaluate(features, labels, verbose=0), distiller.evaluate(features, labels, verbose=0), rtol=1e-5
    )


def test_true_or_false_settings_refuse_other_values(pair):
    # "no" read as true: normalized losses, quantized embeddings.
    teacher, student = pair
    with pytest.raises(ValueError, match="`normalize_losses` must be True or False, got 'no'"):
        bertzoo.Distiller(teacher, student, normalize_losses="no")
    with pytest.raises(ValueError, match="`include_embeddings` must be True or False, got 'no'"):
        bertzoo.quantize(student, "int8", include_embeddings="no")
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer, got 0"):
        student.fit(["good", "bad"], [1, 0], batch_size=0, verbose=0)  # Raw text took the default size.
