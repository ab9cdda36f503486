"""bertzoo on the JAX backend: same outputs as TensorFlow on the same
weights, raw-text fit/predict (tokenized in tf.data), and
`keras.distribution.DataParallel` on two CPU devices.

The Keras backend is fixed at import, so the JAX side runs in a subprocess
with `KERAS_BACKEND=jax` and `XLA_FLAGS=--xla_force_host_platform_device_count=2`.
It loads a preset this (TensorFlow) process saved. Skipped when JAX is not
installed (`pip install jax jaxlib`; see the README's optional JAX job).
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import bertzoo

if importlib.util.find_spec("jax") is None:
    pytest.skip("jax is not installed (optional job: pip install jax jaxlib)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
TEXTS = [f"film {i} was {'great fun' if i % 2 else 'dull and long'}" for i in range(16)]
LABELS = np.arange(16) % 2

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    import keras
    import numpy as np
    import bertzoo

    preset, out = sys.argv[1], sys.argv[2]
    texts, labels = json.loads(sys.argv[3]), np.array(json.loads(sys.argv[4]))
    report = {"backend": keras.backend.backend(), "devices": [str(d) for d in jax.devices()]}

    model = bertzoo.BertClassifier.from_preset(preset)
    features = {k: np.asarray(v) for k, v in model.preprocessor(texts).items()}
    outputs = model.backbone.predict_on_batch(features)
    report["sequence_output"] = np.asarray(outputs["sequence_output"]).tolist()
    report["pooled_output"] = np.asarray(outputs["pooled_output"]).tolist()
    report["logits"] = model.predict(texts, batch_size=8, verbose=0).tolist()

    def train():
        model = bertzoo.BertClassifier.from_preset(preset)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        history = model.fit(texts, labels, batch_size=8, epochs=3, shuffle=False, verbose=0)
        weight = model.backbone.embeddings.token_embedding.embeddings.value
        return history.history["loss"], bool(model.jit_compile), len(weight.sharding.device_set)

    report["one_device"] = train()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()[:2]))
    report["data_parallel"] = train()
    with open(out, "w") as f:
        json.dump(report, f)
    """
)


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jax")
    keras.utils.set_random_seed(7)
    backbone = bertzoo.BertBackbone.from_preset("tiny", load_weights=False, dropout=0.0)
    preprocessor = bertzoo.Preset.resolve("tiny").build_preprocessor(sequence_length=40)
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=preprocessor, dropout=0.0)
    model.save_to_preset(tmp / "preset")

    features = {k: np.asarray(v) for k, v in preprocessor(TEXTS).items()}
    tf_outputs = backbone.predict_on_batch(features)
    tf_logits = model.predict(TEXTS, batch_size=8, verbose=0)
    trained = bertzoo.BertClassifier.from_preset(tmp / "preset")
    trained.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=False)
    tf_losses = trained.fit(TEXTS, LABELS, batch_size=8, epochs=3, shuffle=False, verbose=0).history["loss"]

    script = tmp / "run_jax.py"
    script.write_text(SCRIPT)
    out = tmp / "report.json"
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    done = subprocess.run(
        [sys.executable, str(script), str(tmp / "preset"), str(out), json.dumps(TEXTS), json.dumps(LABELS.tolist())],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    report["tf"] = {"outputs": tf_outputs, "logits": tf_logits, "losses": tf_losses}
    return report


def test_runs_on_the_jax_backend_with_two_cpu_devices(jax_run):
    assert jax_run["backend"] == "jax"
    assert len(jax_run["devices"]) == 2


def test_backbone_matches_tensorflow_on_the_same_weights(jax_run):
    tf_outputs = jax_run["tf"]["outputs"]
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(np.asarray(jax_run[key]), tf_outputs[key], atol=2e-5, rtol=1e-4)


def test_classifier_predicts_raw_text_like_tensorflow(jax_run):
    np.testing.assert_allclose(np.asarray(jax_run["logits"]), jax_run["tf"]["logits"], atol=2e-5, rtol=1e-4)


def test_jax_fit_follows_the_tensorflow_loss_trajectory(jax_run):
    losses, jit, _ = jax_run["one_device"]
    assert jit  # On JAX, bertzoo always compiles (eager would be op by op).
    assert np.ptp(losses) > 1e-3  # Training moved.
    np.testing.assert_allclose(losses, jax_run["tf"]["losses"], rtol=1e-4)


def test_data_parallel_on_two_devices_matches_one_device(jax_run):
    one, _, one_devices = jax_run["one_device"]
    two, _, two_devices = jax_run["data_parallel"]
    assert (one_devices, two_devices) == (1, 2)  # Weights replicated on both devices.
    np.testing.assert_allclose(two, one, rtol=1e-5)
