"""SavedModel export: a fresh TensorFlow-only process serves the same
predictions as the Keras model, for raw text, pairs and token ids; bad input
gives defined outputs or errors; float32, mixed precision, zeroed (pruned)
and int8 models; other tasks; atomic writes; the `bertzoo export` CLI."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo import cli
from bertzoo.datasets import find_shared_sentiment
from bertzoo.datasets import load_rated_sentences
from bertzoo.datasets import synthetic_sentiment
from bertzoo.export import custom_ops
from bertzoo.export import describe_export
from bertzoo.export import read_export_metadata
from bertzoo.layers.dense import portable_kernels
from bertzoo.models import serving
from bertzoo.models.serving import batch_bucket
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary
from bertzoo.utils.onednn import onednn_int8_available

VOCABULARY_SIZE = 1200
SEQUENCE_LENGTH = 48
MAX_SEQUENCE_LENGTH = 128
TF_TEXT_OPS = ["FastWordpieceTokenizeWithOffsets", "NormalizeUTF8", "RegexSplitWithOffsets", "TFText>RoundRobinTrim"]
SERVER_SCRIPT = Path(__file__).resolve().parent / "export_fresh_server.py"


def small_backbone(num_layers=1, dtype=None):
    return bertzoo.BertBackbone(
        vocabulary_size=VOCABULARY_SIZE,
        num_layers=num_layers,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        dtype=dtype,
    )


def small_preprocessor(sequence_length=SEQUENCE_LENGTH):
    return BertPreprocessor(BertTokenizer(builtin_vocabulary(VOCABULARY_SIZE)), sequence_length=sequence_length)


def small_classifier(num_layers=1, dtype=None, seed=0):
    keras.utils.set_random_seed(seed)
    return bertzoo.BertClassifier(
        small_backbone(num_layers, dtype),
        2,
        preprocessor=small_preprocessor(),
        class_names=["negative", "positive"],
        dropout=0.0,
    )


def tokenized(texts, sequence_length=SEQUENCE_LENGTH):
    return {k: np.asarray(v).astype("int32") for k, v in small_preprocessor(sequence_length)(texts).items()}


def real_sentences(n=12):
    """Human-written review sentences from ../shared when present (else generated ones)."""
    path = find_shared_sentiment("amazon")
    if path is not None:
        return load_rated_sentences(path, max_rows=n)[0]
    return synthetic_sentiment(n, seed=7)[0]


def serving_batch():
    """Real sentences plus in-domain ones, on which the trained model's predictions differ."""
    return real_sentences(12) + synthetic_sentiment(12, seed=1)[0]


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def assert_serves_like(result, reference, class_names=("negative", "positive"), atol=1e-5):
    """`result` (a signature's outputs, as NumPy or lists) matches Keras logits `reference`."""
    logits = np.asarray(result["logits"], "float32").reshape(reference.shape)
    np.testing.assert_allclose(logits, reference, atol=atol)
    np.testing.assert_allclose(
        np.asarray(result["probabilities"]).reshape(reference.shape), softmax(reference), atol=atol
    )
    labels = np.asarray(result["label_ids"])
    margin = np.abs(reference[:, 1] - reference[:, 0])
    clear = margin > 10 * atol  # Near-ties may flip within tolerance.
    np.testing.assert_array_equal(labels[clear], reference.argmax(-1)[clear])
    names = [n.decode() if isinstance(n, bytes) else n for n in np.asarray(result["label_names"]).tolist()]
    assert names == [class_names[i] for i in labels]


@pytest.fixture(scope="module")
def trained():
    """A small classifier trained a few steps, so its predictions differ between texts."""
    model = small_classifier()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    texts, labels = synthetic_sentiment(256, seed=0)
    model.fit(texts, labels, batch_size=32, epochs=3, verbose=0)  # 24 steps.
    return model


@pytest.fixture(scope="module")
def cli_export(trained, tmp_path_factory):
    """`bertzoo export PRESET_DIR OUT_DIR` on the trained model's preset: (preset, export, printed)."""
    root = tmp_path_factory.mktemp("serving")
    trained.save_to_preset(root / "preset")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = cli.main(["export", str(root / "preset"), str(root / "sentiment" / "1")])
    assert status == 0
    return root / "preset", root / "sentiment" / "1", printed.getvalue()


@pytest.fixture(scope="module")
def exported(cli_export):
    return cli_export[1]


def test_a_fresh_tensorflow_only_process_serves_the_keras_predictions(trained, exported, tmp_path):
    sentences = serving_batch()
    long_text = "a gripping, funny film that never drags. " * 3000  # 126k characters.
    non_utf8 = [b"\xff\xfe caf\xc3 great", b"\x80", b"fine \xe2\x82"]
    blank = ["", " ", "\t\n"]
    scalar = "one string, not a batch"
    pairs = (sentences[:3], sentences[3:6])
    # The Keras model's predictions, in one call: the sentences, then the odd inputs.
    texts = [t.encode() for t in sentences + blank + [long_text, scalar]] + non_utf8
    keras_logits = trained.predict(tf.constant(texts), verbose=0)
    reference, keras_logits = keras_logits[: len(sentences)], keras_logits[len(sentences) :]
    keras_blank, keras_long, keras_scalar, keras_non_utf8 = np.split(keras_logits, [3, 4, 5])
    assert np.std(reference[:, 1] - reference[:, 0]) > 2e-2, "the test model's predictions are trivial"
    inputs = {
        "sentences": sentences,
        "blank": blank,
        "scalar": scalar,
        "long_text": long_text,
        "non_utf8_hex": [b.hex() for b in non_utf8],
        "pairs": pairs,
        "tokenized": {k: v.tolist() for k, v in tokenized(sentences[:3]).items()},
        "max_sequence_length": MAX_SEQUENCE_LENGTH,
        "vocabulary_size": VOCABULARY_SIZE,
    }
    (tmp_path / "inputs.json").write_text(json.dumps(inputs))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run(
        [sys.executable, str(SERVER_SCRIPT), str(exported), str(tmp_path / "inputs.json"), str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())

    # Only TensorFlow and TF Text's op kernels were needed: never Keras or bertzoo.
    assert results["imported_in_part_1"] == []
    assert "bertzoo" not in results["imported_in_part_2"]
    assert "Op type not registered" in results["load_without_tf_text"]
    assert any(op in results["load_without_tf_text"] for op in TF_TEXT_OPS)
    assert results["signatures"] == {
        "serving_default": {"inputs": ["text"], "outputs": ["label_ids", "label_names", "logits", "probabilities"]},
        "serving_pairs": {
            "inputs": ["text", "text_pair"],
            "outputs": ["label_ids", "label_names", "logits", "probabilities"],
        },
        "serving_tokenized": {
            "inputs": ["padding_mask", "segment_ids", "token_ids"],
            "outputs": ["label_ids", "label_names", "logits", "probabilities"],
        },
    }

    assert_serves_like(results["sentences"]["outputs"], reference)
    assert_serves_like(results["documented_path"]["outputs"], reference[:2])
    assert_serves_like(results["after_errors"]["outputs"], reference[:2])
    assert_serves_like(results["pairs"]["outputs"], trained.predict(pairs, verbose=0))
    assert_serves_like(results["tokenized"]["outputs"], reference[:3])
    # Bad input: defined outputs ...
    assert_serves_like(results["empty_strings"]["outputs"], keras_blank)
    assert_serves_like(results["long_text"]["outputs"], keras_long)
    assert_serves_like(results["non_utf8"]["outputs"], keras_non_utf8)
    assert results["empty_batch"]["shapes"] == {
        "logits": [0, 2],
        "probabilities": [0, 2],
        "label_ids": [0],
        "label_names": [0],
    }
    # ... or an error for the caller, after which the server still serves.
    assert_serves_like(results["scalar"]["outputs"], keras_scalar)
    assert results["numbers"]["error"] == "InvalidArgumentError"
    assert "expected to be a string tensor" in results["numbers"]["message"]
    for case, message in [
        ("pairs_mismatch", "same number of rows"),
        ("too_long", f"max_sequence_length={MAX_SEQUENCE_LENGTH}"),
        ("bad_token_ids", f"vocabulary_size={VOCABULARY_SIZE}"),
        ("bad_segment_ids", "num_segments=2"),
        ("zero_length", "at least one token"),
        ("shape_mismatch", "`segment_ids` must have the shape of `token_ids`"),
        ("wrong_rank", "is not compatible with expected shape [?,?]"),
    ]:
        assert results[case]["error"] == "InvalidArgumentError", (case, results[case])
        assert message in results[case]["message"], (case, results[case]["message"][:500])


@pytest.mark.skipif(shutil.which("saved_model_cli") is None, reason="saved_model_cli is not installed")
def test_saved_model_cli_lists_signatures_with_meaningful_names(exported):
    shown = subprocess.run(
        ["saved_model_cli", "show", "--dir", str(exported), "--all"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    text = shown.stdout
    for signature in ("serving_default", "serving_pairs", "serving_tokenized"):
        assert f"signature_def['{signature}']" in text
    for name in (
        "inputs['text']",
        "inputs['text_pair']",
        "inputs['token_ids']",
        "inputs['segment_ids']",
        "inputs['padding_mask']",
        "outputs['logits']",
        "outputs['probabilities']",
        "outputs['label_ids']",
        "outputs['label_names']",
    ):
        assert name in text
    assert "DT_STRING" in text and "DT_INT32" in text


def test_export_metadata_describes_signatures_and_needed_ops(exported, trained):
    metadata = read_export_metadata(exported)
    assert metadata["class_names"] == ["negative", "positive"]
    assert metadata["sequence_length"] == SEQUENCE_LENGTH
    assert metadata["max_sequence_length"] == MAX_SEQUENCE_LENGTH
    assert metadata["custom_ops"] == TF_TEXT_OPS == custom_ops(exported)
    assert metadata["signatures"]["serving_default"] == {
        "inputs": {"text": {"dtype": "string", "shape": None}},  # Any shape: flattened by the signature.
        "outputs": {
            "label_ids": {"dtype": "int32", "shape": [-1]},
            "label_names": {"dtype": "string", "shape": [-1]},
            "logits": {"dtype": "float32", "shape": [-1, 2]},
            "probabilities": {"dtype": "float32", "shape": [-1, 2]},
        },
    }
    assert metadata["signatures"]["serving_tokenized"]["inputs"]["token_ids"] == {"dtype": "int32", "shape": [-1, -1]}
    summary = describe_export(exported)
    assert "serving_pairs(text: string[any shape], text_pair: string[any shape])" in summary
    assert "import tensorflow_text" in summary
    # The variables hold the Keras weights exactly.
    served = tf.saved_model.load(str(exported))
    saved = {v.name: v.numpy() for v in served.model_variables}
    assert sorted(saved) == sorted(w.path + ":0" for w in trained.weights)
    for weight in trained.weights:
        np.testing.assert_array_equal(saved[weight.path + ":0"], weight.numpy())


def test_exports_atomically_and_refuses_to_replace_a_version(tmp_path, monkeypatch):
    model = small_classifier()
    target = tmp_path / "model" / "1"
    model.export(target)  # Task.export -> export_saved_model.
    assert (target / "saved_model.pb").is_file()
    before = (target / "saved_model.pb").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        model.export(target)

    # A crash while writing leaves the old version in place and no debris.
    def crash(root, directory, signatures):
        (Path(directory) / "saved_model.pb").write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        model.export(target, overwrite=True)
    monkeypatch.undo()
    assert (target / "saved_model.pb").read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["1"]
    # overwrite=True replaces a SavedModel, never another directory (it replaces the whole of it).
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="exists and is not a SavedModel"):
        model.export(tmp_path / "work", overwrite=True)
    assert (tmp_path / "work" / "notes.txt").read_text() == "keep me"
    # Nor files of others beside an export: TF Serving's warm-up requests, notes.
    warmup = target / "assets.extra" / "tf_serving_warmup_requests"
    warmup.write_bytes(b"requests")
    (target / "README").write_text("served since May")
    with pytest.raises(FileExistsError, match=r"other files \(README, assets.extra/tf_serving_warmup_requests\)"):
        model.export(target, overwrite=True)
    assert warmup.read_bytes() == b"requests" and (target / "saved_model.pb").read_bytes() == before
    warmup.unlink()
    (target / "README").unlink()
    model.export(target, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == [
        "assets",
        "assets.extra",
        "fingerprint.pb",
        "saved_model.pb",
        "variables",
    ]

    with pytest.raises(ValueError, match="input_signature"):
        model.export(target, input_signature=[None])
    with pytest.raises(ValueError, match="Unknown export format 'openvino'"):
        model.export(tmp_path / "x", format="openvino")
    with pytest.raises(ValueError, match="max_sequence_length=128"):
        bertzoo.export_saved_model(model, tmp_path / "y", sequence_length=MAX_SEQUENCE_LENGTH + 1)
    with pytest.raises(ValueError, match="`pairs` must be"):
        bertzoo.export_saved_model(model, tmp_path / "y", pairs="yes")
    with pytest.raises(ValueError, match=r"but the export has no text signatures \(preprocessor=None\)"):
        bertzoo.export_saved_model(model, tmp_path / "y", preprocessor=None, sequence_length=16)
    with pytest.raises(ValueError, match="expects a bertzoo Task"):
        bertzoo.export_saved_model(keras.Sequential([keras.layers.Dense(2)]), tmp_path / "y")
    assert not (tmp_path / "y").exists()


def _variant(kind, trained):
    """A copy of the trained classifier in mixed precision, with zeroed weights, or int8."""
    model = small_classifier(dtype="mixed_bfloat16" if kind == "mixed_bfloat16" else None)
    model.set_weights(trained.get_weights())
    model.compile(jit_compile=False)  # Reference predictions without XLA compile time.
    if kind == "zeroed":  # What a pruned, stripped model looks like: ordinary weights with zeros.
        attention = model.backbone.attention_blocks[0]
        attention.query_dense.kernel.assign(np.zeros(attention.query_dense.kernel.shape, "float32"))
        ffn = model.backbone.feedforward_blocks[0].intermediate_dense
        kernel = ffn.kernel.numpy()
        kernel[:, ::2] = 0
        ffn.kernel.assign(kernel)
    if kind == "int8":
        model.predict(["builds the preprocessing layers"], verbose=0)  # Keras quantizes built layers only.
        model.quantize("int8")
    return model


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
@pytest.mark.parametrize("kind", ["mixed_bfloat16", "zeroed", "int8"])
def test_compressed_and_mixed_precision_models_export(kind, trained, tmp_path):
    model = _variant(kind, trained)
    # Portable: int8 layers run Keras's int8 path (standard ops), not the
    # fused oneDNN kernel predict() uses on CPU (bertzoo.layers.dense).
    # A float model ignores `int8_kernels`, even "onednn" where that kernel cannot run.
    kernels = "portable" if kind == "int8" else "onednn"
    path = bertzoo.export_saved_model(model, tmp_path / kind, pairs=False, int8_kernels=kernels)
    sentences = serving_batch()
    with portable_kernels() if kind == "int8" else contextlib.nullcontext():
        reference = model.predict(sentences, verbose=0)
    # bfloat16 keeps ~3 significant digits, and cutting the padding changes the shapes it sums over.
    atol = 3e-2 if kind == "mixed_bfloat16" else 1e-5
    assert np.std(reference[:, 1] - reference[:, 0]) > 5 * atol
    served = tf.saved_model.load(str(path))
    outputs = {k: v.numpy() for k, v in served.signatures["serving_default"](text=tf.constant(sentences)).items()}
    assert outputs["logits"].dtype == np.float32
    assert_serves_like(outputs, reference, atol=atol)
    if kind == "int8":  # The quantized kernels themselves are exported.
        assert tf.int8 in {v.dtype for v in served.model_variables}
    if kind == "zeroed":
        kernel = next(v for v in served.model_variables if v.name == "attention_0/query/kernel:0")
        assert kernel.shape == (32, 32) and not kernel.numpy().any()
    metadata = read_export_metadata(path)
    assert metadata["dtype_policy"] == ("mixed_bfloat16" if kind == "mixed_bfloat16" else "float32")
    assert metadata["quantization"] == (["int8"] if kind == "int8" else None)
    assert metadata["int8_kernels"] == ("portable" if kind == "int8" else None)
    assert "_QuantizedMatMul" not in (metadata["custom_ops"] or [])


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
@pytest.mark.parametrize("mode", ["weight_only", "int4"])
def test_exports_without_int8_inputs_record_the_kernels_that_run(mode, trained, tmp_path):
    model = _variant("float32", trained)
    quantized = (
        bertzoo.quantize(model, "int8", weight_only=True) if mode == "weight_only" else bertzoo.quantize(model, "int4")
    )
    # No int8 inputs to multiply, so no fused kernel: "onednn" is ignored, as for float models.
    path = bertzoo.export_saved_model(
        quantized, tmp_path / mode, preprocessor=None, int8_kernels="onednn", jit_compile=False
    )
    metadata = read_export_metadata(path)
    assert metadata["int8_kernels"] == "portable" and "_QuantizedMatMul" not in (metadata["custom_ops"] or [])
    assert metadata["quantization"] == ["int8" if mode == "weight_only" else "int4"]


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
def test_int8_exports_run_the_fused_kernel_where_predict_does(trained, tmp_path):
    model = _variant("int8", trained)
    sentences = serving_batch()
    path = bertzoo.export_saved_model(model, tmp_path / "auto", pairs=False)
    metadata = read_export_metadata(path)
    if not onednn_int8_available():  # "auto" falls back to the portable ops.
        assert metadata["int8_kernels"] == "portable"
        with pytest.raises(ValueError, match="int8_kernels='portable'"):
            bertzoo.export_saved_model(model, tmp_path / "fused", int8_kernels="onednn")
        return
    assert metadata["int8_kernels"] == "onednn" and "_QuantizedMatMul" in metadata["custom_ops"]
    # The fused kernel is TensorFlow's own (oneDNN builds), not a tensorflow-text op.
    text_line, onednn_line = describe_export(path).splitlines()[-2:]
    assert "tensorflow-text ops" in text_line and "_QuantizedMatMul" not in text_line
    assert "oneDNN" in onednn_line and "_QuantizedMatMul" in onednn_line
    reference = model.predict(sentences, verbose=0)  # The fused kernel, as served.
    served = tf.saved_model.load(str(path))
    outputs = {k: v.numpy() for k, v in served.signatures["serving_default"](text=tf.constant(sentences)).items()}
    assert_serves_like(outputs, reference, atol=1e-5)
    # Short texts (fewer tokens than 16): one input range per batch covers
    # the padding positions too, so the export must cut as `predict` does.
    short = ["good", "a dull film", "great fun"]
    pinned = bertzoo.export_saved_model(model, tmp_path / "pinned", int8_kernels="onednn", jit_compile=False)
    served = tf.saved_model.load(str(pinned)).signatures["serving_default"](text=tf.constant(short))
    np.testing.assert_allclose(served["logits"].numpy(), model.predict(short, verbose=0), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="`int8_kernels` must be"):
        bertzoo.export_saved_model(model, tmp_path / "x", int8_kernels="fast")


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
def test_int8_exports_serve_under_xla_where_predict_runs_xla(trained, tmp_path, monkeypatch):
    model = _variant("int8", trained)
    sentences = serving_batch()
    # "auto" follows the fast-path choice for predict: pinned to XLA here.
    monkeypatch.setenv("BERTZOO_JIT_COMPILE", "1")
    model.compile()  # Back to jit_compile="auto" (the variant pinned False), so the variable decides.
    path = bertzoo.export_saved_model(model, tmp_path / "xla", pairs=False)
    metadata = read_export_metadata(path)
    assert metadata["jit_compile"] is True and metadata["xla_length_multiple"] == 16
    assert metadata["int8_kernels"] == "portable" and "_QuantizedMatMul" not in (metadata["custom_ops"] or [])
    assert b"_XlaMustCompile" in (path / "saved_model.pb").read_bytes()
    assert "XLA-compiled function" in describe_export(path) and "multiples of 16 tokens" in describe_export(path)
    assert [int(batch_bucket(tf.constant(n))) for n in (0, 1, 3, 8, 9, 24, 32, 33, 100)] == [
        1,
        1,
        4,
        8,
        16,
        32,
        32,
        64,
        128,
    ]
    model.compile(jit_compile=True)  # What predict runs when the measurement picks XLA.
    reference = model.predict(sentences, verbose=0)
    served = tf.saved_model.load(str(path))
    outputs = {k: v.numpy() for k, v in served.signatures["serving_default"](text=tf.constant(sentences)).items()}
    assert_serves_like(outputs, reference, atol=1e-4)
    tokenized = model.preprocessor(sentences[:3])
    ids = {k: tf.cast(v, tf.int32) for k, v in tokenized.items()}
    np.testing.assert_allclose(
        served.signatures["serving_tokenized"](**ids)["logits"].numpy(), reference[:3], atol=1e-4
    )
    # Batches run padded to their bucket (24 -> 32 above, 3 -> 4 here); the padding rows are dropped.
    three = served.signatures["serving_default"](text=tf.constant(sentences[:3]))["logits"].numpy()
    np.testing.assert_allclose(three, reference[:3], atol=1e-4)
    assert served.signatures["serving_default"](text=tf.constant([], tf.string))["logits"].shape == (0, 2)
    # Bad combinations are refused.
    with pytest.raises(ValueError, match="cannot be combined with jit_compile=True"):
        bertzoo.export_saved_model(model, tmp_path / "x", int8_kernels="onednn", jit_compile=True)
    with pytest.raises(ValueError, match="`jit_compile` must be True, False or 'auto'"):
        bertzoo.export_saved_model(model, tmp_path / "x", jit_compile="yes")
    assert not (tmp_path / "x").exists()
    # The command line pins it too ("auto" would follow the pin above: XLA).
    model.save_to_preset(tmp_path / "int8_preset")
    assert cli.main(["export", str(tmp_path / "int8_preset"), str(tmp_path / "cli"), "--jit-compile", "false"]) == 0
    assert read_export_metadata(tmp_path / "cli")["jit_compile"] is False
    # A user's compile() pin is what predict runs, so "auto" follows it (over the variable too).
    model.compile(jit_compile=False)
    pinned = bertzoo.export_saved_model(model, tmp_path / "pinned", pairs=False)
    assert read_export_metadata(pinned)["jit_compile"] is False
    assert bertzoo.explain_fast_path(model).source == "pinned"  # The export measured nothing over it.


def test_float_exports_serve_the_path_predict_takes_here(trained, tmp_path, monkeypatch):
    # On a CPU where the measurement picks XLA for a float model's predict, an
    # export without it served 1.1-1.5x slower than predict (benchmarks.export).
    monkeypatch.setenv("BERTZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTZOO_JIT_COMPILE")
    bertzoo.utils.fast_path.clear_memory_cache()
    model = small_classifier()
    model.set_weights(trained.get_weights())
    model.compile()  # jit_compile="auto": the measurement decides.
    timed = []

    def xla_faster(name, fn):
        timed.append(name)
        return 0.01 if name.endswith("/xla") else 0.02

    monkeypatch.setattr(bertzoo.utils.fast_path, "wall_timer", xla_faster)
    path = bertzoo.export_saved_model(model, tmp_path / "measured", pairs=False)
    assert (
        read_export_metadata(path)["jit_compile"] is True
        and b"_XlaMustCompile" in (path / "saved_model.pb").read_bytes()
    )
    assert set(timed) == {"predict/no_xla", "predict/xla"}  # The export measured predict only.
    assert bertzoo.explain_fast_path(model).predict is True  # ... and predict follows the same choice.
    sentences = serving_batch()
    served = tf.saved_model.load(str(path))
    outputs = {k: v.numpy() for k, v in served.signatures["serving_default"](text=tf.constant(sentences)).items()}
    assert_serves_like(outputs, model.predict(sentences, verbose=0), atol=1e-4)
    # Measured once: the next export reads the choice; a compile() pin wins over it.
    timed.clear()
    assert read_export_metadata(bertzoo.export_saved_model(model, tmp_path / "again", pairs=False))["jit_compile"]
    assert timed == []
    model.compile(jit_compile=False)
    assert (
        read_export_metadata(bertzoo.export_saved_model(model, tmp_path / "pinned", pairs=False))["jit_compile"]
        is False
    )
    # The rule, where nothing is measured: no XLA for a float model on a CPU.
    monkeypatch.setenv("BERTZOO_JIT_COMPILE", "rule")
    model.compile()
    assert (
        read_export_metadata(bertzoo.export_saved_model(model, tmp_path / "rule", pairs=False))["jit_compile"] is False
    )


def _built_in_task(kind):
    keras.utils.set_random_seed(4)
    backbone, preprocessor = small_backbone(), small_preprocessor()
    if kind == "question_answerer":
        model = bertzoo.BertQuestionAnswerer(backbone, preprocessor=preprocessor)
    elif kind == "token_classifier":
        model = bertzoo.BertTokenClassifier(backbone, 3, preprocessor=preprocessor, class_names=["O", "PER", "LOC"])
    else:
        model = bertzoo.BertMultipleChoice(backbone, 2, preprocessor=preprocessor)
    head = model.span_dense if kind == "question_answerer" else model.output_dense
    head.kernel.assign(head.kernel.numpy() * 50)  # Predictions that differ between inputs.
    model.compile(jit_compile=False)
    return model


def test_task_export_writes_through_the_exporter_bertzoo_export_registers(monkeypatch):
    # `bertzoo.models` may not import `bertzoo.export` (the package order): the
    # writer reaches `Task.export` through the registry.
    assert serving.exporter() is bertzoo.export.export_model
    calls = []
    monkeypatch.setattr(serving, "_exporter", lambda model, path, **options: calls.append((model, path, options)))
    model = bertzoo.BertClassifier(bertzoo.BertBackbone.from_preset("tiny", load_weights=False), 2, preprocessor=None)
    model.export("serving/1", format="onnx", sequence_length=16)
    assert calls == [
        (model, "serving/1", {"format": "onnx", "overwrite": False, "sequence_length": 16, "verbose": False})
    ]
    monkeypatch.setattr(serving, "_exporter", None)
    with pytest.raises(RuntimeError, match="No exporter is registered: import bertzoo"):
        model.export("serving/2")


@pytest.mark.parametrize("kind", ["question_answerer", "token_classifier", "multiple_choice"])
def test_built_in_tasks_serve_their_own_raw_inputs_and_outputs(kind, tmp_path):
    model = _built_in_task(kind)
    path = bertzoo.export_saved_model(model, tmp_path / kind)
    served = tf.saved_model.load(str(path)).signatures
    if kind == "question_answerer":  # The answer span, decoded as predict_spans does.
        questions = ["who wrote it?", "where was it?", "when?"]
        contexts = ["it was written by ada in london.", "in the garden behind the house", ""]
        outputs = served["serving_default"](question=tf.constant(questions), context=tf.constant(contexts))
        expected = model.predict_spans(questions, contexts)
        assert [a.decode() for a in outputs["answer"].numpy()] == [e["text"] for e in expected]
        assert outputs["start"].numpy().tolist() == [e["start"] for e in expected]
        assert outputs["end"].numpy().tolist() == [e["end"] for e in expected]
        np.testing.assert_allclose(outputs["score"].numpy(), [e["score"] for e in expected], rtol=1e-5)
        assert "TFText>FastWordpieceDetokenize" in read_export_metadata(path)["custom_ops"]
        # Other ranks are flattened: a column of contexts (what df[["context"]] gives) answers the same,
        # and a scalar pair is a batch of one (a [n, 1] column once reached the body unflattened).
        column = served["serving_default"](
            question=tf.constant(questions), context=tf.constant([[c] for c in contexts])
        )
        assert column["answer"].numpy().tolist() == outputs["answer"].numpy().tolist()
        one = served["serving_default"](question=tf.constant(questions[0]), context=tf.constant(contexts[0]))
        assert one["answer"].numpy().tolist() == outputs["answer"].numpy()[:1].tolist()
    elif kind == "token_classifier":  # One label per word, as predict_words gives.
        # Unicode spaces (no-break, ideographic) separate words in both, as in str.split().
        sentences = ["Anna visits Oslo today", "Olaf\u00a0left\u3000", ""]
        expected = model.predict_words(sentences)
        assert len({label for row in expected for label in row}) > 1
        for outputs in (
            served["serving_default"](text=tf.constant(sentences)),
            served["serving_words"](words=tf.constant([s.split() + [""] * (4 - len(s.split())) for s in sentences])),
        ):
            names = [[n.decode() or None for n in row] for row in outputs["label_names"].numpy()]
            assert [row[: len(e)] for row, e in zip(names, expected)] == expected
            assert [row[len(e) :] for row, e in zip(names, expected)] == [[None] * (4 - len(e)) for e in expected]
            assert outputs["words"].numpy()[0].tolist() == [b"Anna", b"visits", b"Oslo", b"today"]
        # One sentence's words, not a batch of them: refused with the shape expected.
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"`words` must be a string tensor of shape \[batch, n\]"
        ):
            served["serving_words"](words=tf.constant(["Anna", "visits"]))
    else:
        contexts = ["He was hungry,", "She opened the umbrella"]
        choices = [["so he ate.", "so he slept."], ["because it rained.", "because it was dry."]]
        outputs = served["serving_default"](context=tf.constant(contexts), choices=tf.constant(choices))
        reference = model.predict((contexts, choices), verbose=0)
        np.testing.assert_allclose(outputs["logits"].numpy(), reference, atol=1e-5)
        np.testing.assert_array_equal(outputs["label_ids"].numpy(), reference.argmax(-1))
        assert served["serving_tokenized"].structured_input_signature[1]["token_ids"].shape.as_list() == [None, 2, None]
        column = served["serving_default"](context=tf.constant([[c] for c in contexts]), choices=tf.constant(choices))
        np.testing.assert_allclose(column["logits"].numpy(), reference, atol=1e-5)
        one = served["serving_default"](context=tf.constant(contexts[0]), choices=tf.constant(choices[:1]))
        np.testing.assert_allclose(one["logits"].numpy(), reference[:1], atol=1e-5)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"`choices` must be a string tensor of shape \[batch, 2\]"
        ):
            served["serving_default"](
                context=tf.constant(contexts[:1]), choices=tf.constant([[c[0] for c in choices]]).numpy()[0]
            )


class TokenTagger(bertzoo.Task):
    """A task that is not a classifier: per-token scores, with a serving hook."""

    def __init__(self, backbone, num_tags, preprocessor=None, **kwargs):
        inputs = backbone.input
        scores = keras.layers.Dense(num_tags, name="tag_scores")(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=scores, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_tags = num_tags

    def task_config(self):
        return {"num_tags": self.num_tags}

    def serving_outputs(self, outputs):
        return {"tag_scores": outputs, "tag_ids": tf.argmax(outputs, axis=-1, output_type=tf.int32)}


def test_other_tasks_export_through_their_serving_hook(tmp_path):
    keras.utils.set_random_seed(1)
    model = TokenTagger(small_backbone(num_layers=1), num_tags=5)  # No preprocessor: token ids only.
    path = bertzoo.export_saved_model(model, tmp_path / "tagger")
    served = tf.saved_model.load(str(path))
    assert sorted(served.signatures) == ["serving_default", "serving_tokenized"]
    inputs = tokenized(real_sentences(4))
    reference = model.predict(inputs, verbose=0)
    for name in ("serving_default", "serving_tokenized"):
        outputs = served.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        np.testing.assert_allclose(outputs["tag_scores"].numpy(), reference, atol=1e-5)
        np.testing.assert_array_equal(outputs["tag_ids"].numpy(), reference.argmax(-1))
    assert read_export_metadata(path)["custom_ops"] == []  # Token ids only: core TensorFlow suffices.


def test_a_backbone_exports_text_features_with_its_own_outputs(tmp_path):
    keras.utils.set_random_seed(2)
    backbone = small_backbone(num_layers=1)
    path = bertzoo.export_saved_model(
        backbone, tmp_path / "features", preprocessor=small_preprocessor(), sequence_length=16, pairs=False
    )
    served = tf.saved_model.load(str(path))
    texts = ["short", "a sentence that is much longer than sixteen tokens"]
    outputs = served.signatures["serving_default"](text=tf.constant(texts))
    reference = backbone.predict(tokenized(texts, sequence_length=16), verbose=0)
    assert sorted(outputs) == ["pooled_output", "sequence_output"]
    np.testing.assert_allclose(outputs["pooled_output"].numpy(), reference["pooled_output"], atol=1e-5)
    # Rows are cut to the longest text in the batch (here the full 16).
    np.testing.assert_allclose(outputs["sequence_output"].numpy(), reference["sequence_output"], atol=1e-5)
    assert read_export_metadata(path)["sequence_length"] == 16


def test_backbone_export_is_bertzoos_export_not_keras(tmp_path):
    # It was keras.Model.export: "serve" and no serving_tokenized, and it wrote into an existing directory.
    keras.utils.set_random_seed(2)
    backbone = small_backbone(num_layers=1)
    backbone.export(tmp_path / "1")
    served = tf.saved_model.load(str(tmp_path / "1"))
    assert sorted(served.signatures) == ["serving_default", "serving_tokenized"]
    features = tokenized(["short", "a longer sentence"], sequence_length=16)
    outputs = served.signatures["serving_tokenized"](**{k: tf.constant(v) for k, v in features.items()})
    reference = backbone.predict(features, verbose=0)
    for key in ("pooled_output", "sequence_output"):
        np.testing.assert_allclose(outputs[key].numpy(), reference[key], atol=1e-5)
    with pytest.raises(FileExistsError, match="already exists. Pass overwrite=True"):
        backbone.export(tmp_path / "1")
    with pytest.raises(ValueError, match=r"BertBackbone.export writes fixed serving signatures"):
        backbone.export(tmp_path / "2", input_signature=[])


def test_cli_export_prints_the_signatures_and_reports_errors(cli_export, tmp_path, capsys, monkeypatch):
    preset, out, printed = cli_export  # Served by the fresh process in the first test.
    assert f"SavedModel at {out}" in printed
    assert "serving_default(text: string[any shape])" in printed and "label_names: string[-1]" in printed
    assert cli.main(["export", str(preset), str(out)]) == 1
    assert "already exists. Pass overwrite=True (CLI: --overwrite)" in capsys.readouterr().err
    (tmp_path / "ready").mkdir()  # An empty directory made for the export is no reason to refuse.
    assert cli.main(["export", str(preset), str(tmp_path / "ready")]) == 0
    assert (tmp_path / "ready" / "saved_model.pb").is_file()
    capsys.readouterr()
    assert cli.main(["export", "tiny", str(tmp_path / "other")]) == 1
    assert "built-in preset definition" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "missing"), str(tmp_path / "other")]) == 1
    assert "missing' does not exist; check the path" in capsys.readouterr().err

    calls = []
    monkeypatch.setattr(bertzoo.export, "export_model", lambda model, path, **kwargs: calls.append(kwargs))
    argv = ["export", str(preset), str(out), "--overwrite", "--sequence-length", "32", "--format", "litert"]
    assert cli.main(argv) == 0
    assert calls == [{"format": "litert", "overwrite": True, "sequence_length": 32}]


@pytest.mark.parametrize("activation", [None, "sigmoid"])
def test_a_one_output_head_serves_its_scores(activation, tmp_path):
    # One output without an activation is a regression head (mean squared error): a softmax over
    # one column would serve probability 1 and label 0 for every text.
    model = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, num_classes=1, activation=activation, sequence_length=16
    )
    texts = ["short", "a somewhat longer text"]
    path = bertzoo.export_saved_model(model, tmp_path / "served", pairs=False)
    outputs = tf.saved_model.load(str(path)).signatures["serving_default"](text=tf.constant(texts))
    assert sorted(outputs) == ["scores"]
    np.testing.assert_allclose(outputs["scores"].numpy(), model.predict(texts, verbose=0), atol=1e-5)
