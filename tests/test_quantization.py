"""Post-training quantization of bertzoo models, presets, and export."""

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.layers.dense import portable_kernels
from bertzoo.saving.preset import Preset

TEXTS = ["a gripping, funny film", "dull and far too long", "fine", "what a lovely day out"]


@pytest.fixture(scope="module")
def model(random_classifier):
    return random_classifier(class_names=["a", "b", "c"])


def call(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def test_int8_copy_matches_keras_abs_max_scheme_and_float_outputs(model):
    x = model.preprocessor(TEXTS)
    float_kernel = keras.ops.convert_to_numpy(model.backbone.attention_blocks[0].query_dense.kernel).copy()
    q = bertzoo.quantize(model, "int8")
    assert type(q) is bertzoo.BertClassifier and q is not model
    # The original is untouched.
    assert model.backbone.attention_blocks[0].query_dense.quantization_mode is None
    layer = q.backbone.attention_blocks[0].query_dense
    assert layer.quantization_mode == "int8" and layer._kernel.dtype == "int8"
    # Per output channel: int8 = round(w * 127 / max|w|).
    scale = 127.0 / np.abs(float_kernel).max(axis=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer._kernel), np.round(float_kernel * scale))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.kernel_scale), scale, rtol=1e-5)
    assert q.backbone.embeddings.token_embedding.quantization_mode == "int8"
    assert q.backbone.embeddings.layer_norm.dtype_policy.quantization_mode is None
    # Outputs stay close to float32 (int8 weights and activations).
    expected, got = call(model, x), call(q, x)
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()

    plain = bertzoo.quantize(model, "int8", include_embeddings=False)
    assert plain.backbone.embeddings.token_embedding.quantization_mode is None
    assert plain.backbone.pooler.quantization_mode == "int8"


def test_a_mixed_bfloat16_model_quantizes_with_its_embeddings(random_classifier):
    # Keras's int8 Embedding returns float32 under a bfloat16 compute dtype;
    # the embeddings layer must still add its tables in bfloat16.
    mixed = random_classifier(dtype="mixed_bfloat16")
    x = mixed.preprocessor(TEXTS)
    q = bertzoo.quantize(mixed, "int8")
    assert q.backbone.embeddings.token_embedding.quantization_mode == "int8"
    assert q.backbone.embeddings.compute_dtype == "bfloat16"
    sequence = q.backbone(x)["sequence_output"]
    assert keras.backend.standardize_dtype(sequence.dtype) == "bfloat16"
    expected, got = call(mixed, x), call(q, x)
    assert np.abs(got - expected).max() < 0.1 * np.abs(expected).max()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_presets_load_back_with_identical_predictions(model, mode, tmp_path):
    x = model.preprocessor(TEXTS)
    q = bertzoo.quantize(model, mode)
    expected = call(q, x)
    q.save_to_preset(tmp_path / "q")
    quantization = Preset.resolve(tmp_path / "q").quantization
    assert quantization["mode"] == mode
    assert "attention_0/query" in quantization["layers"] and "logits" in quantization["layers"]

    again = bertzoo.BertClassifier.from_preset(tmp_path / "q")
    assert again.backbone.feedforward_blocks[1].output_dense.quantization_mode == mode
    np.testing.assert_allclose(call(again, x), expected, atol=1e-6)

    backbone = bertzoo.BertBackbone.from_preset(tmp_path / "q")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(backbone(x)["pooled_output"]),
        keras.ops.convert_to_numpy(q.backbone(x)["pooled_output"]),
        atol=1e-6,
    )
    # A new head: the quantized backbone loads, the fresh head stays float.
    other = bertzoo.BertClassifier.from_preset(tmp_path / "q", num_classes=5, class_names=None)
    assert other.backbone.pooler.quantization_mode == mode and other.output_dense.quantization_mode is None


def test_quantized_backbone_round_trips(model, tmp_path):
    q = bertzoo.quantize(model.backbone)
    assert type(q) is bertzoo.BertBackbone
    q.save_to_preset(tmp_path / "b", tokenizer=model.preprocessor.tokenizer)
    again = bertzoo.BertBackbone.from_preset(tmp_path / "b")
    x = model.preprocessor(TEXTS)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(again(x)["sequence_output"]),
        keras.ops.convert_to_numpy(q(x)["sequence_output"]),
        atol=1e-6,
    )


def test_quantized_model_exports_to_a_saved_model(model, tmp_path):
    import tensorflow as tf

    q = bertzoo.quantize(model, "int8")
    q.export(tmp_path / "serving" / "1", format="tf_saved_model", int8_kernels="portable")
    served = tf.saved_model.load(str(tmp_path / "serving" / "1"))
    out = served.signatures["serving_default"](text=tf.constant(TEXTS))
    # A portable export holds Keras's int8 ops, not the fused oneDNN kernel (bertzoo.layers.dense).
    with portable_kernels():
        expected = q.predict(TEXTS, verbose=0)
    np.testing.assert_allclose(out["logits"].numpy(), expected, atol=1e-5)
    assert [n.decode() for n in out["label_names"].numpy()] == [["a", "b", "c"][i] for i in out["label_ids"].numpy()]


def test_bad_quantization_requests(model):
    with pytest.raises(ValueError, match=r"Unknown quantization mode 'int2'.*int8"):
        bertzoo.quantize(model, "int2")
    q = bertzoo.quantize(model)
    with pytest.raises(ValueError, match=r"already quantized \(int8\)"):
        bertzoo.quantize(q)
    pruned = bertzoo.compression.model_copy.copy_model(model)
    bertzoo.Pruner(pruned, bertzoo.ConstantSparsity(0.5, 0))
    with pytest.raises(ValueError, match=r"Pruner attached: quantize `pruner.strip\(\)`"):
        bertzoo.quantize(pruned)


def test_command_line_quantize_and_sparsity(model, tmp_path, capsys):
    from bertzoo import cli

    model.save_to_preset(tmp_path / "float")
    assert cli.main(["quantize", str(tmp_path / "float"), str(tmp_path / "int8")]) == 0
    assert "MB gzipped" in capsys.readouterr().out
    assert Preset.resolve(tmp_path / "int8").quantization["mode"] == "int8"
    x = model.preprocessor(TEXTS)
    again = bertzoo.BertClassifier.from_preset(tmp_path / "int8")
    np.testing.assert_allclose(call(again, x), call(bertzoo.quantize(model), x), atol=1e-6)
    assert cli.main(["quantize", str(tmp_path / "float"), str(tmp_path / "int8")]) == 1
    assert "already exists" in capsys.readouterr().err

    (tmp_path / "texts.tsv").write_text("text\n" + "\n".join(TEXTS) + "\n")
    argv = [
        "quantize",
        str(tmp_path / "float"),
        str(tmp_path / "smoothed"),
        "--calibration",
        str(tmp_path / "texts.tsv"),
    ]
    assert cli.main(argv + ["--smoothing", "0.5"]) == 0
    again = bertzoo.BertClassifier.from_preset(tmp_path / "smoothed")
    expected = bertzoo.quantize(model, calibration=TEXTS, smoothing=0.5)
    np.testing.assert_allclose(call(again, x), call(expected, x), atol=1e-6)
    assert again.backbone.pooler.input_scale is not None and again.backbone.pooler.input_range is None
    static_argv = argv[:2] + [str(tmp_path / "static")] + argv[3:] + ["--input-ranges", "static"]
    assert cli.main(static_argv) == 0
    again = bertzoo.BertClassifier.from_preset(tmp_path / "static")
    expected = bertzoo.quantize(model, calibration=TEXTS, input_ranges="static")
    np.testing.assert_allclose(call(again, x), call(expected, x), atol=1e-6)
    assert again.backbone.pooler.input_range is not None
    assert cli.main(argv[:2] + [str(tmp_path / "d"), "--input-ranges", "static"]) == 1
    assert "--input-ranges sets how --calibration quantizes" in capsys.readouterr().err
    assert cli.main(argv[:2] + [str(tmp_path / "b"), "--calibration", str(tmp_path / "missing.tsv")]) == 1
    assert "missing.tsv does not exist" in capsys.readouterr().err
    assert cli.main(argv[:2] + [str(tmp_path / "c"), "--smoothing", "0.5"]) == 1
    assert "pass --calibration FILE too" in capsys.readouterr().err

    assert cli.main(["sparsity", str(tmp_path / "float")]) == 0
    out = capsys.readouterr().out
    assert "attention_0/query" in out and "gzip" in out
