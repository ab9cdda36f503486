"""Structured pruning: head/neuron importance and the rebuilt smaller model."""

import json

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.compression import head_and_neuron_importance


def classifier(seed=0, layers=2, heads=4, intermediate=32, **kwargs):
    keras.utils.set_random_seed(seed)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=64,
        num_layers=layers,
        hidden_dim=16,
        num_heads=heads,
        head_dim=4,
        intermediate_dim=intermediate,
        max_sequence_length=16,
        dropout=0.0,
        **kwargs,
    )
    model = bertzoo.BertClassifier(backbone, num_classes=3, dropout=0.0)
    rng = np.random.default_rng(seed)  # Large, distinct weights: pruning visibly matters.
    for v in model.weights:
        v.assign(rng.normal(0.0, 0.3, v.shape).astype("float32"))
    return model


def data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 9, n)
    mask = (np.arange(8)[None, :] < lengths[:, None]).astype("int32")
    x = {
        "token_ids": rng.integers(0, 64, (n, 8)).astype("int32") * mask,
        "segment_ids": np.zeros((n, 8), "int32"),
        "padding_mask": mask,
    }
    return x, rng.integers(0, 3, n).astype("int32")


def call(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def masked_copy(model, kept_heads, kept_neurons):
    """The full model with the removed heads' and neurons' outputs zeroed
    (their rows of the output projections set to zero)."""
    copy = bertzoo.compression.model_copy.copy_model(model)
    backbone = copy.backbone
    for i in range(backbone.num_layers):
        attention, ffn = backbone.layer_blocks(i)
        kernel, bias = [keras.ops.convert_to_numpy(w) for w in attention.output_dense.weights]
        rows = np.zeros(attention.num_heads, bool)
        rows[kept_heads[i]] = True
        kernel = kernel * np.repeat(rows, attention.head_dim)[:, None]
        attention.output_dense.set_weights([kernel, bias])
        kernel, bias = [keras.ops.convert_to_numpy(w) for w in ffn.output_dense.weights]
        rows = np.zeros(ffn.intermediate_dim, bool)
        rows[kept_neurons[i]] = True
        ffn.output_dense.set_weights([kernel * rows[:, None], bias])
    return copy


def top(scores, k):
    return np.sort(np.argsort(-np.asarray(scores))[:k])


def test_pruned_model_equals_the_masked_full_model_and_round_trips(tmp_path):
    model = classifier()
    x, y = data()
    importance = head_and_neuron_importance(model, (x, y))
    small = bertzoo.prune_heads_and_neurons(model, heads_to_keep=[3, 1], ffn_keep_ratio=0.5, importance=importance)

    assert type(small) is bertzoo.BertClassifier
    config = small.backbone.get_config()
    assert config["num_heads"] == [3, 1] and config["intermediate_dim"] == 16 and config["head_dim"] == 4
    assert small.count_params() < model.count_params()
    kept_heads = [top(importance["heads"][0], 3), top(importance["heads"][1], 1)]
    kept_neurons = [top(s, 16) for s in importance["neurons"]]
    expected = call(masked_copy(model, kept_heads, kept_neurons), x)
    np.testing.assert_allclose(call(small, x), expected, atol=1e-5)
    assert np.abs(call(model, x) - expected).max() > 1e-2  # The removed parts did matter.

    small.save_to_preset(tmp_path / "small")
    saved = json.loads((tmp_path / "small" / "config.json").read_text())
    assert saved["backbone"]["config"]["num_heads"] == [3, 1]
    again = bertzoo.BertClassifier.from_preset(tmp_path / "small", preprocessor=None)
    np.testing.assert_allclose(call(again, x), expected, atol=1e-5)


def test_importance_is_the_gate_gradient_of_the_loss():
    """|dL/dg| for a gate g on one head's output, by finite differences."""
    model = classifier(seed=1)
    x, y = data(8, seed=1)
    importance = head_and_neuron_importance(model, (x, y))  # One batch of 8.
    loss_fn = model.default_loss()

    def loss_with_gate(layer, head, gate):
        copy = bertzoo.compression.model_copy.copy_model(model)
        attention, _ = copy.backbone.layer_blocks(layer)
        kernel, bias = [keras.ops.convert_to_numpy(w) for w in attention.output_dense.weights]
        kernel = kernel.astype("float64")
        kernel[head * 4 : (head + 1) * 4] *= gate
        attention.output_dense.set_weights([kernel.astype("float32"), bias])
        return float(loss_fn(y, copy(x, training=False)))

    eps = 1e-2
    for layer, head in ((0, 2), (1, 0)):
        slope = (loss_with_gate(layer, head, 1 + eps) - loss_with_gate(layer, head, 1 - eps)) / (2 * eps)
        assert importance["heads"][layer][head] == pytest.approx(abs(slope), rel=0.05, abs=1e-4)


def test_scores_from_raw_data_prune_a_whole_task_and_a_backbone():
    model = classifier()
    x, y = data()
    ds = __import__("tensorflow").data.Dataset.from_tensor_slices((x, y)).batch(8)
    small = bertzoo.prune_heads_and_neurons(model, heads_to_keep=2, data=ds, steps=2)
    assert small.backbone.num_heads == 2 and small.backbone.intermediate_dim == 32
    importance = head_and_neuron_importance(model, ds, steps=2)
    kept = [top(s, 2) for s in importance["heads"]]
    all_neurons = [np.arange(32)] * 2
    np.testing.assert_allclose(call(small, x), call(masked_copy(model, kept, all_neurons), x), atol=1e-5)

    backbone = bertzoo.prune_heads_and_neurons(model.backbone, ffn_keep_ratio=[0.25, 1.0], importance=importance)
    assert type(backbone) is bertzoo.BertBackbone and backbone.intermediate_dim == [8, 32]
    with pytest.raises(ValueError, match=r"needs calibration `data`"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=2)
    with pytest.raises(ValueError, match=r"bare backbone pass precomputed `importance=`"):
        bertzoo.prune_heads_and_neurons(model.backbone, heads_to_keep=2, data=ds)


def test_albert_shared_layers_are_pruned_together():
    model = classifier(layers=2, num_groups=1)
    x, y = data()
    importance = head_and_neuron_importance(model, (x, y))
    np.testing.assert_array_equal(importance["heads"][0], importance["heads"][1])
    small = bertzoo.prune_heads_and_neurons(model, heads_to_keep=2, ffn_keep_ratio=0.5, importance=importance)
    assert len(small.backbone.attention_blocks) == 1 and small.backbone.num_groups == 1
    kept = [top(importance["heads"][0], 2)] * 2
    neurons = [top(importance["neurons"][0], 16)] * 2
    np.testing.assert_allclose(call(small, x), call(masked_copy(model, kept, neurons), x), atol=1e-5)
    with pytest.raises(ValueError, match=r"Layers 0 and 1 share their attention weights.*same number"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=[2, 3], importance=importance)


def test_bad_structured_requests_are_refused():
    model = classifier()
    importance = {"heads": [np.ones(4)] * 2, "neurons": [np.ones(32)] * 2}
    with pytest.raises(ValueError, match=r"would leave layer 1 with zero attention heads"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=[2, 0], importance=importance)
    with pytest.raises(ValueError, match=r"heads_to_keep=5 for layer 0, which has only 4 heads"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=5, importance=importance)
    with pytest.raises(ValueError, match=r"`heads_to_keep` has 3 entries but the model has 2 layers"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=[1, 1, 1], importance=importance)
    with pytest.raises(ValueError, match=r"`ffn_keep_ratio` must be in \(0, 1\]"):
        bertzoo.prune_heads_and_neurons(model, ffn_keep_ratio=0.0, importance=importance)
    with pytest.raises(ValueError, match=r"importance\['neurons'\]\[0\]` has shape \(5,\)"):
        bertzoo.prune_heads_and_neurons(
            model, heads_to_keep=1, importance={"heads": importance["heads"], "neurons": [np.ones(5)] * 2}
        )
    with pytest.raises(ValueError, match=r"is quantized"):
        bertzoo.prune_heads_and_neurons(bertzoo.quantize(model), heads_to_keep=1, importance=importance)
    diverged = {"heads": [np.array([1.0, np.nan, 2.0, 3.0])] * 2, "neurons": importance["neurons"]}
    with pytest.raises(ValueError, match=r"importance\['heads'\]\[0\]` holds non-finite scores"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=1, importance=diverged)  # Was: "Layers 0 and 0 share".
    for steps in (-1, 0, 1.5):  # -1 dropped the last in-memory batch and kept every batch of a dataset.
        with pytest.raises(ValueError, match=r"`steps` must be a positive integer"):
            head_and_neuron_importance(model, data(), steps=steps)


def test_shared_layers_scored_differently_are_refused():
    model = classifier(layers=2, num_groups=1)
    importance = {"heads": [np.arange(4.0), np.arange(4.0)[::-1]], "neurons": [np.ones(32)] * 2}
    with pytest.raises(
        ValueError, match=r"Layers 0 and 1 share their attention weights but .* scores them differently"
    ):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=2, importance=importance)


def test_numpy_numbers_are_accepted_as_ratios_and_layers():
    model = classifier()
    importance = {"heads": [np.arange(4.0)] * 2, "neurons": [np.arange(32.0)] * 2}
    small = bertzoo.prune_heads_and_neurons(
        model, heads_to_keep=2, ffn_keep_ratio=np.float32(0.5), importance=importance
    )
    assert small.backbone.intermediate_dim == 16
    uneven = bertzoo.prune_heads_and_neurons(model, heads_to_keep=np.array([2, 1]), importance=importance)
    assert uneven.backbone.num_heads == [2, 1]
    ticket = bertzoo.lottery_ticket(model, lambda copy: None, np.float32(0.5), rounds=np.int64(1))
    assert ticket.sparsity == pytest.approx(0.5, abs=0.01)
    student = bertzoo.init_student_from_teacher(model, {"num_layers": 1}, layers=np.array([2]))
    assert student.backbone.num_layers == 1 and json.dumps(student.backbone.get_config())


def test_scores_read_labels_and_sample_weights_as_fit_does():
    model = classifier()
    model.class_names = ["neg", "neutral", "pos"]
    x, y = data(16)
    by_id = head_and_neuron_importance(model, (x, y))
    by_name = head_and_neuron_importance(model, (x, [model.class_names[i] for i in y]))  # Failed: an IndexError.
    np.testing.assert_array_equal(by_name["heads"][0], by_id["heads"][0])
    # Rows of weight 0 count for nothing: one batch of 16, the mean loss over all 16 rows.
    weights = (np.arange(16) < 4).astype("float32")
    weighted = head_and_neuron_importance(model, (x, y, weights))
    first_rows = head_and_neuron_importance(model, ({k: v[:4] for k, v in x.items()}, y[:4]))
    for key in ("heads", "neurons"):
        np.testing.assert_allclose(weighted[key][1] * 16 / 4, first_rows[key][1], rtol=1e-4, atol=1e-7)


def test_scoring_a_model_with_one_loss_per_output_names_the_way_out():
    model = classifier()
    model.compile(loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True)])
    with pytest.raises(ValueError, match=r"one loss per output.*pass precomputed `importance=`"):
        head_and_neuron_importance(model, data())
