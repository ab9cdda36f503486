"""BertClassifier on raw strings, presets on disk, and their error paths."""

import json
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.saving import preset as preset_lib

POSITIVE = ["bright", "sunny", "warm", "happy", "calm", "kind"]
NEGATIVE = ["dark", "rainy", "cold", "angry", "noisy", "cruel"]
FILLER = ["the", "day", "was", "very", "quite", "and", "a", "morning", "felt"]


def separable_task(n, seed):
    """Sentences whose label is decided by which word list they draw from."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(2))
        words = list(rng.choice(FILLER, size=4)) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(label)
    return texts, np.array(labels, "int32")


def tiny_classifier(**kwargs):
    return bertzoo.BertClassifier.from_preset("tiny", num_classes=2, load_weights=False, sequence_length=40, **kwargs)


@pytest.fixture(scope="module")
def trained():
    keras_seed = 1
    import keras

    keras.utils.set_random_seed(keras_seed)
    model = tiny_classifier()
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    texts, labels = separable_task(1024, seed=0)
    model.fit(texts, labels, batch_size=32, epochs=1, verbose=0)  # 32 steps: 1.0 on the held-out texts
    return model


def test_learns_a_separable_task_from_raw_strings(trained):
    texts, labels = separable_task(256, seed=1)
    _, accuracy = trained.evaluate(texts, labels, verbose=0)
    assert accuracy > 0.9


def test_class_names_are_labels_too(trained):
    texts, labels = separable_task(64, seed=3)
    named = ["neg", "pos"]
    model = bertzoo.BertClassifier(trained.backbone, class_names=named, preprocessor=trained.preprocessor)
    model.output_dense.set_weights(trained.output_dense.get_weights())
    model.compile(jit_compile=False)
    words = [named[label] for label in labels]
    np.testing.assert_array_equal(model.label_ids(words), labels)
    np.testing.assert_array_equal(model.label_ids(np.array(words, dtype=object)), labels)
    assert model.label_ids(labels) is labels  # Ids pass through.
    # evaluate (and fit) read the names: the same figures as with the ids.
    np.testing.assert_allclose(model.evaluate(texts, words, verbose=0), model.evaluate(texts, labels, verbose=0))
    history = model.fit(texts[:16], words[:16], batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match=r"Labels \['neutral'\] are not among the classifier's class_names"):
        model.label_ids(["pos", "neutral"])
    with pytest.raises(ValueError, match=r"labels are strings \('pos', \.\.\.\) but this classifier has no"):
        trained.fit(texts[:2], ["pos", "neg"], verbose=0)


def test_preset_round_trip_restores_identical_predictions(trained, tmp_path):
    texts, _ = separable_task(40, seed=2)
    before = trained.predict(texts, verbose=0)
    trained.save_to_preset(tmp_path / "sentiment")
    files = sorted(p.name for p in (tmp_path / "sentiment").iterdir())
    assert files == ["config.json", "metadata.json", "model.weights.h5", "task.weights.h5", "vocabulary.txt"]
    again = bertzoo.BertClassifier.from_preset(tmp_path / "sentiment")
    for a, b in zip(again.weights, trained.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    again.compile(jit_compile=trained.jit_compile)  # Same kernels, so bit-identical.
    np.testing.assert_array_equal(again.predict(texts, verbose=0), before)
    metadata = json.loads((tmp_path / "sentiment" / "metadata.json").read_text())
    assert metadata["parameter_count"] == trained.count_params()
    assert metadata["source_preset"] == "tiny"
    assert metadata["bertzoo_version"] == bertzoo.__version__
    # A preset's backbone also loads alone, with the same weights.
    backbone = bertzoo.BertBackbone.from_preset(tmp_path / "sentiment")
    for a, b in zip(backbone.weights, trained.backbone.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_new_head_on_a_task_preset_keeps_the_backbone(trained, tmp_path):
    trained.save_to_preset(tmp_path / "p")
    three = bertzoo.BertClassifier.from_preset(tmp_path / "p", num_classes=3)
    assert three.output_shape == (None, 3)

    np.testing.assert_array_equal(
        three.backbone.embeddings.token_embedding.embeddings.numpy(),
        trained.backbone.embeddings.token_embedding.embeddings.numpy(),
    )


def test_accepts_pairs_datasets_and_tokenized_inputs():
    model = tiny_classifier()
    model.compile()
    a, labels = separable_task(8, seed=3)
    b = list(reversed(a))
    pair_logits = model.predict((a, b), verbose=0)
    assert pair_logits.shape == (8, 2)
    # Tokenized dicts skip the preprocessor and give the same logits.
    features = model.preprocessor((tf.constant(a), tf.constant(b)))
    np.testing.assert_allclose(model.predict(features, verbose=0), pair_logits, atol=1e-6)
    # A single string is a batch of one.
    assert model.predict("just one", verbose=0).shape == (1, 2)
    dataset = tf.data.Dataset.from_tensor_slices(((a, b), labels)).batch(4)
    history = model.fit(dataset, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    unbatched = tf.data.Dataset.from_tensor_slices((a, labels))
    loss, _ = model.evaluate(unbatched, verbose=0)
    assert np.isfinite(loss)
    # A dataset carries its own labels and weights: separate ones are refused, not silently dropped.
    with pytest.raises(ValueError, match=r"`sample_weight` must be None when `x` is a tf.data.Dataset"):
        model.fit(dataset, sample_weight=np.ones(8), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"`y` must be None when `x` is a tf.data.Dataset"):
        model.fit(tf.data.Dataset.from_tensor_slices(a), labels, epochs=1, verbose=0)


def test_default_compile_uses_bert_fine_tuning_recipe():
    model = tiny_classifier()
    model.compile()
    optimizer = model.optimizer
    assert type(optimizer).__name__ == "AdamW"
    schedule = optimizer._learning_rate
    assert isinstance(schedule, bertzoo.WarmupLinearDecay)
    assert 2e-5 <= schedule.peak_learning_rate <= 5e-5
    texts, labels = separable_task(64, seed=4)
    history = model.fit(texts, labels, batch_size=16, epochs=2, verbose=0, validation_data=(texts[:8], labels[:8]))
    assert len(history.history["val_accuracy"]) == 2  # Raw-string validation data works.
    assert schedule.total_steps == 8  # 4 batches x 2 epochs, filled in by fit().
    # 10% of 8 steps is no whole warm-up step (BERT's int(0.1 * 8)): the first step trains at the peak.
    assert float(schedule(0)) == pytest.approx(5e-5)
    assert float(schedule(4)) == pytest.approx(2.5e-5)
    assert float(schedule(8)) == 0.0
    longer = bertzoo.WarmupLinearDecay(5e-5, warmup_fraction=0.1, total_steps=25)  # int(2.5) = 2 warm-up steps.
    assert [float(longer(step)) for step in (0, 1, 2)] == pytest.approx([0.0, 2.5e-5, 5e-5])
    assert float(longer(13.5)) == pytest.approx(2.5e-5) and float(longer(25)) == 0.0
    # A second fit() extends the schedule from the current step instead of
    # training at rate zero.
    model.fit(texts, labels, batch_size=16, epochs=1, verbose=0)
    assert schedule.total_steps == 12
    assert float(schedule(9)) > 0.0


def test_a_float16_backbone_trains_with_loss_scaling():
    # Keras scales the loss only for a mixed_float16 model policy; the task
    # (float32 policy) around a float16 backbone gets it from bertzoo.
    backbone = bertzoo.BertBackbone.from_preset("tiny", load_weights=False, dtype="mixed_float16")
    preprocessor = bertzoo.Preset.resolve("tiny").build_preprocessor(sequence_length=40)
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=preprocessor)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert type(model.optimizer.inner_optimizer).__name__ == "AdamW"
    texts, labels = separable_task(32, seed=5)
    history = model.fit(texts, labels, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    schedule = model.optimizer.inner_optimizer._learning_rate
    assert schedule.total_steps == 2  # Filled in by fit() through the wrapper.
    model.compile(optimizer=keras.optimizers.SGD(0.1))  # A user's optimizer is wrapped too.
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert not isinstance(tiny_classifier().optimizer, keras.optimizers.LossScaleOptimizer)


def test_presets_do_not_store_optimizer_state(trained, tmp_path):
    """A compiled, trained model's preset holds model weights only."""
    trained.save_to_preset(tmp_path / "trained")
    fresh = tiny_classifier()
    fresh.save_to_preset(tmp_path / "fresh")
    size = lambda d: (d / "task.weights.h5").stat().st_size
    assert size(tmp_path / "trained") < 1.1 * size(tmp_path / "fresh")


def test_builtin_preset_warns_once_about_random_weights():
    preset_lib._warned_random_init.discard("tiny")
    with pytest.warns(UserWarning, match="randomly initialized"):
        bertzoo.BertClassifier.from_preset("tiny", num_classes=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bertzoo.BertClassifier.from_preset("tiny", num_classes=2)
        preset_lib._warned_random_init.discard("tiny")
        bertzoo.BertClassifier.from_preset("tiny", num_classes=2, load_weights=False)


def test_builtin_preset_tokenizes_offline():
    model = tiny_classifier()
    features = model.preprocessor(tf.constant(["Offline, naïve café — 42!"]))
    ids = features["token_ids"].numpy()[0]
    unk = model.preprocessor.tokenizer.unk_token_id
    assert ids[0] == model.preprocessor.tokenizer.cls_token_id
    assert unk not in ids


def test_unknown_preset_suggests_close_names():
    with pytest.raises(ValueError, match="Did you mean 'base'"):
        bertzoo.BertClassifier.from_preset("bsae", num_classes=2)


def test_missing_head_argument_is_explained():
    with pytest.raises(TypeError, match="num_classes"):
        bertzoo.BertTokenClassifier.from_preset("tiny", load_weights=False)


@pytest.mark.filterwarnings("ignore:Preset '(base|tiny)' has no pretrained weights")
def test_the_design_cards_first_line_fits_raw_strings_without_compile():
    # The card's line names "base": built here, compiled on construction; the
    # fit (the same code for every preset) runs on "tiny", as training tests do.
    base = bertzoo.BertClassifier.from_preset("base")
    assert base.compiled and base.num_classes == 2 and base.backbone.hidden_dim == 768
    model = bertzoo.BertClassifier.from_preset("tiny")
    history = model.fit(["a gripping, funny film", "dull and far too long"], [1, 0], epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.num_classes == 2 and model.optimizer.iterations.numpy() == 1
    assert model.predict(["one more"], verbose=0).shape == (1, 2)


def test_construction_compiles_with_defaults_and_a_users_compile_replaces_them():
    model = tiny_classifier()
    assert model.compiled and isinstance(model.optimizer, bertzoo.models.optimizers.AdamW)
    assert model.optimizer.global_clipnorm == 1.0
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", jit_compile=False)
    assert isinstance(model.optimizer, keras.optimizers.SGD) and model.jit_compile is False
    assert bertzoo.BertClassifier(model.backbone, class_names=["neg", "neu", "pos"]).num_classes == 3


def test_the_compiling_constructor_keeps_its_signature_so_clone_model_works():
    import inspect

    assert inspect.getfullargspec(bertzoo.BertClassifier.__init__).args[1:3] == ["backbone", "num_classes"]
    model = tiny_classifier()
    # A `(*args, **kwargs)` wrapper made Keras call BertClassifier(inputs, outputs).
    clone = keras.models.clone_model(model)
    # Keras rebuilds any Functional subclass as a plain functional model, with new layers of the same config.
    assert isinstance(clone, keras.Model) and not isinstance(clone, bertzoo.BertClassifier)
    x = model.preprocessor(["a clone has new weights"])
    assert clone(x).shape == model(x).shape
    assert not {id(v) for v in clone.weights} & {id(v) for v in model.weights}


@pytest.fixture
def saved(tmp_path):
    model = tiny_classifier()
    model.save_to_preset(tmp_path / "p")
    return tmp_path / "p"


def test_a_new_dropout_rate_keeps_the_saved_head(saved, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        again = bertzoo.BertClassifier.from_preset(saved, dropout=0.3)
    assert again.dropout == 0.3 and "randomly initialized" not in caplog.text
    kept = bertzoo.BertClassifier.from_preset(saved)
    x = kept.preprocessor(["dropout has no weights"])
    np.testing.assert_array_equal(again(x, training=False), kept(x, training=False))


def test_missing_file_is_reported(saved):
    (saved / "task.weights.h5").unlink()
    (saved / "model.weights.h5").unlink()
    os.remove(saved / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        bertzoo.BertClassifier.from_preset(saved)


def test_truncated_weights_are_reported(saved):
    path = saved / "task.weights.h5"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated"):
        bertzoo.BertClassifier.from_preset(saved)


def test_vocabulary_longer_than_the_embeddings_is_reported(saved):
    lines = (saved / "vocabulary.txt").read_text().splitlines()
    (saved / "vocabulary.txt").write_text("\n".join(lines + [f"extra{i}" for i in range(5)]) + "\n")
    with pytest.raises(ValueError, match="30527 tokens but the embedding table only 30522 rows"):
        bertzoo.BertClassifier.from_preset(saved)


def test_failed_save_keeps_the_existing_preset(saved, monkeypatch):
    before = {p.name: p.read_bytes() for p in saved.iterdir()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("bertzoo.text.vocabulary.save_vocabulary", broken)
    with pytest.raises(OSError, match="disk full"):
        tiny_classifier().save_to_preset(saved)
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    assert [p.name for p in saved.parent.iterdir()] == ["p"]  # No temp dirs left behind.


def test_bad_num_classes():
    backbone = bertzoo.BertBackbone.from_preset("tiny", load_weights=False)
    with pytest.raises(ValueError, match="num_classes"):
        bertzoo.BertClassifier(backbone, num_classes=0)


def test_a_new_head_drops_the_old_class_names(tmp_path):
    tiny_classifier(class_names=["negative", "positive"]).save_to_preset(tmp_path / "named")
    again = bertzoo.BertClassifier.from_preset(tmp_path / "named")
    assert again.class_names == ["negative", "positive"]
    three = bertzoo.BertClassifier.from_preset(tmp_path / "named", num_classes=3)
    assert three.class_names is None


@pytest.mark.parametrize("pairs", [False, True])
def test_short_inputs_tokenize_eagerly_and_long_ones_stream(trained, pairs, monkeypatch):
    from bertzoo.models import task as task_lib

    a, _ = separable_task(12, seed=5)
    x = (a, list(reversed(a))) if pairs else a
    streamed = []
    as_dataset = type(trained)._as_dataset

    def spy(self, *args, **kwargs):
        streamed.append(1)
        return as_dataset(self, *args, **kwargs)

    monkeypatch.setattr(type(trained), "_as_dataset", spy)
    eager = trained.predict(x, batch_size=5, verbose=0)  # Batches of 5, 5, 2.
    assert not streamed, "a short list should not build a tf.data pipeline"
    monkeypatch.setattr(task_lib, "EAGER_PREPROCESS_LIMIT", 11)  # 12 examples: over the limit.
    through_tf_data = trained.predict(x, batch_size=5, verbose=0)
    assert streamed
    assert eager.shape == (12, 2)
    np.testing.assert_allclose(eager, through_tf_data, rtol=1e-5, atol=1e-6)


def test_auto_jit_compile_is_decided_when_a_step_function_is_built(monkeypatch):
    monkeypatch.setenv("BERTZOO_JIT_COMPILE", "1")  # Pinned: no timing in this test.
    model = tiny_classifier()
    assert model.jit_compile is False  # Provisional until the model runs.
    assert model.get_compile_config()["jit_compile"] == "auto"
    model.make_predict_function()
    assert model.jit_compile is True
    monkeypatch.setenv("BERTZOO_JIT_COMPILE", "0")
    model.compile(jit_compile=True)  # The user's choice is kept as given.
    model.make_predict_function(force=True)
    assert model.jit_compile is True and model.get_compile_config()["jit_compile"] is True


def test_an_empty_batch_predicts_empty_outputs():
    model = tiny_classifier()
    assert model.predict([], verbose=0).shape == (0, 2)
    assert model.predict(([], []), verbose=0).shape == (0, 2)


def test_raw_text_batches_drop_unused_padding_without_changing_outputs(trained, monkeypatch):
    model = trained
    texts = ["warm day", "the day was very quite and a calm morning felt kind"]
    batches = list(model._as_dataset(texts, np.array([1, 1]), batch_size=1))
    # Each batch keeps its longest text, rounded up to a multiple of 16 tokens (at most all 40).
    full = model.preprocessor(texts)
    lengths = np.sum(np.asarray(full["padding_mask"]), -1)
    assert lengths[0] < 16 < lengths[1]
    expected = [min(-(-n // 16) * 16, 40) for n in lengths]
    assert [b[0]["token_ids"].shape[-1] for b in batches] == expected
    for (x, _), row in zip(batches, range(2)):
        np.testing.assert_array_equal(x["token_ids"][0], np.asarray(full["token_ids"])[row, : expected[row]])
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(1)
    trimmed = model.predict(dataset, verbose=0)
    monkeypatch.setattr(type(model), "trims_padding", False)
    assert [b["token_ids"].shape[-1] for b in model._as_dataset(texts, batch_size=1)] == [40, 40]
    np.testing.assert_allclose(model.predict(dataset, verbose=0), trimmed, atol=1e-5)


def test_batch_methods_point_raw_text_to_predict_and_fit():
    model = tiny_classifier()
    for method, call in [
        ("predict_on_batch", lambda: model.predict_on_batch(["a", "b"])),
        ("train_on_batch", lambda: model.train_on_batch(["a", "b"], np.array([0, 1]))),
        ("test_on_batch", lambda: model.test_on_batch((["a"], ["b"]), np.array([0]))),
        ("predict_on_batch", lambda: model.predict_on_batch(tf.constant(["a", "b"]))),
    ]:
        with pytest.raises(ValueError, match=f"{method} takes the model's features .* not raw text"):
            call()
    features = model.preprocessor(["a", "b"])  # What they take.
    np.testing.assert_allclose(model.predict_on_batch(features), model.predict(["a", "b"], verbose=0), atol=1e-5)
    assert np.isfinite(model.train_on_batch(features, np.array([0, 1]))).all()


def test_raw_text_without_a_preprocessor_names_the_fix():
    model = bertzoo.BertClassifier(tiny_classifier().backbone, 2, preprocessor=None)
    features = tiny_classifier().preprocessor(["some text", "more"])
    texts = tf.data.Dataset.from_tensor_slices((["a", "b"], [0, 1])).batch(2)
    calls = (
        lambda: model.predict(["text"]),
        lambda: model.fit(["text"], [1]),
        lambda: model.evaluate(["a"], [0]),
        lambda: model.fit(texts),
        lambda: model.predict(texts),
        lambda: model.fit(features, np.array([0, 1]), validation_data=(["a", "b"], [0, 1])),
    )
    for call in calls:
        with pytest.raises(ValueError, match=r"has no preprocessor.*a dict of padding_mask, segment_ids, token_ids"):
            call()


def test_a_loss_of_another_kind_gets_no_class_id_accuracy_and_trains_on_soft_targets():
    model = tiny_classifier()
    texts = ["a gripping film", "dull and long", "fine"]
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True), jit_compile=False)
    history = model.fit(texts, np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]]), verbose=0).history
    assert set(history) == {"loss"}
    # The metrics each loss gets are chosen at compile(): the fits below check
    # them eagerly, where a traced step would cost seconds apiece.
    model.compile(
        loss="categorical_crossentropy", metrics=["categorical_accuracy"], jit_compile=False, run_eagerly=True
    )
    assert "categorical_accuracy" in model.fit(texts, np.eye(2)[[0, 1, 1]], verbose=0).history
    for loss in (keras.losses.SparseCategoricalCrossentropy(from_logits=True), "sparse_categorical_crossentropy", None):
        model.compile(loss=loss or "auto", jit_compile=False, run_eagerly=True)
        assert "accuracy" in model.fit(texts, [0, 1, 1], verbose=0).history
    regression = bertzoo.BertClassifier.from_preset("tiny", num_classes=1, load_weights=False, sequence_length=40)
    for loss in ("mse", keras.losses.Huber()):  # Other kinds of loss keep the head's own metrics.
        regression.compile(loss=loss, jit_compile=False, run_eagerly=True)
        assert "mae" in regression.fit(texts, [0.2, 0.9, 0.5], verbose=0).history


def test_class_names_of_another_length_build_a_head_of_that_many_classes(tmp_path, caplog):
    # The saved num_classes=2 met the three names: "`class_names` has 3 names but num_classes=2".
    tiny_classifier().save_to_preset(tmp_path / "two")
    with caplog.at_level("WARNING", logger="bertzoo"):
        three = bertzoo.BertClassifier.from_preset(tmp_path / "two", class_names=["neg", "neutral", "pos"])
    assert three.output_shape == (None, 3) and three.num_classes == 3
    assert "{'num_classes': 3} differ from the saved ones" in caplog.text
    renamed = bertzoo.BertClassifier.from_preset(tmp_path / "two", class_names=["bad", "good"])
    assert renamed.num_classes == 2 and renamed.class_names == ["bad", "good"]  # Names alone keep the head.
    named = tiny_classifier()
    named.class_names = ["neg", "pos"]
    named.save_to_preset(tmp_path / "named")
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertzoo"):
        bertzoo.BertClassifier.from_preset(tmp_path / "named", class_names=["neg", "pos"])
        assert caplog.text == ""
        swapped = bertzoo.BertClassifier.from_preset(tmp_path / "named", class_names=["pos", "neg"])
    assert swapped.class_names == ["pos", "neg"]  # As asked, but said: each output now has the other name.
    assert "the saved head's classes are ['neg', 'pos'], in this order" in caplog.text
    tagger = bertzoo.BertTokenClassifier.from_preset("tiny", load_weights=False, num_classes=2, sequence_length=16)
    tagger.save_to_preset(tmp_path / "tagger")
    assert (
        bertzoo.BertTokenClassifier.from_preset(tmp_path / "tagger", class_names=["O", "PER", "LOC"]).num_classes == 3
    )


def test_tensorflow_activations_save_by_their_keras_name_and_own_functions_are_refused(tmp_path):
    # tf.nn.softmax was saved as {'module': 'builtins', ... 'softmax_v2'}, which from_preset refused.
    model = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, sequence_length=40, num_classes=3, activation=tf.nn.softmax
    )
    assert model.activation == "softmax" and model.get_config()["activation"] == "softmax"
    model.save_to_preset(tmp_path / "softmax")
    again = bertzoo.BertClassifier.from_preset(tmp_path / "softmax")
    texts = ["a fine film", "dull"]
    np.testing.assert_allclose(again.predict(texts, verbose=0), model.predict(texts, verbose=0), atol=1e-6)
    np.testing.assert_allclose(model.predict(texts, verbose=0).sum(axis=-1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match=r"has no Keras activation name(.|\n)*pass a name such as 'softmax'"):
        tiny_classifier(activation=lambda x: 2 * x)
