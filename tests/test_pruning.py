"""Unstructured / block / N:M magnitude, movement and second-order pruning, and lottery
tickets, checked against NumPy.

Most tests drive the masks with `optimizer.apply` eagerly (SGD with a zero
learning rate leaves the weights as they are, so the expected masks follow
from the initial weights); the compiled paths (XLA `fit`, resuming from a
checkpoint, distillation) each get one test.
"""

import logging

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.compression.model_copy import copy_model
from bertzoo.datasets import synthetic_sentiment
from bertzoo.models.task import bert_optimizer
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary
from bertzoo.utils import private_api

ENCODER = ["query", "key", "value", "output"]


def tiny_classifier(
    seed=0, hidden=16, heads=2, intermediate=32, layers=1, vocabulary_size=64, preprocessor=None, **kwargs
):
    keras.utils.set_random_seed(seed)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=layers,
        hidden_dim=hidden,
        num_heads=heads,
        intermediate_dim=intermediate,
        max_sequence_length=32,
        dropout=0.0,
        initializer_range=0.2,
        **kwargs,
    )
    model = bertzoo.BertClassifier(backbone, num_classes=2, dropout=0.0, preprocessor=preprocessor)
    # Distinct values everywhere (no magnitude ties), whatever the initializers do.
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0.0, 0.2, v.shape).astype("float32"))
    return model


def tokenized(n=16, length=8, vocabulary_size=64, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "token_ids": rng.integers(0, vocabulary_size, (n, length)).astype("int32"),
        "segment_ids": np.zeros((n, length), "int32"),
        "padding_mask": np.ones((n, length), "int32"),
    }
    return x, rng.integers(0, 2, n).astype("int32")


def encoder_kernels(model):
    backbone = model.backbone
    out = {}
    for block in backbone.attention_blocks:
        for layer in (block.query_dense, block.key_dense, block.value_dense, block.output_dense):
            out[layer.path] = layer.kernel
    for block in backbone.feedforward_blocks:
        for layer in (block.intermediate_dense, block.output_dense):
            out[layer.path] = layer.kernel
    return out


def numpy_of(variables):
    return {k: keras.ops.convert_to_numpy(v).copy() for k, v in variables.items()}


def apply_steps(model, steps, learning_rate=0.0, seed=0):
    """Runs `steps` optimizer updates eagerly (random gradients)."""
    optimizer = keras.optimizers.SGD(learning_rate)
    variables = model.trainable_variables
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        optimizer.apply(grads, variables)


def smallest(values, count):
    """Boolean mask of the `count` smallest |values| (NumPy reference)."""
    flat = np.abs(values).reshape(-1)
    mask = np.zeros(flat.size, bool)
    mask[np.argsort(flat, kind="stable")[:count]] = True
    return mask.reshape(values.shape)


# --- Masks ------------------------------------------------------------------
def test_layer_scope_zeroes_the_smallest_weights_of_each_kernel():
    model = tiny_classifier()
    before = numpy_of(encoder_kernels(model))
    others = {v.path: keras.ops.convert_to_numpy(v).copy() for v in model.weights}
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.6, begin_step=0))
    assert sorted(t.path for t in pruner.targets) == sorted(before)
    apply_steps(model, 1)
    after = numpy_of(encoder_kernels(model))
    for path, w in before.items():
        expected = np.where(smallest(w, int(round(0.6 * w.size))), 0.0, w)
        np.testing.assert_array_equal(after[path], expected, err_msg=path)
    for v in model.weights:  # Embeddings, pooler, head: untouched.
        if v.path in others and not any(v.path.startswith(p + "/") for p in before):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), others[v.path], err_msg=v.path)
    assert pruner.step == 1
    assert pruner.sparsity() == pytest.approx(0.6, abs=1e-3)


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_score_threshold_is_the_kth_smallest_score(sparsity):
    from bertzoo.compression.masks import score_threshold

    rng = np.random.default_rng(0)
    cases = {
        "signed": rng.standard_normal(101).astype("float32"),
        "ties": np.repeat(np.float32([-2.0, 0.0, 3.0]), 7),
        "extremes": np.float32([-np.inf, -3.4e38, -1e-38, -0.0, 0.0, 1e-38, 3.4e38, np.inf, 1.0]),
        "one": np.float32([5.0]),
    }
    for name, scores in cases.items():
        k = int(round(sparsity * scores.size))
        k = min(k, scores.size - 1) if sparsity < 1 else k  # Below 1, at least one weight stays (TF-MOT).
        expected = -np.inf if k == 0 else np.sort(scores)[k - 1]
        got = float(keras.ops.convert_to_numpy(score_threshold(keras.ops.convert_to_tensor(scores), sparsity)))
        assert got == expected, (name, sparsity)


def test_global_scope_uses_one_threshold_across_layers():
    model = tiny_classifier()
    kernels = encoder_kernels(model)
    # Make one kernel 10x larger: a global threshold spares it, a per-layer one would not.
    big = "feedforward_0/intermediate"
    kernels[big].assign(kernels[big] * 10.0)
    before = numpy_of(kernels)
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0), scope="global")
    apply_steps(model, 1)
    after = numpy_of(encoder_kernels(model))
    paths = sorted(before)
    flat = np.concatenate([before[p].reshape(-1) for p in paths])
    expected = np.where(smallest(flat, int(round(0.5 * flat.size))), 0.0, flat)
    np.testing.assert_array_equal(np.concatenate([after[p].reshape(-1) for p in paths]), expected)
    assert np.mean(after[big] == 0) < 0.1
    assert all(np.mean(after[p] == 0) > 0.55 for p in paths if p != big)
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("pattern, rows, cols", [("1x4", 1, 4), ("4x1", 4, 1)])
def test_block_patterns_prune_whole_blocks_with_the_smallest_mean_magnitude(pattern, rows, cols):
    model = tiny_classifier()
    before = numpy_of(encoder_kernels(model))
    bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0), pattern=pattern)
    apply_steps(model, 1)
    after = numpy_of(encoder_kernels(model))
    for path, w in before.items():
        h, c = w.shape
        scores = np.abs(w).reshape(h // rows, rows, c // cols, cols).mean(axis=(1, 3))
        pruned_blocks = smallest(scores, int(round(0.5 * scores.size)))
        expected_mask = np.repeat(np.repeat(~pruned_blocks, rows, 0), cols, 1)
        np.testing.assert_array_equal(after[path], np.where(expected_mask, w, 0.0), err_msg=path)


def test_blocks_cut_short_by_the_edge_average_the_weights_they_hold():
    # hidden 10 and intermediate 20 with 4x1 blocks: the last block of each column holds 2 rows.
    model = tiny_classifier(hidden=10, intermediate=20)
    before = numpy_of(encoder_kernels(model))
    bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0), pattern="4x1")
    apply_steps(model, 1)
    after = numpy_of(encoder_kernels(model))
    for path, w in before.items():
        h, c = w.shape
        padded = np.pad(np.abs(w), [[0, -h % 4], [0, 0]])
        counts = np.pad(np.ones_like(w), [[0, -h % 4], [0, 0]]).reshape(-1, 4, c).sum(axis=1)
        scores = padded.reshape(-1, 4, c).sum(axis=1) / counts  # TF-MOT: "SAME" average pooling.
        pruned_blocks = smallest(scores, int(round(0.5 * scores.size)))
        expected_mask = np.repeat(~pruned_blocks, 4, 0)[:h]
        np.testing.assert_array_equal(after[path], np.where(expected_mask, w, 0.0), err_msg=path)


def test_two_of_four_keeps_the_two_largest_of_every_four_inputs():
    model = tiny_classifier()
    before = numpy_of(encoder_kernels(model))
    bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0), pattern="2:4")
    apply_steps(model, 1)
    for path, w in numpy_of(encoder_kernels(model)).items():
        original = before[path]
        groups = np.abs(original).T.reshape(original.shape[1], -1, 4)  # (out, in/4, 4)
        keep = np.argsort(-groups, axis=-1, kind="stable")[..., :2]
        expected = np.zeros_like(groups, bool)
        np.put_along_axis(expected, keep, True, axis=-1)
        expected = expected.reshape(original.shape[1], -1).T
        np.testing.assert_array_equal(w, np.where(expected, original, 0.0), err_msg=path)
        assert np.all((w.T.reshape(w.shape[1], -1, 4) == 0).sum(-1) == 2)


def test_masks_follow_the_schedule_and_stay_applied_between_updates():
    model = tiny_classifier()
    schedule = bertzoo.PolynomialDecay(0.0, 0.8, begin_step=2, end_step=8, power=1, frequency=3)
    pruner = bertzoo.Pruner(model, schedule)
    kernel = encoder_kernels(model)["attention_0/query"]
    # Pruning steps 2, 5, 8 at sparsities 0, 0.4, 0.8 (linear); masks fixed in between.
    expected = [0, 0, 0, 0, 0, 0.4, 0.4, 0.4, 0.8, 0.8, 0.8]
    optimizer = keras.optimizers.SGD(0.05)
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    for step, sparsity in enumerate(expected):
        mask_before = keras.ops.convert_to_numpy(pruner.state.masks[0]).copy()
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        optimizer.apply(grads, variables)
        w = keras.ops.convert_to_numpy(kernel)
        assert np.mean(w == 0) == pytest.approx(sparsity, abs=1 / w.size), f"step {step}"
        if step not in (2, 5, 8):  # Between pruning steps the gradient regrows nothing.
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(pruner.state.masks[0]), mask_before)
            assert np.all(w[mask_before == 0] == 0)
    assert pruner.step == len(expected)


def test_embeddings_are_pruned_only_on_request_and_layers_can_be_listed():
    model = tiny_classifier()
    pruner = bertzoo.Pruner(
        model, bertzoo.ConstantSparsity(0.5, 0), layers=["feedforward_0/intermediate"], include_embeddings=True
    )
    assert [t.path for t in pruner.targets] == [
        "feedforward_0/intermediate",
        "embeddings/token_embedding",
        "embeddings/position_embedding",
        "embeddings/segment_embedding",
    ]
    apply_steps(model, 1)
    table = keras.ops.convert_to_numpy(model.backbone.embeddings.token_embedding.embeddings)
    assert np.mean(table == 0) == pytest.approx(0.5, abs=1e-3)
    assert np.all(keras.ops.convert_to_numpy(encoder_kernels(model)["attention_0/query"]) != 0)
    chosen = bertzoo.Pruner(
        tiny_classifier(), bertzoo.ConstantSparsity(0.5, 0), layers=lambda layer: layer.name == "pooler"
    )
    assert [t.path for t in chosen.targets] == ["pooler"]


def test_a_selected_weight_the_loss_does_not_use_is_named_in_a_warning(caplog):
    backbone = tiny_classifier().backbone
    tagger = bertzoo.BertTokenClassifier(backbone, num_classes=3, dropout=0.0)  # Its loss never reads the pooler.
    pruner = bertzoo.Pruner(
        tagger,
        bertzoo.ConstantSparsity(0.5, 0),
        layers=lambda layer: layer.name in ("pooler", "intermediate"),
    )
    x, _ = tokenized(n=8)
    labels = np.random.default_rng(0).integers(0, 3, x["token_ids"].shape).astype("int32")
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        pruner.fit(x, labels, batch_size=4, epochs=2, verbose=0)
    assert "1 selected weight(s) received no gradient, so they are never pruned" in caplog.text
    assert "never pruned and the sparsity stays below the schedule's: pooler." in caplog.text
    assert caplog.text.count("received no gradient") == 1  # Once, not every epoch.


def test_holding_zeros_keeps_a_pruned_models_zeros_and_ignores_a_dense_one():
    assert bertzoo.Pruner.holding_zeros(tiny_classifier()) is None  # Dense: nothing to hold.
    model = tiny_classifier()
    table = model.backbone.embeddings.token_embedding.embeddings
    query = encoder_kernels(model)["attention_0/query"]
    rng = np.random.default_rng(0)
    for variable in (table, query):
        value = keras.ops.convert_to_numpy(variable).copy()
        value[rng.random(value.shape) < 0.5] = 0.0
        variable.assign(value)
    before = {name: keras.ops.convert_to_numpy(v).copy() for name, v in (("table", table), ("query", query))}
    pruner = bertzoo.Pruner.holding_zeros(model)
    assert "embeddings/token_embedding" in [t.path for t in pruner.targets]
    apply_steps(model, 3, learning_rate=0.5)
    stripped = pruner.strip()
    after = {
        "table": keras.ops.convert_to_numpy(stripped.backbone.embeddings.token_embedding.embeddings),
        "query": keras.ops.convert_to_numpy(encoder_kernels(stripped)["attention_0/query"]),
    }
    for name, value in before.items():
        assert np.all(after[name][value == 0] == 0), name  # Held at zero,
        assert np.all(after[name][value != 0] != value[value != 0]), name  # while the others train.


def test_layers_a_user_froze_stay_frozen_in_every_copy_the_compression_tools_make():
    # A config holds constructor arguments only: copies came back with the frozen embeddings trainable.
    model = tiny_classifier(layers=2)
    model.backbone.embeddings.trainable = False
    model.backbone.attention_blocks[1].trainable = False
    frozen = sorted(v.path for v in model.non_trainable_weights)
    copies = {"copy_model": bertzoo.compression.model_copy.copy_model(model)}
    copies["structured"] = bertzoo.prune_heads_and_neurons(
        model, heads_to_keep=1, importance={"heads": [np.arange(2.0)] * 2, "neurons": [np.arange(32.0)] * 2}
    )
    seen = []
    train_round = lambda copy: seen.append(len(copy.trainable_weights))  # noqa: E731
    # (Its Pruner refuses a frozen kernel, as any Pruner does: the frozen block is left out.)
    ticket = bertzoo.lottery_ticket(model, train_round, 0.5, rounds=1, layers=["attention_0/query"])
    copies["lottery"] = ticket.model
    model.compile(optimizer="sgd")
    copies["strip"] = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, 0), layers=["attention_0/query"]).strip()
    assert set(seen) == {len(model.trainable_weights)}  # Each round trained what the user trains.
    for name, copy in copies.items():
        assert sorted(v.path for v in copy.non_trainable_weights) == frozen, name
    # A pruned model's frozen kernels need no mask to keep their zeros (Pruner refuses them): left out.
    pruned = copies["lottery"]
    pruned.compile(optimizer="sgd")
    held = [t.path for t in bertzoo.Pruner.holding_zeros(pruned).targets]
    assert "attention_0/query" in held and not any(path.startswith("attention_1/") for path in held)


def test_copies_merge_a_lora_update_and_weight_names_refuse_an_unmerged_one(tmp_path):
    model = tiny_classifier()
    x, _ = tokenized()
    head = model.output_dense
    head.enable_lora(2)
    head.lora_kernel_b.assign(np.random.default_rng(0).normal(0.0, 1.0, head.lora_kernel_b.shape).astype("float32"))
    expected = model.predict(x, verbose=0)
    # Failed: "Could not copy ... 41 weights, but it has 43".
    copy = bertzoo.compression.model_copy.copy_model(model)
    assert not copy.output_dense.lora_enabled
    np.testing.assert_allclose(copy.predict(x, verbose=0), expected, atol=1e-6)
    ticket = bertzoo.lottery_ticket(model, lambda round_model: None, 0.5, rounds=1, layers=["attention_0/query"])
    assert not ticket.model.output_dense.lora_enabled
    # On the backbone: the weight names (structured pruning, masks, converters) say to merge first, as a preset does.
    block = model.backbone.feedforward_blocks[0].intermediate_dense
    block.kernel.assign(np.zeros(block.kernel.shape, "float32"))  # A pruned-away base: the update alone remains.
    block.enable_lora(2)
    block.lora_kernel_b.assign(np.ones(block.lora_kernel_b.shape, "float32"))
    importance = {"heads": [np.arange(2.0)], "neurons": [np.arange(32.0)]}
    with pytest.raises(ValueError, match=r"LoRA is enabled on .*intermediate.*save_to_preset and from_preset"):
        bertzoo.prune_heads_and_neurons(model, heads_to_keep=1, importance=importance)
    model.save_to_preset(tmp_path / "merged")
    merged = bertzoo.BertClassifier.from_preset(tmp_path / "merged")
    # (Called, not `predict`: Keras's traced predict function predates the LoRA just enabled.)
    np.testing.assert_allclose(merged(x, training=False), model(x, training=False), atol=1e-6)
    assert bertzoo.prune_heads_and_neurons(merged, heads_to_keep=1, importance=importance).backbone.num_heads == 1
    # The report counts the kernels as the preset holds them (it said the LoRA'd zero base was 100% sparse).
    report, saved = bertzoo.sparsity_report(model).to_dict(), bertzoo.sparsity_report(merged).to_dict()
    assert report["layers"] == saved["layers"] and report["parameters"] == saved["parameters"]
    assert report["total_sparsity"] == saved["total_sparsity"] < 0.01
    assert next(row for row in report["layers"] if row["path"] == "feedforward_0/intermediate")["zeros"] == 0
    embedding = model.backbone.token_embedding
    embedding.enable_lora(2)  # An Embedding's LoRA has no kernel to merge: counted as its variables.
    factors = sum(int(np.prod(v.shape)) for v in embedding.trainable_weights if "lora" in v.path)
    assert factors > 0 and bertzoo.sparsity_report(model).to_dict()["parameters"] == report["parameters"] + factors


def test_shared_albert_weights_are_pruned_once_per_step():
    model = tiny_classifier(layers=2, num_groups=1)  # Both layers use one set of weights.
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
    assert len(pruner.targets) == 6
    apply_steps(model, 1)
    assert pruner.step == 1
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)


# --- Compiled training, strip, report, presets --------------------------------
def test_fit_under_xla_on_raw_strings_then_strip_report_and_preset(tmp_path):
    tokenizer = BertTokenizer(builtin_vocabulary(1200))
    preprocessor = BertPreprocessor(tokenizer, sequence_length=16)
    model = tiny_classifier(vocabulary_size=1200, hidden=32, intermediate=64, preprocessor=preprocessor)
    texts, labels = synthetic_sentiment(32, seed=0)
    pruner = bertzoo.Pruner(
        model, bertzoo.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=2, frequency=1), include_embeddings=True
    )
    # XLA (bertzoo's default on GPU/TPU), so the masks are checked inside a compiled step.
    pruner.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=True)
    assert model.jit_compile
    csv = tmp_path / "log.csv"  # The user's callbacks see `sparsity` too.
    history = pruner.fit(texts, labels, batch_size=8, epochs=1, verbose=0, callbacks=[keras.callbacks.CSVLogger(csv)])
    assert history.history["sparsity"][-1] == pytest.approx(0.75, abs=1e-3)  # 4 steps.
    assert "sparsity" in csv.read_text().splitlines()[0].split(",")
    for path, w in numpy_of(encoder_kernels(model)).items():
        assert np.mean(w == 0) == pytest.approx(0.75, abs=1 / w.size), path

    pruned = pruner.strip()
    assert type(pruned) is bertzoo.BertClassifier and pruned is not model
    assert not hasattr(pruned, "_pruning_state")
    assert len(pruned.weights) == len(tiny_classifier(vocabulary_size=1200, hidden=32, intermediate=64).weights)
    assert all(v.constraint is None for v in pruned.weights)
    features = preprocessor(texts)
    expected = keras.ops.convert_to_numpy(model(features))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(pruned(features)), expected, atol=1e-6)

    report = bertzoo.sparsity_report(pruned)
    rows = {r["path"]: r for r in report.layers}
    assert rows["attention_0/query"]["sparsity"] == pytest.approx(0.75, abs=1e-3)
    assert rows["pooler"]["sparsity"] == 0.0
    zeros = sum(r["zeros"] for r in report.layers)
    assert report.total_sparsity == pytest.approx(zeros / sum(r["parameters"] for r in report.layers))
    # Zeros compress away: gzip size tracks the dense size times the density.
    density = 1 - report.overall_sparsity
    dense_report = bertzoo.sparsity_report(
        tiny_classifier(vocabulary_size=1200, hidden=32, intermediate=64, preprocessor=preprocessor)
    )
    assert dense_report.total_sparsity == 0.0 and dense_report.dense_bytes == report.dense_bytes
    assert report.compressed_bytes < report.dense_bytes * (density + 0.1)
    assert dense_report.compressed_bytes > 2 * report.compressed_bytes
    assert "attention_0/query" in str(report) and "gzip" in str(report)

    # The model being pruned carries the pruner's masks and counters, which a preset would not keep.
    with pytest.raises(ValueError, match=r"is being pruned .* save `pruner.strip\(\)`"):
        model.save_to_preset(tmp_path / "unstripped")
    assert not (tmp_path / "unstripped").exists()
    pruned.save_to_preset(tmp_path / "pruned")
    again = bertzoo.BertClassifier.from_preset(tmp_path / "pruned")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(again.preprocessor(texts))), expected, atol=1e-6)
    assert bertzoo.sparsity_report(again).total_sparsity == pytest.approx(report.total_sparsity)


def test_resuming_from_a_checkpoint_continues_on_schedule(tmp_path):
    x, y = tokenized(32)
    schedule = bertzoo.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=6, frequency=2)

    def build():
        model = tiny_classifier(seed=3)
        pruner = bertzoo.Pruner(model, schedule, scope="global")
        pruner.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
        return model, pruner

    model, pruner = build()
    pruner.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # Steps 0-3.
    checkpoint = tmp_path / "ckpt.weights.h5"
    model.save_weights(checkpoint)
    traced = model.train_function
    pruner.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # Steps 4-7, uninterrupted.
    assert model.train_function is traced  # A later fit reuses the step it traced (seconds each).

    resumed, resumed_pruner = build()
    resumed.optimizer.build(resumed.trainable_variables)
    resumed.load_weights(checkpoint)
    assert resumed_pruner.step == 4
    resumed_pruner.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert resumed_pruner.step == pruner.step == 8
    for a, b in zip(model.weights, resumed.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), atol=1e-6, err_msg=a.path
        )
    assert resumed_pruner.sparsity() == pytest.approx(0.8, abs=1e-3)


def test_pruning_while_distilling():
    teacher = tiny_classifier(seed=1, hidden=32, intermediate=64, layers=2)
    student = tiny_classifier(seed=2, hidden=16, intermediate=32, layers=1)
    teacher_before = [keras.ops.convert_to_numpy(v).copy() for v in teacher.weights]
    pruner = bertzoo.Pruner(student, bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=1))
    distiller = bertzoo.Distiller(teacher, student, temperature=2.0, alpha=0.5)
    distiller.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)  # XLA: tested above.
    x, y = tokenized(16)
    distiller.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert pruner.step == 2
    for path, w in numpy_of(encoder_kernels(student)).items():
        assert np.mean(w == 0) == pytest.approx(0.5, abs=1 / w.size), path
    for before, v in zip(teacher_before, teacher.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), before)
    stripped = pruner.strip()
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(stripped(x)), keras.ops.convert_to_numpy(student(x)), atol=1e-6
    )


def test_tied_scores_prune_exactly_the_share_asked_for_or_less_across_layers():
    from bertzoo.compression.masks import keep_mask
    from bertzoo.compression.masks import score_threshold
    from bertzoo.compression.masks import threshold_keeping_ties

    grid = np.round(np.random.default_rng(0).normal(size=(32, 16)) * 5).astype("float32") / 5  # Many ties.
    for sparsity in (0.0, 0.3, 0.5, 0.9):
        threshold = score_threshold(grid, sparsity)
        kept = keras.ops.convert_to_numpy(keep_mask(grid, threshold, sparsity))
        assert (~kept).sum() == round(sparsity * grid.size)
        assert grid[~kept].max(initial=-np.inf) <= grid[kept].min()  # The smallest go first.
        across = float(threshold_keeping_ties(grid, threshold, sparsity))
        assert (grid <= across).sum() <= round(sparsity * grid.size)  # Ties kept, never over-pruned.
    equal = np.zeros((4, 4), "float32")
    assert float(threshold_keeping_ties(equal, score_threshold(equal, 0.5), 0.5)) < 0.0  # 0 > it: all kept.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(keep_mask(equal, 0.0, 0.5)).ravel(), [False] * 8 + [True] * 8
    )


def test_weights_on_a_coarse_grid_are_pruned_to_the_sparsity_asked_for():
    model = tiny_classifier()
    for kernel in encoder_kernels(model).values():
        kernel.assign(np.round(keras.ops.convert_to_numpy(kernel) * 50) / 50)  # Steps of 0.02: many equal |w|.
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
    apply_steps(model, 1)
    for path, w in numpy_of(encoder_kernels(model)).items():
        assert np.sum(w == 0) == pytest.approx(0.5 * w.size, abs=1), path
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_movement_pruning_from_step_0_under_a_warm_up_ranks_by_magnitude_first(scope):
    # The default optimizer warms up from rate 0: at step 0 no weight has
    # moved, so every movement score is 0; that step ranks by |w| instead
    # of pruning everything.
    model = tiny_classifier(seed=3)
    w0 = numpy_of(encoder_kernels(model))
    pruner = bertzoo.Pruner(
        model, bertzoo.ConstantSparsity(0.7, begin_step=0, frequency=1), scope=scope, scores="movement"
    )
    x, y = tokenized(32)
    model.compile(optimizer=bert_optimizer(1e-2), jit_compile=False)
    pruner.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert pruner.sparsity() == pytest.approx(0.7, abs=0.01)
    if scope == "layer":
        for path, w in numpy_of(encoder_kernels(model)).items():
            assert np.mean(w == 0) == pytest.approx(0.7, abs=1 / w.size), path
    # The first step's masks were the magnitude ones.
    first = bertzoo.Pruner(tiny_classifier(seed=3), bertzoo.ConstantSparsity(0.7, begin_step=0), scores="movement")
    apply_steps(first.model, 1)
    for i, target in enumerate(first.targets):
        kept = keras.ops.convert_to_numpy(first.state.masks[i]) != 0
        np.testing.assert_array_equal(
            kept, ~smallest(w0[target.path], int(round(0.7 * kept.size))), err_msg=target.path
        )


def test_fisher_scores_read_the_optimizer_of_the_trainer_that_trains():
    teacher = tiny_classifier(seed=1, hidden=32, intermediate=64, layers=2)
    student = tiny_classifier(seed=2)
    student.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    x, y = tokenized(16)
    pruner = bertzoo.Pruner(student, bertzoo.ConstantSparsity(0.5, begin_step=1, frequency=100), scores="fisher")
    distiller = bertzoo.Distiller(teacher, student, temperature=2.0, alpha=0.5)
    distiller.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    pruner.prepare_trainer(distiller)
    distiller.fit(x, y, batch_size=8, epochs=1, verbose=0)  # Steps 0 and 1: prunes at 1.
    assert not student.optimizer.built  # The student's own optimizer never ran.
    for i, target in enumerate(pruner.targets):
        kept = keras.ops.convert_to_numpy(pruner.state.masks[i]) != 0
        second_moment = keras.ops.convert_to_numpy(private_api.adam_moments(distiller.optimizer, target.variable)[1])
        assert np.mean(kept) == pytest.approx(0.5, abs=1 / kept.size)
        assert second_moment[kept].max() > 0  # The distiller's Adam saw gradients for them.


# --- Movement scores ----------------------------------------------------------
def block_means(values, rows, cols):
    h, c = values.shape
    return values.reshape(h // rows, rows, c // cols, cols).mean(axis=(1, 3))


@pytest.mark.parametrize("scope, pattern", [("layer", None), ("global", None), ("layer", "1x4"), ("layer", "2:4")])
def test_movement_scores_accumulate_w_old_times_the_update_and_rank_the_weights(scope, pattern):
    model = tiny_classifier()
    kernels = encoder_kernels(model)
    paths = sorted(kernels)
    w0 = numpy_of(kernels)
    # Prune once, at step 1 (the second update), by the movement of both updates.
    pruner = bertzoo.Pruner(
        model,
        bertzoo.ConstantSparsity(0.5, begin_step=1, frequency=100),
        scope=scope,
        pattern=pattern,
        scores="movement",
    )
    learning_rate = np.float32(0.1)
    optimizer = keras.optimizers.SGD(0.1)
    variables = model.trainable_variables
    rng = np.random.default_rng(1)
    grads = [[rng.normal(size=v.shape).astype("float32") for v in variables] for _ in range(2)]
    for step_grads in grads:
        optimizer.apply(step_grads, variables)

    # NumPy: w1 = w0 - lr g1, w2 = w1 - lr g2, S = w0 (w1 - w0) + w1 (w2 - w1).
    index = {id(v): i for i, v in enumerate(variables)}
    w1 = {p: w0[p] - learning_rate * grads[0][index[id(kernels[p])]] for p in paths}
    w2 = {p: w1[p] - learning_rate * grads[1][index[id(kernels[p])]] for p in paths}
    movement = {p: w0[p] * (w1[p] - w0[p]) + w1[p] * (w2[p] - w1[p]) for p in paths}
    if pattern is None and scope == "layer":
        keep = {p: ~smallest_signed(movement[p], int(round(0.5 * movement[p].size))) for p in paths}
    elif pattern is None:  # One ranking across all kernels.
        flat = np.concatenate([movement[p].reshape(-1) for p in paths])
        pruned = smallest_signed(flat, int(round(0.5 * flat.size)))
        sizes = np.cumsum([0] + [movement[p].size for p in paths])
        keep = {p: ~pruned[sizes[i] : sizes[i + 1]].reshape(movement[p].shape) for i, p in enumerate(paths)}
    elif pattern == "1x4":
        keep = {}
        for p in paths:
            scores = block_means(movement[p], 1, 4)
            keep[p] = np.repeat(~smallest_signed(scores, int(round(0.5 * scores.size))), 4, axis=1)
    else:  # 2:4 along the input axis: the 2 largest movements of every 4 kept.
        keep = {}
        for p in paths:
            groups = movement[p].T.reshape(movement[p].shape[1], -1, 4)
            kept = np.zeros_like(groups, bool)
            np.put_along_axis(kept, np.argsort(-groups, axis=-1, kind="stable")[..., :2], True, axis=-1)
            keep[p] = kept.reshape(movement[p].shape[1], -1).T

    after = numpy_of(encoder_kernels(model))
    magnitude_agrees = True
    for i, target in enumerate(pruner.targets):
        p = target.path
        accumulated = keras.ops.convert_to_numpy(pruner.state.movement[i])
        np.testing.assert_allclose(accumulated, movement[p], rtol=1e-5, atol=1e-7, err_msg=p)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(pruner.state.masks[i]) != 0, keep[p], err_msg=p)
        np.testing.assert_allclose(after[p], np.where(keep[p], w2[p], 0.0), atol=1e-6, err_msg=p)
        magnitude_agrees &= np.array_equal(keep[p], ~smallest(w2[p], int(round(0.5 * w2[p].size))))
    assert not magnitude_agrees  # Movement ranks differently from |W| here.
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)
    # A pruned weight stays zero until the next pruning step, and its score stops moving.
    before = [keras.ops.convert_to_numpy(m).copy() for m in pruner.state.movement]
    optimizer.apply(grads[0], variables)
    for i, target in enumerate(pruner.targets):
        mask = keras.ops.convert_to_numpy(pruner.state.masks[i])
        np.testing.assert_array_equal(mask != 0, keep[target.path])
        assert np.all(keras.ops.convert_to_numpy(target.variable)[mask == 0] == 0)
        moved = keras.ops.convert_to_numpy(pruner.state.movement[i])
        np.testing.assert_array_equal(moved[mask == 0], before[i][mask == 0])


def smallest_signed(values, count):
    """Boolean mask of the `count` smallest (signed) values."""
    flat = values.reshape(-1)
    mask = np.zeros(flat.size, bool)
    mask[np.argsort(flat, kind="stable")[:count]] = True
    return mask.reshape(values.shape)


# --- Second-order (Fisher) scores -------------------------------------------------
@pytest.mark.parametrize("scope", ["layer", "global"])
def test_fisher_scores_are_adams_squared_gradient_mean_times_w_squared(scope):
    model = tiny_classifier()
    kernels = encoder_kernels(model)
    paths = sorted(kernels)
    w0 = numpy_of(kernels)
    pruner = bertzoo.Pruner(
        model, bertzoo.ConstantSparsity(0.5, begin_step=1, frequency=100), scope=scope, scores="fisher"
    )
    learning_rate, beta_1, beta_2, epsilon = 0.01, 0.9, 0.999, 1e-7
    model.compile(optimizer=keras.optimizers.Adam(learning_rate, beta_1, beta_2, epsilon), loss="mse")
    variables = model.trainable_variables
    rng = np.random.default_rng(3)
    # Gradient scales differ per weight, so F * W**2 ranks unlike |W|.
    grads = [[rng.normal(size=v.shape).astype("float32") * rng.uniform(0.1, 3.0, v.shape) for v in variables]]
    grads.append([g * rng.uniform(0.5, 1.5, g.shape).astype("float32") for g in grads[0]])
    for step_grads in grads:
        model.optimizer.apply([g.astype("float32") for g in step_grads], variables)

    # NumPy Adam (Keras's form): v_t = b2 v + (1 - b2) g^2, w -= lr_t m / (sqrt(v) + eps).
    index = {id(v): i for i, v in enumerate(variables)}
    w, m, v = dict(w0), {p: 0.0 for p in paths}, {p: 0.0 for p in paths}
    for t, step_grads in enumerate(grads, start=1):
        rate = learning_rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        for p in paths:
            g = step_grads[index[id(kernels[p])]].astype("float64")
            m[p] = beta_1 * m[p] + (1 - beta_1) * g
            v[p] = beta_2 * v[p] + (1 - beta_2) * g * g
            w[p] = w[p] - rate * m[p] / (np.sqrt(v[p]) + epsilon)
    scores = {p: (v[p] + epsilon**2) * w[p] ** 2 for p in paths}
    if scope == "layer":
        keep = {p: ~smallest(scores[p], int(round(0.5 * scores[p].size))) for p in paths}
    else:
        flat = np.concatenate([scores[p].reshape(-1) for p in paths])
        pruned = smallest(flat, int(round(0.5 * flat.size)))
        sizes = np.cumsum([0] + [scores[p].size for p in paths])
        keep = {p: ~pruned[sizes[i] : sizes[i + 1]].reshape(scores[p].shape) for i, p in enumerate(paths)}
    after = numpy_of(encoder_kernels(model))
    magnitude_agrees = True
    for i, target in enumerate(pruner.targets):
        p = target.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(pruner.state.masks[i]) != 0, keep[p], err_msg=p)
        np.testing.assert_allclose(after[p], np.where(keep[p], w[p], 0.0), atol=1e-6, err_msg=p)
        magnitude_agrees &= np.array_equal(keep[p], ~smallest(w[p], int(round(0.5 * w[p].size))))
    assert not magnitude_agrees
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)


def test_fisher_scores_rank_by_magnitude_where_adam_has_seen_no_gradient():
    model = tiny_classifier(seed=1)
    w0 = numpy_of(encoder_kernels(model))
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0), scores="fisher")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.apply([np.zeros(v.shape, "float32") for v in model.trainable_variables], model.trainable_variables)
    for i, target in enumerate(pruner.targets):
        kept = keras.ops.convert_to_numpy(pruner.state.masks[i]) != 0
        expected = ~smallest(w0[target.path], int(round(0.5 * kept.size)))
        np.testing.assert_array_equal(kept, expected, err_msg=target.path)


def test_fisher_scores_prune_in_a_compiled_fit_with_the_default_optimizer_and_need_adam():
    model = tiny_classifier(seed=4)
    pruner = bertzoo.Pruner(
        model, bertzoo.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=2, frequency=1), scores="fisher"
    )
    pruner.compile(optimizer=bert_optimizer(1e-3), loss="sparse_categorical_crossentropy", jit_compile=True)
    x, y = tokenized(16)
    history = pruner.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert history.history["sparsity"][-1] == pytest.approx(0.75, abs=1e-3)
    assert pruner.strip().get_config() == model.get_config()

    # Under mixed_float16 the model's optimizer wraps Adam in a LossScaleOptimizer.
    half = tiny_classifier(seed=4, dtype="mixed_float16")
    scaled = bertzoo.Pruner(half, bertzoo.ConstantSparsity(0.5, begin_step=0), scores="fisher")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    half.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=False)
    half.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert scaled.sparsity() == pytest.approx(0.5, abs=1e-3)

    plain = tiny_classifier(seed=4)
    sgd = bertzoo.Pruner(plain, bertzoo.ConstantSparsity(0.5, begin_step=0), scores="fisher")
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", jit_compile=False)
    with pytest.raises(
        ValueError, match=r"scores='fisher' reads the squared-gradient mean .* \(SGD\) has none"
    ) as error:
        sgd.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # Refused before Keras's step (inside it, the message comes wrapped in a Cond.call error and, on
    # JAX, the models' variables are lost).
    assert str(error.value).startswith("scores='fisher'")
    assert int(plain.optimizer.iterations) == 0


def test_movement_state_is_saved_with_the_weights_and_the_config_round_trips(tmp_path):
    schedule = bertzoo.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=4, frequency=2)
    model = tiny_classifier()
    pruner = bertzoo.Pruner(model, schedule, scope="global", scores="movement")
    apply_steps(model, 3, learning_rate=0.1)
    config = pruner.get_config()
    assert config["scores"] == "movement" and config["scope"] == "global"
    assert bertzoo.Pruner(tiny_classifier(), schedule).get_config()["scores"] == "magnitude"
    path = tmp_path / "pruned.weights.h5"
    model.save_weights(path)

    fresh = tiny_classifier(seed=5)
    again = bertzoo.Pruner.from_config(config, fresh)
    assert again.get_config() == config
    state_config = pruner.state.get_config()
    assert state_config["scores"] == "movement"
    assert len(bertzoo.compression.PruningState.from_config(state_config).weights) == len(pruner.state.weights)
    fresh.load_weights(path)
    assert again.step == pruner.step == 3
    for a, b in zip(pruner.state.weights, again.state.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)
    assert any(np.any(keras.ops.convert_to_numpy(m) != 0) for m in again.state.movement)
    # Both continue alike: the loaded accumulators and previous values are used.
    apply_steps(model, 2, learning_rate=0.1, seed=7)
    apply_steps(fresh, 2, learning_rate=0.1, seed=7)
    for a, b in zip(pruner.state.masks, again.state.masks):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


# --- Distillation from the dense model in one call -------------------------------
def test_fit_with_a_teacher_prunes_while_distilling_with_the_models_optimizer():
    model = tiny_classifier(seed=2)
    teacher = copy_model(model)  # The dense model, before pruning.
    teacher_before = [keras.ops.convert_to_numpy(v).copy() for v in teacher.weights]
    schedule = bertzoo.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=1, frequency=1)
    pruner = bertzoo.Pruner(model, schedule, scope="global", scores="movement")
    pruner.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    x, y = tokenized(16)
    history = pruner.fit(
        x, y, batch_size=8, epochs=1, verbose=0, teacher=teacher, distillation={"temperature": 2.0, "alpha": 0.5}
    )
    assert pruner.step == 2 and int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
    assert {"distillation_loss", "agreement", "sparsity"} <= set(history.history)
    assert history.history["sparsity"][-1] == pytest.approx(0.5, abs=1e-3)
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)
    for before, v in zip(teacher_before, teacher.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), before)
    # A second call goes on with the model's own optimizer and the schedule.
    again = pruner.fit(
        x, y, batch_size=8, epochs=1, verbose=0, teacher=teacher, distillation={"temperature": 2.0, "alpha": 0.5}
    )
    assert "distillation_loss" in again.history
    assert pruner.step == 4 and int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4
    with pytest.raises(ValueError, match=r"`distillation` options need a `teacher`"):
        pruner.fit(x, y, distillation={"alpha": 0.5})


def test_fit_with_a_teacher_after_fine_tuning_distills_predictions_only_by_default():
    model = tiny_classifier(seed=3)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    x, y = tokenized(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # Fine-tuned: its optimizer is built.
    teacher = copy_model(model)
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
    history = pruner.fit(x, y, batch_size=8, epochs=1, verbose=0, teacher=teacher)
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)
    # The student starts as the teacher: its predictions' loss starts near 0
    # (0.001 here). Layer terms, normalised from their (zero) start, would
    # weigh as much as the whole prediction loss (0.32 here with them on).
    assert history.history["distillation_loss"][0] < 0.05


# --- Lottery tickets --------------------------------------------------------------
def test_lottery_ticket_prunes_geometrically_rewinds_and_keeps_pruned_weights_pruned():
    model = tiny_classifier(seed=4)
    original = [keras.ops.convert_to_numpy(v).copy() for v in model.weights]
    x, y = tokenized(16)
    seen = []  # (weights before training, kernels after training) of each call.

    def train(m):
        assert type(m) is bertzoo.BertClassifier and m is not model
        seen.append([keras.ops.convert_to_numpy(v).copy() for v in bertzoo.compression.model_copy.model_weights(m)])
        m.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
        m.fit(x, y, batch_size=8, epochs=1, verbose=0)
        seen[-1] = (seen[-1], numpy_of(encoder_kernels(m)))

    ticket = bertzoo.lottery_ticket(model, train, final_sparsity=0.875, rounds=3)
    assert ticket.sparsities == pytest.approx([0.5, 0.75, 0.875])
    assert len(seen) == 4
    for v, before in zip(model.weights, original):  # `model` (the rewind point) is untouched.
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), before)

    paths = sorted(encoder_kernels(model))
    kernel_index = {p: i for i, v in enumerate(model.weights) for p in paths if v is encoder_kernels(model)[p]}
    previous_zeros = None
    for call, (start, trained) in enumerate(seen):
        target = [0.0, 0.5, 0.75, 0.875][call]
        zeros = {}
        for value, rewound in zip(start, original):
            pruned = value == 0
            # Survivors (and every weight that is not pruned) are rewound exactly.
            np.testing.assert_array_equal(value[~pruned], rewound[~pruned])
        for p in paths:
            value = start[kernel_index[p]]
            zeros[p] = value == 0
            assert zeros[p].sum() == int(round(target * value.size)), (call, p)
            assert np.all(trained[p][zeros[p]] == 0)  # Masks fixed while training.
        if previous_zeros is not None:
            for p in paths:
                assert np.all(zeros[p][previous_zeros[p]]), (call, p)  # Pruned weights stay pruned.
                # The new cuts are the smallest surviving trained weights of the round before.
                survivors = np.where(previous_zeros[p], -1.0, np.abs(seen[call - 1][1][p]))
                expected = smallest_signed(survivors, int(round(target * survivors.size)))
                np.testing.assert_array_equal(zeros[p], expected, err_msg=f"{call} {p}")
        previous_zeros = zeros

    stripped = ticket.model
    assert type(stripped) is bertzoo.BertClassifier and not hasattr(stripped, "_pruning_state")
    assert all(v.constraint is None for v in stripped.weights)
    for p, w in numpy_of(encoder_kernels(stripped)).items():
        assert np.all(w[previous_zeros[p]] == 0) and np.sum(w == 0) == int(round(0.875 * w.size))
    assert ticket.sparsity == pytest.approx(0.875, abs=1e-3)


# --- Bad input --------------------------------------------------------------
def test_a_trainer_that_already_trained_prunes_once_prepared():
    # Keras keeps a trainer's traced step; the one traced before the Pruner
    # existed would run without its masks and never prune.
    teacher = tiny_classifier(seed=1)
    student = tiny_classifier(seed=2)
    x, y = tokenized(16)
    distiller = bertzoo.Distiller(teacher, student, alpha=0.5)
    distiller.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    distiller.fit(x, y, batch_size=8, epochs=1, verbose=0)  # A first stage, no pruning.
    pruner = bertzoo.Pruner(student, bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=1))
    pruner.prepare_trainer(distiller)
    distiller.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert pruner.sparsity() == pytest.approx(0.5, abs=0.01)
    for path, w in numpy_of(encoder_kernels(student)).items():
        assert np.mean(w == 0) == pytest.approx(0.5, abs=1 / w.size), path


def test_a_trainer_that_trained_before_the_pruner_attached_prunes_without_being_prepared():
    # Its step, traced before the masks existed, ran on silently: sparsity 0 after the fit.
    teacher, student = tiny_classifier(seed=1), tiny_classifier(seed=2)
    x, y = tokenized(16)
    distiller = bertzoo.Distiller(teacher, student, alpha=0.5)
    distiller.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    distiller.fit(x, y, batch_size=8, epochs=1, verbose=0)
    pruner = bertzoo.Pruner(student, bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=1))
    distiller.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert pruner.sparsity() == pytest.approx(0.5, abs=0.01)


def test_a_pruner_on_a_tasks_backbone_is_seen_from_the_task(tmp_path):
    # The task saved a preset that could not load ("config.json describes a backbone of ... parameters"),
    # and its copies failed with "its config rebuilds a model with 41 weights, but it has 67".
    model = tiny_classifier()
    x, y = tokenized(16)
    pruner = bertzoo.Pruner(model.backbone, bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=1))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert pruner.sparsity() == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match=r"BertClassifier '\w+' \(its BertBackbone '\w+'\) is being pruned"):
        model.save_to_preset(tmp_path / "task")
    assert not (tmp_path / "task").exists()
    with pytest.raises(ValueError, match=r"has a Pruner attached: quantize `pruner.strip\(\)`"):
        bertzoo.quantize(model, "int8")
    with pytest.raises(ValueError, match=r"already has a Pruner attached"):
        bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
    copy = copy_model(model)  # What the task computes, without the masks and counters.
    assert len(copy.weights) == len(tiny_classifier().weights)
    np.testing.assert_allclose(copy.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    assert len(model.backbone.named_weights()) == len(copy.backbone.weights)


def test_lottery_ticket_rewinds_a_lora_layer_to_its_merged_kernel():
    model = tiny_classifier()
    query = model.backbone.attention_blocks[0].query_dense
    query.enable_lora(2)
    query.lora_kernel_b.assign(np.random.default_rng(1).normal(0.0, 1.0, query.lora_kernel_b.shape).astype("float32"))
    merged = keras.ops.convert_to_numpy(query.kernel)
    starts = []

    def train(m):
        starts.append(keras.ops.convert_to_numpy(m.backbone.attention_blocks[0].query_dense.kernel))

    ticket = bertzoo.lottery_ticket(model, train, 0.5, rounds=1, layers=["attention_0/key"])
    for start in starts + [keras.ops.convert_to_numpy(ticket.model.backbone.attention_blocks[0].query_dense.kernel)]:
        np.testing.assert_allclose(start, merged, atol=1e-6)  # Was the base kernel, the update dropped.


def test_bad_inputs_give_clear_errors():
    model = tiny_classifier()
    schedule = bertzoo.ConstantSparsity(0.5, 0)
    with pytest.raises(ValueError, match=r"Cannot prune layer 'attention_0/querry'.*Did you mean 'attention_0/query'"):
        bertzoo.Pruner(model, schedule, layers=["attention_0/querry"])
    with pytest.raises(ValueError, match=r"pattern='2:4' prunes exactly 0.5.*final sparsity is 0.8"):
        bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.8, 0), pattern="2:4")
    with pytest.raises(ValueError, match=r"no global threshold.*scope='layer'"):
        bertzoo.Pruner(model, schedule, pattern="2:4", scope="global")
    with pytest.raises(ValueError, match=r"Unknown pruning `pattern`='3x'"):
        bertzoo.Pruner(model, schedule, pattern="3x")
    with pytest.raises(ValueError, match=r"Unknown `scope`"):
        bertzoo.Pruner(model, schedule, scope="model")
    with pytest.raises(
        ValueError, match=r"Unknown `scores`='gradient'. Expected 'magnitude' .*'movement' .* or 'fisher'"
    ):
        bertzoo.Pruner(model, schedule, scores="gradient")
    with pytest.raises(ValueError, match=r"`final_sparsity` must be in \[0, 1\)"):
        bertzoo.lottery_ticket(model, lambda m: None, final_sparsity=1.0)
    with pytest.raises(ValueError, match=r"`rounds` must be an integer >= 1"):
        bertzoo.lottery_ticket(model, lambda m: None, final_sparsity=0.5, rounds=0)
    with pytest.raises(ValueError, match=r"`rewind_weights` must be a model .* or a list of \d+ arrays"):
        bertzoo.lottery_ticket(model, lambda m: None, final_sparsity=0.5, rewind_weights=[np.zeros(3)])
    # A model of another shape is described as the model given, not as the list made of it.
    with pytest.raises(ValueError, match=r"got BertClassifier '\w+' with \d+ weights"):
        bertzoo.lottery_ticket(model, lambda m: None, final_sparsity=0.5, rewind_weights=tiny_classifier(layers=2))
    with pytest.raises(ValueError, match=r"`include_embeddings` must be True or False, got 'false'"):
        bertzoo.Pruner(model, schedule, include_embeddings="false")  # bool("false") is True.
    for bad in (0, -1, 2, float("nan"), "0.5"):
        with pytest.raises(ValueError, match=r"`min_sparsity` must be a fraction in \(0, 1\]"):
            bertzoo.Pruner.holding_zeros(model, min_sparsity=bad)
    with pytest.raises(ValueError, match=r"pruning schedule"):
        bertzoo.Pruner(model, 0.5)
    with pytest.raises(ValueError, match=r"matched nothing"):
        bertzoo.Pruner(model, schedule, layers=lambda layer: False)
    model.backbone.pooler.trainable = False
    with pytest.raises(ValueError, match=r"'pooler' is frozen"):
        bertzoo.Pruner(model, schedule, layers=["pooler"])
    model.backbone.pooler.trainable = True
    odd = tiny_classifier(intermediate=30)
    with pytest.raises(ValueError, match=r"input dimension of 'feedforward_0/output' \(30\).*multiple of 4"):
        bertzoo.Pruner(odd, schedule, pattern="2:4")

    attached = bertzoo.Pruner(model, schedule)
    with pytest.raises(ValueError, match=r"already has a Pruner attached"):
        bertzoo.Pruner(model, schedule)
    with pytest.raises(ValueError, match=r"'attention_0/querry' is not a pruned weight"):
        attached.set_masks({"attention_0/querry": np.ones((16, 16))})
    with pytest.raises(ValueError, match=r"mask of 'attention_0/query' has shape \(4,\)"):
        attached.set_masks({"attention_0/query": np.ones(4)})

    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="dense")])
    with pytest.raises(ValueError, match=r"layers='encoder' needs a bertzoo backbone"):
        bertzoo.Pruner(plain, schedule)
    with pytest.raises(ValueError, match=r"is quantized"):
        bertzoo.Pruner(bertzoo.quantize(tiny_classifier(), "int8"), schedule)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"gradient_accumulation_steps": 4}, r"also run on the calls that only accumulate"),
        ({"use_ema": True}, r"use_ema=True overwrites the pruned weights"),
    ],
)
@pytest.mark.parametrize("loss_scaled", [False, True])
def test_optimizer_settings_that_undo_pruning_are_refused_before_fit(options, message, loss_scaled):
    model = bertzoo.BertClassifier(
        bertzoo.BertBackbone(vocabulary_size=30, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32), 2
    )
    optimizer = keras.optimizers.Adam(1e-2, **options)
    if loss_scaled:  # As float16 models compile: the settings are the inner optimizer's.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, jit_compile=False)
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=1))
    x = {"token_ids": np.ones((4, 8), "int32"), "segment_ids": np.zeros((4, 8), "int32")}
    x["padding_mask"] = np.ones((4, 8), "int32")
    with pytest.raises(ValueError, match=message):
        pruner.fit(x, np.array([0, 1, 0, 1]), verbose=0)


def test_a_small_matrix_keeps_at_least_one_weight():
    from bertzoo.compression.masks import keep_mask
    from bertzoo.compression.masks import score_threshold

    for shape, sparsity in (((2, 2), 0.9), ((8, 4), 0.99), ((3,), 0.99)):
        scores = np.abs(np.random.default_rng(0).standard_normal(shape)).astype("float32")
        mask = np.asarray(keep_mask(scores, score_threshold(scores, sparsity), sparsity))
        assert mask.sum() == 1, (shape, sparsity)  # TF-MOT keeps max(1, round(n * (1 - s))).


def test_attaching_to_a_trained_optimizer_says_the_schedule_starts_over(caplog):
    import logging

    model = bertzoo.BertClassifier(
        bertzoo.BertBackbone(vocabulary_size=30, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32), 2
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)
    x = {"token_ids": np.ones((4, 8), "int32"), "segment_ids": np.zeros((4, 8), "int32")}
    x["padding_mask"] = np.ones((4, 8), "int32")
    model.fit(x, np.array([0, 1, 0, 1]), verbose=0)
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
    assert "has made 1 updates already; the pruning schedule counts from 0 now" in caplog.text


def test_the_sparsity_of_int4_models_is_refused_not_miscounted():
    # int4 kernels hold two weights per byte: zero bytes are not zero weights.
    model = tiny_classifier()
    quantized = bertzoo.quantize(model, "int4")
    with pytest.raises(ValueError, match=r"has int4 layers, which store two weights in each byte"):
        bertzoo.sparsity_report(quantized)
    assert bertzoo.sparsity_report(bertzoo.quantize(model, "int8")).total_sparsity < 0.5
