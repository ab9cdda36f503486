"""Weight-only int8 (`bertzoo.quantize(..., weight_only=True)`): int8
kernels, float inputs and arithmetic; presets, the command line, refusals."""

import json

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.layers.dense import WeightOnlyInt8Policy
from bertzoo.saving.preset import Preset
from bertzoo.utils.layers import own_dtype_policy

TEXTS = ["a gripping, funny film", "dull and far too long", "fine", "what a lovely day out"]


@pytest.fixture(scope="module")
def model(random_classifier):
    return random_classifier(class_names=["a", "b", "c"])


def call(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def quantized_dense_layers(model):
    return [
        layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dense) and layer.quantization_mode
    ]


def test_inputs_meet_the_dequantized_kernel_unquantized(model):
    query = model.backbone.attention_blocks[0].query_dense
    float_kernel = keras.ops.convert_to_numpy(query.kernel).copy()
    q = bertzoo.quantize(model, "int8", weight_only=True)
    assert model.backbone.attention_blocks[0].query_dense.quantization_mode is None  # The original is untouched.
    layers = quantized_dense_layers(q)
    assert len(layers) == len([d for d in model._flatten_layers() if isinstance(d, keras.layers.Dense)])
    assert all(
        layer.inputs_quantizer is None and isinstance(own_dtype_policy(layer), WeightOnlyInt8Policy) for layer in layers
    )
    assert q.backbone.embeddings.token_embedding.quantization_mode == "int8"

    layer = q.backbone.attention_blocks[0].query_dense
    # The kernel is stored as Keras's int8 scheme: round(w * 127 / max|w|) per output channel.
    scale = 127.0 / np.abs(float_kernel).max(axis=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer._kernel), np.round(float_kernel * scale))
    # By hand: float inputs times the dequantized kernel, plus the bias.
    x = np.random.default_rng(0).standard_normal((2, 5, float_kernel.shape[0])).astype("float32") * 3
    dequantized = np.round(float_kernel * scale) / scale
    expected = x @ dequantized + keras.ops.convert_to_numpy(layer.bias)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), expected, rtol=1e-5, atol=1e-5)
    # The dynamic int8 layer rounds its inputs too: it misses the same figure by far more.
    dynamic = bertzoo.quantize(model, "int8").backbone.attention_blocks[0].query_dense
    assert np.abs(keras.ops.convert_to_numpy(dynamic(x)) - expected).max() > 100 * 1e-5

    # Whole model: close to float32, and the same under XLA.
    x = model.preprocessor(TEXTS)
    expected, got = call(model, x), call(q, x)
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()
    q.compile(jit_compile=True)
    np.testing.assert_allclose(q.predict_on_batch(x), got, atol=1e-5)


def test_presets_keep_weight_only_and_retarget_it_to_another_dtype(model, tmp_path):
    x = model.preprocessor(TEXTS)
    q = bertzoo.quantize(model, "int8", weight_only=True)
    expected = call(q, x)
    q.save_to_preset(tmp_path / "w")
    assert "bertzoo>WeightOnlyInt8Policy" in json.dumps(json.loads((tmp_path / "w" / "config.json").read_text()))

    quantization = Preset.resolve(tmp_path / "w").quantization
    assert quantization["mode"] == "int8" and "attention_0/query" in quantization["weight_only_layers"]
    assert "token_embedding" not in " ".join(quantization["weight_only_layers"])  # Tables are int8 either way.
    bertzoo.quantize(model, "int8").save_to_preset(tmp_path / "dynamic")
    assert "weight_only_layers" not in Preset.resolve(tmp_path / "dynamic").quantization

    again = bertzoo.BertClassifier.from_preset(tmp_path / "w")
    np.testing.assert_allclose(call(again, x), expected, atol=1e-6)
    assert all(layer.inputs_quantizer is None for layer in quantized_dense_layers(again))

    in_bfloat16 = bertzoo.BertClassifier.from_preset(tmp_path / "w", dtype="bfloat16")
    layer = in_bfloat16.backbone.feedforward_blocks[1].output_dense
    policy = own_dtype_policy(layer)
    assert isinstance(policy, WeightOnlyInt8Policy) and policy.compute_dtype == "bfloat16"
    assert layer.inputs_quantizer is None
    got = keras.ops.convert_to_numpy(keras.ops.cast(in_bfloat16(x, training=False), "float32"))
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()


def test_saved_model_serves_it_without_the_fused_int8_kernel(model, tmp_path):
    import tensorflow as tf

    from bertzoo.export import read_export_metadata

    q = bertzoo.quantize(model, "int8", weight_only=True)
    path = q.export(tmp_path / "1", format="tf_saved_model", jit_compile=False)
    # No integer matmul to fuse: the graph holds Keras's float ops only.
    metadata = read_export_metadata(path)
    assert metadata["int8_kernels"] == "portable" and metadata["quantization"] == ["int8"]
    served = tf.saved_model.load(str(path)).signatures["serving_default"](text=tf.constant(TEXTS))
    np.testing.assert_allclose(served["logits"].numpy(), q.predict(TEXTS, verbose=0), atol=1e-5)


def test_command_line_writes_a_weight_only_preset(model, tmp_path, capsys):
    from bertzoo import cli

    model.save_to_preset(tmp_path / "float")
    assert cli.main(["quantize", str(tmp_path / "float"), str(tmp_path / "w"), "--weight-only"]) == 0
    assert "(int8, weight-only)" in capsys.readouterr().out
    x = model.preprocessor(TEXTS)
    again = bertzoo.BertClassifier.from_preset(tmp_path / "w")
    np.testing.assert_allclose(call(again, x), call(bertzoo.quantize(model, weight_only=True), x), atol=1e-6)
    (tmp_path / "texts.tsv").write_text("text\n" + "\n".join(TEXTS) + "\n")
    argv = ["quantize", str(tmp_path / "float"), str(tmp_path / "c"), "--weight-only"]
    for extra in (["--calibration", str(tmp_path / "texts.tsv")], ["--input-ranges", "static"], ["--smoothing", "0.5"]):
        assert cli.main(argv + extra) == 1
        assert "--weight-only quantizes no inputs, so --calibration, --smoothing and --input-ranges do not apply" in (
            capsys.readouterr().err
        )
    assert not (tmp_path / "c").exists()


def test_refusals_name_the_fix(model):
    refusal = r"weight_only=True quantizes no inputs, so input calibration and ranges do not apply: drop `calibration`"
    with pytest.raises(ValueError, match=refusal):
        bertzoo.quantize(model, "int8", weight_only=True, calibration=TEXTS)
    # Not "pass `calibration`" first (static ranges alone are refused for that), then refused for it.
    with pytest.raises(ValueError, match=refusal + r".*input_ranges='static'"):
        bertzoo.quantize(model, "int8", weight_only=True, input_ranges="static")
    assert bertzoo.quantize(model, "int8", weight_only=np.bool_(True)).backbone.pooler.inputs_quantizer is None
    with pytest.raises(ValueError, match=r"`weight_only` must be True or False, got 'yes'"):
        bertzoo.quantize(model, "int8", weight_only="yes")
    # A Keras Dense head: its policy could not record the choice in a preset.
    inputs = model.backbone.input
    head = keras.layers.Dense(3, name="keras_head")(model.backbone(inputs)["pooled_output"])
    wrapped = keras.Model(inputs, head)
    with pytest.raises(ValueError, match=r"needs bertzoo's Dense layers.*keras_head"):
        bertzoo.quantize(wrapped, "int8", weight_only=True)
    # Keras's int4 already keeps the inputs float: weight_only changes nothing there.
    int4 = bertzoo.quantize(model, "int4", weight_only=True)
    assert all(layer.inputs_quantizer is None for layer in quantized_dense_layers(int4))
