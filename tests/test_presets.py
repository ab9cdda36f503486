"""Preset format 2 (Keras serialization, each weight stored once) and the
reader for format 1, tested on presets written by the format-1 code."""

import json
import logging
import re
import shutil
import sys
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import PresetFileNotFoundError

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "format1_expected.json").read_text())
INPUTS = {k: np.asarray(v, "int32") for k, v in EXPECTED["inputs"].items()}


def h5_datasets(path):
    names = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


@pytest.mark.parametrize("name", ["format1_classifier", "format1_classifier_int8"])
def test_format1_presets_load_with_the_recorded_predictions(name, tmp_path):
    preset = Preset.resolve(FIXTURES / name)
    assert preset.format_version == 1 and preset.class_name == "BertClassifier"
    model = bertzoo.BertClassifier.from_preset(FIXTURES / name)
    assert model.class_names == ["a", "b", "c"]
    predictions = model.predict(INPUTS, verbose=0)
    if name.endswith("int8"):
        # int8 products round differently on another CPU (an AVX2-only AMD EPYC gave 0.12 away from the
        # recorded logits, XLA and the fused kernel alike): here the loaded int8 weights must equal
        # quantizing the float fixture here, and the recording holds to its own int8 error.
        float_model = bertzoo.BertClassifier.from_preset(FIXTURES / "format1_classifier")
        fresh = bertzoo.quantize(float_model, "int8").predict(INPUTS, verbose=0)
        np.testing.assert_allclose(predictions, fresh, atol=1e-5)
        int8_error = np.abs(np.subtract(EXPECTED[name], EXPECTED["format1_classifier"])).max()
        assert np.abs(predictions - np.asarray(EXPECTED[name])).max() <= int8_error
    else:
        np.testing.assert_allclose(predictions, EXPECTED[name], atol=1e-5)
    features = model.preprocessor(EXPECTED["texts"])
    assert features["token_ids"].numpy().tolist() == EXPECTED["inputs"]["token_ids"]
    if name.endswith("int8"):
        assert preset.quantization["mode"] == "int8" and "logits" in preset.quantization["layers"]
        assert model.output_dense.quantization_mode == "int8"
        assert model.backbone.attention_blocks[0].query_dense.quantization_mode == "int8"

    # Saved again, it is a format-2 preset with the same predictions.
    model.save_to_preset(tmp_path / "again")
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["format_version"] == 2
    again = bertzoo.BertClassifier.from_preset(tmp_path / "again")
    np.testing.assert_allclose(again.predict(INPUTS, verbose=0), predictions, atol=1e-5)
    backbone = bertzoo.BertBackbone.from_preset(FIXTURES / name)
    np.testing.assert_array_equal(
        backbone(INPUTS)["pooled_output"].numpy(), model.backbone(INPUTS)["pooled_output"].numpy()
    )


def test_format2_stores_each_weight_once(tmp_path):
    model = bertzoo.BertClassifier.from_preset(FIXTURES / "format1_classifier")
    model.save_to_preset(tmp_path / "p")
    backbone_names = h5_datasets(tmp_path / "p" / "model.weights.h5")
    head_names = h5_datasets(tmp_path / "p" / "task.weights.h5")
    assert len(head_names) == 2  # The logits layer's kernel and bias.
    assert len(backbone_names) == len(model.backbone.weights)
    old = FIXTURES / "format1_classifier"
    new = tmp_path / "p"
    size = lambda d: sum(p.stat().st_size for p in d.iterdir())
    assert size(new) < 0.65 * size(old)


def test_format2_config_is_keras_serialization(tmp_path):
    model = bertzoo.BertClassifier.from_preset(FIXTURES / "format1_classifier_int8")
    model.save_to_preset(tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert sorted(config) == ["backbone", "format_version", "preprocessor", "task"]
    assert config["backbone"]["registered_name"] == "bertzoo>BertBackbone"
    assert config["task"]["registered_name"] == "bertzoo>BertClassifier"
    assert "backbone" not in config["task"]["config"] and "preprocessor" not in config["task"]["config"]
    assert config["preprocessor"]["config"]["tokenizer"]["config"]["vocabulary"] == "vocabulary.txt"
    backbone_map = config["backbone"]["config"]["dtype"]
    assert backbone_map["class_name"] == "DTypePolicyMap"
    assert "attention_0/query" in backbone_map["config"]["policy_map"]
    assert list(config["task"]["config"]["dtype"]["config"]["policy_map"]) == ["logits"]
    # The task's config rebuilds the quantized task (keras.saving round trip).
    clone = bertzoo.BertClassifier.from_config(model.get_config())
    assert clone.output_dense.quantization_mode == "int8"
    assert clone.backbone.embeddings.token_embedding.quantization_mode == "int8"


@pytest.mark.parametrize(
    "node",
    [
        {"module": "os", "class_name": "system", "config": {}, "registered_name": None},
        {"module": "evil_module_xyz", "class_name": "BertBackbone", "config": {}, "registered_name": None},
        {"module": "keras.layers", "class_name": "Dense", "config": {}, "registered_name": "other>Dense"},
        {"module": "bertzoo.models", "class_name": "Nope", "config": {}, "registered_name": "bertzoo>Nope"},
        {"module": "keras.layers", "class_name": "__lambda__", "config": {"code": "1"}, "registered_name": None},
    ],
)
def test_configs_naming_other_classes_are_refused_before_any_import(node, tmp_path):
    directory = tmp_path / "p"
    shutil.copytree(FIXTURES / "format1_classifier", directory)
    (directory / "metadata.json").unlink()
    preset = Preset.resolve(directory)
    preset.config["backbone"]["config"]["activation"] = node  # Nested anywhere.
    with pytest.raises(ValueError, match="file is refused"):
        preset.build_backbone()
    config = preset.config
    (directory / "config.json").write_text(json.dumps({**config, "format_version": 2, "backbone": node}))
    with pytest.raises(ValueError, match="file is refused"):
        bertzoo.BertBackbone.from_preset(directory)
    assert "evil_module_xyz" not in sys.modules


def test_newer_formats_are_refused(tmp_path):
    shutil.copytree(FIXTURES / "format1_classifier", tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    (tmp_path / "p" / "config.json").write_text(json.dumps({**config, "format_version": 3}))
    with pytest.raises(ValueError, match="newer bertzoo"):
        Preset.resolve(tmp_path / "p")


def test_saving_never_replaces_a_directory_that_is_not_a_preset(tmp_path):
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    target = tmp_path / "work"
    (target / "data").mkdir(parents=True)
    (target / "data" / "important.csv").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a bertzoo preset"):
        model.save_to_preset(target)
    assert (target / "data" / "important.csv").read_text() == "keep me"
    model.save_to_preset(tmp_path / "p")
    model.save_to_preset(tmp_path / "p")  # A preset is replaced, as before.
    # Not with files of yours beside it: notes, an export (they were deleted).
    (tmp_path / "p" / "NOTES.md").write_text("eval results")
    (tmp_path / "p" / "export").mkdir()
    (tmp_path / "p" / "export" / "saved_model.pb").write_text("mine")
    before = sorted(path.name for path in (tmp_path / "p").iterdir())
    with pytest.raises(FileExistsError, match=r"holds a bertzoo preset and other files \(NOTES.md, export/\)"):
        model.save_to_preset(tmp_path / "p")
    assert sorted(path.name for path in (tmp_path / "p").iterdir()) == before
    assert (tmp_path / "p" / "export" / "saved_model.pb").read_text() == "mine"
    # Nor a preset inside a preset (the outer one could not be saved again), however the path is spelled.
    for inner in (tmp_path / "p" / "inner", tmp_path / "p" / "export" / ".." / "inner"):
        with pytest.raises(FileExistsError, match=r"lies inside the preset .*p\b"):
            model.save_to_preset(inner)
    assert not (tmp_path / "p" / "inner").exists()
    model.save_to_preset(tmp_path / "p" / ".." / "beside")  # Beside it, through "..": fine.
    assert (tmp_path / "beside" / "config.json").is_file()
    (tmp_path / "empty").mkdir()
    model.save_to_preset(tmp_path / "empty")  # So is an empty directory.
    assert (tmp_path / "empty" / "config.json").is_file()


@pytest.mark.parametrize("vocabulary", ["/etc/hostname", "../outside_vocab.txt", 7])
def test_a_vocabulary_that_names_another_file_is_refused(vocabulary, tmp_path):
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    model.save_to_preset(tmp_path / "p")
    (tmp_path / "p" / "vocabulary.txt").unlink()
    (tmp_path / "outside_vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    config["preprocessor"]["config"]["tokenizer"]["config"]["vocabulary"] = vocabulary
    (tmp_path / "p" / "config.json").write_text(json.dumps(config))
    with pytest.raises(bertzoo.PresetError, match="vocabulary.txt.*or a list of tokens"):
        bertzoo.BertClassifier.from_preset(tmp_path / "p")
    with pytest.raises(ValueError, match="`vocabulary` as a list of tokens"):
        bertzoo.text.BertTokenizer.from_config({"vocabulary": str(tmp_path / "outside_vocab.txt")})


def test_keras_internals_are_refused_like_foreign_classes():
    from bertzoo.saving.serialization import check_config

    internal = {"module": "keras.src.utils.file_utils", "class_name": "function", "config": "rmtree"}
    with pytest.raises(ValueError, match="file is refused"):
        check_config({"layer": {"activation": {**internal, "registered_name": "function"}}})
    check_config({"module": "keras.layers", "class_name": "Dense", "config": {}, "registered_name": None})


def test_from_preset_arguments_keep_the_saved_head_or_are_refused(tmp_path):
    model = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, sequence_length=16, class_names=["neg", "pos"]
    )
    model.save_to_preset(tmp_path / "p")
    texts = ["a fine day"]
    expected = model.predict(texts, verbose=0)
    # The model's own name and trainable flag, and class names as a tuple (saved as a JSON list),
    # are no new head: the trained head loads.
    for kwargs in ({"name": "sentiment"}, {"trainable": False}, {"class_names": ("neg", "pos")}):
        loaded = bertzoo.BertClassifier.from_preset(tmp_path / "p", **kwargs)
        np.testing.assert_array_equal(loaded.predict(texts, verbose=0), expected)
    assert bertzoo.BertClassifier.from_preset(tmp_path / "p", name="sentiment").name == "sentiment"
    assert not bertzoo.BertClassifier.from_preset(tmp_path / "p", trainable=False).trainable
    # What no head takes (a typo, a tokenizer setting) is refused, not swallowed.
    for kwargs in ({"num_clases": 3}, {"lowercase": False}):
        with pytest.raises(TypeError, match=rf"unexpected keyword argument\(s\) \['{next(iter(kwargs))}'\]"):
            bertzoo.BertClassifier.from_preset(tmp_path / "p", **kwargs)
    for length, message in ((0, "positive integer"), (4096, "max_sequence_length=512")):
        with pytest.raises(ValueError, match=message):
            bertzoo.BertClassifier.from_preset(tmp_path / "p", sequence_length=length)
    with pytest.raises(ValueError, match="with `preprocessor=` given it would be ignored"):
        bertzoo.BertClassifier.from_preset(tmp_path / "p", sequence_length=8, preprocessor=None)
    assert (
        bertzoo.BertClassifier.from_preset(tmp_path / "p", sequence_length=np.int64(8)).preprocessor.sequence_length
        == 8
    )
    with pytest.raises(TypeError, match=r"BertBackbone.from_preset got unexpected keyword argument\(s\) \['dropuot'\]"):
        bertzoo.BertBackbone.from_preset(tmp_path / "p", dropuot=0.0)
    assert bertzoo.BertBackbone.from_preset(tmp_path / "p", dropout=0.0).dropout == 0.0


def test_a_config_of_fewer_layers_than_its_weights_is_refused(tmp_path):
    bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16).save_to_preset(tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    backbone = config["backbone"]["config"]
    assert backbone["num_layers"] == 2
    backbone.update(num_layers=1, num_groups=1)  # Keras skips the second layer's weights in the file.
    (tmp_path / "p" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        bertzoo.PresetError,
        match=r"config.json describes a backbone of [\d,]+ parameters, but .*"
        r"metadata.json records [\d,]+ \(`backbone_parameter_count`\)",
    ):
        bertzoo.BertClassifier.from_preset(tmp_path / "p")


def test_backbone_weights_that_load_are_never_drawn_at_random_first(tmp_path, monkeypatch):
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, preprocessor=None, num_classes=2)
    model.save_to_preset(tmp_path / "p")
    draws = []  # Values drawn; not the symbolic placeholders Keras traces while it builds the layers.
    draw = keras.initializers.TruncatedNormal.__call__

    def counted_draw(self, shape, dtype=None):
        if tf.executing_eagerly():
            draws.append(tuple(shape))
        return draw(self, shape, dtype)

    monkeypatch.setattr(keras.initializers.TruncatedNormal, "__call__", counted_draw)
    backbone = bertzoo.BertBackbone.from_preset(tmp_path / "p")
    assert draws == []
    loaded = bertzoo.BertClassifier.from_preset(tmp_path / "p")
    assert draws == [(model.backbone.hidden_dim, 2)]  # The head, built as usual (small), then loaded.
    draws.clear()
    for saved, again in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(again), np.asarray(saved))
    # Named as if built the usual way (a SavedModel lists the TensorFlow names).
    assert [w.value.name for w in loaded.weights] == [w.value.name for w in model.weights]
    inputs = {"token_ids": np.array([[2, 7, 9, 3]]), "segment_ids": np.zeros((1, 4), "int32")}
    inputs["padding_mask"] = np.ones((1, 4), "int32")
    np.testing.assert_allclose(loaded.predict_on_batch(inputs), model.predict_on_batch(inputs), rtol=1e-6)
    np.testing.assert_array_equal(backbone(inputs)["pooled_output"], model.backbone(inputs)["pooled_output"])
    # A new head is drawn (its kernel, the only truncated-normal weight), the backbone loaded.
    new_head = bertzoo.BertClassifier.from_preset(tmp_path / "p", num_classes=3)
    assert draws == [(model.backbone.hidden_dim, 3)]
    for saved, again in zip(model.backbone.weights, new_head.backbone.weights):
        np.testing.assert_array_equal(np.asarray(again), np.asarray(saved))
    bertzoo.BertClassifier.from_preset(tmp_path / "p", load_weights=False)
    assert len(draws) > model.backbone.num_layers * 4


@pytest.mark.parametrize(
    "task, saved_arguments, changed",
    [
        (bertzoo.BertClassifier, {"num_classes": 3}, {"activation": "softmax"}),
        (bertzoo.BertClassifier, {"num_classes": 3}, {"class_names": ["a", "b", "c"]}),
        (bertzoo.BertTokenClassifier, {"num_classes": 3}, {"class_names": ["O", "B", "I"]}),
        (bertzoo.BertQuestionAnswerer, {}, {"mask_question": False}),
        (bertzoo.BertMultipleChoice, {"num_choices": 2}, {"num_choices": 3}),
    ],
)
def test_head_arguments_that_shape_no_weight_keep_the_trained_head(task, saved_arguments, changed, tmp_path, caplog):
    model = task.from_preset("tiny", load_weights=False, preprocessor=None, **saved_arguments)
    head = [v for v in model.weights if not any(v is w for w in model.backbone.weights)]
    for variable in head:  # A trained head, far from any fresh initialization.
        variable.assign(np.full(variable.shape, 0.25, variable.dtype))
    model.save_to_preset(tmp_path / "p")
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        loaded = task.from_preset(tmp_path / "p", **changed)
    assert "randomly initialized" not in caplog.text
    for name, value in changed.items():
        assert getattr(loaded, name) == value
    loaded_head = [v for v in loaded.weights if not any(v is w for w in loaded.backbone.weights)]
    assert len(loaded_head) == len(head)
    for variable in loaded_head:
        np.testing.assert_array_equal(variable.numpy(), 0.25)


def test_a_file_or_a_missing_directory_is_named_as_such(tmp_path, monkeypatch):
    bertzoo.BertBackbone.from_preset("tiny", load_weights=False).save_to_preset(tmp_path / "p")
    with pytest.raises(bertzoo.PresetError, match=r"config.json is a file; a preset is a directory .*: pass '.*p'"):
        bertzoo.BertBackbone.from_preset(tmp_path / "p" / "config.json")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(bertzoo.PresetError, match=r"'runs/p' does not exist \(resolved to .*runs/p\); check the path"):
        bertzoo.BertBackbone.from_preset("runs/p")
    with pytest.raises(bertzoo.PresetError, match=r"names a model hub; bertzoo does not download presets"):
        bertzoo.BertBackbone.from_preset("hf://google-bert/bert-base-uncased")
    with pytest.raises(bertzoo.PresetError, match=r"Unknown preset 'tinny'.* Did you mean 'tiny'\?"):
        bertzoo.BertBackbone.from_preset("tinny")


def test_precision_is_not_restored_and_a_warning_says_so(tmp_path, caplog):
    bertzoo.BertBackbone.from_preset("tiny", load_weights=False, dtype="mixed_bfloat16").save_to_preset(tmp_path / "p")
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        loaded = bertzoo.BertBackbone.from_preset(tmp_path / "p")
    assert loaded.dtype_policy.name == keras.config.dtype_policy().name == "float32"
    assert "saved computing in mixed_bfloat16; it is built in float32" in caplog.text
    assert "Pass dtype='mixed_bfloat16'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        loaded = bertzoo.BertBackbone.from_preset(tmp_path / "p", dtype="mixed_bfloat16")
    assert loaded.dtype_policy.name == "mixed_bfloat16" and "saved computing" not in caplog.text


def test_an_embedding_table_padded_past_its_vocabulary_saves_and_loads_and_a_longer_vocabulary_is_refused(tmp_path):
    from bertzoo.text import BertTokenizer

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    sizes = dict(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=16)
    padded = bertzoo.BertBackbone(vocabulary_size=48, **sizes)  # 40 tokens, 48 rows.
    padded.save_to_preset(tmp_path / "p", tokenizer=BertTokenizer(vocabulary))
    model = bertzoo.BertClassifier.from_preset(tmp_path / "p", num_classes=2)
    assert model.backbone.vocabulary_size == 48 and model.preprocessor.tokenizer.vocabulary_size() == 40
    np.testing.assert_array_equal(model.backbone.weights[0].numpy(), padded.weights[0].numpy())
    pretrainer = bertzoo.BertPretrainer.from_preset(tmp_path / "p")
    assert pretrainer.masker.vocabulary_size == 40  # Random replacements are real tokens.
    filled = pretrainer.predict_masked("w1 [MASK]", top_k=1000)[0][0]  # Over the 40 tokens, not the 48 rows.
    assert len(filled) == 40 and sum(p for _, p in filled) == pytest.approx(1.0)

    short = bertzoo.BertBackbone(vocabulary_size=32, **sizes)
    with pytest.raises(ValueError, match="40 tokens but the embedding table only 32 rows"):
        short.save_to_preset(tmp_path / "q", tokenizer=BertTokenizer(vocabulary))
    assert not (tmp_path / "q").exists()


def test_metadata_cannot_replace_the_checksums_and_a_missing_vocabulary_checksum_is_refused(tmp_path):
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    for reserved in ({"vocabulary": "bert-base-uncased"}, {"files": {}}):
        with pytest.raises(ValueError, match=rf"`metadata` may not set \['{next(iter(reserved))}'\]"):
            model.save_to_preset(tmp_path / "p", metadata=reserved)
        assert not (tmp_path / "p").exists()  # Refused before anything is written.
    for bad, match in (
        ("notadict", r"`metadata` must be a dict of JSON values"),
        ({"score": float("nan")}, r"plain JSON values .*no NaN"),
        ({"score": np.float32(0.5)}, r"plain JSON values .*NumPy scalars"),
    ):
        with pytest.raises(ValueError, match=match):
            model.save_to_preset(tmp_path / "p", metadata=bad)
        assert not (tmp_path / "p").exists()
    model.save_to_preset(tmp_path / "p", metadata={"notes": "mine"})
    metadata = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert metadata["notes"] == "mine" and "sha256" in metadata["vocabulary"]
    # A changed vocabulary whose checksum entry was deleted too is not loaded silently.
    tokens = (tmp_path / "p" / "vocabulary.txt").read_text().splitlines()
    tokens[1000], tokens[1001] = tokens[1001], tokens[1000]
    (tmp_path / "p" / "vocabulary.txt").write_text("\n".join(tokens) + "\n")
    del metadata["vocabulary"]
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(bertzoo.PresetError, match=r"records no checksum of vocabulary.txt.*verify_checksums=False"):
        bertzoo.BertClassifier.from_preset(tmp_path / "p")
    loaded = bertzoo.BertClassifier.from_preset(tmp_path / "p", verify_checksums=False)
    assert loaded.preprocessor.tokenizer.id_to_token(1000) == tokens[1000]


def test_a_preprocessor_of_another_class_is_a_preset_error(tmp_path):
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    model.save_to_preset(tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    config["preprocessor"] = config["preprocessor"]["config"]["tokenizer"]  # A registered bertzoo class, not a packer.
    (tmp_path / "p" / "config.json").write_text(json.dumps(config))
    with pytest.raises(bertzoo.PresetError, match="must be a serialized BertPreprocessor with a `tokenizer`"):
        bertzoo.BertClassifier.from_preset(tmp_path / "p", preprocessor=None)


def test_each_preprocessor_built_from_a_preset_is_a_new_layer():
    # `validate()` builds the tokenizer to check its files; the first build without
    # overrides reuses that one, and no two callers ever get the same layer.
    preset = Preset.resolve(FIXTURES / "format1_classifier")
    unchecked = Preset.resolve(preset, verify_checksums=False)  # A copy, made before any build.
    built = [preset.build_preprocessor(), unchecked.build_preprocessor(), preset.build_preprocessor()]
    built.append(preset.build_preprocessor(sequence_length=8))
    assert len({id(p) for p in built}) == 4
    texts = ["a short film", "the film was good"]
    first, *others = [{k: np.asarray(v) for k, v in p(texts).items()} for p in built[:3]]
    for other in others:
        for key, value in first.items():
            np.testing.assert_array_equal(other[key], value)
    assert built[3](texts)["token_ids"].shape[-1] == 8


def test_a_task_saved_without_a_tokenizer_loads_without_one(tmp_path):
    backbone = bertzoo.BertBackbone(vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)
    model = bertzoo.BertClassifier(backbone, 2)
    model.save_to_preset(tmp_path / "tokenized")
    assert not (tmp_path / "tokenized" / "vocabulary.txt").exists()
    again = bertzoo.BertClassifier.from_preset(tmp_path / "tokenized")
    assert again.preprocessor is None
    features = {k: np.ones((1, 8), "int32") for k in ("token_ids", "padding_mask")}
    features["segment_ids"] = np.zeros((1, 8), "int32")
    np.testing.assert_allclose(again.predict(features, verbose=0), model.predict(features, verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="has no tokenizer .* so `sequence_length` has no preprocessor to set"):
        bertzoo.BertClassifier.from_preset(tmp_path / "tokenized", sequence_length=8)
    # Text settings without a tokenizer would name a vocabulary the preset lacks: refused, nothing written.
    with pytest.raises(ValueError, match=r"`preprocessor_config` .* but no tokenizer was given: pass tokenizer="):
        backbone.save_to_preset(tmp_path / "settings_only", preprocessor_config={"sequence_length": 8})
    assert not (tmp_path / "settings_only").exists()
    # A vocabulary the preset records but lost is damage, not "no tokenizer".
    tiny = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    tiny.save_to_preset(tmp_path / "damaged")
    (tmp_path / "damaged" / "vocabulary.txt").unlink()
    with pytest.raises(PresetFileNotFoundError, match="vocabulary.txt is missing"):
        bertzoo.BertClassifier.from_preset(tmp_path / "damaged")
    # Format 1 recorded no vocabulary checksum: a lost vocabulary is an error there too.
    old = tmp_path / "format1"
    shutil.copytree(FIXTURES / "format1_classifier", old)
    (old / "vocabulary.txt").unlink()
    with pytest.raises(PresetFileNotFoundError, match="vocabulary.txt is missing"):
        bertzoo.BertClassifier.from_preset(old)


def test_a_backbone_preset_saved_without_a_length_packs_what_its_positions_hold(tmp_path):
    from bertzoo.text import BertTokenizer
    from bertzoo.text.vocabulary import builtin_vocabulary

    short = bertzoo.BertBackbone(
        vocabulary_size=1200, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=64
    )
    short.save_to_preset(tmp_path / "short", tokenizer=BertTokenizer(builtin_vocabulary(1200)))
    model = bertzoo.BertClassifier.from_preset(tmp_path / "short", num_classes=2)
    assert model.preprocessor.sequence_length == 64  # Not the default 128, which its positions cannot hold.
    assert model.predict(["a b c"], verbose=0).shape == (1, 2)


def test_backbone_presets_keep_every_tokenizer_option_and_refuse_unknown_settings(tmp_path, monkeypatch):
    from bertzoo.text import BertTokenizer
    from bertzoo.text.vocabulary import builtin_vocabulary

    backbone = bertzoo.BertBackbone(vocabulary_size=1200, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)
    tokenizer = BertTokenizer(builtin_vocabulary(1200), special_tokens_in_strings=True, lowercase=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    path = backbone.save_to_preset("~/kept", tokenizer=tokenizer, preprocessor_config={"sequence_length": 8})
    assert path == tmp_path / "kept"  # Expanded and absolute, so the caller can open files in it.
    loaded = Preset.resolve(path).build_preprocessor()
    assert loaded.tokenizer.special_tokens_in_strings and not loaded.tokenizer.lowercase
    text = ["[CLS] Hello"]
    np.testing.assert_array_equal(loaded.tokenizer(text).to_list(), tokenizer(text).to_list())
    # A text option in preprocessor_config replaces the tokenizer's own.
    backbone.save_to_preset(tmp_path / "lower", tokenizer=tokenizer, preprocessor_config={"lowercase": True})
    assert Preset.resolve(tmp_path / "lower").build_preprocessor().tokenizer.lowercase
    # A setting nothing takes (a typo) is refused before anything is written, not on every later load.
    with pytest.raises(ValueError, match=r"settings no preprocessor takes: \['sequence_lenght'\]"):
        backbone.save_to_preset(tmp_path / "typo", tokenizer=tokenizer, preprocessor_config={"sequence_lenght": 8})
    assert not (tmp_path / "typo").exists()


def test_a_preprocessor_longer_than_the_position_table_is_refused_up_front():
    from bertzoo.text import BertPreprocessor

    tiny = bertzoo.BertClassifier.from_preset("tiny", load_weights=False)
    longer = BertPreprocessor(tiny.preprocessor.tokenizer, sequence_length=tiny.backbone.max_sequence_length + 1)
    with pytest.raises(
        ValueError, match=r"packs sequences of 513 tokens but the backbone has position embeddings for 512"
    ):
        bertzoo.BertClassifier(tiny.backbone, 2, preprocessor=longer)


def test_a_preprocessor_made_longer_after_construction_is_refused_at_use(word_classifier):
    from bertzoo.text import BertPreprocessor

    model = word_classifier(["good", "bad"], sequence_length=8)
    model.preprocessor.sequence_length = 12  # TensorFlow's own message: a bare slice error mid-step.
    for call in (lambda: model.predict(["good"], verbose=0), lambda: model.fit(["good"], [1], verbose=0)):
        with pytest.raises(
            ValueError, match=r"packs sequences of 12 tokens but the backbone has position embeddings for 8"
        ):
            call()
    features = BertPreprocessor(model.preprocessor.tokenizer, sequence_length=8)(["good"])
    assert model.predict(features, verbose=0).shape == (1, 2)  # Tokenized inputs: the preprocessor is not used.
    model.preprocessor.sequence_length = 8
    assert model.predict(["good"], verbose=0).shape == (1, 2)


@pytest.mark.parametrize(
    "task", [bertzoo.BertClassifier, bertzoo.BertTokenClassifier, bertzoo.BertMultipleChoice, bertzoo.BertPretrainer]
)
def test_a_tokenizer_with_more_tokens_than_the_embedding_table_is_refused_up_front(task):
    # TensorFlow on a CPU only failed (a bare GatherV2 error) once a token past the table came up.
    tokenizer = bertzoo.Preset.resolve("tiny").build_preprocessor().tokenizer  # 30522 tokens.
    small = bertzoo.BertBackbone(
        vocabulary_size=1000, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=16
    )
    arguments = {bertzoo.BertClassifier: (2,), bertzoo.BertTokenClassifier: (2,), bertzoo.BertMultipleChoice: (2,)}
    with pytest.raises(ValueError, match=r"tokenizer has 30522 tokens but the embedding table only 1000 rows.*Use the"):
        task(small, *arguments.get(task, ()), preprocessor=bertzoo.text.BertPreprocessor(tokenizer, sequence_length=16))


def test_a_local_folder_named_like_a_built_in_preset(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()  # Not a preset (say, data): the built-in is what was meant.
    (tmp_path / "tiny" / "notes.txt").write_text("x")
    builtin = Preset.resolve("tiny")
    assert builtin.name == "tiny" and builtin.backbone_config["num_layers"] == 2
    # A saved preset there is loaded, with a warning that names both.
    shutil.rmtree(tmp_path / "tiny")
    bertzoo.BertBackbone.from_preset("tiny", load_weights=False, num_layers=1).save_to_preset(tmp_path / "tiny")
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        local = Preset.resolve("tiny")
    assert local.backbone_config["num_layers"] == 1
    assert re.search(r"'tiny' names a built-in preset and the preset directory .*tiny; loading", caplog.text)
