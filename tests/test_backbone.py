"""Tests for bertzoo.BertBackbone (issue #2).

References: keras-hub's BertBackbone / AlbertBackbone (parameter counts and,
with weights copied across by an explicit mapping, outputs), hand-derived
parameter arithmetic, and round trips. The big presets are only ever built
with unmaterialized variables (see `variables_not_materialized`).
"""

import contextlib
import json
import math

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops

import bertzoo
from bertzoo import BertBackbone
from bertzoo.models.bert_backbone import count_backbone_parameters
from bertzoo.saving.preset import builtin_presets

TINY = dict(
    vocabulary_size=50,
    num_layers=2,
    hidden_dim=16,
    num_heads=2,
    intermediate_dim=32,
    max_sequence_length=16,
    dropout=0.0,
)
# Every per-layer feature at once: factorized embeddings, per-layer heads and
# feed-forward sizes (a structurally pruned model), exact GELU.
PER_LAYER = dict(
    vocabulary_size=50,
    num_layers=4,
    hidden_dim=16,
    num_heads=[4, 2, 2, 1],
    head_dim=4,
    intermediate_dim=[32, 24, 16, 8],
    embedding_dim=8,
    max_sequence_length=16,
    activation="gelu_exact",
    dropout=0.0,
)
# The reference values (keras-hub, vocabulary 30,000 for ALBERT).
REFERENCE_PARAMETERS = {
    "base": 109_482_240,
    "large": 335_141_888,
    "albert_base": 11_683_584,
    "albert_large": 17_683_968,
    "albert_xlarge": 58_724_864,
    "albert_xxlarge": 222_595_584,
}
PRESETS = builtin_presets()


# --- Helpers -----------------------------------------------------------------


def n(tensor):
    return np.asarray(ops.convert_to_numpy(tensor))


def as_float32(outputs):
    return {k: n(ops.cast(v, "float32")) for k, v in outputs.items()}


def randomize(model, rng, scale=0.3):
    """Large random weights, so that every weight visibly matters."""
    for variable in model.weights:
        variable.assign(rng.normal(0.0, scale, variable.shape).astype("float32"))


def unique_variables(model):
    return list({id(v): v for v in model.weights}.values())


@contextlib.contextmanager
def variables_not_materialized():
    """Builds models whose variables have shapes but no values.

    Inside a `StatelessScope(initialize_variables=False)` Keras defers running
    the initializers, which dominate the cost of building BERT-Large or
    ALBERT-xxLarge (seconds and gigabytes each); shapes, and so
    `count_params()`, are exact. Keras keeps the deferred variables in its
    global state to initialize them later, so the session is cleared after.
    """
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        keras.backend.clear_session(free_memory=False)


def keras_hub_backbone(config):
    """keras-hub's model for a bertzoo config (ALBERT when E is set)."""
    c = config
    common = dict(
        vocabulary_size=c["vocabulary_size"],
        num_layers=c["num_layers"],
        num_heads=c["num_heads"],
        hidden_dim=c["hidden_dim"],
        intermediate_dim=c["intermediate_dim"],
        max_sequence_length=c.get("max_sequence_length", 512),
        num_segments=c.get("num_segments", 2),
        dropout=c.get("dropout", 0.1),
    )
    if c.get("embedding_dim"):
        return keras_hub.models.AlbertBackbone(
            embedding_dim=c["embedding_dim"],
            num_groups=c.get("num_groups") or c["num_layers"],
            num_inner_repetitions=1,
            **common,
        )
    assert (c.get("num_groups") or c["num_layers"]) == c["num_layers"]
    return keras_hub.models.BertBackbone(**common)


def copy_from_keras_hub(source, target):
    """Copies a keras-hub BertBackbone/AlbertBackbone into a bertzoo backbone.

    keras-hub's attention projections are EinsumDense kernels of shape
    (H, heads, head_dim) and (heads, head_dim, H); ours are Dense kernels
    (H, heads * head_dim) and (heads * head_dim, H) whose columns are split
    into heads in the same (head, dim) order, so a reshape maps one to the
    other. Checks that every variable on both sides is used.
    """
    values = {v.path: n(v) for v in source.weights}
    used, assigned = set(), set()
    hidden = target.hidden_dim

    def put(variable, path, shape=None):
        value = values[path]
        variable.assign(value if shape is None else value.reshape(shape))  # assign checks shapes
        used.add(path)
        assigned.add(id(variable))

    emb = target.embeddings
    put(emb.token_embedding.embeddings, "token_embedding/embeddings")
    put(emb.position_embedding.embeddings, "position_embedding/embeddings")
    put(emb.segment_embedding.embeddings, "segment_embedding/embeddings")
    put(emb.layer_norm.gamma, "embeddings_layer_norm/gamma")
    put(emb.layer_norm.beta, "embeddings_layer_norm/beta")
    if emb.projection is not None:
        put(emb.projection.kernel, "embedding_projection/kernel")
        put(emb.projection.bias, "embedding_projection/bias")
    is_albert = isinstance(source, keras_hub.models.AlbertBackbone)
    group_size = target.num_layers // target.num_groups
    for i in range(target.num_layers):
        prefix = f"group_{i // group_size}_inner_layer_0" if is_albert else f"transformer_layer_{i}"
        attention, feedforward = target.layer_blocks(i)
        mha = f"{prefix}/self_attention_layer"
        for dense, name in (
            (attention.query_dense, "query"),
            (attention.key_dense, "key"),
            (attention.value_dense, "value"),
        ):
            put(dense.kernel, f"{mha}/{name}/kernel", (hidden, -1))
            put(dense.bias, f"{mha}/{name}/bias", (-1,))
        put(attention.output_dense.kernel, f"{mha}/attention_output/kernel", (-1, hidden))
        put(attention.output_dense.bias, f"{mha}/attention_output/bias")
        put(attention.layer_norm.gamma, f"{prefix}/self_attention_layer_norm/gamma")
        put(attention.layer_norm.beta, f"{prefix}/self_attention_layer_norm/beta")
        put(feedforward.intermediate_dense.kernel, f"{prefix}/feedforward_intermediate_dense/kernel")
        put(feedforward.intermediate_dense.bias, f"{prefix}/feedforward_intermediate_dense/bias")
        put(feedforward.output_dense.kernel, f"{prefix}/feedforward_output_dense/kernel")
        put(feedforward.output_dense.bias, f"{prefix}/feedforward_output_dense/bias")
        put(feedforward.layer_norm.gamma, f"{prefix}/feedforward_layer_norm/gamma")
        put(feedforward.layer_norm.beta, f"{prefix}/feedforward_layer_norm/beta")
    put(target.pooler.kernel, "pooled_dense/kernel")
    put(target.pooler.bias, "pooled_dense/bias")
    assert used == set(values), f"unmapped keras-hub weights: {set(values) - used}"
    assert assigned == {id(v) for v in target.weights}, "some bertzoo weights were not set"


@pytest.fixture
def tiny_inputs(make_bert_inputs):
    # Row 0 is full, row 1 has 5 real tokens and 3 padded positions.
    return make_bert_inputs(batch=2, length=8, lengths=[8, 5])


@pytest.fixture(params=["mixed_bfloat16", "mixed_float16"])
def mixed_policy(request):
    """Sets a global mixed-precision policy for one test, then restores float32."""
    keras.mixed_precision.set_dtype_policy(request.param)
    try:
        yield keras.mixed_precision.dtype_policy()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


# --- Parameter counts --------------------------------------------------------


@pytest.mark.parametrize("name", list(REFERENCE_PARAMETERS))
def test_list_presets_reports_the_reference_parameter_counts(name):
    rows = bertzoo.list_presets(verbose=False)
    assert rows[name]["parameters"] == REFERENCE_PARAMETERS[name]


def test_list_presets_prints_a_table(capsys):
    rows = bertzoo.list_presets()
    printed = capsys.readouterr().out
    assert set(rows) == set(PRESETS)
    for name, row in rows.items():
        assert f"`{name}`" in printed and f"{row['parameters']:,}" in printed


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_counts_equal_keras_hub(name):
    """Every preset, ours and keras-hub's, built without materializing weights."""
    config = PRESETS[name]["backbone"]
    with variables_not_materialized():
        ours = BertBackbone.from_preset(name, load_weights=False)
        theirs = keras_hub_backbone(config)
        counts = (ours.count_params(), theirs.count_params())
    expected = bertzoo.list_presets(verbose=False)[name]["parameters"]
    assert counts == (expected, expected)
    assert count_backbone_parameters(config) == expected
    if name in REFERENCE_PARAMETERS:
        assert expected == REFERENCE_PARAMETERS[name]


@pytest.mark.parametrize("name", ["tiny"])
def test_cheap_presets_build_with_the_listed_parameter_count(name, make_bert_inputs):
    backbone = BertBackbone.from_preset(name, load_weights=False)
    assert backbone.count_params() == bertzoo.list_presets(verbose=False)[name]["parameters"]
    outputs = backbone(make_bert_inputs(batch=1, length=8, vocabulary_size=30522))
    assert tuple(outputs["pooled_output"].shape) == (1, backbone.hidden_dim)


# --- Agreement with keras-hub --------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        TINY,
        dict(TINY, num_layers=4, embedding_dim=8, num_groups=2),  # ALBERT-style
        dict(TINY, num_layers=2, embedding_dim=8, num_groups=1),
    ],
    ids=["bert", "albert-2-groups", "albert-1-group"],
)
def test_outputs_equal_keras_hub_with_copied_weights(config, tiny_inputs, rng):
    """keras-hub 0.32 uses the tanh GELU (`gelu_approximate`) in both models."""
    theirs = keras_hub_backbone(config)
    randomize(theirs, rng)
    ours = BertBackbone(**config, activation="gelu_tanh")
    assert ours.count_params() == theirs.count_params()
    copy_from_keras_hub(theirs, ours)

    expected = as_float32(theirs(tiny_inputs))
    got = as_float32(ours(tiny_inputs))
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-5, err_msg=key)

    # The same comparison is sharp enough to tell the two GELUs apart.
    exact = BertBackbone(**config, activation="gelu_exact")
    exact.set_weights(ours.get_weights())
    with_exact_gelu = as_float32(exact(tiny_inputs))["sequence_output"]
    assert not np.allclose(with_exact_gelu, expected["sequence_output"], rtol=1e-5, atol=1e-5)


# --- Weight sharing ------------------------------------------------------------


def _block_params(block):
    return sum(math.prod(v.shape) for v in block.weights)


SHARING = dict(TINY, num_layers=4, embedding_dim=8)


@pytest.fixture(scope="module")
def unshared_parameters():
    return BertBackbone(**SHARING).count_params()


@pytest.mark.parametrize("mode", ["all", "attention", "ffn"])
@pytest.mark.parametrize("num_groups", [1, 2])
def test_sharing_modes_share_by_identity_and_count(mode, num_groups, tiny_inputs, unshared_parameters):
    config = dict(SHARING, num_groups=num_groups, shared_sublayers=mode)
    model = BertBackbone(**config)
    group_size = 4 // num_groups
    attention_shared = mode in ("all", "attention")
    ffn_shared = mode in ("all", "ffn")

    for i in range(4):
        for j in range(4):
            same_group = i // group_size == j // group_size
            (attn_i, ffn_i), (attn_j, ffn_j) = model.layer_blocks(i), model.layer_blocks(j)
            assert (attn_i is attn_j) == (i == j or (same_group and attention_shared)), (i, j)
            assert (ffn_i is ffn_j) == (i == j or (same_group and ffn_shared)), (i, j)
    assert len(model.attention_blocks) == (num_groups if attention_shared else 4)
    assert len(model.feedforward_blocks) == (num_groups if ffn_shared else 4)

    # Every weight is listed once; the count is the sum of the unique variables.
    assert len(model.weights) == len(unique_variables(model))
    total = sum(math.prod(v.shape) for v in model.weights)
    assert model.count_params() == total == count_backbone_parameters(config)

    # Against the unshared model: sharing saves exactly the repeated blocks.
    saved = (4 - num_groups) * (
        attention_shared * _block_params(model.attention_blocks[0])
        + ffn_shared * _block_params(model.feedforward_blocks[0])
    )
    assert unshared_parameters - model.count_params() == saved
    assert np.all(np.isfinite(n(model(tiny_inputs)["sequence_output"])))


def test_num_groups_equal_to_num_layers_is_plain_bert():
    default = BertBackbone(**TINY)
    explicit = BertBackbone(**dict(TINY, num_groups=TINY["num_layers"]))
    assert default.num_groups == explicit.num_groups == TINY["num_layers"]
    assert len(default.attention_blocks) == len(default.feedforward_blocks) == TINY["num_layers"]
    assert default.count_params() == explicit.count_params()


def test_shared_layers_reuse_one_weight_set_per_group(tiny_inputs):
    """ALBERT (G=1): each layer applies the same blocks to the previous output."""
    model = BertBackbone(**dict(TINY, num_layers=3, num_groups=1, embedding_dim=8))
    features = model.compute_features(tiny_inputs)
    attention, feedforward = model.attention_blocks[0], model.feedforward_blocks[0]
    mask = tiny_inputs["padding_mask"]
    for i in range(3):
        step = feedforward(attention(features["hidden_states"][i], padding_mask=mask))
        np.testing.assert_allclose(n(step), n(features["hidden_states"][i + 1]), rtol=1e-6, atol=1e-6)


# --- Per-layer sizes, configs and saving -------------------------------------


def test_per_layer_sizes_build_and_run(tiny_inputs):
    model = BertBackbone(**PER_LAYER)
    heads, intermediate = PER_LAYER["num_heads"], PER_LAYER["intermediate_dim"]
    for i in range(4):
        attention, feedforward = model.layer_blocks(i)
        assert tuple(attention.query_dense.kernel.shape) == (16, heads[i] * 4)
        assert tuple(attention.output_dense.kernel.shape) == (heads[i] * 4, 16)
        assert tuple(feedforward.intermediate_dense.kernel.shape) == (16, intermediate[i])
    assert model.count_params() == count_backbone_parameters(PER_LAYER)
    features = model.feature_extractor(return_attention_scores=True)(tiny_inputs)
    assert [tuple(p.shape) for p in features["attention_scores"]] == [(2, h, 8, 8) for h in heads]
    assert tuple(features["sequence_output"].shape) == (2, 8, 16)


def test_per_layer_lists_must_agree_within_shared_groups():
    ok = BertBackbone(**dict(TINY, num_layers=4, num_groups=2, num_heads=[2, 2, 1, 1], head_dim=8))
    assert ok.get_config()["num_heads"] == [2, 2, 1, 1]
    # Unshared sub-layers may differ inside a group.
    unshared_ffn = dict(num_layers=4, num_groups=1, shared_sublayers="attention", intermediate_dim=[32, 16, 8, 4])
    BertBackbone(**dict(TINY, **unshared_ffn))
    # A uniform list is stored as an int.
    assert BertBackbone(**dict(TINY, num_heads=[2, 2])).get_config()["num_heads"] == 2


@pytest.mark.parametrize(
    "config",
    [PER_LAYER, dict(TINY, num_layers=4, num_groups=2, shared_sublayers="ffn", embedding_dim=8)],
    ids=["per-layer", "shared-ffn"],
)
def test_get_config_from_config_round_trip(config, tiny_inputs, rng):
    model = BertBackbone(**config)
    randomize(model, rng)
    clone = BertBackbone.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    for key, value in config.items():  # Derived values (here `head_dim`) are saved as None: the attributes hold them.
        assert getattr(clone, key) == value, key
    clone.set_weights(model.get_weights())
    expected, got = as_float32(model(tiny_inputs)), as_float32(clone(tiny_inputs))
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


def test_derived_settings_are_saved_as_none_so_that_overrides_derive_them_again(tmp_path):
    model = BertBackbone(**dict(TINY, dropout=0.1, layer_norm_epsilon=np.float32(1e-6)))
    config = model.get_config()
    assert (config["num_groups"], config["head_dim"], config["attention_dropout"]) == (None, None, None)
    json.dumps(config)  # NumPy floats are saved as Python floats.
    model.save_to_preset(tmp_path / "p")
    # A saved plain BERT stays unshared with more layers, as one built with num_layers=4 (it shared 2 by 2).
    deeper = BertBackbone.from_preset(tmp_path / "p", num_layers=4, load_weights=False)
    assert deeper.num_groups == 4 and len(deeper.attention_blocks) == 4
    assert BertBackbone.from_preset(tmp_path / "p", dropout=0.0, load_weights=False).attention_dropout == 0.0
    wider = BertBackbone.from_preset(tmp_path / "p", hidden_dim=64, num_heads=2, load_weights=False)
    assert wider.head_dim == 32
    # Chosen values other than the derived ones are kept.
    chosen = BertBackbone(**dict(TINY, num_layers=4, num_groups=2, head_dim=4, attention_dropout=0.2)).get_config()
    assert (chosen["num_groups"], chosen["head_dim"], chosen["attention_dropout"]) == (2, 4, 0.2)


@pytest.mark.parametrize(
    "config",
    [
        PER_LAYER,
        dict(TINY, num_layers=4, num_groups=1, shared_sublayers="attention", embedding_dim=8),
        dict(TINY, dtype="mixed_bfloat16"),
    ],
    ids=["per-layer", "shared-attention", "mixed_bfloat16"],
)
def test_keras_file_round_trip(config, tiny_inputs, rng, tmp_path):
    model = BertBackbone(**config)
    randomize(model, rng)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # No custom_objects.
    assert type(loaded) is BertBackbone
    assert loaded.get_config() == model.get_config()
    assert loaded.dtype_policy.name == model.dtype_policy.name
    expected, got = as_float32(model(tiny_inputs)), as_float32(loaded(tiny_inputs))
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(got[key], expected[key])
    # The loaded model still offers per-layer features.
    features = loaded.feature_extractor(return_attention_scores=True)(tiny_inputs)
    assert len(features["attention_scores"]) == model.num_layers


def test_dtype_argument_sets_the_model_policy():
    model = BertBackbone(**TINY, dtype="mixed_float16")
    assert model.dtype_policy.name == "mixed_float16"
    assert model.get_config()["dtype"]["config"]["name"] == "mixed_float16"
    assert BertBackbone.from_config(model.get_config()).dtype_policy.name == "mixed_float16"


@pytest.mark.parametrize("dtype", ["int32", "int8"])
def test_integer_dtypes_are_refused_with_quantization_as_the_fix(dtype):
    message = rf"`dtype` must be a float dtype or a mixed policy .* got '{dtype}'.*bertzoo.quantize\(model, 'int8'\)"
    with pytest.raises(ValueError, match=message):
        BertBackbone(**TINY, dtype=dtype)
    with pytest.raises(ValueError, match=message):  # Before anything is built (was a Keras deserialization error).
        bertzoo.BertClassifier.from_preset("tiny", load_weights=False, dtype=dtype)


# --- Features: hidden states, attention probabilities, padding ---------------


def test_backbone_outputs_only_sequence_and_pooled(tiny_inputs):
    model = BertBackbone(**TINY)
    outputs = model(tiny_inputs)
    assert set(outputs) == {"sequence_output", "pooled_output"}
    assert tuple(outputs["sequence_output"].shape) == (2, 8, 16)
    assert tuple(outputs["pooled_output"].shape) == (2, 16)
    # The pooler is tanh(Dense) on the [CLS] (first) position.
    cls = n(outputs["sequence_output"])[:, 0]
    pooled = np.tanh(cls @ n(model.pooler.kernel) + n(model.pooler.bias))
    np.testing.assert_allclose(n(outputs["pooled_output"]), pooled, rtol=1e-5, atol=1e-6)


def test_inputs_with_other_keys_are_refused_not_read_by_position(tiny_inputs):
    """Keras's functional model would match `labels` to an input by position
    (sorted first, it would be read as `padding_mask`), with only a warning."""
    model = BertBackbone(**TINY)
    classifier = bertzoo.BertClassifier(model, num_classes=2)
    extra = dict(tiny_inputs, labels=np.ones_like(tiny_inputs["token_ids"]))
    for call in (model, classifier, lambda x: classifier.predict(x, verbose=0)):
        with pytest.raises(ValueError, match=r"got inputs it does not take: \['labels'\].*\{k: x\[k\] for k in"):
            call(extra)
    missing = {k: v for k, v in tiny_inputs.items() if k != "segment_ids"}
    with pytest.raises(ValueError, match=r"Missing data for input \"segment_ids\""):  # Keras's own check.
        model(missing)
    np.testing.assert_array_equal(
        n(model({k: extra[k] for k in model.input})["pooled_output"]), n(model(tiny_inputs)["pooled_output"])
    )
    # The check keeps Keras passing `training` through: dropout is on in training only.
    dropped = bertzoo.BertClassifier(BertBackbone(**dict(TINY, dropout=0.5)), num_classes=2)
    np.testing.assert_array_equal(n(dropped(tiny_inputs)), n(dropped(tiny_inputs, training=False)))
    assert not np.allclose(n(dropped(tiny_inputs, training=True)), n(dropped(tiny_inputs, training=False)))


def test_feature_extractor_hidden_states_and_attention_probabilities(tiny_inputs, rng):
    model = BertBackbone(**dict(TINY, num_layers=3))
    randomize(model, rng)
    extractor = model.feature_extractor(return_attention_scores=True)
    assert {id(v) for v in extractor.weights} == {id(v) for v in model.weights}
    features = extractor(tiny_inputs)
    default = model(tiny_inputs)

    hidden = features["hidden_states"]
    assert len(hidden) == model.num_layers + 1
    np.testing.assert_allclose(
        n(hidden[0]), n(model.embeddings(tiny_inputs["token_ids"], tiny_inputs["segment_ids"])), rtol=1e-6, atol=1e-6
    )
    # Explicit path (probabilities requested) against the fused default graph.
    np.testing.assert_allclose(n(hidden[-1]), n(default["sequence_output"]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(n(features["pooled_output"]), n(default["pooled_output"]), rtol=1e-5, atol=1e-5)

    probs = [n(p) for p in features["attention_scores"]]
    assert len(probs) == model.num_layers
    for p in probs:
        assert p.dtype == np.float32 and p.shape == (2, 2, 8, 8)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
        assert np.all(p[1, :, :, 5:] == 0.0)  # Padded keys of row 1.

    plain = model.feature_extractor()(tiny_inputs)
    assert "attention_scores" not in plain
    assert len(plain["hidden_states"]) == model.num_layers + 1


def test_compute_features_on_real_tensors_matches_the_extractor(tiny_inputs):
    model = BertBackbone(**TINY)
    eager = model.compute_features(tiny_inputs, return_attention_scores=True)
    graph = model.feature_extractor(return_attention_scores=True)(tiny_inputs)
    for key in ("hidden_states", "attention_scores"):
        for a, b in zip(eager[key], graph[key], strict=True):
            np.testing.assert_allclose(n(a), n(b), rtol=1e-6, atol=1e-6)


def test_fused_attention_only_when_probabilities_are_not_requested(tiny_inputs, monkeypatch):
    from bertzoo.layers import attention

    model = BertBackbone(**dict(TINY, num_layers=3))
    calls = []
    fused_op = ops.dot_product_attention
    monkeypatch.setattr(ops, "dot_product_attention", lambda *a, **k: calls.append(1) or fused_op(*a, **k))
    expected = model(tiny_inputs)["sequence_output"]
    assert calls == []  # TensorFlow: head-major matmuls (its op has no fused kernel).
    monkeypatch.setattr(attention, "_fused_attention_available", lambda dtype: True)  # As on JAX and torch.
    fused = model(tiny_inputs)["sequence_output"]
    assert len(calls) == 3
    np.testing.assert_allclose(n(fused), n(expected), rtol=1e-5, atol=1e-5)
    model.compute_features(tiny_inputs, return_attention_scores=True)
    assert len(calls) == 3


@pytest.mark.parametrize("path", ["fused", "explicit"])
def test_padding_does_not_affect_real_positions(path, make_bert_inputs, rng, monkeypatch):
    from bertzoo.layers import attention

    if path == "fused":  # `ops.dot_product_attention`, as on JAX and torch.
        monkeypatch.setattr(attention, "_fused_attention_available", lambda dtype: True)
    model = BertBackbone(**dict(TINY, num_layers=2, embedding_dim=8))
    randomize(model, rng)
    extractor = model.feature_extractor(return_attention_scores=True)

    def run(x):
        outputs = model(x) if path == "fused" else extractor(x)
        return as_float32({k: outputs[k] for k in ("sequence_output", "pooled_output")})

    padded = make_bert_inputs(batch=1, length=8, lengths=[5])
    changed = {k: v.copy() for k, v in padded.items()}
    changed["token_ids"][:, 5:] = (changed["token_ids"][:, 5:] + 7) % 50
    changed["segment_ids"][:, 5:] = 1 - changed["segment_ids"][:, 5:]
    unpadded = {k: v[:, :5] for k, v in padded.items()}

    a, b, c = run(padded), run(changed), run(unpadded)
    np.testing.assert_allclose(a["sequence_output"][:, :5], b["sequence_output"][:, :5], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a["pooled_output"], b["pooled_output"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a["sequence_output"][:, :5], c["sequence_output"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a["pooled_output"], c["pooled_output"], rtol=1e-5, atol=1e-5)


# --- XLA and training ----------------------------------------------------------


def _classifier(backbone):
    logits = keras.layers.Dense(2, name="logits")(backbone.output["pooled_output"])
    return keras.Model(backbone.input, logits)


def _train_data(make_bert_inputs, vocabulary_size):
    x = make_bert_inputs(batch=8, length=8, vocabulary_size=vocabulary_size, lengths=[8, 5] * 4)
    y = np.array([0, 1] * 4, "int32")
    return x, y


def test_jit_compiled_forward_matches_eager(tiny_inputs):
    model = BertBackbone(**dict(TINY, embedding_dim=8, num_groups=1))
    model.compile(jit_compile=True)
    assert model.jit_compile
    compiled = model.predict_on_batch(tiny_inputs)
    eager = model(tiny_inputs)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(n(compiled[key]), n(eager[key]), rtol=1e-5, atol=1e-5)


def test_jit_compiled_training_steps(make_bert_inputs):
    # Dropout on, so the training graph also holds the explicit attention path.
    # One layer and SGD keep the XLA compilation (most of the cost) short.
    backbone = BertBackbone(**dict(TINY, num_layers=1, embedding_dim=8, dropout=0.1))
    model = _classifier(backbone)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    assert model.jit_compile
    before = n(backbone.token_embedding.embeddings).copy()
    x, y = _train_data(make_bert_inputs, TINY["vocabulary_size"])
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"][0])
    assert not np.array_equal(before, n(backbone.token_embedding.embeddings))


# --- Mixed precision -----------------------------------------------------------


def test_mixed_precision_forward(mixed_policy, tiny_inputs, rng):
    model = BertBackbone(**dict(TINY, embedding_dim=8))
    assert {v.dtype for v in model.weights} == {"float32"}
    randomize(model, rng, scale=0.2)
    features = model.feature_extractor(return_attention_scores=True)(tiny_inputs)
    outputs = model(tiny_inputs)
    for key in ("sequence_output", "pooled_output"):
        assert ops.dtype(outputs[key]) == mixed_policy.compute_dtype
        assert np.all(np.isfinite(n(ops.cast(outputs[key], "float32"))))
    for probs in features["attention_scores"]:
        assert ops.dtype(probs) == "float32"
        np.testing.assert_allclose(n(probs).sum(-1), 1.0, atol=1e-5)

    # Close to the float32 model with the same weights.
    reference = BertBackbone(**dict(TINY, embedding_dim=8), dtype="float32")
    reference.set_weights(model.get_weights())
    got, expected = as_float32(outputs), as_float32(reference(tiny_inputs))
    np.testing.assert_allclose(got["sequence_output"], expected["sequence_output"], atol=0.15)

    # The low-precision graph also compiles with XLA.
    model.compile(jit_compile=True)
    compiled = model.predict_on_batch(tiny_inputs)
    assert compiled["sequence_output"].dtype == mixed_policy.compute_dtype
    np.testing.assert_allclose(np.asarray(compiled["sequence_output"], "float32"), got["sequence_output"], atol=0.05)


def test_mixed_precision_training_step(mixed_policy, make_bert_inputs):
    backbone = BertBackbone(**dict(TINY, dropout=0.1))
    model = _classifier(backbone)
    # Eager steps: an XLA-compiled low-precision train step takes ~30 s to
    # build on CPU; XLA compilation itself is covered above.
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,
    )
    if mixed_policy.name == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    before = n(backbone.pooler.kernel).copy()
    x, y = _train_data(make_bert_inputs, TINY["vocabulary_size"])
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert {v.dtype for v in backbone.weights} == {"float32"}
    assert not np.array_equal(before, n(backbone.pooler.kernel))


# --- Configuration errors ------------------------------------------------------

BASE = dict(vocabulary_size=50, num_layers=4, hidden_dim=16, num_heads=2, intermediate_dim=32)
_POSITIVE = ["vocabulary_size", "num_layers", "hidden_dim", "num_heads", "intermediate_dim", "embedding_dim",
             "num_groups", "head_dim", "max_sequence_length", "num_segments"]  # fmt: skip
BAD_CONFIGS = [
    ("heads-divide-hidden", dict(hidden_dim=18, num_heads=4), r"`hidden_dim`=18 is not divisible by `num_heads`=4"),
    ("groups-divide-layers", dict(num_groups=3), r"`num_layers`=4 is not divisible by `num_groups`=3"),
    ("unknown-activation", dict(activation="swish"), r"Unknown activation 'swish'"),
    ("ambiguous-gelu", dict(activation="gelu"), r"activation='gelu' is ambiguous"),
    ("unknown-sharing", dict(num_groups=2, shared_sublayers="embeddings"),
     r"Unknown `shared_sublayers`='embeddings'\. Expected one of \['all', 'attention', 'ffn'\]"),
    *[(f"{name}-zero", {name: 0}, rf"`{name}` must be a positive integer, got 0") for name in _POSITIVE],
    ("hidden-negative", dict(hidden_dim=-16), r"`hidden_dim` must be a positive integer, got -16"),
    ("layers-float", dict(num_layers=2.5), r"`num_layers` must be a positive integer, got 2\.5"),
    ("hidden-bool", dict(hidden_dim=True), r"`hidden_dim` must be a positive integer, got True"),
    ("list-length", dict(num_heads=[2, 2]), r"`num_heads` has 2 entries but num_layers=4"),
    ("list-entry", dict(intermediate_dim=[32, 32, 0, 32]), r"`intermediate_dim\[2\]` must be a positive integer, got 0"),
    ("shared-heads-differ", dict(num_groups=2, num_heads=[2, 1, 2, 2]),
     r"Layers 0 and 1 share weights, so their `num_heads` must be equal \(got 2 and 1\)"),
    ("shared-ffn-differ", dict(num_groups=1, shared_sublayers="ffn", intermediate_dim=[32, 32, 32, 16]),
     r"Layers 0 and 3 share weights, so their `intermediate_dim` must be equal"),
    ("dropout-one", dict(dropout=1.0), r"`dropout` must be a float in \[0, 1\), got 1\.0"),
    ("attention-dropout-negative", dict(attention_dropout=-0.1), r"`attention_dropout` must be a float in \[0, 1\)"),
]  # fmt: skip


@pytest.mark.parametrize("overrides, message", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_impossible_configurations_raise_value_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        BertBackbone(**{**BASE, **overrides})


def test_misspelled_keyword_arguments_are_refused_not_dropped():
    # Keras's functional constructor drops unknown keywords: `num_layer=2` built the default depth silently.
    with pytest.raises(
        TypeError, match=r"BertBackbone got unexpected keyword arguments: `num_layer` \(did you mean `num_layers`\?\)"
    ):
        BertBackbone(**BASE, num_layer=2)
    backbone = BertBackbone(**BASE, name="encoder", trainable=False)  # Keras's own keywords still pass.
    assert backbone.name == "encoder" and not backbone.trainable
    with pytest.raises(
        TypeError,
        match=r"BertClassifier got unexpected keyword arguments: `num_class` \(did you mean `num_classes`\?\)",
    ):
        bertzoo.BertClassifier(backbone, num_classes=2, num_class=3)

    # A user's subclass: its own arguments and those its **kwargs hand on are named, with the hint.
    class TaggedBackbone(BertBackbone):
        def __init__(self, *args, tag="x", **kwargs):
            super().__init__(*args, **kwargs)
            self.tag = tag

    with pytest.raises(TypeError, match=r"`dropuot` \(did you mean `dropout`\?\)\. It takes .*dropout.*tag"):
        TaggedBackbone(**BASE, dropuot=0.2)
    # A student config with a typo is the same mistake (it was a full-depth copy of the teacher).
    teacher = bertzoo.BertClassifier(BertBackbone(**BASE), num_classes=2)
    with pytest.raises(TypeError, match="did you mean `num_layers`"):
        bertzoo.init_student_from_teacher(teacher, {"num_layer": 2})


def test_head_dim_lifts_the_divisibility_rule():
    model = BertBackbone(**{**BASE, "hidden_dim": 18, "num_heads": 4, "head_dim": 4})
    assert tuple(model.attention_blocks[0].query_dense.kernel.shape) == (18, 16)


# --- Bad inputs ------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("token_ids", 50, r"token id 50 outside \[0, 50\) \(vocabulary_size=50\)"),
        ("token_ids", -3, r"token id -3 outside \[0, 50\)"),
        ("segment_ids", 2, r"segment id 2 outside \[0, 2\) \(num_segments=2\)"),
    ],
    ids=["token-too-large", "token-negative", "segment-too-large"],
)
def test_out_of_range_ids_raise_in_eager_mode(field, value, message, tiny_inputs):
    model = BertBackbone(**TINY)
    tiny_inputs[field][1, 2] = value
    with pytest.raises(ValueError, match=message):
        model(tiny_inputs)


def test_too_long_sequence_raises_in_eager_mode(make_bert_inputs):
    model = BertBackbone(**TINY)  # max_sequence_length=16
    model(make_bert_inputs(batch=1, length=16))
    with pytest.raises(ValueError, match=r"length 17 exceeds the position table \(max_sequence_length=16\)"):
        model(make_bert_inputs(batch=1, length=17))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's shape-relaxed predict graphs")
def test_too_long_sequence_in_a_graph_of_any_length_names_the_position_table(make_bert_inputs):
    import tensorflow as tf

    model = BertBackbone(**TINY)  # max_sequence_length=16
    model.compile(jit_compile=False)
    for length in (8, 12, 14):  # Different lengths: Keras retraces predict with the length unknown.
        model.predict(make_bert_inputs(batch=2, length=length), verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"length exceeds the position table \(max_sequence"):
        model.predict(make_bert_inputs(batch=2, length=20), verbose=0)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's graphs and XLA")
def test_xla_graphs_of_any_length_carry_no_assert_xla_would_drop(make_bert_inputs):
    # XLA ignores Assert ops, logging "Ignoring Assert operator" at every
    # compile; it fixes the length when it compiles, where the slice refuses it.
    import tensorflow as tf

    model = BertBackbone(**TINY)  # max_sequence_length=16
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in ("token_ids", "segment_ids", "padding_mask")}
    for jit_compile, expected in ((False, 1), (True, 0)):
        function = tf.function(model, jit_compile=jit_compile)
        graph = function.get_concrete_function(spec).graph
        asserts = [op.name for op in graph.get_operations() if op.type == "Assert" and "position_embedding" in op.name]
        assert len(asserts) == expected, asserts
        message = "length exceeds the position table" if jit_compile is False else r"Expected size\[0\] in \[0, 16\]"
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            function(make_bert_inputs(batch=1, length=20))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="documents TensorFlow's graph mode")
def test_graph_mode_leaves_id_checks_to_the_backend(tiny_inputs):
    """Documented behaviour: inside a compiled graph bertzoo cannot look at the
    ids. TensorFlow's CPU gather then raises its own InvalidArgumentError (on
    GPU/XLA out-of-range ids are clamped or zeroed silently)."""
    import tensorflow as tf

    from bertzoo.utils.device import accelerator

    if accelerator() != "cpu":
        pytest.skip("the CPU kernel is the one that raises")
    model = BertBackbone(**TINY)
    tiny_inputs["token_ids"][0, 0] = 50
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in"):
        tf.function(model)(tiny_inputs)
