"""Post-training quantization of bertzoo models (dynamic and weight-only
int8, int4), presets, the command line, and export."""

import json

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.layers.dense import Dense
from bertzoo.layers.dense import WeightOnlyInt8Policy
from bertzoo.layers.dense import portable_kernels
from bertzoo.saving.preset import Preset
from bertzoo.utils.layers import own_dtype_policy
from bertzoo.utils.private_api import flatten_layers

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


def test_kerass_in_place_quantize_works_on_a_task_and_decides_its_fast_path_again(random_classifier, tmp_path):
    from bertzoo.utils import fast_path

    fresh = random_classifier()
    fresh.quantize("int8")  # Keras refused the preprocessor's packer, never called yet: "isn't yet built".
    model = random_classifier()
    expected = bertzoo.quantize(model, "int8").predict(TEXTS, verbose=0)
    np.testing.assert_array_equal(fresh.predict(TEXTS, verbose=0), expected)
    model.predict(TEXTS, verbose=0)
    assert fast_path._recorded.get(model) is not None  # The float model's choice.
    model.quantize("int8")
    assert fast_path._recorded.get(model) is None  # Decided again, for the int8 weights.
    np.testing.assert_array_equal(model.predict(TEXTS, verbose=0), expected)
    model.save_to_preset(tmp_path / "int8")
    again = bertzoo.BertClassifier.from_preset(tmp_path / "int8")
    np.testing.assert_array_equal(again.predict(TEXTS, verbose=0), expected)
    pinned = random_classifier()
    pinned.compile(jit_compile=False)
    pinned.quantize("int8", filters="query")  # Keras's filters still apply; a pin stays.
    assert fast_path._recorded[pinned].source == "pinned"
    assert [layer.name for layer in quantized_dense_layers(pinned)] == ["query", "query"]


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


def test_int8_of_a_float16_model_is_refused_with_the_way_out_before_training(random_classifier, monkeypatch):
    half = random_classifier(dtype="mixed_float16")
    fits = []
    monkeypatch.setattr(keras.Model, "fit", lambda *args, **kwargs: fits.append(args))
    message = "int8 quantization does not work with float16 compute .* dtype='mixed_bfloat16'"
    with pytest.raises(ValueError, match=message):
        bertzoo.quantize(half, "int8", calibration=TEXTS)
    with pytest.raises(ValueError, match=message):
        bertzoo.quantization_aware_training(half, TEXTS, [0, 1, 2, 0])
    assert fits == []
    assert bertzoo.quantize(half, "int4").backbone.pooler.quantization_mode == "int4"  # Keras allows int4.


def test_smoothing_a_float16_layer_is_refused_before_its_kernel_changes():
    layer = Dense(4, dtype="mixed_float16")
    layer.build((None, 3))
    before = keras.ops.convert_to_numpy(layer.kernel)
    with pytest.raises(ValueError, match="float16"):
        layer.smooth_inputs(np.array([2.0, 2.0, 2.0], "float32"))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.kernel), before)
    assert layer.quantization_mode is None


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
    if mode == "int8":  # As bertzoo.quantize refuses int8 for a float16 model.
        with pytest.raises(
            ValueError, match=r"is int8-quantized, .* not compute in float16: load it with dtype='bfloat16'"
        ):
            bertzoo.BertClassifier.from_preset(tmp_path / "q", dtype="mixed_float16")
    else:  # int4 computes in float16, as quantizing a float16 model to int4 does.
        half = bertzoo.BertClassifier.from_preset(tmp_path / "q", dtype="mixed_float16")
        assert half.backbone.dtype_policy.compute_dtype == "float16"
        np.testing.assert_allclose(call(half, x), expected, atol=2e-2)


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
    # "none", as compress spells it: plain int8, which calibrates nothing.
    assert cli.main(argv[:2] + [str(tmp_path / "e")] + argv[3:] + ["--smoothing", "none"]) == 1
    assert "drop one of them" in capsys.readouterr().err
    assert cli.main(argv[:2] + [str(tmp_path / "plain"), "--smoothing", "None"]) == 0
    again = bertzoo.BertClassifier.from_preset(tmp_path / "plain")
    np.testing.assert_allclose(call(again, x), call(bertzoo.quantize(model), x), atol=1e-6)

    assert cli.main(["sparsity", str(tmp_path / "float")]) == 0
    out = capsys.readouterr().out
    assert "attention_0/query" in out and "gzip" in out


# --- Weight-only int8: int8 kernels, float inputs and arithmetic ---------------


def quantized_dense_layers(model):
    return [
        layer for layer in flatten_layers(model) if isinstance(layer, keras.layers.Dense) and layer.quantization_mode
    ]


def test_weight_only_inputs_meet_the_dequantized_kernel_unquantized(model):
    query = model.backbone.attention_blocks[0].query_dense
    float_kernel = keras.ops.convert_to_numpy(query.kernel).copy()
    q = bertzoo.quantize(model, "int8", weight_only=True)
    assert model.backbone.attention_blocks[0].query_dense.quantization_mode is None  # The original is untouched.
    layers = quantized_dense_layers(q)
    assert len(layers) == len([d for d in flatten_layers(model) if isinstance(d, keras.layers.Dense)])
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


def test_weight_only_saved_model_serves_without_the_fused_int8_kernel(model, tmp_path):
    import tensorflow as tf

    from bertzoo.export import read_export_metadata

    q = bertzoo.quantize(model, "int8", weight_only=True)
    path = q.export(tmp_path / "1", format="tf_saved_model", jit_compile=False)
    # No integer matmul to fuse: the graph holds Keras's float ops only.
    metadata = read_export_metadata(path)
    assert metadata["int8_kernels"] == "portable" and metadata["quantization"] == ["int8"]
    served = tf.saved_model.load(str(path)).signatures["serving_default"](text=tf.constant(TEXTS))
    np.testing.assert_allclose(served["logits"].numpy(), q.predict(TEXTS, verbose=0), atol=1e-5)


def test_command_line_writes_a_weight_only_preset(model, tmp_path, capsys, monkeypatch):
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
    # "~" (quoted, or after --out=) is the home directory for the existence check too: no silent overwrite.
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["quantize", str(tmp_path / "float"), "~/w", "--weight-only"]) == 1
    assert "already exists. Pass --overwrite" in capsys.readouterr().err


def test_weight_only_refusals_name_the_fix(model):
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
