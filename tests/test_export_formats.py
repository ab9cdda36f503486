"""ONNX and LiteRT exports of the tokenized model give the Keras predictions."""

import importlib.util
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.export import portable
from bertzoo.layers.dense import portable_kernels
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary

VOCABULARY_SIZE = 1200
SEQUENCE_LENGTH = 24
TEXTS = ["a gripping, funny film", "dull and far too long", "", "ok"]


def small_classifier(dtype=None, **backbone_arguments):
    keras.utils.set_random_seed(5)
    config = dict(num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64, max_sequence_length=64)
    backbone = bertzoo.BertBackbone(vocabulary_size=VOCABULARY_SIZE, dtype=dtype, **{**config, **backbone_arguments})
    preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(VOCABULARY_SIZE)), sequence_length=SEQUENCE_LENGTH)
    model = bertzoo.BertClassifier(backbone, 3, preprocessor=preprocessor)
    head = model.get_layer("logits")
    head.kernel.assign(head.kernel.numpy() * 50)  # Logits of order 1, so the tolerance means something.
    model.compile(jit_compile=False)
    return model


def needs_onnx():
    """Skips the test unless the ONNX export packages are installed."""
    for module in ("tf2onnx", "onnx", "onnxruntime"):
        pytest.importorskip(module, reason='ONNX export needs pip install "bertzoo[export]"')


@pytest.fixture(scope="module")
def model():
    return small_classifier()


def quantized(model, layer=None):
    """`model` after Keras int8 quantization (of one layer, or of the whole model)."""
    model.predict(TEXTS, verbose=0)  # Keras quantizes built layers only (the packer included).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Layer X does not have a `quantize` method"
        (model.get_layer(layer) if layer else model).quantize("int8")
    return model


@pytest.fixture(scope="module")
def float_tflite(model, tmp_path_factory):
    return model.export(tmp_path_factory.mktemp("litert") / "classifier.tflite", format="litert")


def run_tflite(path, features):
    runner = tf.lite.Interpreter(model_path=str(path)).get_signature_runner()
    (logits,) = runner(**features).values()
    return logits


@pytest.fixture(scope="module")
def features(model):
    return {k: np.asarray(v).astype("int32") for k, v in model.preprocessor(TEXTS).items()}


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_litert_export_runs_in_the_tflite_interpreter(model, features, float_tflite, tmp_path):
    path = float_tflite
    interpreter = tf.lite.Interpreter(model_path=str(path))
    signature = interpreter.get_signature_list()["serving_default"]
    assert sorted(signature["inputs"]) == ["padding_mask", "segment_ids", "token_ids"]
    runner = interpreter.get_signature_runner()
    reference = model.predict(features, verbose=0)
    assert np.std(reference) > 0.1
    for rows in (slice(0, 4), slice(1, 2)):  # The batch size is free.
        (logits,) = runner(**{k: v[rows] for k, v in features.items()}).values()
        np.testing.assert_allclose(logits, reference[rows], atol=1e-5)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        model.export(path, format="litert")
    with pytest.raises(ValueError, match="max_sequence_length=64"):
        model.export(tmp_path / "long.tflite", format="litert", sequence_length=65)


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_a_pretrainer_converts_to_builtin_litert_ops_and_a_select_op_is_refused(tmp_path, monkeypatch):
    keras.utils.set_random_seed(7)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=64, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=16
    )
    model = bertzoo.BertPretrainer(backbone, sentence_objective="nsp")
    features = {
        "token_ids": np.arange(16, dtype="int32").reshape(2, 8) + 5,
        "mask_positions": np.array([[1, 3], [2, 6]]),
    }
    features.update(segment_ids=np.zeros((2, 8), "int32"), padding_mask=np.ones((2, 8), "int32"))
    features["mask_positions"] = features["mask_positions"].astype("int32")
    # The masked-LM head's gather wrote a TensorFlow StridedSlice, which the plain interpreter refused to run
    # ("Select TensorFlow op(s) ... not supported by this interpreter"), after an export that reported success.
    path = model.export(tmp_path / "pretrainer.tflite", format="litert")
    outputs = tf.lite.Interpreter(model_path=str(path)).get_signature_runner()(**features)
    reference = model.predict(features, verbose=0)
    for name in ("mlm", "sentence"):
        np.testing.assert_allclose(outputs[name], reference[name], atol=1e-5)
    # An op without a LiteRT builtin (the head's old gather) is refused, and nothing is written ...
    import bertzoo.layers.masked_lm_head as head_module

    class OldIndexing:
        def __getattr__(self, name):
            return getattr(keras.ops, name)

        def expand_dims(self, x, axis):
            return x[:, :, None]

    monkeypatch.setattr(head_module, "ops", OldIndexing())
    with pytest.raises(
        ValueError, match=r"no builtin kernel for the TensorFlow op\(s\) StridedSlice .*nothing was written"
    ):
        model.export(tmp_path / "select.tflite", format="litert")
    assert not (tmp_path / "select.tflite").exists()
    with pytest.raises(
        ValueError, match=r"no builtin kernel for the TensorFlow op\(s\) StridedSlice"
    ):  # Other settings.
        model.export(tmp_path / "select.tflite", format="litert", target_spec={"supported_types": [tf.float32]})
    # ... unless the caller allows TensorFlow's ops for a runtime that has them.
    allowed = {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]}
    assert model.export(tmp_path / "select.tflite", format="litert", target_spec=allowed).stat().st_size > 0


def test_a_one_file_export_is_flushed_to_disk_before_it_takes_its_name(model, tmp_path, monkeypatch):
    # The rename alone is atomic against a killed process, not against a power loss: the file's data
    # must be on disk first, and the directory entry after.
    events = []
    for name in ("sync_tree", "sync_directory"):
        real = getattr(portable, name)
        monkeypatch.setattr(portable, name, lambda path, real=real, name=name: (events.append(name), real(path))[1])
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    path = model.export(tmp_path / "m.tflite", format="litert")
    assert path.is_file() and events == ["sync_tree", "replace", "sync_directory"]


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_litert_int8_goes_through_the_converters_own_quantization(model, features, float_tflite, tmp_path):
    keras_int8 = quantized(small_classifier(), layer="logits")
    with pytest.raises(ValueError, match=r"optimizations=\[tf.lite.Optimize.DEFAULT\]"):
        keras_int8.export(tmp_path / "keras_int8.tflite", format="litert")
    int8_path = model.export(tmp_path / "int8.tflite", format="litert", optimizations=[tf.lite.Optimize.DEFAULT])
    assert int8_path.stat().st_size < 0.5 * float_tflite.stat().st_size
    reference = model.predict(features, verbose=0)
    np.testing.assert_allclose(run_tflite(int8_path, features), reference, atol=0.05)


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_litert_exports_weight_only_int8_which_has_no_integer_matmuls(features, float_tflite, tmp_path):
    float_model = small_classifier()
    float_model.predict(TEXTS, verbose=0)
    weight_only = bertzoo.quantize(float_model, "int8", weight_only=True)
    path = weight_only.export(tmp_path / "weight_only.tflite", format="litert")
    assert path.stat().st_size < 0.6 * float_tflite.stat().st_size  # int8 kernels and tables (0.52x here)
    np.testing.assert_allclose(run_tflite(path, features), weight_only.predict(features, verbose=0), atol=1e-5)


def test_mixed_precision_models_are_refused_with_the_way_out(tmp_path):
    mixed = small_classifier(dtype="mixed_bfloat16")
    for format in ("onnx", "litert"):
        with pytest.raises(ValueError, match="Export the float32 model"):
            mixed.export(tmp_path / f"mixed.{format}", format=format)


def test_float8_models_are_refused_for_onnx_with_the_way_out(tmp_path):
    needs_onnx()
    model = small_classifier()
    model.predict(TEXTS, verbose=0)  # Keras quantizes built layers only (the packer included).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("float8")
    with pytest.raises(ValueError, match="not float8 .* Export the float32 model"):
        model.export(tmp_path / "float8.onnx", format="onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_no_directory_it_created(model, tmp_path):
    with pytest.raises(ValueError, match="bogus_option"):
        model.export(tmp_path / "new" / "sub" / "m.tflite", format="litert", bogus_option=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_onnx_export_runs_in_onnxruntime(kind, model, features, tmp_path):
    needs_onnx()
    import onnxruntime

    exported_model = model if kind == "float32" else quantized(small_classifier())
    path = exported_model.export(tmp_path / "classifier.onnx", format="onnx")
    session = onnxruntime.InferenceSession(str(path))
    assert sorted(i.name for i in session.get_inputs()) == ["padding_mask", "segment_ids", "token_ids"]
    assert all(isinstance(i.shape[1], str) for i in session.get_inputs())  # Any length (a symbolic dimension).
    with portable_kernels():  # The int8 kernels the export holds (not the fused oneDNN one).
        reference = exported_model.predict(features, verbose=0)
    assert np.std(reference) > 0.1
    for rows in (slice(0, 4), slice(1, 2)):
        (logits,) = session.run(None, {k: v[rows] for k, v in features.items()})
        np.testing.assert_allclose(logits, reference[rows], atol=1e-5)


def test_onnx_export_of_one_head_layers_runs_in_onnxruntime(features, tmp_path):
    # Structured pruning leaves layers of one head; tf2onnx once broke their
    # head transposes (a reshape sharing another layer's shape constant).
    needs_onnx()
    import onnxruntime

    model = small_classifier(num_layers=2, num_heads=[1, 3], head_dim=8)
    path = model.export(tmp_path / "one_head.onnx", format="onnx")
    (logits,) = onnxruntime.InferenceSession(str(path)).run(None, features)
    np.testing.assert_allclose(logits, model.predict(features, verbose=0), atol=1e-5)
    not_an_export = tmp_path / "config.json"
    not_an_export.write_text("{}")
    with pytest.raises(FileExistsError, match=r"is not an earlier onnx export, which is all overwrite=True replaces"):
        model.export(not_an_export, format="onnx", overwrite=True)
    assert not_an_export.read_text() == "{}"
    no_suffix = model.export(tmp_path / "model_onnx", format="onnx")
    assert model.export(no_suffix, format="onnx", overwrite=True) == no_suffix  # Its own earlier export.


def test_onnx_export_of_an_exact_gelu_model_runs_in_onnxruntime(features, tmp_path):
    # Every converted Hugging Face BERT: TensorFlow's exact GELU is an Erfc op, which tf2onnx left unconverted
    # in a file onnxruntime refused ("No Op registered for Erfc"), after exporting without an error.
    needs_onnx()
    import onnxruntime

    model = small_classifier(activation="gelu_exact")
    path = model.export(tmp_path / "exact.onnx", format="onnx")
    (logits,) = onnxruntime.InferenceSession(str(path)).run(None, features)
    np.testing.assert_allclose(logits, model.predict(features, verbose=0), atol=1e-5)


def test_an_invalid_onnx_graph_is_refused_and_a_trailing_slash_names_no_file(model, tmp_path):
    needs_onnx()
    import onnx
    from onnx import TensorProto
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Erfc", ["x"], ["y"])],
        "unconverted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "bad.onnx")
    with pytest.raises(ValueError, match=r"invalid ONNX graph \(.*Erfc.*\), so nothing was written"):
        portable._check_onnx_graph(tmp_path / "bad.onnx")
    with pytest.raises(IsADirectoryError, match=r"names a directory; onnx export writes one file.*model\.onnx"):
        model.export(f"{tmp_path / 'folder'}/", format="onnx")
    assert not (tmp_path / "folder").exists()


def test_onnx_export_without_its_packages_says_what_to_install(model, tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        portable.importlib.util, "find_spec", lambda name, *a: None if name == "tf2onnx" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r'needs tf2onnx.*pip install "bertzoo\[export\]"'):
        model.export(tmp_path / "classifier.onnx", format="onnx")
    assert not (tmp_path / "classifier.onnx").exists()


def run_portable(format, path, features):
    """The exported file's outputs for `features` (of any length)."""
    if format == "onnx":
        import onnxruntime

        return onnxruntime.InferenceSession(str(path)).run(None, features)[0]
    # The plain interpreter: resize the inputs to this batch, then allocate.
    interpreter = tf.lite.Interpreter(model_path=str(path))
    inputs = {d["name"].split(":")[0].split("serving_default_")[-1]: d for d in interpreter.get_input_details()}
    for name, value in features.items():
        interpreter.resize_tensor_input(inputs[name]["index"], value.shape)
    interpreter.allocate_tensors()
    for name, value in features.items():
        interpreter.set_tensor(inputs[name]["index"], value)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_one_file_serves_any_length_up_to_max_sequence_length(format, tmp_path):
    if format == "onnx":
        needs_onnx()
    keras.utils.set_random_seed(6)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=VOCABULARY_SIZE,
        num_layers=1,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        max_sequence_length=128,
    )
    model = bertzoo.BertClassifier(backbone, 3)
    head = model.get_layer("logits")
    head.kernel.assign(head.kernel.numpy() * 50)
    path = model.export(tmp_path / f"any_length.{format}", format=format)
    rng = np.random.default_rng(0)
    for length in (7, 64, 128):
        token_ids = rng.integers(5, VOCABULARY_SIZE, (3, length)).astype("int32")
        padding_mask = (np.arange(length)[None] < [[length], [length // 2 + 1], [1]]).astype("int32")
        features = {
            "token_ids": token_ids * padding_mask,
            "segment_ids": (np.arange(length)[None] >= length // 3).astype("int32").repeat(3, 0) * padding_mask,
            "padding_mask": padding_mask,
        }
        reference = model.predict(features, verbose=0)
        assert np.std(reference) > 0.1
        np.testing.assert_allclose(run_portable(format, path, features), reference, atol=1e-5)
    # A fixed length on request (runtimes that need static shapes).
    fixed = model.export(tmp_path / f"fixed.{format}", format=format, sequence_length=np.int64(24))
    if format == "onnx":
        import onnxruntime

        assert [i.shape[1] for i in onnxruntime.InferenceSession(str(fixed)).get_inputs()] == [24] * 3
    else:
        details = tf.lite.Interpreter(model_path=str(fixed)).get_input_details()
        assert [d["shape_signature"][1] for d in details] == [24] * 3
    with pytest.raises(ValueError, match="or None \\(any length\\)"):
        model.export(tmp_path / f"bad.{format}", format=format, sequence_length=0)
