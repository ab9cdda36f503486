"""Tests for bertzoo.layers against NumPy re-implementations (issue #2)."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from bertzoo.layers import SUPPORTED_ACTIVATIONS
from bertzoo.layers import BertEmbeddings
from bertzoo.layers import Dropout
from bertzoo.layers import FeedForwardBlock
from bertzoo.layers import PositionEmbedding
from bertzoo.layers import SelfAttentionBlock
from bertzoo.layers import get_activation
from bertzoo.layers.masked_lm_head import MaskedLMHead

TOL = dict(rtol=1e-5, atol=1e-5)


# --- NumPy references (float64) ---------------------------------------------


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def np_gelu_exact(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


NP_ACTIVATIONS = {
    "gelu_tanh": np_gelu_tanh,
    "gelu_exact": np_gelu_exact,
    "relu": lambda x: np.maximum(x, 0.0),
}


def np_layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def np_dense(x, dense):
    return x @ w(dense.kernel) + w(dense.bias)


def np_attention_block(block, x, padding_mask):
    """LayerNorm(x + W_o · MHSA(x)), also returning the probabilities."""
    b, t, _ = x.shape
    n, d = block.num_heads, block.head_dim
    q = np_dense(x, block.query_dense).reshape(b, t, n, d)
    k = np_dense(x, block.key_dense).reshape(b, t, n, d)
    v = np_dense(x, block.value_dense).reshape(b, t, n, d)
    logits = np.einsum("btnd,bsnd->bnts", q, k) / math.sqrt(d)
    logits = np.where(padding_mask[:, None, None, :].astype(bool), logits, -np.inf)
    probs = np_softmax(logits)
    context = np.einsum("bnts,bsnd->btnd", probs, v).reshape(b, t, n * d)
    attended = np_dense(context, block.output_dense)
    ln = block.layer_norm
    return np_layer_norm(x + attended, w(ln.gamma), w(ln.beta), block.layer_norm_epsilon), probs


def np_feedforward_block(block, x):
    h = NP_ACTIVATIONS[block.activation](np_dense(x, block.intermediate_dense))
    ln = block.layer_norm
    return np_layer_norm(x + np_dense(h, block.output_dense), w(ln.gamma), w(ln.beta), block.layer_norm_epsilon)


def np_embeddings(layer, token_ids, segment_ids):
    x = w(layer.token_embedding.embeddings)[token_ids]
    x = x + w(layer.position_embedding.embeddings)[: token_ids.shape[1]][None]
    x = x + w(layer.segment_embedding.embeddings)[segment_ids]
    ln = layer.layer_norm
    x = np_layer_norm(x, w(ln.gamma), w(ln.beta), layer.layer_norm_epsilon)
    if layer.projection is not None:
        x = np_dense(x, layer.projection)
    return x


# --- Helpers -----------------------------------------------------------------


def w(variable):
    """A variable's value as a float64 NumPy array."""
    return np.asarray(ops.convert_to_numpy(variable), dtype="float64")


def n(tensor):
    return np.asarray(ops.convert_to_numpy(tensor))


def randomize(layer, rng, scale=0.5):
    """Replaces the default tiny initial weights (stddev 0.02, LayerNorm 1/0)
    by large random ones, so attention is far from uniform and every weight
    visibly matters."""
    for variable in layer.weights:
        variable.assign(rng.normal(0.0, scale, variable.shape).astype("float32"))


def padded_batch(rng, batch=2, length=6, width=16, lengths=(6, 3)):
    x = rng.normal(size=(batch, length, width)).astype("float32")
    mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype("int32")
    return x, mask


# --- Activations -------------------------------------------------------------


def test_gelu_variants_match_their_formulas_and_differ():
    x = np.linspace(-5.0, 5.0, 201).astype("float32")
    tanh_form = n(get_activation("gelu_tanh")(x))
    erf_form = n(get_activation("gelu_exact")(x))
    np.testing.assert_allclose(tanh_form, np_gelu_tanh(x.astype("float64")), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(erf_form, np_gelu_exact(x.astype("float64")), rtol=1e-6, atol=1e-6)
    # The two forms are different functions (max gap about 5e-4 near |x|=2).
    assert np.abs(tanh_form - erf_form).max() > 1e-4


def test_plain_gelu_is_rejected_as_ambiguous():
    with pytest.raises(ValueError, match=r"activation='gelu' is ambiguous.*gelu_exact.*gelu_tanh"):
        get_activation("gelu")
    with pytest.raises(ValueError, match="ambiguous"):
        FeedForwardBlock(8, activation="gelu")


def test_unknown_activation_lists_the_supported_names():
    assert set(SUPPORTED_ACTIVATIONS) >= {"gelu_tanh", "gelu_exact", "relu"}
    with pytest.raises(ValueError, match=r"Unknown activation 'swishy'.*gelu_tanh"):
        get_activation("swishy")


# --- Embeddings --------------------------------------------------------------


@pytest.mark.parametrize("embedding_dim", [None, 16, 8], ids=["E=None", "E=H", "E<H"])
def test_embeddings_match_numpy(rng, embedding_dim):
    layer = BertEmbeddings(50, 16, embedding_dim=embedding_dim, max_sequence_length=10, dropout=0.0)
    token_ids = rng.integers(0, 50, (2, 7)).astype("int32")
    segment_ids = rng.integers(0, 2, (2, 7)).astype("int32")
    layer(token_ids, segment_ids)
    randomize(layer, rng)
    # Only a real factorization (E < H) adds the E -> H projection.
    assert (layer.projection is not None) == (embedding_dim == 8)
    out = n(layer(token_ids, segment_ids))
    assert out.shape == (2, 7, 16)
    np.testing.assert_allclose(out, np_embeddings(layer, token_ids, segment_ids), **TOL)


def test_factorized_embeddings_store_v_by_e_tables_and_a_projection(rng):
    vocabulary, embedding, hidden, positions, segments = 50, 8, 32, 12, 3
    layer = BertEmbeddings(
        vocabulary,
        hidden,
        embedding_dim=embedding,
        max_sequence_length=positions,
        num_segments=segments,
    )
    out = layer(np.zeros((2, 5), "int32"), np.zeros((2, 5), "int32"))
    assert tuple(out.shape) == (2, 5, hidden)
    assert tuple(layer.token_embedding.embeddings.shape) == (vocabulary, embedding)
    assert tuple(layer.position_embedding.embeddings.shape) == (positions, embedding)
    assert tuple(layer.segment_embedding.embeddings.shape) == (segments, embedding)
    assert tuple(layer.layer_norm.gamma.shape) == (embedding,)  # LayerNorm acts on E.
    assert tuple(layer.projection.kernel.shape) == (embedding, hidden)
    assert tuple(layer.projection.bias.shape) == (hidden,)
    expected = (vocabulary + positions + segments) * embedding + 2 * embedding + embedding * hidden + hidden
    assert layer.count_params() == expected


def test_embedding_dropout_only_in_training(rng):
    layer = BertEmbeddings(50, 16, dropout=0.5)
    ids = rng.integers(0, 50, (2, 6)).astype("int32")
    seg = np.zeros_like(ids)
    np.testing.assert_array_equal(n(layer(ids, seg)), n(layer(ids, seg, training=False)))
    assert not np.allclose(n(layer(ids, seg, training=True)), n(layer(ids, seg)))


@pytest.mark.parametrize(
    "token_ids, segment_ids, message",
    [
        ([[1, 50]], [[0, 0]], r"token id 50 outside \[0, 50\) \(vocabulary_size=50\)"),
        ([[-1, 3]], [[0, 0]], r"token id -1 outside \[0, 50\)"),
        ([[1, 2]], [[0, 2]], r"segment id 2 outside \[0, 2\) \(num_segments=2\)"),
    ],
    ids=["too-large-token", "negative-token", "bad-segment"],
)
def test_embeddings_reject_out_of_range_ids_eagerly(token_ids, segment_ids, message):
    layer = BertEmbeddings(50, 16)
    with pytest.raises(ValueError, match=message):
        layer(np.asarray(token_ids, "int32"), np.asarray(segment_ids, "int32"))


def test_position_embedding_slices_and_rejects_too_long_inputs():
    layer = PositionEmbedding(max_sequence_length=8, embedding_dim=4)
    table = n(layer(np.zeros((2, 5, 4), "float32")))
    np.testing.assert_array_equal(table, n(layer.embeddings)[:5])
    with pytest.raises(ValueError, match=r"length 9 exceeds the position table \(max_sequence_length=8\)"):
        layer(np.zeros((1, 9, 4), "float32"))


# --- Self-attention ----------------------------------------------------------


@pytest.mark.parametrize("num_heads, head_dim", [(2, 8), (3, 4)], ids=["heads*dim=H", "pruned"])
def test_attention_explicit_path_matches_numpy(rng, num_heads, head_dim):
    block = SelfAttentionBlock(num_heads, head_dim, dropout=0.0, attention_dropout=0.0)
    x, mask = padded_batch(rng)
    block(x, padding_mask=mask)
    randomize(block, rng)
    out, probs = block(x, padding_mask=mask, return_attention_scores=True)
    ref_out, ref_probs = np_attention_block(block, x.astype("float64"), mask)
    assert tuple(probs.shape) == (2, num_heads, 6, 6)
    np.testing.assert_allclose(n(probs), ref_probs, **TOL)
    np.testing.assert_allclose(n(out), ref_out, **TOL)


def test_attention_probabilities_are_normalized_and_ignore_padding(rng):
    block = SelfAttentionBlock(2, 8)
    x, mask = padded_batch(rng, lengths=(6, 3))
    block(x, padding_mask=mask)
    randomize(block, rng)
    _, probs = block(x, padding_mask=mask, return_attention_scores=True)
    probs = n(probs)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(-1), np.ones((2, 2, 6)), atol=1e-6)
    assert np.all(probs[1, :, :, 3:] == 0.0)  # Padded keys get exactly zero.
    assert np.all(probs[0] > 0.0)


def test_attention_over_one_token_gives_probability_one_without_warnings(rng, recwarn):
    block = SelfAttentionBlock(2, 8)
    x = rng.normal(size=(2, 1, 16)).astype("float32")
    for mask in (np.ones((2, 1), "int32"), np.array([[1], [0]], "int32")):
        out, probs = block(x, padding_mask=mask, return_attention_scores=True)
        np.testing.assert_array_equal(n(probs), np.ones((2, 2, 1, 1), "float32"))
        assert np.isfinite(n(out)).all()
    assert not [w for w in recwarn if "softmax" in str(w.message)]
    # Training on one-token inputs: every weight gets a gradient (zero for the query and key).
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = ops.sum(block(x, padding_mask=np.ones((2, 1), "int32"), training=True) ** 2)
    gradients = tape.gradient(loss, block.trainable_variables)
    assert all(g is not None for g in gradients), [
        v.path for v, g in zip(block.trainable_variables, gradients) if g is None
    ]


@pytest.fixture
def fused_attention(monkeypatch):
    """Forces the `ops.dot_product_attention` path (JAX's and torch's) and
    counts its calls."""
    from bertzoo.layers import attention

    calls = []
    fused_op = ops.dot_product_attention
    monkeypatch.setattr(attention, "_fused_attention_available", lambda dtype: True)
    monkeypatch.setattr(ops, "dot_product_attention", lambda *a, **k: calls.append(1) or fused_op(*a, **k))
    return calls


def test_fused_and_explicit_paths_agree_with_padding(rng, fused_attention):
    block = SelfAttentionBlock(2, 8)
    x, mask = padded_batch(rng, lengths=(6, 2))
    block(x, padding_mask=mask)
    randomize(block, rng)
    fused_attention.clear()

    fused = n(block(x, padding_mask=mask))
    assert len(fused_attention) == 1  # Inference without probabilities takes the fused op...
    explicit, _ = block(x, padding_mask=mask, return_attention_scores=True)
    assert len(fused_attention) == 1  # ... and asking for probabilities does not.
    np.testing.assert_allclose(fused, n(explicit), rtol=1e-5, atol=1e-5)
    # Also without any mask.
    np.testing.assert_allclose(n(block(x)), n(block(x, return_attention_scores=True)[0]), rtol=1e-5, atol=1e-5)


def test_tensorflow_runs_head_major_matmuls_equal_to_keras_attention(rng, monkeypatch):
    from bertzoo.layers.attention import _head_major_attention

    calls = []
    fused_op = ops.dot_product_attention
    monkeypatch.setattr(ops, "dot_product_attention", lambda *a, **k: calls.append(1) or fused_op(*a, **k))
    block = SelfAttentionBlock(2, 8)
    x, mask = padded_batch(rng, lengths=(6, 2))
    block(x, padding_mask=mask)
    assert calls == []  # TensorFlow's op has no fused kernel: the matmul form runs.

    q, k, v = (rng.normal(size=(2, 6, 2, 8)).astype("float32") for _ in range(3))
    keep = np.asarray(mask)[:, None, None, :].astype(bool)
    context, probs = _head_major_attention(q, k, v, keep, 8**-0.5)
    reference = fused_op(q, k, v, mask=keep)
    np.testing.assert_allclose(n(context), n(reference), rtol=1e-6, atol=1e-6)
    assert n(probs).shape == (2, 2, 6, 6)
    np.testing.assert_allclose(n(probs).sum(-1), 1.0, rtol=1e-6)


def test_attention_dropout_in_training_uses_the_explicit_path(rng, fused_attention):
    x, mask = padded_batch(rng)

    noisy = SelfAttentionBlock(2, 8, dropout=0.0, attention_dropout=0.5)
    assert not np.allclose(n(noisy(x, padding_mask=mask, training=True)), n(noisy(x, padding_mask=mask)))
    assert len(fused_attention) == 1  # Only the inference call was fused.

    # Without attention dropout, training mode may fuse and computes the same.
    quiet = SelfAttentionBlock(2, 8, dropout=0.0, attention_dropout=0.0)
    np.testing.assert_allclose(
        n(quiet(x, padding_mask=mask, training=True)), n(quiet(x, padding_mask=mask)), rtol=1e-6, atol=1e-6
    )


# --- Dropout -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_keeps_the_rate_and_the_expected_value(dtype):
    rate = 0.1
    x = ops.ones((64, 1023), dtype=dtype)  # An odd size: the 16-bit numbers come in pairs.
    y = n(ops.cast(Dropout(rate, seed=3, dtype=dtype)(x, training=True), "float32"))
    kept = y != 0
    assert abs(kept.mean() - (1 - rate)) < 0.005  # 65k draws: the standard error is 0.0012.
    threshold = round(rate * 65536)
    scale = np.float32(65536 / (65536 - threshold))
    np.testing.assert_allclose(y[kept], float(ops.cast(ops.cast(scale, dtype), "float32")))
    # Inference, rate 0 and rate 1 behave as Keras's layer.
    np.testing.assert_array_equal(n(ops.cast(Dropout(rate)(x), "float32")), 1.0)
    np.testing.assert_array_equal(n(ops.cast(Dropout(0.0)(x, training=True), "float32")), 1.0)
    np.testing.assert_array_equal(n(ops.cast(Dropout(1.0)(x, training=True), "float32")), 0.0)


def test_dropout_masks_change_per_call_and_repeat_with_the_seed():
    x = ops.ones((32, 100))
    layer = Dropout(0.5, seed=11)
    first, second = n(layer(x, training=True)), n(layer(x, training=True))
    assert not np.array_equal(first == 0, second == 0)
    again = Dropout(0.5, seed=11)
    np.testing.assert_array_equal(n(again(x, training=True)), first)
    restored = Dropout.from_config(layer.get_config())
    assert (restored.rate, restored.seed) == (0.5, 11)


def test_dropout_with_a_noise_shape_is_keras_dropout():
    x = ops.ones((4, 6, 8))
    y = n(Dropout(0.5, noise_shape=(4, 1, 8), seed=2)(x, training=True))
    np.testing.assert_array_equal(y[:, :1, :].repeat(6, axis=1), y)  # One mask per (row, feature).
    assert set(np.unique(y)) <= {0.0, 2.0}


# --- Feed-forward ------------------------------------------------------------


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu_exact", "relu"])
def test_feedforward_matches_numpy(rng, activation):
    block = FeedForwardBlock(24, activation=activation, dropout=0.0)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    block(x)
    randomize(block, rng)
    np.testing.assert_allclose(n(block(x)), np_feedforward_block(block, x.astype("float64")), **TOL)


def test_feedforward_default_activation_is_gelu_tanh():
    assert FeedForwardBlock(8).activation == "gelu_tanh"


# --- Serialization -----------------------------------------------------------

LAYER_CASES = {
    "embeddings": (
        lambda: BertEmbeddings(50, 16, embedding_dim=8, max_sequence_length=10, dropout=0.2),
        lambda rng: (rng.integers(0, 50, (2, 5)).astype("int32"), np.ones((2, 5), "int32")),
    ),
    "position": (
        lambda: PositionEmbedding(10, 8),
        lambda rng: (rng.normal(size=(2, 5, 8)).astype("float32"),),
    ),
    "attention": (
        lambda: SelfAttentionBlock(3, 4, dropout=0.2, attention_dropout=0.3, layer_norm_epsilon=1e-6),
        lambda rng: (rng.normal(size=(2, 5, 16)).astype("float32"),),
    ),
    "feedforward": (
        lambda: FeedForwardBlock(24, activation="gelu_exact", initializer_range=0.1),
        lambda rng: (rng.normal(size=(2, 5, 16)).astype("float32"),),
    ),
}


@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_layer_config_round_trip(rng, case):
    make_layer, make_args = LAYER_CASES[case]
    layer = make_layer()
    args = make_args(rng)
    expected = n(layer(*args))
    config = layer.get_config()

    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone(*args)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(n(clone(*args)), expected, rtol=1e-6, atol=1e-6)

    # Registered with Keras: deserializes by name, without custom_objects.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    assert restored.get_config() == config


# --- Mixed precision -----------------------------------------------------------


@pytest.mark.parametrize(
    "make_block",
    [lambda d: SelfAttentionBlock(2, 8, dtype=d), lambda d: FeedForwardBlock(32, dtype=d)],
    ids=["attention", "feedforward"],
)
def test_blocks_under_mixed_float16_keep_float32_weights_and_normalize_in_float32(rng, make_block):
    # Residual streams of magnitude ~300 have a variance (~9e4) beyond float16's
    # range (65504): a LayerNorm computed in float16 would overflow.
    x = (300.0 * rng.normal(size=(2, 5, 16))).astype("float16")
    block = make_block("mixed_float16")
    out = block(x)
    assert {v.dtype for v in block.weights} == {"float32"}
    assert ops.dtype(out) == "float16"
    reference = make_block("float32")
    reference(x.astype("float32"))
    reference.set_weights(block.get_weights())
    expected = n(reference(x.astype("float32")))
    np.testing.assert_allclose(n(out).astype("float32"), expected, atol=0.02)


def _kernels(layer):
    return [w.numpy() for w in layer.weights if len(w.shape) == 2]


def test_every_weight_matrix_starts_from_its_own_random_draw():
    # Regression: one unseeded Keras initializer shared by several weights
    # hands them all the same values (Q = K = V = output at init).
    keras.utils.set_random_seed(3)
    attention = SelfAttentionBlock(num_heads=2, head_dim=4)
    attention.build((None, 5, 8))
    feedforward = FeedForwardBlock(intermediate_dim=8)
    feedforward.build((None, 5, 8))
    embeddings = BertEmbeddings(
        vocabulary_size=30, hidden_dim=8, embedding_dim=8, max_sequence_length=30, num_segments=2
    )
    embeddings.build((None, 5), (None, 5))
    matrices = _kernels(attention) + _kernels(feedforward) + [m[:2] for m in _kernels(embeddings)]
    assert len(matrices) == 4 + 2 + 3
    for i, a in enumerate(matrices):
        for b in matrices[i + 1 :]:
            if a.shape == b.shape:
                assert not np.allclose(a, b), "two weights were initialized identically"
    for m in matrices:  # Still BERT's truncated normal, stddev 0.02.
        assert np.abs(m).max() <= 2 * 0.02 + 1e-6 and 0.005 < m.std() < 0.03


def test_same_global_seed_gives_the_same_initial_weights():
    def build():
        keras.utils.set_random_seed(11)
        block = SelfAttentionBlock(num_heads=2, head_dim=4)
        block.build((None, 5, 8))
        return _kernels(block)

    for a, b in zip(build(), build()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "make, name, value",
    [
        (lambda: SelfAttentionBlock(num_heads=0, head_dim=8), "num_heads", "0"),
        (lambda: SelfAttentionBlock(num_heads=2.5, head_dim=8), "num_heads", "2.5"),
        (lambda: SelfAttentionBlock(num_heads=2, head_dim=-4), "head_dim", "-4"),
        (lambda: SelfAttentionBlock(num_heads=2, head_dim=8, attention_dropout=1.0), "attention_dropout", "1.0"),
        (lambda: FeedForwardBlock(intermediate_dim=0), "intermediate_dim", "0"),
        (lambda: FeedForwardBlock(intermediate_dim=64, dropout=-0.1), "dropout", "-0.1"),
        (lambda: PositionEmbedding(max_sequence_length=0, embedding_dim=8), "max_sequence_length", "0"),
        (lambda: BertEmbeddings(vocabulary_size=10, hidden_dim=8, num_segments=0), "num_segments", "0"),
        (lambda: BertEmbeddings(vocabulary_size=10, hidden_dim=8, embedding_dim=3.0), "embedding_dim", "3.0"),
        (lambda: MaskedLMHead(vocabulary_size=0, embedding_dim=8), "vocabulary_size", "0"),
    ],
)
def test_layers_name_a_bad_size_or_rate_by_their_own_argument(make, name, value):
    # Keras's Dense would say "units" (or build a 2.5 * 8 = 20-wide projection).
    with pytest.raises(ValueError, match=rf"`{name}` must be .*got {value}"):
        make()


def test_the_erf_gelu_scope_nests_and_stays_in_its_thread():
    import threading

    from bertzoo.layers.activations import _gelu_exact
    from bertzoo.layers.activations import exact_gelu_as_erf
    from bertzoo.utils.scopes import ThreadScope

    x = ops.convert_to_tensor(np.linspace(-6, 6, 49).astype("float32"))
    reference = ops.convert_to_numpy(keras.activations.gelu(x, approximate=False))
    with exact_gelu_as_erf():
        with exact_gelu_as_erf():
            pass
        np.testing.assert_allclose(ops.convert_to_numpy(_gelu_exact(x)), reference, atol=1e-6)
    scope, seen = ThreadScope(), []
    with scope():
        other = threading.Thread(target=lambda: seen.append(scope.active()))
        other.start()
        other.join()
        assert scope.active()
    assert seen == [False] and not scope.active()
