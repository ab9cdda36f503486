"""Hugging Face BERT / ALBERT directories -> bertzoo presets, with numerical parity."""

import datetime
import json
from pathlib import Path

import keras
import keras_hub
import numpy as np
import pytest

import bertzoo
from bertzoo.saving.preset import PRETRAINING_HEADS_FILE
from bertzoo.saving.preset import Preset

# Real weights, shared by all developers at ../shared (absent on a fresh machine).
MINILM = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "all-MiniLM-L6-v2"

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The stock market fell sharply on Monday.",
    "Naïve café owners don't like rainy weekends, isn't it?",
]

needs_minilm = pytest.mark.skipif(
    not (MINILM / "model.safetensors").is_file(), reason=f"{MINILM} is absent (../shared not mounted)"
)


# --- Real weights: all-MiniLM-L6-v2 ---------------------------------------------


@pytest.fixture(scope="module")
def minilm_preset(tmp_path_factory):
    return bertzoo.convert_checkpoint(MINILM, tmp_path_factory.mktemp("minilm") / "preset")


@pytest.fixture(scope="module")
def minilm_inputs(minilm_preset):
    preprocessor = Preset.resolve(minilm_preset.path).build_preprocessor(sequence_length=24)
    return {k: np.asarray(v) for k, v in preprocessor(SENTENCES).items()}


def keras_hub_minilm(exact_gelu):
    """keras-hub's BertBackbone with the MiniLM weights, mapped here by hand
    from the safetensors file (independently of bertzoo.convert)."""
    from safetensors.numpy import load_file

    hf = json.loads((MINILM / "config.json").read_text())
    w = load_file(str(MINILM / "model.safetensors"))
    H, A, L = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    kh = keras_hub.models.BertBackbone(
        vocabulary_size=hf["vocab_size"],
        num_layers=L,
        num_heads=A,
        hidden_dim=H,
        intermediate_dim=hf["intermediate_size"],
        max_sequence_length=hf["max_position_embeddings"],
        num_segments=hf["type_vocab_size"],
    )
    by_path = {v.path: v for v in kh.weights}

    def put(path, array):
        by_path[path].assign(np.reshape(array, by_path[path].shape))

    put("token_embedding/embeddings", w["embeddings.word_embeddings.weight"])
    put("position_embedding/embeddings", w["embeddings.position_embeddings.weight"])
    put("segment_embedding/embeddings", w["embeddings.token_type_embeddings.weight"])
    put("embeddings_layer_norm/gamma", w["embeddings.LayerNorm.weight"])
    put("embeddings_layer_norm/beta", w["embeddings.LayerNorm.bias"])
    for i in range(L):
        t, p = f"transformer_layer_{i}", f"encoder.layer.{i}."
        for ours, theirs in (
            ("self_attention_layer/query", "attention.self.query"),
            ("self_attention_layer/key", "attention.self.key"),
            ("self_attention_layer/value", "attention.self.value"),
            ("self_attention_layer/attention_output", "attention.output.dense"),
            ("feedforward_intermediate_dense", "intermediate.dense"),
            ("feedforward_output_dense", "output.dense"),
        ):
            put(f"{t}/{ours}/kernel", w[f"{p}{theirs}.weight"].T)
            put(f"{t}/{ours}/bias", w[f"{p}{theirs}.bias"])
        for ours, theirs in (
            ("self_attention_layer_norm", "attention.output.LayerNorm"),
            ("feedforward_layer_norm", "output.LayerNorm"),
        ):
            put(f"{t}/{ours}/gamma", w[f"{p}{theirs}.weight"])
            put(f"{t}/{ours}/beta", w[f"{p}{theirs}.bias"])
        if exact_gelu:
            # keras-hub's BertBackbone hard-codes the tanh GELU; MiniLM was
            # trained with the exact one (hidden_act "gelu").
            kh.get_layer(t)._feedforward_intermediate_dense.activation = lambda x: keras.activations.gelu(
                x, approximate=False
            )
    put("pooled_dense/kernel", w["pooler.dense.weight"].T)
    put("pooled_dense/bias", w["pooler.dense.bias"])
    return kh


def sentence_embeddings(backbone, inputs):
    hidden = np.asarray(backbone(inputs)["sequence_output"], dtype="float64")
    mask = inputs["padding_mask"].astype("float64")[:, :, None]
    mean = (hidden * mask).sum(1) / mask.sum(1)
    return mean / np.linalg.norm(mean, axis=-1, keepdims=True)


@needs_minilm
def test_minilm_matches_keras_hub_on_real_sentences(minilm_preset, minilm_inputs):
    backbone = bertzoo.BertBackbone.from_preset(minilm_preset.path)
    assert backbone.activation == "gelu_exact" and backbone.num_layers == 6
    ours = backbone(minilm_inputs)
    theirs = keras_hub_minilm(exact_gelu=True)(minilm_inputs)
    diff = {
        key: float(np.abs(np.asarray(ours[key]) - np.asarray(theirs[key])).max())
        for key in ("sequence_output", "pooled_output")
    }
    print(f"MiniLM bertzoo vs keras-hub (exact GELU) max abs diff: {diff}")
    assert diff["sequence_output"] < 1e-4 and diff["pooled_output"] < 1e-4
    # The activation matters at this tolerance: keras-hub's own (tanh) GELU misses it.
    approximate = keras_hub_minilm(exact_gelu=False)(minilm_inputs)["sequence_output"]
    assert np.abs(np.asarray(ours["sequence_output"]) - np.asarray(approximate)).max() > 1e-4


@needs_minilm
def test_minilm_sentence_embedding_is_unit_length_and_survives_save_load(minilm_preset, minilm_inputs, tmp_path):
    backbone = bertzoo.BertBackbone.from_preset(minilm_preset.path)
    embeddings = sentence_embeddings(backbone, minilm_inputs)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-6)
    similarity = embeddings @ embeddings.T
    # Real weights: the two guitar sentences are each other's nearest neighbour.
    assert similarity[0, 1] > similarity[0, 2] + 0.3 and similarity[0, 1] > similarity[1, 2] + 0.3

    backbone.save_to_preset(tmp_path / "again")
    reloaded = bertzoo.BertBackbone.from_preset(tmp_path / "again")
    np.testing.assert_allclose(sentence_embeddings(reloaded, minilm_inputs), embeddings, atol=1e-6)


@needs_minilm
def test_minilm_preset_is_an_ordinary_preset(minilm_preset, minilm_inputs):
    preset = Preset.resolve(minilm_preset.path)
    assert preset.vocabulary() == bertzoo.text.load_vocabulary(MINILM / "vocab.txt")
    preprocessor = preset.build_preprocessor()
    assert (preprocessor.sequence_length, preprocessor.tokenizer.lowercase) == (128, True)
    source = preset.metadata["source"]
    assert source["format"] == "huggingface" and source["path"] == str(MINILM.resolve())
    datetime.datetime.fromisoformat(source["converted"])
    assert preset.metadata["conversion"]["skipped"] == {
        "embeddings.position_ids": "a constant buffer (position/segment ids), not a weight"
    }
    assert not preset.has_arrays()  # A sentence-embedding model: no pre-training heads.

    classifier = bertzoo.BertClassifier.from_preset(minilm_preset.path, num_classes=2)
    assert classifier.preprocessor is not None
    np.testing.assert_array_equal(
        classifier.backbone.token_embedding.embeddings.numpy(),
        bertzoo.BertBackbone.from_preset(minilm_preset.path).token_embedding.embeddings.numpy(),
    )
    assert classifier(minilm_inputs).shape == (len(SENTENCES), 2)


@needs_minilm
def test_converting_twice_gives_byte_identical_weights(minilm_preset, tmp_path):
    again = bertzoo.convert_checkpoint(MINILM, tmp_path / "again")
    first, second = Preset.resolve(minilm_preset.path), Preset.resolve(again.path)
    name = "model.weights.h5"
    assert (first.directory / name).read_bytes() == (second.directory / name).read_bytes()
    assert first.metadata["files"][name]["sha256"] == second.metadata["files"][name]["sha256"]


# --- Tiny random checkpoints, against an independent NumPy forward pass ----------


@pytest.mark.parametrize(
    "hidden_act, activation, prefix, legacy",
    [("gelu", "gelu_exact", "bert.", True), ("gelu_new", "gelu_tanh", "", False)],
)
def test_hf_bert_matches_numpy(ref, rng, make_bert_inputs, tmp_path, hidden_act, activation, prefix, legacy):
    model = ref.random_model(rng, num_layers=2)
    source = ref.write_hf(
        tmp_path / "hf",
        ref.hf_config(model, hidden_act=hidden_act, layer_norm_eps=1e-6),
        ref.hf_bert_arrays(model, prefix=prefix, legacy_norm_names=legacy),
        vocabulary=ref.tiny_vocabulary(40),
        tokenizer_config={"do_lower_case": False, "tokenize_chinese_chars": False},
    )
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    backbone = bertzoo.BertBackbone.from_preset(result.path)
    assert (backbone.activation, backbone.layer_norm_epsilon) == (activation, 1e-6)
    inputs = make_bert_inputs(batch=2, length=10, vocabulary_size=40, lengths=[10, 6])
    diff = ref.max_difference(backbone, model, inputs, activation, eps=1e-6)
    print(f"HF BERT ({hidden_act}) vs NumPy max abs diff: {diff:.2e}")
    assert diff < 1e-5

    preset = Preset.resolve(result.path)
    tokenizer = preset.config["preprocessor"]["config"]["tokenizer"]["config"]
    assert tokenizer["lowercase"] is False and tokenizer["split_on_cjk"] is False
    heads = preset.load_arrays(PRETRAINING_HEADS_FILE)
    np.testing.assert_array_equal(heads["nsp/kernel"], model["heads"]["nsp"][0])
    np.testing.assert_array_equal(heads["mlm/transform/kernel"], model["heads"]["transform"][0])
    np.testing.assert_array_equal(heads["mlm/output_bias"], model["heads"]["output_bias"])
    assert "mlm/decoder/kernel" not in heads  # Tied to the token embedding.
    assert set(preset.metadata["conversion"]["pretraining_heads"]) == set(heads)
    skipped = preset.metadata["conversion"]["skipped"]
    assert "tied to the token embedding" in skipped["cls.predictions.decoder.weight"]
    assert "copy of" in skipped["cls.predictions.decoder.bias"]
    summary = str(result)
    assert PRETRAINING_HEADS_FILE in summary and "nsp/kernel <- cls.seq_relationship.weight" in summary


def test_a_masked_lm_checkpoint_without_a_pooler_converts_with_a_note(ref, rng, make_bert_inputs, tmp_path):
    # Hugging Face's BertForMaskedLM saves its encoder without the pooler (run_mlm.py's checkpoints).
    model = ref.random_model(rng, num_layers=2)
    arrays = ref.hf_bert_arrays(model, prefix="bert.")
    full = ref.write_hf(tmp_path / "full", ref.hf_config(model), arrays, vocabulary=ref.tiny_vocabulary(40))
    no_pooler = {k: v for k, v in arrays.items() if ".pooler." not in k}
    assert len(no_pooler) == len(arrays) - 2
    mlm = ref.write_hf(tmp_path / "mlm", ref.hf_config(model), no_pooler, vocabulary=ref.tiny_vocabulary(40))
    result = bertzoo.convert_checkpoint(mlm, tmp_path / "mlm_preset")
    assert "no pooler" in str(result) and "fine-tune before using it" in str(result)
    inputs = make_bert_inputs(batch=2, length=10, vocabulary_size=40, lengths=[10, 6])
    ours = bertzoo.BertBackbone.from_preset(result.path)(inputs)["sequence_output"]
    reference = bertzoo.BertBackbone.from_preset(bertzoo.convert_checkpoint(full, tmp_path / "full_preset").path)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(reference(inputs)["sequence_output"]))
    # Half a pooler is damage, still refused.
    half = {k: v for k, v in arrays.items() if not k.endswith("pooler.dense.bias")}
    damaged = ref.write_hf(tmp_path / "half", ref.hf_config(model), half, vocabulary=ref.tiny_vocabulary(40))
    with pytest.raises(bertzoo.convert.ConversionError, match=r"(?s)Missing tensors.*pooler\.dense\.bias"):
        bertzoo.convert_checkpoint(damaged, tmp_path / "half_preset")


def keras_hub_albert(model, num_layers):
    """keras-hub's AlbertBackbone with the random weights, mapped here by hand."""
    s = model["sizes"]
    kh = keras_hub.models.AlbertBackbone(
        vocabulary_size=s["V"],
        num_layers=num_layers,
        num_heads=s["A"],
        embedding_dim=s["E"],
        hidden_dim=s["H"],
        intermediate_dim=s["I"],
        num_groups=len(model["sets"]),
        max_sequence_length=s["P"],
        num_segments=s["T"],
    )
    by_path = {v.path: v for v in kh.weights}

    def put(path, array):
        by_path[path].assign(np.reshape(array, by_path[path].shape))

    put("token_embedding/embeddings", model["word"])
    put("position_embedding/embeddings", model["position"])
    put("segment_embedding/embeddings", model["segment"])
    put("embeddings_layer_norm/gamma", model["embedding_norm"][0])
    put("embeddings_layer_norm/beta", model["embedding_norm"][1])
    put("embedding_projection/kernel", model["projection"][0])
    put("embedding_projection/bias", model["projection"][1])
    for g, w in enumerate(model["sets"]):
        t = f"group_{g}_inner_layer_0"
        for ours, name in (
            ("self_attention_layer/query", "query"),
            ("self_attention_layer/key", "key"),
            ("self_attention_layer/value", "value"),
            ("self_attention_layer/attention_output", "output"),
            ("feedforward_intermediate_dense", "intermediate"),
            ("feedforward_output_dense", "ffn_output"),
        ):
            put(f"{t}/{ours}/kernel", w[name][0])
            put(f"{t}/{ours}/bias", w[name][1])
        for ours, name in (("self_attention_layer_norm", "attention_norm"), ("feedforward_layer_norm", "ffn_norm")):
            put(f"{t}/{ours}/gamma", w[name][0])
            put(f"{t}/{ours}/beta", w[name][1])
    put("pooled_dense/kernel", model["pooler"][0])
    put("pooled_dense/bias", model["pooler"][1])
    return kh


def test_hf_albert_matches_numpy_and_keras_hub(ref, rng, make_bert_inputs, tmp_path):
    # 4 layers in 2 groups of shared weights, factorized embeddings E=8 < H=16.
    model = ref.random_model(rng, num_layers=4, num_sets=2, embedding=8)
    source = ref.write_hf(tmp_path / "albert", ref.hf_config(model, "albert"), ref.hf_albert_arrays(model))
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    backbone = bertzoo.BertBackbone.from_preset(result.path)
    assert (backbone.embedding_dim, backbone.num_groups, backbone.activation) == (8, 2, "gelu_tanh")
    assert len(backbone.attention_blocks) == 2
    inputs = make_bert_inputs(batch=2, length=9, vocabulary_size=40, lengths=[9, 4])
    diff_numpy = ref.max_difference(backbone, model, inputs, "gelu_tanh")
    theirs = keras_hub_albert(model, num_layers=4)(inputs)
    ours = backbone(inputs)
    diff_keras_hub = max(
        float(np.abs(np.asarray(ours[k]) - np.asarray(theirs[k])).max()) for k in ("sequence_output", "pooled_output")
    )
    print(f"HF ALBERT vs NumPy max abs diff: {diff_numpy:.2e}; vs keras-hub: {diff_keras_hub:.2e}")
    assert diff_numpy < 1e-5 and diff_keras_hub < 1e-5

    preset = Preset.resolve(result.path)
    heads = preset.load_arrays()
    assert heads["mlm/transform/kernel"].shape == (16, 8)  # ALBERT's head maps H -> E.
    np.testing.assert_array_equal(heads["nsp/kernel"], model["heads"]["nsp"][0])
    assert preset.metadata["conversion"]["pretraining_heads"]["nsp/bias"] == "sop_classifier.classifier.bias"
    assert not result.has_vocabulary and "no vocabulary" in str(result)
    # As the summary says: its tasks load without a preprocessor and take tokenized inputs.
    assert Preset.resolve(result.path).config["preprocessor"] is None
    classifier = bertzoo.BertClassifier.from_preset(result.path, num_classes=2)
    assert classifier.preprocessor is None and classifier.predict(inputs, verbose=0).shape == (2, 2)


def test_hf_albert_with_spiece_model_fits_raw_strings(ref, rng, tmp_path):
    model = ref.random_model(rng, num_layers=2, num_sets=1, embedding=8)
    source = ref.write_hf(tmp_path / "albert", ref.hf_config(model, "albert"), ref.hf_albert_arrays(model))
    (source / "spiece.model").write_bytes(ref.sentencepiece_model(40))
    (source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "keep_accents": False}))
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    assert result.has_vocabulary
    # The preset keeps the model as a file (checksummed), not inside config.json.
    assert (result.path / "sentencepiece.model").read_bytes() == (source / "spiece.model").read_bytes()
    assert "sentencepiece.model" in Preset.resolve(result.path).metadata["files"]
    assert '"proto": "sentencepiece.model"' in (result.path / "config.json").read_text()
    classifier = bertzoo.BertClassifier.from_preset(result.path, sequence_length=16)
    tokenizer = classifier.preprocessor.tokenizer
    assert isinstance(tokenizer, bertzoo.text.SentencePieceTokenizer)
    assert tokenizer.lowercase and tokenizer.strip_accents and tokenizer.split_digit_comma
    texts, labels = ["the quick brown fox", "the lazy dog sat", "Blue sky over the park", "cat jumps"], [1, 0, 1, 0]
    history = classifier.fit(texts, labels, epochs=2, batch_size=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert classifier.predict(texts, verbose=0).shape == (4, 2)
    classifier.save_to_preset(tmp_path / "tuned")
    again = bertzoo.BertClassifier.from_preset(tmp_path / "tuned")
    np.testing.assert_allclose(again.predict(texts, verbose=0), classifier.predict(texts, verbose=0), atol=1e-5)
    (tmp_path / "tuned" / "sentencepiece.model").write_bytes(ref.sentencepiece_model(40)[:-7] + b"changed")
    with pytest.raises(bertzoo.PresetError, match="sentencepiece.model"):
        bertzoo.BertClassifier.from_preset(tmp_path / "tuned")


def test_spiece_model_larger_than_the_table_is_refused_and_a_smaller_one_converts(ref, rng, tmp_path):
    model = ref.random_model(rng, num_layers=1, num_sets=1, embedding=8)
    source = ref.write_hf(tmp_path / "albert", ref.hf_config(model, "albert"), ref.hf_albert_arrays(model))
    (source / "spiece.model").write_bytes(ref.sentencepiece_model(44))
    with pytest.raises(bertzoo.convert.ConversionError, match="model has 44 tokens but the embedding table only 40"):
        bertzoo.convert_checkpoint(source, tmp_path / "preset")
    (source / "spiece.model").write_bytes(ref.sentencepiece_model(38))  # A table padded past its pieces.
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    assert bertzoo.BertBackbone.from_preset(result.path).vocabulary_size == 40


def test_hf_albert_inner_groups_become_unshared_layers(ref, rng, make_bert_inputs, tmp_path):
    # 2 layers, 2 groups, 2 inner layers per group: 4 distinct sub-layers in a row.
    model = ref.random_model(rng, num_layers=4, num_sets=4, embedding=8)
    config = ref.hf_config(model, "albert", num_hidden_layers=2, num_hidden_groups=2, inner_group_num=2)
    source = ref.write_hf(tmp_path / "albert", config, ref.hf_albert_arrays(model, inner_group_num=2, heads=False))
    backbone = bertzoo.BertBackbone.from_preset(bertzoo.convert_checkpoint(source, tmp_path / "preset").path)
    assert (backbone.num_layers, backbone.num_groups) == (4, 4)
    inputs = make_bert_inputs(batch=2, length=7, vocabulary_size=40, lengths=[7, 3])
    assert ref.max_difference(backbone, model, inputs, "gelu_tanh") < 1e-5


def test_albert_sentencepiece_preset_distils_and_exports(ref, rng, tmp_path):
    import tensorflow as tf

    model = ref.random_model(rng, num_layers=2, num_sets=2, embedding=8)
    source = ref.write_hf(tmp_path / "albert", ref.hf_config(model, "albert"), ref.hf_albert_arrays(model))
    (source / "spiece.model").write_bytes(ref.sentencepiece_model(40))
    preset = bertzoo.convert_checkpoint(source, tmp_path / "preset").path
    teacher = bertzoo.BertClassifier.from_preset(preset, sequence_length=16)
    student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 1, "num_groups": 1})
    texts, labels = ["the quick brown fox", "the lazy dog sat", "blue sky over the park", "cat jumps"], [1, 0, 1, 0]
    history = bertzoo.Distiller(teacher, student).fit(texts, labels, epochs=1, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    exported = student.export(tmp_path / "serving" / "1")
    served = tf.saved_model.load(str(exported)).signatures["serving_default"](text=tf.constant(texts))
    np.testing.assert_allclose(served["logits"].numpy(), student.predict(texts, verbose=0), atol=1e-5)
    # `bertzoo quantize` keeps the backbone preset's SentencePiece tokenizer.
    from bertzoo import cli

    assert cli.main(["quantize", str(preset), str(tmp_path / "int8")]) == 0
    assert (tmp_path / "int8" / "sentencepiece.model").read_bytes() == (preset / "sentencepiece.model").read_bytes()
    quantized = bertzoo.BertClassifier.from_preset(tmp_path / "int8", sequence_length=16)
    assert quantized.predict(texts, verbose=0).shape == (4, 2)
