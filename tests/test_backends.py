"""bertzoo on Keras's JAX and torch backends: same outputs as TensorFlow on
the same weights, raw-text fit/predict (tokenized in tf.data), the same loss
trajectory, int8 quantization (with input smoothing too), and on JAX `keras.distribution.DataParallel`
on two CPU devices.

The Keras backend is fixed at import, so each backend runs in a subprocess
with `KERAS_BACKEND` set (and, for JAX,
`XLA_FLAGS=--xla_force_host_platform_device_count=2`). It loads a preset this
(TensorFlow) process saved. A backend whose package is not installed is
skipped (see the README's optional backend job).
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

BACKENDS = {"jax": "pip install jax jaxlib", "torch": "pip install torch"}
REPO = Path(__file__).resolve().parents[1]
TEXTS = [f"film {i} was {'great fun' if i % 2 else 'dull and long'}" for i in range(16)]
LABELS = np.arange(16) % 2


def pruning_report(preset, features, labels):
    """Two of the preset's classifier's kernels pruned to half while it
    trains (SGD, token ids), alone (by magnitude) and while distilling an
    unpruned copy's predictions (by movement): the losses, each mask's kept
    count and the stripped model's logits."""
    report = {}
    for name, teacher in (("alone", None), ("distilled", bertzoo.BertClassifier.from_preset(preset))):
        model = bertzoo.BertClassifier.from_preset(preset)
        # XLA where the pruning state is traced (JAX); TensorFlow's compile would cost more than the steps.
        model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=keras.backend.backend() == "jax")
        schedule = bertzoo.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=2, frequency=1)
        scores = "movement" if teacher else "magnitude"
        pruner = bertzoo.Pruner(
            model, schedule, layers=["attention_0/query", "feedforward_1/intermediate"], scores=scores
        )
        history = pruner.fit(
            features,
            labels,
            batch_size=8,
            epochs=2,
            shuffle=False,
            verbose=0,
            teacher=teacher,
        )
        report[name] = {
            "losses": history.history["loss"],
            "kept": [int(np.sum(keras.ops.convert_to_numpy(mask))) for mask in pruner.state.masks],
            "logits": np.asarray(pruner.strip().predict(features, verbose=0)).tolist(),
        }
    return report


SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import keras
    import numpy as np
    import bertzoo

    sys.path.insert(0, "tests")
    from test_backends import pruning_report

    preset, out = sys.argv[1], sys.argv[2]
    texts, labels = json.loads(sys.argv[3]), np.array(json.loads(sys.argv[4]))
    report = {"backend": keras.backend.backend()}

    model = bertzoo.BertClassifier.from_preset(preset)
    features = {k: np.asarray(v) for k, v in model.preprocessor(texts).items()}
    outputs = model.backbone.predict_on_batch(features)
    report["sequence_output"] = np.asarray(outputs["sequence_output"]).tolist()
    report["pooled_output"] = np.asarray(outputs["pooled_output"]).tolist()
    report["logits"] = model.predict(texts, batch_size=8, verbose=0).tolist()
    int8_model = bertzoo.quantize(model, "int8")
    report["int8_logits"] = int8_model.predict(texts, batch_size=8, verbose=0).tolist()
    smoothed = bertzoo.quantize(model, "int8", calibration=texts)
    query = smoothed.backbone.attention_blocks[0].query_dense
    report["smoothing_factors"] = (1.0 / keras.ops.convert_to_numpy(query.input_scale)).tolist()
    report["smoothed_logits"] = smoothed.predict(texts, batch_size=8, verbose=0).tolist()
    static = bertzoo.quantize(model, "int8", calibration=texts, input_ranges="static")
    report["static_range"] = float(keras.ops.convert_to_numpy(static.backbone.attention_blocks[0].query_dense.input_range))
    report["static_logits"] = static.predict(texts, batch_size=8, verbose=0).tolist()
    weight_only = bertzoo.quantize(model, "int8", weight_only=True)
    report["weight_only_logits"] = weight_only.predict(texts, batch_size=8, verbose=0).tolist()
    # Gradients pass the rounding straight through: for sum(y), the smoothing
    # times the dequantized kernel's row sums (TensorFlow: test_quantization_static).
    head = static.output_dense
    x = np.full((2, head.input_scale.shape[0]), 0.1, "float32")
    kernel = keras.ops.convert_to_numpy(head._kernel) / keras.ops.convert_to_numpy(head.kernel_scale)
    expected = keras.ops.convert_to_numpy(head.input_scale) * kernel.sum(axis=1)
    if keras.backend.backend() == "jax":
        import jax

        grad = np.asarray(jax.grad(lambda x: head(x, training=False).sum())(x))
    else:
        import torch

        x = torch.tensor(x, requires_grad=True)
        head(x, training=False).sum().backward()
        grad = x.grad.numpy()
    report["static_grad_error"] = float(np.abs(grad - expected[None, :]).max())
    if keras.backend.backend() == "torch":
        # Inference runs PyTorch's int8 matmul; with gradients on, Keras's path.
        import torch
        from bertzoo.utils import private_api

        used = []
        int8_matmul = private_api.torch_int8_matmul
        private_api.torch_int8_matmul = lambda: int8_matmul() and (lambda a, b: used.append(1) or int8_matmul()(a, b))
        tensors = {k: torch.from_numpy(v) for k, v in features.items()}
        with torch.no_grad():
            fast = int8_model.backbone(tensors)["sequence_output"].numpy()
        keras_path = int8_model.backbone(tensors)["sequence_output"].detach().numpy()
        report["torch_int8_matmul_layers"] = len(used)
        report["torch_int8_max_diff"] = float(np.abs(fast - keras_path).max())
        with torch.no_grad():
            static.backbone(tensors)
        report["torch_static_int8_matmul_layers"] = len(used) - report["torch_int8_matmul_layers"]
        private_api.torch_int8_matmul = int8_matmul

    if keras.backend.backend() == "jax":
        # The mask the attention blocks hand to ops.dot_product_attention, put through JAX's
        # own cuDNN layout check (shape rules only, so it runs on a CPU; a private JAX module:
        # None where it has moved).
        seen = []
        attention = keras.ops.dot_product_attention
        keras.ops.dot_product_attention = lambda *a, **kw: seen.append((*a[:3], kw["mask"])) or attention(*a, **kw)
        model.backbone(features)
        keras.ops.dot_product_attention = attention
        report["attention_mask_shapes"] = [list(mask.shape) for *_, mask in seen]
        try:
            import inspect
            import jax.numpy as jnp
            from jax._src.cudnn import fused_attention_stablehlo as cudnn
        except ImportError:
            cudnn = None

        def cudnn_layout_check(query, key, value, mask):
            query, key, value = (jnp.zeros(t.shape, jnp.bfloat16) for t in (query, key, value))
            bias = cudnn.combine_bias_and_mask(None, jnp.ones(mask.shape, bool), jnp.bfloat16)
            known = ("query", "key", "value", "bias", "layout")
            unset = {p: None for p in inspect.signature(cudnn.check_layout).parameters if p not in known}
            try:
                cudnn.check_layout(query, key, value, bias, layout=cudnn._normalize_layout("BTNH"), **unset)
            except ValueError as error:
                return str(error)
            return "accepted"

        if cudnn is not None:
            query, key, value, mask = seen[0]
            report["cudnn_layout_check"] = cudnn_layout_check(query, key, value, mask)
            report["cudnn_layout_check_key_mask"] = cudnn_layout_check(query, key, value, mask[:, :, :1, :])

        # bertzoo's predict_on_batch (bertzoo.models.jax_predict) against Keras's own: before and
        # after fit, and from a callback while fit holds the variables purged.
        lean_model = bertzoo.BertClassifier.from_preset(preset)
        weights = [np.array(w) for w in lean_model.get_weights()]
        lean = lean_model.predict_on_batch(features)
        unchanged = all(np.array_equal(a, b) for a, b in zip(weights, lean_model.get_weights()))
        keras_before = keras.Model.predict_on_batch(lean_model, features)
        in_fit = []

        class PredictEachBatch(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                in_fit.append(self.model.predict_on_batch(features))

        lean_model.compile(optimizer=keras.optimizers.SGD(0.5))
        lean_model.fit(features, labels, batch_size=8, epochs=1, verbose=0, callbacks=[PredictEachBatch()])
        trained = lean_model.predict_on_batch(features)
        keras_trained = keras.Model.predict_on_batch(lean_model, features)

        # Two layers with weights of one shape: freezing the first after the forward pass is
        # traced moves its variables to the end of trainable + non-trainable (no retrace, the
        # shapes line up), so values passed in that order would land in the wrong layer.
        from bertzoo.models.jax_predict import JaxPredictOnBatchMixin

        class Plain(JaxPredictOnBatchMixin, keras.Model):
            pass

        plain_input = keras.Input((3,))
        first, second = keras.layers.Dense(3), keras.layers.Dense(3)
        plain = Plain(plain_input, second(first(plain_input)))
        plain.compile(jit_compile=True)
        ones = np.ones((2, 3), "float32")
        traced = plain.predict_on_batch(ones)
        first.trainable = False
        first.kernel.assign(first.kernel * 3.0)
        frozen = plain.predict_on_batch(ones)
        # Inside a StatelessScope the variables read the scope's values.
        with keras.StatelessScope(state_mapping=[(second.kernel, np.zeros((3, 3), "float32"))]):
            in_scope = plain.predict_on_batch(ones)

        # A model whose inference assigns a variable keeps Keras's path (which writes it back).
        class CountCalls(keras.layers.Layer):
            def build(self, shape):
                self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False)

            def call(self, x):
                self.calls.assign(self.calls + 1.0)
                return x

        class Counting(JaxPredictOnBatchMixin, keras.Model):
            pass

        probe_input = keras.Input((4,))
        counting = Counting(probe_input, CountCalls()(probe_input))
        counting.compile(jit_compile=True)
        for _ in range(2):
            counting.predict_on_batch(np.ones((2, 4), "float32"))
        report["jax_predict"] = {
            # A task's preprocessor (never called here) does not send it to Keras's path.
            "own_path_used": getattr(lean_model, "_jitted_forward", None) is not None,
            "before_fit_diff": float(np.abs(lean - keras_before).max()),
            "weights_unchanged": unchanged,
            "after_fit_diff": float(np.abs(trained - keras_trained).max()),
            "moved_by_fit": float(np.abs(trained - lean).max()),
            "in_fit_batches": len(in_fit),
            "last_in_fit_diff": float(np.abs(in_fit[-1] - trained).max()),
            "first_in_fit_moved": float(np.abs(in_fit[0] - lean).max()),
            "writable": bool(trained.flags.writeable),
            "frozen_diff": float(np.abs(frozen - keras.Model.predict_on_batch(plain, ones)).max()),
            "moved_by_frozen_change": float(np.abs(frozen - traced).max()),
            "in_scope": float(np.abs(in_scope).max()),  # Zero kernel, zero bias.
            "updating_model_calls": float(keras.ops.convert_to_numpy(counting.layers[-1].calls)),
        }

    def train():
        model = bertzoo.BertClassifier.from_preset(preset)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        history = model.fit(texts, labels, batch_size=8, epochs=3, shuffle=False, verbose=0)
        weight = model.backbone.embeddings.token_embedding.embeddings.value
        devices = len(weight.sharding.device_set) if keras.backend.backend() == "jax" else 1
        return history.history["loss"], bool(model.jit_compile), devices

    report["pruning"] = pruning_report(preset, features, labels)

    def train_round(copy):  # A lottery round fits the model itself, not through a Pruner.
        copy.compile(optimizer=keras.optimizers.SGD(0.1))
        copy.fit(features, labels, batch_size=8, epochs=1, verbose=0)

    ticket = bertzoo.lottery_ticket(
        bertzoo.BertClassifier.from_preset(preset), train_round, final_sparsity=0.5, rounds=1, layers=["attention_0/query"]
    )
    report["lottery_sparsity"] = ticket.sparsity
    half = bertzoo.BertBackbone.from_preset(preset, dtype="mixed_float16")
    report["float16_sequence_output"] = np.asarray(half.predict_on_batch(features)["sequence_output"]).tolist()
    half_model = bertzoo.BertClassifier(half, 2, preprocessor=None)
    half_model.compile(optimizer=keras.optimizers.SGD(0.1))
    report["float16_losses"] = half_model.fit(features, labels, batch_size=8, epochs=1, verbose=0).history["loss"]
    if keras.backend.backend() == "jax":
        try:  # Its LossScaleOptimizer updates inside a lax.cond.
            bertzoo.Pruner(half_model, bertzoo.ConstantSparsity(0.5, begin_step=0)).fit(features, labels, verbose=0)
        except ValueError as error:
            report["float16_pruning_error"] = str(error)
        model = bertzoo.BertClassifier.from_preset(preset)
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
        try:
            model.fit(features, labels, epochs=1, verbose=0)  # Not through the pruner.
        except RuntimeError as error:
            report["unprepared_trainer_error"] = str(error)
        # Refused before Keras's step started: raised inside it, the model's variables were lost.
        try:
            report["usable_after_refusal"] = bool(np.all(np.isfinite(np.asarray(model.predict_on_batch(features)))))
        except Exception as error:
            report["usable_after_refusal"] = repr(error)
    # A student initialized from the teacher, and a task given a new backbone,
    # train without touching the models they were copied from (on JAX they
    # shared the teacher's buffers, which the train step then donated).
    teacher = bertzoo.BertClassifier.from_preset(preset)
    report["weight_paths"] = [w.path for w in teacher.weights]
    before = np.asarray(teacher.predict_on_batch(features))
    try:  # Failures are reported, not fatal: the other tests of this run still say what they saw.
        student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 1})
        student.compile(optimizer=keras.optimizers.SGD(0.1))
        student.fit(features, labels, batch_size=8, epochs=1, verbose=0)
        moved = teacher.with_backbone(bertzoo.BertBackbone.from_preset(preset))
        moved.compile(optimizer=keras.optimizers.SGD(0.1))
        moved.fit(features, labels, batch_size=8, epochs=1, verbose=0)
    except Exception as error:
        report["copies_error"] = repr(error)
    try:  # Movement pruning after an eager optimizer step (its `previous` copy of each weight), then fit.
        moving = bertzoo.BertClassifier.from_preset(preset)
        moving.compile(optimizer=keras.optimizers.SGD(0.1))
        movement = bertzoo.Pruner(moving, bertzoo.ConstantSparsity(0.5, begin_step=0), scores="movement")
        moving.optimizer.apply([keras.ops.ones(v.shape) for v in moving.trainable_variables], moving.trainable_variables)
        movement.fit(features, labels, batch_size=8, epochs=1, verbose=0)
        report["movement_after_eager_step"] = bool(np.isfinite(np.asarray(moving.predict_on_batch(features))).all())
    except Exception as error:
        report["movement_after_eager_step"] = repr(error)
    try:  # Before any training: every stage ends in a TensorFlow SavedModel.
        bertzoo.compress(preset, "train.tsv", "eval.tsv", "never_written")
    except RuntimeError as error:
        report["compress_error"] = str(error)
    try:
        bertzoo.compression.head_and_neuron_importance(teacher, (features, labels))
    except RuntimeError as error:
        report["structured_scores_error"] = str(error)
    report["export_errors"] = {}
    for format, name in (("tf_saved_model", "served"), ("onnx", "m.onnx"), ("litert", "m.tflite")):
        path = os.path.join(os.path.dirname(os.path.abspath(out)), "exports", name)
        try:
            teacher.export(path, format=format)
        except Exception as error:  # Recorded, so one regression fails one test, not the whole run.
            report["export_errors"][format] = [f"{type(error).__name__}: {error}", os.path.exists(path)]
    try:
        report["teacher_after_copies_train"] = float(
            np.abs(np.asarray(teacher.predict_on_batch(features)) - before).max()
        )
    except Exception as error:
        report["teacher_after_copies_train"] = repr(error)
    try:  # With dropout (every real model; the preset above has none): from a preset, quantized, stripped.
        dropout_preset = os.path.join(os.path.dirname(os.path.abspath(out)), "dropout_preset")
        config = dict(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=16)
        dropout_backbone = bertzoo.BertBackbone(vocabulary_size=100, dropout=0.1, **config)
        original = bertzoo.BertClassifier(dropout_backbone, 2, preprocessor=None)
        original.save_to_preset(dropout_preset)
        loaded = bertzoo.BertClassifier.from_preset(dropout_preset)
        ids = {"token_ids": np.arange(32).reshape(2, 16) % 100, "segment_ids": np.zeros((2, 16), "int32")}
        ids["padding_mask"] = np.ones((2, 16), "int32")
        loaded_logits = np.asarray(loaded.predict_on_batch(ids))
        saved_logits = np.asarray(original.predict_on_batch(ids))
        if keras.backend.backend() == "torch":  # PyTorch's parameters are the variables, not placeholders.
            parameters = {id(p) for p in loaded.parameters()}
            registered = all(id(v.value) in parameters for v in loaded.variables)
        quantized = bertzoo.quantize(loaded, "int8")
        pruner = bertzoo.Pruner(loaded, bertzoo.ConstantSparsity(0.5, begin_step=0), layers=["attention_0/query"])
        stripped = pruner.strip()
        report["dropout_preset"] = {
            "same_logits": bool(np.array_equal(loaded_logits, saved_logits)),
            "int8_finite": bool(np.isfinite(np.asarray(quantized.predict_on_batch(ids))).all()),
            "stripped_finite": bool(np.isfinite(np.asarray(stripped.predict_on_batch(ids))).all()),
        }
        if keras.backend.backend() == "torch":
            report["dropout_preset"]["torch_parameters_are_the_variables"] = registered
    except Exception as error:
        report["dropout_preset"] = repr(error)
    try:  # Interrupted at the end of an epoch, and in the middle of one: resumed with dropout, bit for bit.
        class Interrupt(keras.callbacks.Callback):
            def __init__(self, at):
                super().__init__()
                self.at = at

            def on_train_batch_end(self, batch, logs=None):
                if int(np.asarray(self.model.optimizer.iterations)) == self.at:
                    raise KeyboardInterrupt

        ids = {"token_ids": np.arange(192).reshape(12, 16) % 100, "segment_ids": np.zeros((12, 16), "int32")}
        ids["padding_mask"] = np.ones((12, 16), "int32")

        def resumable_run(backup, interrupt_at=None):
            keras.utils.set_random_seed(5)  # As each process of a script seeds itself.
            model = bertzoo.BertClassifier(bertzoo.BertBackbone.from_preset(dropout_preset), 2, preprocessor=None)
            callbacks = [bertzoo.ResumableTraining(backup, save_every=2)] + ([Interrupt(interrupt_at)] if interrupt_at else [])
            try:
                model.fit(ids, np.arange(12) % 2, batch_size=2, epochs=2, callbacks=callbacks, verbose=0)
            except KeyboardInterrupt:
                return None
            return np.concatenate([np.asarray(v).ravel() for v in model.trainable_weights])

        runs = os.path.join(os.path.dirname(os.path.abspath(out)), "resumable")
        uninterrupted = resumable_run(os.path.join(runs, "whole"))
        report["dropout_resume_differences"] = []
        for interrupt_at in (7, 5):  # Saved at step 6 (the first epoch's end), at step 4 (mid-epoch).
            backup = os.path.join(runs, f"interrupted_at_{interrupt_at}")
            assert resumable_run(backup, interrupt_at) is None
            report["dropout_resume_differences"].append(float(np.abs(resumable_run(backup) - uninterrupted).max()))
    except Exception as error:
        report["dropout_resume_differences"] = repr(error)
    report["one_device"] = train()
    if keras.backend.backend() == "jax":
        import jax

        report["devices"] = [str(d) for d in jax.devices()]
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()[:2]))
        report["data_parallel"] = train()
    with open(out, "w") as f:
        json.dump(report, f)
    """
)


@pytest.fixture(scope="module")
def tensorflow_run(tmp_path_factory):
    """The preset every backend loads, and TensorFlow's figures on it."""
    tmp = tmp_path_factory.mktemp("backends")
    keras.utils.set_random_seed(7)
    backbone = bertzoo.BertBackbone.from_preset("tiny", load_weights=False, dropout=0.0)
    preprocessor = bertzoo.Preset.resolve("tiny").build_preprocessor(sequence_length=40)
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=preprocessor, dropout=0.0)
    model.save_to_preset(tmp / "preset")

    features = {k: np.asarray(v) for k, v in preprocessor(TEXTS).items()}
    tf_outputs = backbone.predict_on_batch(features)
    tf_logits = model.predict(TEXTS, batch_size=8, verbose=0)
    tf_int8_logits = bertzoo.quantize(model, "int8").predict(TEXTS, batch_size=8, verbose=0)
    smoothed = bertzoo.quantize(model, "int8", calibration=TEXTS)
    tf_factors = 1.0 / keras.ops.convert_to_numpy(smoothed.backbone.attention_blocks[0].query_dense.input_scale)
    tf_smoothed_logits = smoothed.predict(TEXTS, batch_size=8, verbose=0)
    static = bertzoo.quantize(model, "int8", calibration=TEXTS, input_ranges="static")
    tf_static_range = float(keras.ops.convert_to_numpy(static.backbone.attention_blocks[0].query_dense.input_range))
    tf_static_logits = static.predict(TEXTS, batch_size=8, verbose=0)
    tf_weight_only_logits = bertzoo.quantize(model, "int8", weight_only=True).predict(TEXTS, batch_size=8, verbose=0)
    trained = bertzoo.BertClassifier.from_preset(tmp / "preset")
    trained.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=False)
    tf_losses = trained.fit(TEXTS, LABELS, batch_size=8, epochs=3, shuffle=False, verbose=0).history["loss"]
    tf_pruning = pruning_report(tmp / "preset", features, LABELS)
    return {
        "preset": tmp / "preset",
        "outputs": tf_outputs,
        "logits": tf_logits,
        "int8_logits": tf_int8_logits,
        "smoothing_factors": tf_factors,
        "smoothed_logits": tf_smoothed_logits,
        "static_range": tf_static_range,
        "static_logits": tf_static_logits,
        "weight_only_logits": tf_weight_only_logits,
        "losses": tf_losses,
        "pruning": tf_pruning,
        "weight_paths": [w.path for w in trained.weights],
    }


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend_run(request, tensorflow_run, tmp_path_factory):
    backend = request.param
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (optional backend job: {BACKENDS[backend]})")
    tmp = tmp_path_factory.mktemp(backend)
    script = tmp / "run_backend.py"
    script.write_text(SCRIPT)
    out = tmp / "report.json"
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if backend == "jax":
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        # The script builds and fits a dozen models of a few architectures, and JAX compiles
        # each model's steps anew: a compilation cache (this run's own, empty at the start)
        # hands identical programs their executable instead of compiling them again.
        env["JAX_COMPILATION_CACHE_DIR"] = str(tmp / "jax_cache")
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    preset = tensorflow_run["preset"]
    done = subprocess.run(
        [sys.executable, str(script), str(preset), str(out), json.dumps(TEXTS), json.dumps(LABELS.tolist())],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    report["tf"] = tensorflow_run
    report["expected_backend"] = backend
    return report


def test_runs_on_the_requested_backend(backend_run):
    assert backend_run["backend"] == backend_run["expected_backend"]


def test_backbone_matches_tensorflow_on_the_same_weights(backend_run):
    tf_outputs = backend_run["tf"]["outputs"]
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(np.asarray(backend_run[key]), tf_outputs[key], atol=2e-5, rtol=1e-4)


def test_classifier_predicts_raw_text_like_tensorflow(backend_run):
    np.testing.assert_allclose(np.asarray(backend_run["logits"]), backend_run["tf"]["logits"], atol=2e-5, rtol=1e-4)


def test_int8_model_matches_tensorflow_int8(backend_run):
    # Keras's int8 ops on every backend (TensorFlow may run its fused oneDNN
    # kernel, which rounds the same way): the same logits up to float error.
    int8, tf_int8 = np.asarray(backend_run["int8_logits"]), backend_run["tf"]["int8_logits"]
    assert not np.allclose(int8, backend_run["tf"]["logits"], atol=1e-6)  # Really quantized.
    np.testing.assert_allclose(int8, tf_int8, atol=2e-3, rtol=1e-2)


def test_weight_only_int8_matches_tensorflow_to_float_error(backend_run):
    # Float inputs times the dequantized kernel: no input rounding to differ in.
    weight_only, tf_weight_only = np.asarray(backend_run["weight_only_logits"]), backend_run["tf"]["weight_only_logits"]
    assert not np.allclose(weight_only, backend_run["tf"]["logits"], atol=1e-6)  # Really quantized.
    np.testing.assert_allclose(weight_only, tf_weight_only, atol=2e-5, rtol=1e-4)


def test_int8_smoothing_calibrates_and_runs_like_tensorflow(backend_run):
    # The calibration pass (eager, `observe_inputs`) sees the same activations on every backend.
    factors = np.asarray(backend_run["smoothing_factors"])
    np.testing.assert_allclose(factors, backend_run["tf"]["smoothing_factors"], rtol=1e-4)
    assert not np.allclose(factors, 1.0)
    smoothed, tf_smoothed = np.asarray(backend_run["smoothed_logits"]), backend_run["tf"]["smoothed_logits"]
    np.testing.assert_allclose(smoothed, tf_smoothed, atol=2e-3, rtol=1e-2)


def test_int8_static_input_ranges_calibrate_and_run_like_tensorflow(backend_run):
    np.testing.assert_allclose(backend_run["static_range"], backend_run["tf"]["static_range"], rtol=1e-4)
    static, tf_static = np.asarray(backend_run["static_logits"]), backend_run["tf"]["static_logits"]
    assert not np.allclose(static, backend_run["tf"]["smoothed_logits"], atol=1e-6)  # Another rounding.
    np.testing.assert_allclose(static, tf_static, atol=2e-3, rtol=1e-2)
    assert backend_run["static_grad_error"] < 1e-5  # Straight-through gradients.


def test_torch_int8_inference_runs_pytorchs_int8_matmul_with_kerass_arithmetic(backend_run):
    if backend_run["backend"] != "torch":
        pytest.skip("the torch backend's int8 path")
    assert backend_run["torch_int8_matmul_layers"] == 2 * 6 + 1  # Every Dense of 2 layers, and the pooler.
    assert backend_run["torch_static_int8_matmul_layers"] == 2 * 6 + 1  # Static ranges too.
    assert backend_run["torch_int8_max_diff"] == 0.0  # The same integers, the same float ops.


def test_fit_follows_the_tensorflow_loss_trajectory(backend_run):
    losses, jit, _ = backend_run["one_device"]
    # bertzoo's "auto": JAX always compiles (eager would be op by op), torch
    # never (torch.compile is Keras's own opt-in there).
    assert jit == (backend_run["backend"] == "jax")
    assert np.ptp(losses) > 1e-3  # Training moved.
    np.testing.assert_allclose(losses, backend_run["tf"]["losses"], rtol=1e-4)


def test_pruning_trains_like_tensorflow(backend_run):
    # The pruning state (masks, step counters) lives outside the optimizer's
    # variables: on JAX it is carried through the stateless train step.
    for run in ("alone", "distilled"):
        ours, tf_run = backend_run["pruning"][run], backend_run["tf"]["pruning"][run]
        assert ours["kept"] == tf_run["kept"], run
        assert ours["kept"] == [128 * 128 // 2, 128 * 512 // 2]
        np.testing.assert_allclose(ours["losses"], tf_run["losses"], rtol=1e-4, err_msg=run)
        np.testing.assert_allclose(ours["logits"], tf_run["logits"], atol=1e-4, rtol=1e-3, err_msg=run)


def test_weights_come_in_tensorflows_order(backend_run):
    # So a get_weights() list from one backend set_weights into a model on another.
    assert backend_run["weight_paths"] == backend_run["tf"]["weight_paths"]


def test_copies_of_a_model_train_without_touching_it(backend_run):
    assert "copies_error" not in backend_run, backend_run.get("copies_error")
    assert backend_run["teacher_after_copies_train"] == 0.0
    # On JAX the pruner's copy of each weight shared its buffer after an eager step.
    assert backend_run["movement_after_eager_step"] is True


def test_models_with_dropout_load_quantize_and_strip_from_a_preset(backend_run):
    # On torch a task around a backbone built without drawing its weights (about to be loaded)
    # registered placeholders with PyTorch, and an integer one (a dropout seed) failed.
    expected = {"same_logits": True, "int8_finite": True, "stripped_finite": True}
    if backend_run["backend"] == "torch":
        expected["torch_parameters_are_the_variables"] = True
    assert backend_run["dropout_preset"] == expected


def test_interrupted_training_with_dropout_resumes_bit_for_bit(backend_run):
    # On torch the data iterator Keras makes at a resumed run's start draws from PyTorch's global
    # generator, whose restored state must therefore be set after it, at the first batch.
    assert backend_run["dropout_resume_differences"] == [0.0, 0.0]


def test_compress_refuses_other_backends_before_training(backend_run):
    assert "needs the TensorFlow backend" in backend_run["compress_error"]


def test_exports_refuse_other_backends_before_writing(backend_run):
    errors = backend_run["export_errors"]
    assert sorted(errors) == ["litert", "onnx", "tf_saved_model"]
    for format, (message, written) in errors.items():
        assert message.startswith("BackendError") and "KERAS_BACKEND=tensorflow" in message, (format, message)
        assert not written, format


def test_structured_scores_name_the_backend_they_need(backend_run):
    assert "KERAS_BACKEND=tensorflow" in backend_run["structured_scores_error"]
    assert "prune_heads_and_neurons(..., importance=scores)" in backend_run["structured_scores_error"]


def test_lottery_ticket_rounds_train_on_the_backend(backend_run):
    assert backend_run["lottery_sparsity"] == pytest.approx(0.5, abs=1e-3)


def test_float16_backbone_runs_and_trains(backend_run):
    # On a CPU, JAX's fused attention has no float16 kernel: bertzoo's own runs.
    half = np.asarray(backend_run["float16_sequence_output"], "float64")
    full = backend_run["tf"]["outputs"]["sequence_output"]
    assert np.linalg.norm(half - full) / np.linalg.norm(full) < 1e-2
    assert np.all(np.isfinite(backend_run["float16_losses"]))


def test_jax_refuses_a_trainer_that_does_not_carry_the_pruning_state(backend_run):
    if backend_run["expected_backend"] != "jax":
        pytest.skip("JAX only")
    assert "pruner.prepare_trainer(trainer)" in backend_run["unprepared_trainer_error"]
    assert backend_run["usable_after_refusal"] is True
    assert "does not support a LossScaleOptimizer" in backend_run["float16_pruning_error"]


def test_jax_attention_mask_has_the_shape_cudnn_attention_accepts(backend_run):
    if backend_run["expected_backend"] != "jax":
        pytest.skip("JAX only")
    # (batch, 1, length, length) in every layer: JAX's cuDNN kernel refuses a (batch, 1, 1, length) one.
    assert backend_run["attention_mask_shapes"] == [[len(TEXTS), 1, 40, 40]] * 2
    if "cudnn_layout_check" not in backend_run:
        pytest.skip("this JAX has no jax._src.cudnn.fused_attention_stablehlo to check against")
    assert backend_run["cudnn_layout_check"] == "accepted"
    assert "Bias must have same seq length" in backend_run["cudnn_layout_check_key_mask"]


def test_jax_predict_on_batch_matches_keras_and_follows_training(backend_run):
    if backend_run["backend"] != "jax":
        pytest.skip("bertzoo's own predict_on_batch runs on JAX only")
    found = backend_run["jax_predict"]
    assert found["own_path_used"] and found["weights_unchanged"], json.dumps(found)
    assert found["before_fit_diff"] == 0.0 and found["after_fit_diff"] == 0.0
    assert found["moved_by_fit"] > 1e-4  # Training changed the outputs, and predict_on_batch saw it.
    # Called from a callback while fit holds the variables: each batch's current weights.
    assert found["in_fit_batches"] == 2 and found["last_in_fit_diff"] == 0.0 and found["first_in_fit_moved"] > 1e-4
    assert found["writable"]  # NumPy copies, as Keras returns.
    # A layer frozen after tracing: its changed weight is read into the right place.
    assert found["frozen_diff"] == 0.0 and found["moved_by_frozen_change"] > 1e-3
    assert found["in_scope"] == 0.0
    assert found["updating_model_calls"] == 2.0  # Both calls' updates kept: Keras's path ran.


def test_jax_data_parallel_on_two_devices_matches_one_device(backend_run):
    if backend_run["backend"] != "jax":
        pytest.skip("keras.distribution runs on the JAX backend only")
    assert len(backend_run["devices"]) == 2
    one, _, one_devices = backend_run["one_device"]
    two, _, two_devices = backend_run["data_parallel"]
    assert (one_devices, two_devices) == (1, 2)  # Weights replicated on both devices.
    np.testing.assert_allclose(two, one, rtol=1e-5)


WITHOUT_TENSORFLOW = textwrap.dedent(
    """
    import json, sys

    from importlib.machinery import PathFinder

    # As on a machine where TensorFlow is not installed: `import` raises
    # ModuleNotFoundError and `importlib.util.find_spec` answers None (torch asks it).
    path_find_spec = PathFinder.find_spec

    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text"):
            return None
        return path_find_spec(name, path, target)

    PathFinder.find_spec = find_spec
    import keras
    import numpy as np
    import bertzoo

    preset, out, features = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    features = {k: np.asarray(v, "int32") for k, v in features.items()}
    backbone = bertzoo.BertBackbone.from_preset(preset)
    report = {"sequence_output": np.asarray(backbone.predict_on_batch(features)["sequence_output"]).tolist()}
    keras.utils.set_random_seed(0)  # The head's initial weights and the dropout masks.
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    labels = np.arange(len(features["token_ids"])) % 2
    report["losses"] = model.fit(features, labels, batch_size=8, epochs=8, shuffle=False, verbose=0).history["loss"]
    report["int8_logits"] = bertzoo.quantize(model, "int8").predict(features, verbose=0).tolist()
    smoothed = bertzoo.quantize(model, "int8", calibration=features)  # Calibrated on token ids.
    report["smoothed_logits"] = smoothed.predict(features, verbose=0).tolist()
    try:
        bertzoo.text.BertTokenizer(bertzoo.text.builtin_vocabulary())(["a film"])
    except ImportError as error:
        report["tokenizer_error"] = str(error)
    report["tensorflow_imported"] = "tensorflow" in sys.modules
    with open(out, "w") as f:
        json.dump(report, f)
    """
)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_import_leaves_tensorflow_alone_on_other_backends(backend):
    # Installed or not, TensorFlow is imported only when something needs it.
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (optional backend job: {BACKENDS[backend]})")
    code = "import sys, bertzoo; print(sorted(m for m in ('tensorflow', 'tensorflow_text', 'keras_hub') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "KERAS_BACKEND": backend},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_models_run_without_tensorflow_installed(backend, tensorflow_run, tmp_path):
    # A GPU machine with only JAX or PyTorch: the models import, load, train
    # and quantize; the text pipeline says what to install.
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (optional backend job: {BACKENDS[backend]})")
    preprocessor = bertzoo.Preset.resolve("tiny").build_preprocessor(sequence_length=40)
    features = {k: np.asarray(v).astype("int32").tolist() for k, v in preprocessor(TEXTS).items()}
    script, out = tmp_path / "without_tensorflow.py", tmp_path / "report.json"
    script.write_text(WITHOUT_TENSORFLOW)
    done = subprocess.run(
        [sys.executable, str(script), str(tensorflow_run["preset"]), str(out), json.dumps(features)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "KERAS_BACKEND": backend},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tensorflow_imported"] is False
    np.testing.assert_allclose(
        np.asarray(report["sequence_output"]), tensorflow_run["outputs"]["sequence_output"], atol=2e-5, rtol=1e-4
    )
    assert report["losses"][-1] < report["losses"][0] - 0.05, report["losses"]  # It learns, not drifts.
    for key in ("int8_logits", "smoothed_logits"):
        assert np.isfinite(report[key]).all() and np.shape(report[key]) == (len(TEXTS), 2)
    assert "`tensorflow_text` is not installed" in report["tokenizer_error"]
    assert "pip install tensorflow-text" in report["tokenizer_error"]
