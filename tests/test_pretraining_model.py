"""BertPretrainer: masked-LM and sentence heads against NumPy, tied decoder,
losses, presets and a short training run."""

import json
import logging
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo import PresetError
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer

WORDS = "the cat sat on a mat dog ran to park it was sunny rain fell river rose and then".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [".", ","]


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def tiny_backbone(embedding_dim=None):
    return bertzoo.BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=2,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        embedding_dim=embedding_dim,
        max_sequence_length=32,
        dropout=0.0,
    )


def randomize_heads(model, seed=0):
    """Non-trivial head weights (LayerNorm gamma 1 and zero biases hide mistakes)."""
    rng = np.random.default_rng(seed)
    for layer in (model.mlm_head, model.sentence_head or model.mlm_head):
        for variable in layer.weights:
            if variable is model.backbone.embeddings.token_embedding.embeddings:
                continue
            variable.assign(rng.normal(0, 0.5, variable.shape).astype("float32") + (variable.name == "gamma"))


def features(rng, batch=3, length=10, slots=4):
    ids = rng.integers(5, len(VOCAB), (batch, length)).astype("int32")
    mask = np.ones((batch, length), "int32")
    mask[0, 7:] = 0
    return {
        "token_ids": ids,
        "segment_ids": (np.arange(length) >= 5).astype("int32")[None].repeat(batch, 0),
        "padding_mask": mask,
        "mask_positions": rng.integers(0, 7, (batch, slots)).astype("int32"),
    }


def numpy_heads(model, x):
    """The masked-LM and sentence logits computed by hand from the backbone outputs."""
    backbone = model.backbone
    out = backbone({k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")})
    sequence = np.asarray(out["sequence_output"], "float64")
    pooled = np.asarray(out["pooled_output"], "float64")
    head = model.mlm_head
    w = {v.path.split("/")[-2] + "/" + v.name: np.asarray(v, "float64") for v in head.weights}
    table = np.asarray(backbone.embeddings.token_embedding.embeddings, "float64")
    gathered = np.take_along_axis(sequence, x["mask_positions"][..., None], axis=1)
    h = gelu_tanh(gathered @ w["transform/kernel"] + w["transform/bias"])
    h = layer_norm(h, w["layer_norm/gamma"], w["layer_norm/beta"], backbone.layer_norm_epsilon)
    mlm = h @ table.T + np.asarray(head.output_bias, "float64")
    if model.sentence_head is None:
        return mlm, None
    sentence = pooled @ np.asarray(model.sentence_head.kernel, "float64") + np.asarray(model.sentence_head.bias)
    return mlm, sentence


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("embedding_dim", [None, 8], ids=["bert", "albert_factorized"])
def test_heads_match_numpy(embedding_dim, rng):
    model = bertzoo.BertPretrainer(tiny_backbone(embedding_dim), sentence_objective="sop")
    randomize_heads(model)
    x = features(rng)
    out = model(x)
    assert out["mlm"].shape == (3, 4, len(VOCAB))
    assert out["sentence"].shape == (3, 2)
    if embedding_dim:
        assert model.mlm_head.transform.kernel.shape == (32, 8)  # H -> E, decoded against the V x E table.
    mlm, sentence = numpy_heads(model, x)
    np.testing.assert_allclose(out["mlm"], mlm, atol=2e-4)
    np.testing.assert_allclose(out["sentence"], sentence, atol=2e-5)


def test_decoder_shares_the_token_embedding_variable(rng):
    model = bertzoo.BertPretrainer(tiny_backbone(), sentence_objective=None)
    table = model.backbone.embeddings.token_embedding.embeddings
    assert model.mlm_head.token_embedding.embeddings is table
    assert sum(v is table for v in model.trainable_variables) == 1
    # Parameters: backbone + transform + LayerNorm + output bias; no second V x H table.
    H, V = 32, len(VOCAB)
    assert model.count_params() == model.backbone.count_params() + (H * H + H) + 2 * H + V
    # Changing the embedding changes the decoder the same way.
    x = features(rng)
    table.assign(rng.normal(0, 1, table.shape).astype("float32"))
    np.testing.assert_allclose(model(x)["mlm"], numpy_heads(model, x)[0], atol=2e-4)


def test_loss_is_mean_over_real_slots_plus_sentence_loss(rng):
    model = bertzoo.BertPretrainer(tiny_backbone(), sentence_objective="nsp")
    randomize_heads(model)
    model.compile(jit_compile=False)
    x = features(rng)
    labels = rng.integers(0, len(VOCAB), (3, 4)).astype("int32")
    labels[0, 2:] = -100  # Unused slots.
    labels[2, 3] = -100
    nsp = np.array([0, 1, 1], "int32")
    y_pred = model(x)
    loss = model.compute_loss(x=x, y={"mlm": labels, "sentence": nsp}, y_pred=y_pred)
    mlm, sentence = numpy_heads(model, x)
    valid = labels != -100
    picked = np.take_along_axis(log_softmax(mlm), np.where(valid, labels, 0)[..., None], -1)[..., 0]
    expected_mlm = -picked[valid].mean()
    expected_nsp = -log_softmax(sentence)[np.arange(3), nsp].mean()
    assert float(loss) == pytest.approx(expected_mlm + expected_nsp, rel=1e-4)


@pytest.fixture(scope="module")
def preprocessor():
    return BertPreprocessor(BertTokenizer(VOCAB), sequence_length=20)


DOCUMENTS = [
    ["the cat sat on a mat .", "then the cat ran to the park .", "the dog sat ."],
    ["it was sunny .", "then rain fell .", "and the river rose ."],
    ["a dog ran .", "the dog sat on a mat ."],
    ["rain fell on the park .", "the river rose and rose ."],
] * 16


def test_short_nsp_training_lowers_the_loss(preprocessor):
    keras.utils.set_random_seed(0)
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective="nsp")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    first, second, labels = bertzoo.sentence_pairs(DOCUMENTS, "nsp", seed=0)
    # 6 epochs: the masks drawn in tf.data follow the seeds of earlier tests in
    # the same process, and after 4 the MLM loss had fallen 0.48-0.7 (0.8-1.0 after 6).
    history = model.fit((first, second), labels, batch_size=16, epochs=6, verbose=0).history
    assert history["mlm_loss"][-1] < history["mlm_loss"][0] - 0.5
    assert history["loss"][-1] < history["loss"][0] - 0.5
    assert 0 <= history["mlm_accuracy"][-1] <= 1


def test_mlm_only_pipeline_makes_its_own_labels(preprocessor):
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective=None, max_predictions=5)
    x, y = next(iter(model._as_dataset(["the cat sat on a mat .", "it was sunny ."], batch_size=2)))
    assert set(x) == {"token_ids", "segment_ids", "padding_mask", "mask_positions"}
    assert set(y) == {"mlm"} and y["mlm"].shape == (2, 5)
    clean = preprocessor(tf.constant(["the cat sat on a mat .", "it was sunny ."]))
    used = y["mlm"].numpy() != -100
    original = np.take_along_axis(clean["token_ids"].numpy(), x["mask_positions"].numpy(), 1)
    np.testing.assert_array_equal(y["mlm"].numpy()[used], original[used])
    assert used.sum(1).tolist() == [1, 1]  # round(0.15 * 7) = 1, max(1, round(0.15 * 4)) = 1.
    with pytest.raises(ValueError, match="makes its own labels") as raised:
        model.fit(["the cat"], [1], verbose=0)
    assert "in user code" not in str(raised.value)  # Raised up front, not from the tf.data trace.
    with pytest.raises(ValueError, match="makes its own labels") as raised:
        model.evaluate(["the cat"], [1], verbose=0)
    assert "in user code" not in str(raised.value)


def test_the_prediction_slots_follow_a_changed_sequence_length():
    from bertzoo.text.pretraining import default_max_selections

    short = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=8)
    model = bertzoo.BertPretrainer(tiny_backbone(), short, sentence_objective=None)
    short.sequence_length = 32  # The backbone's whole position table.
    text = " ".join((WORDS * 2)[:30])  # 30 selectable tokens once packed.
    x, y = model.preprocess(tf.constant([text]), seed=tf.constant([1, 2]))
    slots = default_max_selections(32)
    assert slots > default_max_selections(8)
    assert x["mask_positions"].shape == (1, slots) == (1, model.measurement_lengths(32)["mask_positions"])
    assert int(np.sum(y["mlm"].numpy() != -100)) == min(round(0.15 * 30), slots)


def test_preset_round_trip_keeps_heads_and_tie(preprocessor, tmp_path, rng):
    model = bertzoo.BertPretrainer(tiny_backbone(8), preprocessor, sentence_objective="sop", max_predictions=6)
    randomize_heads(model, seed=3)
    x = features(rng)
    before = model(x)
    model.save_to_preset(tmp_path / "pre")
    again = bertzoo.BertPretrainer.from_preset(tmp_path / "pre")
    head = lambda m: {k: v for k, v in m.get_config().items() if k not in ("name", "backbone", "preprocessor")}
    assert head(again) == head(model)
    assert again.mlm_head.token_embedding.embeddings is again.backbone.embeddings.token_embedding.embeddings
    after = again(x)
    np.testing.assert_array_equal(after["mlm"], before["mlm"])
    np.testing.assert_array_equal(after["sentence"], before["sentence"])
    assert again.masker.max_selections == 6
    # The masking shapes no weight: BERT's second phase (longer rows, more
    # predictions) continues with the trained heads, and says nothing.
    phase_two = bertzoo.BertPretrainer.from_preset(tmp_path / "pre", max_predictions=9, masking_rate=0.2)
    assert phase_two.masker.max_selections == 9 and phase_two.masking_rate == 0.2
    np.testing.assert_array_equal(phase_two(x)["mlm"], before["mlm"])
    np.testing.assert_array_equal(phase_two(x)["sentence"], before["sentence"])


def test_a_seeded_run_masks_each_batch_the_same_however_the_map_is_scheduled(preprocessor):
    # Many small batches: the parallel map finishes them out of order, and a
    # stream drawn inside it handed the masks to other batches from run to run.
    texts = [" ".join(WORDS[i % 7 : i % 7 + 6]) for i in range(96)]

    def masks():
        keras.utils.set_random_seed(0)
        model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective=None)
        return [x["token_ids"].numpy() for x, _ in model._as_dataset(texts, batch_size=2, training=True)]

    first, second = masks(), masks()
    assert len(first) == 48 and all(np.array_equal(a, b) for a, b in zip(first, second))
    assert not all(np.array_equal(a, b) for a, b in zip(first[:-1], first[1:]))  # Masks differ per batch.

    # Each dataset draws from a stream of its own: reading another (validation) between
    # batches leaves a training dataset's masks as they were.
    keras.utils.set_random_seed(0)
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective=None)
    train = iter(model._as_dataset(texts, batch_size=2, training=True))
    validation = model._as_dataset(texts[:8], batch_size=2, training=True)
    interleaved = [next(train)[0]["token_ids"].numpy() for _ in range(3)]
    list(validation)
    interleaved += [x["token_ids"].numpy() for x, _ in train]
    assert all(np.array_equal(a, b) for a, b in zip(interleaved, first))

    class OwnPreprocess(bertzoo.BertPretrainer):  # A subclass's `preprocess` without `seed` still trains.
        def preprocess(self, x, y=None, sample_weight=None, preprocessor=None):
            return super().preprocess(x, y, sample_weight, preprocessor)

    model = OwnPreprocess(tiny_backbone(), preprocessor, sentence_objective=None)
    assert len(list(model._as_dataset(texts[:4], batch_size=2, training=True))) == 2
    # Masked afresh every epoch (in tf.data), not once for all of them.
    dataset = model._as_dataset(texts, batch_size=2, training=True)
    epoch_1, epoch_2 = ([x["token_ids"].numpy() for x, _ in dataset] for _ in range(2))
    assert not all(np.array_equal(a, b) for a, b in zip(epoch_1, epoch_2))

    class PassesEverything(bertzoo.BertPretrainer):  # Takes `seed` through **kwargs: seeded masks still.
        def preprocess(self, *args, **kwargs):
            return super().preprocess(*args, **kwargs)

    def passed_on():
        keras.utils.set_random_seed(0)
        model = PassesEverything(tiny_backbone(), preprocessor, sentence_objective=None)
        return [x["token_ids"].numpy() for x, _ in model._as_dataset(texts, batch_size=2, training=True)]

    assert all(np.array_equal(a, b) for a, b in zip(passed_on(), first))


def test_errors(preprocessor):
    with pytest.raises(ValueError, match="Unknown `sentence_objective`"):
        bertzoo.BertPretrainer(tiny_backbone(), sentence_objective="next")
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective="nsp")
    with pytest.raises(ValueError, match="needs the pair labels"):
        model.fit((["a"], ["b"]), verbose=0)
    with pytest.raises(ValueError, match="pass sentence pairs"):
        model.fit(["the cat sat"], [0], verbose=0)
    other = BertPreprocessor(BertTokenizer(VOCAB + ["extra"]), sequence_length=20)
    with pytest.raises(ValueError, match="do not belong together"):
        bertzoo.BertPretrainer(tiny_backbone(), other)
    arrays = {"mlm/transform/kernel": np.zeros((32, 32), "float32")}
    with pytest.raises(ValueError, match="mlm/output_bias: missing"):
        model.load_pretraining_heads(arrays)


def test_a_sentence_head_alone_loads_and_leaves_the_masked_lm_head(caplog, rng):
    # E.g. a converted `BertForNextSentencePrediction`: its heads hold `nsp/*` only.
    model = bertzoo.BertPretrainer(tiny_backbone(), sentence_objective="nsp")
    transform_before = np.array(model.mlm_head.transform.kernel)
    arrays = {"nsp/kernel": rng.normal(size=(32, 2)).astype("float32"), "nsp/bias": np.array([0.5, -0.5], "float32")}
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        model.load_pretraining_heads(arrays)
    np.testing.assert_array_equal(model.sentence_head.kernel, arrays["nsp/kernel"])
    np.testing.assert_array_equal(model.sentence_head.bias, arrays["nsp/bias"])
    np.testing.assert_array_equal(model.mlm_head.transform.kernel, transform_before)
    assert "sentence head only" in caplog.text and "the sentence head is loaded" in caplog.text
    caplog.clear()
    masked_lm_only = bertzoo.BertPretrainer(tiny_backbone(), sentence_objective=None)
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        masked_lm_only.load_pretraining_heads(arrays)
    assert "so nothing is loaded" in caplog.text
    with pytest.raises(ValueError, match="nsp/bias: missing"):
        model.load_pretraining_heads({"nsp/kernel": arrays["nsp/kernel"]})


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("masking_rate", 1.5, "`masking_rate` must be a number in \\[0, 1\\]"),
        ("mask_token_rate", 0.95, "`mask_token_rate` \\+ `random_token_rate` = 1.05"),
        ("max_predictions", -3, "`max_predictions` must be a positive integer or None"),
        ("max_predictions", 0, "`max_predictions` must be a positive integer or None"),
        ("sentence_objective", "mlm", "Unknown `sentence_objective` 'mlm'"),
        ("tie_weights", "yes", "`tie_weights` must be True or False"),
    ],
)
def test_bad_head_arguments_are_refused_in_the_constructor_and_in_a_preset(preprocessor, tmp_path, key, value, message):
    for tokenized in (None, preprocessor):
        with pytest.raises(ValueError, match=message):
            bertzoo.BertPretrainer(tiny_backbone(), tokenized, **{key: value})
    bertzoo.BertPretrainer(tiny_backbone(), preprocessor).save_to_preset(tmp_path / "pre")
    config = json.loads((tmp_path / "pre" / "config.json").read_text())
    config["task"]["config"][key] = value
    (tmp_path / "pre" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PresetError, match=f"config.json(.|\\n)*{message}"):
        bertzoo.BertPretrainer.from_preset(tmp_path / "pre")


def test_int8_quantized_model_decodes_with_the_dequantized_table(rng):
    model = bertzoo.BertPretrainer(tiny_backbone(), sentence_objective=None)
    randomize_heads(model)
    x = features(rng)
    quantized = bertzoo.quantize(model, "int8")
    embedding = quantized.backbone.embeddings.token_embedding
    assert embedding.quantization_mode == "int8"
    assert quantized.mlm_head.token_embedding is embedding
    float_logits, int8_logits = np.asarray(model(x)["mlm"]), np.asarray(quantized(x)["mlm"])
    assert np.abs(int8_logits - float_logits).max() < 0.05 * np.abs(float_logits).max()


def test_a_preset_without_pretraining_heads_says_they_start_random(preprocessor, tmp_path, caplog):
    backbone = tiny_backbone()
    backbone.save_to_preset(tmp_path / "encoder")
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        model = bertzoo.BertPretrainer.from_preset(tmp_path / "encoder", preprocessor=preprocessor)
    assert "has no pre-training heads" in caplog.text and "masked-LM and sentence heads start randomly" in caplog.text
    assert "`predict_masked` gives meaningless tokens" in caplog.text
    caplog.clear()
    model.save_to_preset(tmp_path / "pretrainer")  # Heads saved with it: they load silently.
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        bertzoo.BertPretrainer.from_preset(tmp_path / "pretrainer")
    assert "pre-training heads" not in caplog.text
    # Saved heads of another objective: one warning, that the new sentence head starts random (the preset has heads).
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        bertzoo.BertPretrainer.from_preset(tmp_path / "pretrainer", sentence_objective="sop")
    assert "the saved masked-LM head is kept; the 'sop' sentence head is new, randomly initialized" in caplog.text
    assert "no pre-training heads" not in caplog.text


def test_sample_weight_is_one_weight_per_example_on_every_slot_and_the_sentence_loss(preprocessor, rng):
    model = bertzoo.BertPretrainer(tiny_backbone(), sentence_objective="nsp")
    randomize_heads(model)
    model.compile(jit_compile=False)
    x = features(rng)
    labels = rng.integers(0, len(VOCAB), (3, 4)).astype("int32")
    labels[0, 2:] = -100
    nsp = np.array([0, 1, 1], "int32")
    weights = np.array([1.0, 2.5, 0.0], "float32")
    y = {"mlm": labels, "sentence": nsp}
    mlm, sentence = numpy_heads(model, x)
    valid = labels != -100
    slot_losses = -np.take_along_axis(log_softmax(mlm), np.where(valid, labels, 0)[..., None], -1)[..., 0]
    # Keras's weighted mean: the weighted sum over the real slots (examples), divided by their number.
    expected = (slot_losses * weights[:, None])[valid].sum() / valid.sum()
    expected += (-log_softmax(sentence)[np.arange(3), nsp] * weights).sum() / 3
    loss = model.compute_loss(x=x, y=y, y_pred=model(x), sample_weight=weights)
    assert float(loss) == pytest.approx(expected, rel=1e-4)
    # Through evaluate (the metrics weigh the same way), and with as many slots as examples, where
    # the weights once went on the slot columns without an error.
    assert model.evaluate(x, y, sample_weight=weights, batch_size=3, verbose=0)[0] == pytest.approx(expected, rel=1e-4)
    square = dict(x, mask_positions=x["mask_positions"][:, :3])
    y_square = {"mlm": labels[:, :3], "sentence": nsp}
    mlm_square, _ = numpy_heads(model, square)
    losses = -np.take_along_axis(log_softmax(mlm_square), np.where(valid[:, :3], labels[:, :3], 0)[..., None], -1)
    expected_square = (losses[..., 0] * weights[:, None])[valid[:, :3]].sum() / valid[:, :3].sum()
    results = model.evaluate(square, y_square, sample_weight=weights, batch_size=3, verbose=0, return_dict=True)
    assert results["mlm_loss"] == pytest.approx(expected_square, rel=1e-4)

    # Raw sentence pairs, in memory and in a dataset: weights of zero leave nothing to learn from.
    trained = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective="nsp")
    trained.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)  # No weight decay.
    first, second, pair_labels = bertzoo.sentence_pairs(DOCUMENTS[:8], "nsp", seed=0)
    zeros = np.zeros(len(pair_labels), "float32")
    before = [w.copy() for w in trained.get_weights()]
    history = trained.fit((first, second), pair_labels, sample_weight=zeros, batch_size=8, verbose=0).history
    assert history["loss"] == [0.0]
    assert all(np.array_equal(a, b) for a, b in zip(before, trained.get_weights()))
    dataset = tf.data.Dataset.from_tensor_slices(((first, second), pair_labels, zeros + 1)).batch(8)
    assert np.isfinite(trained.evaluate(dataset, verbose=0)[0])
    mlm_only = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective=None)
    with pytest.raises(ValueError, match="masked-LM-only BertPretrainer .* takes no `sample_weight` with raw text"):
        mlm_only.fit(first, sample_weight=zeros, verbose=0)


def test_evaluation_masks_the_same_way_on_every_pass(preprocessor):
    texts = [" ".join(WORDS[i % 7 : i % 7 + 6]) for i in range(12)]
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective=None)
    model.compile(optimizer=keras.optimizers.SGD(0.0), jit_compile=False)
    first = model.evaluate(texts, batch_size=4, verbose=0)
    keras.utils.set_random_seed(7)  # Whatever the global seed.
    assert model.evaluate(texts, batch_size=4, verbose=0) == first
    # With frozen weights, the validation loss is the same every epoch (it moved from epoch to epoch).
    history = model.fit(texts, validation_data=(texts,), batch_size=4, epochs=2, verbose=0).history
    assert history["val_loss"][0] == history["val_loss"][1] == pytest.approx(first[0], rel=1e-6)
    assert history["loss"][0] != history["loss"][1]  # Training still masks afresh every epoch.
    pairs = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective="nsp")
    a = pairs.predict((texts[:4], texts[4:8]), verbose=0)
    b = pairs.predict((texts[:4], texts[4:8]), verbose=0)
    np.testing.assert_array_equal(a["mlm"], b["mlm"])
    np.testing.assert_array_equal(a["sentence"], b["sentence"])


def test_a_changed_sentence_objective_keeps_the_saved_masked_lm_head(preprocessor, tmp_path, rng, caplog):
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective="nsp")
    randomize_heads(model, seed=5)
    model.save_to_preset(tmp_path / "pre")
    x = features(rng)
    saved = model(x)
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        mlm_only = bertzoo.BertPretrainer.from_preset(tmp_path / "pre", sentence_objective=None)
    assert "the saved masked-LM head is kept (this model has no sentence head)" in caplog.text
    np.testing.assert_allclose(mlm_only(x)["mlm"], saved["mlm"], atol=1e-6)
    sop = bertzoo.BertPretrainer.from_preset(tmp_path / "pre", sentence_objective="sop")
    np.testing.assert_allclose(sop(x)["mlm"], saved["mlm"], atol=1e-6)
    assert not np.allclose(sop(x)["sentence"], saved["sentence"])  # Another objective: a new sentence head.
    # An untied decoder starts as the tied one was (the token embedding), and back again.
    untied = bertzoo.BertPretrainer.from_preset(tmp_path / "pre", sentence_objective=None, tie_weights=False)
    np.testing.assert_allclose(untied(x)["mlm"], saved["mlm"], atol=1e-5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertzoo"):  # The same objective: its sentence head stays too.
        untied_nsp = bertzoo.BertPretrainer.from_preset(tmp_path / "pre", tie_weights=False)
    assert "masked-LM and sentence heads are kept; the untied decoder starts as a copy" in caplog.text
    np.testing.assert_allclose(untied_nsp(x)["mlm"], saved["mlm"], atol=1e-5)
    np.testing.assert_allclose(untied_nsp(x)["sentence"], saved["sentence"], atol=1e-6)
    untied.mlm_head.decoder_kernel.assign(untied.mlm_head.decoder_kernel * 2.0)
    untied.save_to_preset(tmp_path / "untied")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        tied = bertzoo.BertPretrainer.from_preset(tmp_path / "untied", tie_weights=True)
    assert "that kernel is not used" in caplog.text
    np.testing.assert_allclose(tied(x)["mlm"], saved["mlm"], atol=1e-5)
    # A quantized head holds integer kernels, no float weights to copy: a new head, said so.
    quantized = bertzoo.BertPretrainer.from_preset(tmp_path / "pre")
    quantized.quantize("int8")
    quantized.save_to_preset(tmp_path / "int8")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        fresh = bertzoo.BertPretrainer.from_preset(tmp_path / "int8", sentence_objective=None)
    assert "the saved head's weights are not used" in caplog.text
    assert not np.allclose(fresh.mlm_head.transform.kernel.numpy(), model.mlm_head.transform.kernel.numpy(), atol=0.05)


def test_a_masked_lm_only_model_trains_on_a_dataset_of_plain_strings_and_resumes_with_fresh_masks(
    preprocessor, tmp_path, monkeypatch
):
    texts = [" ".join(WORDS[i % 7 : i % 7 + 6]) for i in range(8)]
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective=None)
    model.compile(jit_compile=False)
    history = model.fit(tf.data.Dataset.from_tensor_slices(texts).batch(4), epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert np.isfinite(model.evaluate(tf.data.Dataset.from_tensor_slices(texts).batch(4), verbose=0)[0])
    # ResumableTraining's data is training data: masks drawn afresh, not evaluation's fixed ones.
    made = []
    as_dataset = model._as_dataset
    monkeypatch.setattr(model, "_as_dataset", lambda *a, **k: made.append(k.get("training")) or as_dataset(*a, **k))
    model.fit(texts, batch_size=4, epochs=1, verbose=0, callbacks=[bertzoo.ResumableTraining(tmp_path / "backup")])
    assert made == [True]


def test_label_seed_and_rate_errors(preprocessor):
    model = bertzoo.BertPretrainer(tiny_backbone(), preprocessor, sentence_objective="nsp")
    with pytest.raises(ValueError, match="Sentence-pair labels must be integer ids .* got <U1 values"):
        model.fit((["a", "b"], ["c", "d"]), ["0", "1"], verbose=0)
    with pytest.raises(ValueError, match=r"`seed` must be a stateless seed of shape \(2,\).*got shape \[\]"):
        model.masker(np.array([[2, 7, 8, 3]], "int32"), seed=3)
