"""The libraries `benchmarks.run` times, and the worker process that times one.

Each (library, mode, dtype) is timed in its own process, started by
`benchmarks.run`: TensorFlow and PyTorch then never share a process (their
thread pools and oneDNN builds), memory is returned between configurations,
and the global Keras dtype policy of one library cannot leak into another.

A worker builds the model from the bertzoo preset's configuration with seeded
random weights, computes a float32 reference output, then builds each
variant of the requested dtype from those same weights (cast to bfloat16 or
float16, or quantized to int8), checks its output against the reference, and
times it on the accelerator its framework finds (a GPU when there is one):
`warmup` untimed calls (the first one traces/compiles), then `runs` timed
calls. It prints one `BENCH {json}` line per variant.

Libraries:
- `bertzoo`: `bertzoo.BertBackbone` / `bertzoo.BertClassifier` (Task.compile
  defaults: AdamW with warm-up, gradient clipping).
- `bertzoo_jax`: the same bertzoo model code on Keras's JAX backend (the
  worker runs with `KERAS_BACKEND=jax`; JAX always compiles with XLA, so
  there is one variant).
- `bertzoo_torch`: the same on Keras's torch backend (`KERAS_BACKEND=torch`),
  eager (bertzoo's default there) and with `jit_compile=True`, which Keras
  turns into `torch.compile`.
- `keras_hub`: `keras_hub.models.BertBackbone` / `BertTextClassifier`,
  trained with Keras's `AdamW` (weight decay 0.01, clipping at global norm
  1), so that all three libraries run the same training recipe.
- `transformers`: Hugging Face's PyTorch `BertModel` /
  `BertForSequenceClassification` (AdamW, weight decay 0.01, clipping at
  global norm 1), eager and under `torch.compile` (not for int8),
  `torch.inference_mode()` for inference; int8 is PyTorch's dynamic
  quantization of the Linear layers (CPU only), bfloat16 and float16
  training are `torch.autocast` (float16 with a gradient scaler).
- `keras_hub_jax`: keras-hub on Keras's JAX backend, for machines without
  TensorFlow (the GPU image this project is lent has PyTorch and JAX only).

Each row names the device it ran on (`device`): the CPU, or the GPU's name;
where its library's default setting (`default`) came from (`default_source`:
"rule", or for bertzoo on TensorFlow the fast path's "measured", "cache" or
"pinned", measured for the timed mode only, as `predict` / `fit` do); and on
TensorFlow its thread pool sizes as set through `tf.config` (`tf_threads`, 0: not set there).

Keras inference is `predict_on_batch` on a model compiled with
`jit_compile=True/False`; training is `train_on_batch`. int8 is
`keras.Model.quantize("int8")` (what `bertzoo.quantize` does) and is timed for
inference only: no library here trains int8 models. bertzoo's int8 model
without XLA runs TensorFlow's fused oneDNN int8 kernel
(`bertzoo.layers.dense`), keras-hub's Keras's own int8 ops.
`int8_static` (bertzoo only) is `bertzoo.quantize(model, "int8",
calibration=..., input_ranges="static")`, calibrated on another random batch
of the timed shape (seed 1): each Dense layer's input range fixed instead of
measured on every call. Its accuracy on real data is the compression
benchmark's `int8st` row. `int8_weights` and `int8_weights_bfloat16` (the
Keras libraries) quantize the kernels only, the inputs staying float32 or
bfloat16 (`bertzoo.quantize(model, "int8", weight_only=True)`; keras-hub:
Keras's `Int8QuantizationConfig` without an activation quantizer, the same
ops): asked for by name, e.g. on GPUs, where integer matmuls do not pay.
"""

import argparse
import gc
import json
import os
import sys

import numpy as np

from benchmarks.harness import builtin_preset_file
from benchmarks.harness import library_versions
from benchmarks.harness import time_interleaved
from benchmarks.harness import token_batch

DTYPES = ("float32", "bfloat16", "float16", "int8", "int8_static", "int8_weights", "int8_weights_bfloat16")
# bertzoo's own configurations (every Keras backend; the others are peers),
# and the Keras libraries.
OURS = ("bertzoo", "bertzoo_jax", "bertzoo_torch")
KERAS_LIBRARIES = OURS + ("keras_hub", "keras_hub_jax")
# dtypes only some libraries run (`benchmarks.run` skips the others): static
# input ranges are bertzoo's; PyTorch's int8 here is dynamic only.
DTYPE_LIBRARIES = {
    "int8_static": OURS,
    "int8_weights": KERAS_LIBRARIES,
    "int8_weights_bfloat16": KERAS_LIBRARIES,
}
# Quantized dtypes: inference only (no library here trains int8 models).
INT8_DTYPES = ("int8", "int8_static", "int8_weights", "int8_weights_bfloat16")
# The matmul peak each dtype's arithmetic is measured against.
PEAK_DTYPE = {"int8_static": "int8", "int8_weights": "float32", "int8_weights_bfloat16": "bfloat16"}
# What `benchmarks.run` times unless told: float16 is a GPU format (CPUs
# without AVX512-FP16 emulate it), so it is asked for by name.
DEFAULT_DTYPES = ("float32", "bfloat16", "int8", "int8_static")
MODES = ("inference", "training")
NUM_CLASSES = 2
# Untimed calls before timing: the first traces and compiles.
MIN_WARMUP = 1


def backbone_config(preset):
    """The built-in bertzoo preset's backbone configuration (a plain dict).

    Read from the preset file rather than through `bertzoo`, so that the
    PyTorch worker does not import TensorFlow.
    """
    config = dict(json.loads(builtin_preset_file(preset).read_text())["backbone"])
    if config.get("embedding_dim") or config.get("num_groups") or config.get("activation", "gelu_tanh") != "gelu_tanh":
        raise SystemExit(f"Preset {preset!r} is not a plain BERT (needs gelu_tanh, no factorization or sharing).")
    return config


def missing(library):
    """Why `library` cannot be timed here, or None when it can."""
    import importlib.util

    needs = {
        "bertzoo": ["bertzoo", "tensorflow"],
        "bertzoo_jax": ["bertzoo", "jax"],
        "bertzoo_torch": ["bertzoo", "torch"],
        "keras_hub": ["keras_hub", "tensorflow"],
        "keras_hub_jax": ["keras_hub", "jax"],
        "transformers": ["transformers", "torch"],
    }[library]

    def installed(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # A broken or blocked installation.
            return False

    absent = [name for name in needs if not installed(name)]
    if absent:
        return f"not installed ({', '.join(absent)}); `pip install {' '.join(absent)}` to include it"
    return None


def _compare(output, reference):
    """Relative L2 error, max absolute difference and cosine similarity."""
    a = np.asarray(output, "float64").ravel()
    b = np.asarray(reference, "float64").ravel()
    norm = np.linalg.norm(b) + 1e-30
    return {
        "relative_error": float(np.linalg.norm(a - b) / norm),
        "max_abs_diff": float(np.max(np.abs(a - b))),
        "cosine": float(a @ b / (np.linalg.norm(a) * norm)),
    }


# --- Keras libraries ------------------------------------------------------


def runs_dtype(library, dtype):
    """Whether `library` runs `dtype` (see `DTYPE_LIBRARIES`)."""
    return library in DTYPE_LIBRARIES.get(dtype, (library,))


def _quietly_quantize(model, **kwargs):
    """Keras's `model.quantize("int8", ...)` without its warning for each
    layer type that has nothing to quantize (Dropout, LayerNormalization)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*does not have a `quantize` method.*")
        model.quantize("int8", **kwargs)


class KerasLibrary:
    """Shared code of bertzoo and keras-hub: both are Keras 3 models."""

    name = None
    # Where the default setting (`default_xla`) came from: "rule" (fixed by
    # the library), or bertzoo's fast-path report's source after measuring
    # ("measured", "cache", "pinned").
    default_source = "rule"

    def versions(self):
        return library_versions(("keras", "tensorflow", "keras-hub", "bertzoo"))

    def variants(self, mode, dtype):
        return [{"xla": False}, {"xla": True}]

    def default_xla(self, model, mode):
        raise NotImplementedError

    def thread_settings(self):
        """TensorFlow's intra- and inter-op thread pool sizes as set through
        `tf.config` (0: not set there; `TF_NUM_INTRAOP_THREADS` and kin are in
        the row's `machine_info.environment`), `{}` on the other Keras backends."""
        import keras

        if keras.backend.backend() != "tensorflow":
            return {}
        import tensorflow as tf

        return {
            "tf_threads": {
                "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
            }
        }

    def device(self):
        """The device Keras's backend runs on: the GPU's name, or "CPU"."""
        import keras

        backend = keras.backend.backend()
        if backend == "jax":
            import jax

            first = jax.devices()[0]
            return first.device_kind if first.platform == "gpu" else "CPU"
        if backend == "torch":
            return _torch_device_name()
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return "CPU"
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")

    def _policy(self, mode, dtype):
        if dtype == "int8_weights_bfloat16":
            return "bfloat16"
        if dtype in ("bfloat16", "float16"):
            return dtype if mode == "inference" else f"mixed_{dtype}"
        return "float32"

    def quantize_weights_only(self, model):
        """`model` with int8 kernels and float inputs (Keras's config)."""
        import keras

        _quietly_quantize(model, config=keras.quantizers.Int8QuantizationConfig(activation_quantizer=None))
        return model

    def prepare(self, mode, dtype, config, calibration=None):
        """Builds `(reference, model)`: the float32 model (None for training)
        and the `dtype` model holding the same seeded weights (`int8_static`:
        calibrated on `calibration`, a batch of model inputs)."""
        import keras

        keras.utils.set_random_seed(0)
        reference = self.build(mode, "float32", config) if mode == "inference" else None
        keras.utils.set_random_seed(0)
        model = self.build(mode, self._policy(mode, dtype), config)
        if reference is not None:
            model.set_weights(reference.get_weights())
        if dtype == "int8_static":
            import bertzoo

            model = bertzoo.quantize(model, "int8", calibration=calibration, input_ranges="static")
        if dtype == "int8":
            _quietly_quantize(model)
        if dtype in ("int8_weights", "int8_weights_bfloat16"):
            model = self.quantize_weights_only(model)
        return reference, model

    def output(self, model, inputs):
        out = model.predict_on_batch(inputs)
        return out["sequence_output"] if isinstance(out, dict) else out

    def inference(self, model, inputs, variant):
        model.compile(jit_compile=variant["xla"])
        return lambda: model.predict_on_batch(inputs)  # NumPy out: the work is done.

    def training(self, model, inputs, labels, variant):
        self.compile_for_training(model, variant["xla"])
        return lambda: model.train_on_batch(inputs, labels)


class Bertzoo(KerasLibrary):
    name = "bertzoo"
    backend = "tensorflow"

    def quantize_weights_only(self, model):
        import bertzoo

        return bertzoo.quantize(model, "int8", weight_only=True)

    def build(self, mode, policy, config):
        import bertzoo

        backbone = bertzoo.BertBackbone(**config, dtype=policy)
        if mode == "inference":
            return backbone
        return bertzoo.BertClassifier(backbone, NUM_CLASSES)

    def default_xla(self, model, mode):
        # What `predict` / `fit` run with `jit_compile="auto"`: the measured
        # choice of that mode only, as they measure it (an int8 model may
        # infer best without XLA and train best with it; measuring the other
        # mode too would add its compiles to the worker's time).
        from bertzoo.utils import fast_path
        from bertzoo.utils.device import default_jit_compile

        chosen = default_jit_compile(model, mode="predict" if mode == "inference" else "train")
        self.default_source = fast_path.explain_fast_path(model).source
        return chosen

    def compile_for_training(self, model, xla):
        model.compile(jit_compile=xla)  # bertzoo's defaults otherwise.


class BertzooJax(Bertzoo):
    name = "bertzoo_jax"
    backend = "jax"

    def versions(self):
        return library_versions(("keras", "jax", "jaxlib", "bertzoo"))

    def variants(self, mode, dtype):
        return [{"xla": True}]  # Keras on JAX runs every step as one jitted XLA function.

    def default_xla(self, model, mode):
        return True


class BertzooTorch(Bertzoo):
    name = "bertzoo_torch"
    backend = "torch"

    def versions(self):
        import torch

        return {**library_versions(("keras", "torch", "bertzoo")), "torch_threads": torch.get_num_threads()}

    def default_xla(self, model, mode):
        return False  # bertzoo's "auto" on torch: eager (torch.compile is opt-in).


class KerasHub(KerasLibrary):
    name = "keras_hub"
    backend = "tensorflow"

    def versions(self):
        import keras

        return library_versions(("keras", keras.backend.backend(), "keras-hub"))  # Backends are named as on PyPI.

    def build(self, mode, policy, config):
        import keras_hub

        import bertzoo

        # keras-hub's own BertBackbone class, built by bertzoo's converter
        # from a backbone of the same configuration (same weights).
        backbone = bertzoo.convert.to_keras_hub(bertzoo.BertBackbone(**config, dtype=policy))
        if mode == "inference":
            return backbone
        return keras_hub.models.BertTextClassifier(backbone, NUM_CLASSES, preprocessor=None)

    def default_xla(self, model, mode):
        return bool(model.jit_compile)  # Keras's "auto", resolved by the public property.

    def compile_for_training(self, model, xla):
        # The same training recipe as bertzoo's and the PyTorch worker's,
        # with Keras's own AdamW: weight decay 0.01 (not on biases and
        # LayerNorm), clipping at global norm 1. keras-hub's default (plain
        # Adam, no clipping) would do less work per step.
        import keras

        from bertzoo.models.optimizers import NO_WEIGHT_DECAY

        optimizer = keras.optimizers.AdamW(5e-5, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
        optimizer.exclude_from_weight_decay(var_names=list(NO_WEIGHT_DECAY))
        if model.backbone.dtype_policy.compute_dtype == "float16":
            # Loss scaling, as bertzoo's tasks and the PyTorch worker do.
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=xla,
        )


class KerasHubJax(KerasHub):
    name = "keras_hub_jax"
    backend = "jax"

    def variants(self, mode, dtype):
        return [{"xla": True}]  # As bertzoo_jax: one jitted XLA function per step.

    def default_xla(self, model, mode):
        return True


# --- PyTorch --------------------------------------------------------------


class Transformers:
    name = "transformers"
    default_source = "rule"

    def __init__(self):
        import torch

        self._device = "cuda" if torch.cuda.is_available() else "cpu"

    def versions(self):
        import torch

        return {**library_versions(("torch", "transformers")), "torch_threads": torch.get_num_threads()}

    def thread_settings(self):
        return {}  # Each variant records its `threads`.

    def device(self):
        return _torch_device_name()

    def variants(self, mode, dtype):
        # PyTorch's OpenMP threads wait for each other at every op; on a busy
        # machine one thread can beat all cores, so both are timed (on a CPU).
        import torch

        self._default_threads = torch.get_num_threads()
        default = {"xla": False, "threads": self._default_threads}
        # `torch.compile` (TorchInductor), PyTorch's compiled setting, as XLA
        # is the Keras libraries'; not for dynamic int8, which it does not
        # compile.
        compiled = [{**default, "xla": True}] if dtype != "int8" else []
        if self._device != "cpu":
            # JAX runs float32 matmuls on GPUs as TF32 by default, PyTorch
            # in full float32: both are timed, so the peer is not handicapped.
            return [default] + ([{**default, "tf32": True}] if dtype == "float32" else []) + compiled
        one = [{"xla": False, "threads": 1}] if self._default_threads > 1 else []
        return [default] + one + compiled

    def default_xla(self, model, mode):
        return False

    def _set_threads(self, variant):
        import torch

        torch.set_num_threads(variant["threads"])
        torch.backends.cuda.matmul.allow_tf32 = variant.get("tf32", False)
        torch.backends.cudnn.allow_tf32 = variant.get("tf32", False)

    def prepare(self, mode, dtype, config, calibration=None):
        import copy

        import torch
        import transformers

        torch.manual_seed(0)
        hf_config = transformers.BertConfig(
            vocab_size=config["vocabulary_size"],
            hidden_size=config["hidden_dim"],
            num_hidden_layers=config["num_layers"],
            num_attention_heads=config["num_heads"],
            intermediate_size=config["intermediate_dim"],
            max_position_embeddings=config["max_sequence_length"],
            type_vocab_size=config["num_segments"],
            hidden_act="gelu_pytorch_tanh",  # bertzoo's default gelu_tanh.
            num_labels=NUM_CLASSES,
        )
        if dtype == "int8" and self._device != "cpu":
            raise SystemExit("PyTorch's dynamic int8 quantization runs on CPUs only; no int8 row on this GPU.")
        cls = transformers.BertModel if mode == "inference" else transformers.BertForSequenceClassification
        model = cls(hf_config).eval().to(self._device)
        reference = copy.deepcopy(model) if mode == "inference" else None
        half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if mode == "inference" and half is not None:
            model = model.to(half)
        if dtype == "int8":
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        self._autocast = half if mode == "training" else None
        return reference, model

    def _torch_inputs(self, inputs):
        import torch

        return {
            "input_ids": torch.from_numpy(inputs["token_ids"]).long().to(self._device),
            "token_type_ids": torch.from_numpy(inputs["segment_ids"]).long().to(self._device),
            "attention_mask": torch.from_numpy(inputs["padding_mask"]).long().to(self._device),
        }

    def output(self, model, inputs):
        import torch

        with torch.inference_mode():
            out = model(**self._torch_inputs(inputs))
        value = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
        return value.float().cpu().numpy()

    def inference(self, model, inputs, variant):
        import torch

        self._set_threads(variant)
        features = self._torch_inputs(inputs)
        forward = torch.compile(model) if variant["xla"] else model

        def run():
            with torch.inference_mode():
                # To NumPy, as Keras's predict_on_batch returns: the work is done.
                forward(**features).last_hidden_state.float().cpu().numpy()

        return run

    def training(self, model, inputs, labels, variant):
        import torch

        self._set_threads(variant)
        features = self._torch_inputs(inputs)
        labels = torch.from_numpy(np.asarray(labels)).long().to(self._device)
        model.train()
        forward = torch.compile(model) if variant["xla"] else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
        # float16 gradients underflow without loss scaling (Keras's
        # mixed_float16 scales the loss too).
        scaler = torch.amp.GradScaler(self._device, enabled=self._autocast == torch.float16)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(
                self._device, dtype=self._autocast or torch.float32, enabled=self._autocast is not None
            ):
                loss = forward(**features, labels=labels).loss
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            return float(loss)

        return step


def _torch_device_name():
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


LIBRARIES = {cls.name: cls for cls in (Bertzoo, BertzooJax, BertzooTorch, KerasHub, KerasHubJax, Transformers)}


# --- Matmul peak ----------------------------------------------------------


def matmul_peak(size=2048, runs=10):
    """GFLOP/s (GOP/s for int8) of a `size`^3 TensorFlow matmul per dtype,
    the best of with and without XLA, each a median of `runs` calls."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype("float32")
    b = rng.standard_normal((size, size)).astype("float32")
    peaks = {}
    for dtype in [d for d in DEFAULT_DTYPES if d not in PEAK_DTYPE]:  # The others share one of these peaks.
        best = {}
        for xla in (False, True):
            if dtype == "int8":
                x, y = tf.constant((a * 20).astype("int8")), tf.constant((b * 20).astype("int8"))
                fn = tf.function(lambda x, y: tf.linalg.matmul(x, y, output_type=tf.int32), jit_compile=xla)
            else:
                x, y = tf.cast(a, dtype), tf.cast(b, dtype)
                fn = tf.function(tf.matmul, jit_compile=xla)
            median_s = time_interleaved({"matmul": lambda fn=fn, x=x, y=y: fn(x, y).numpy()}, runs, warmup=2)["matmul"][
                "median_s"
            ]
            best["xla" if xla else "no_xla"] = round(2 * size**3 / median_s / 1e9, 1)
        if dtype == "int8":
            best.update(_fused_int8_peak(a, runs))
        peaks[dtype] = {"gflops": max(best.values()), **best}
    return peaks


def _fused_int8_peak(a, runs):
    """`{"onednn_fused": GOP/s}` of a square int8-quantized bertzoo `Dense`
    on float32 inputs (input quantization included), where TensorFlow's
    fused oneDNN int8 kernel runs it; `{}` elsewhere."""
    import tensorflow as tf

    from bertzoo.layers import Dense
    from bertzoo.layers.dense import onednn_int8_available

    if not onednn_int8_available():
        return {}
    size = a.shape[0]
    layer = Dense(size, use_bias=False)
    layer.build((None, size))
    layer.quantize("int8")
    fn = tf.function(lambda x: layer(x, training=False))
    x = tf.constant(a)
    median_s = time_interleaved({"dense": lambda: fn(x).numpy()}, runs, warmup=2)["dense"]["median_s"]
    return {"onednn_fused": round(2 * size**3 / median_s / 1e9, 1)}


# --- Worker ---------------------------------------------------------------


def warmup_calls(text):
    """`--warmup`'s value: an integer of at least 1 (the first call traces
    and compiles, so it is never timed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < MIN_WARMUP:
        raise argparse.ArgumentTypeError(
            f"{value} is below {MIN_WARMUP}: the first call traces and compiles, so at least one call is untimed"
        )
    return value


def run_worker(library, mode, dtype, preset, batch, length, runs, warmup):
    """Times every variant of one (library, mode, dtype) after `warmup`
    untimed calls (at least 1: the first traces and compiles); yields result
    dicts."""
    if warmup < MIN_WARMUP:
        raise ValueError(f"warmup must be at least {MIN_WARMUP} (the first call compiles), got {warmup}.")
    lib = LIBRARIES[library]()
    config = backbone_config(preset)
    inputs = token_batch(batch, length, config["vocabulary_size"])
    labels = np.arange(batch) % NUM_CLASSES
    base = {"library": library, "mode": mode, "dtype": dtype, "versions": lib.versions(), "device": lib.device()}
    calibration = token_batch(batch, length, config["vocabulary_size"], seed=1)
    reference, model = lib.prepare(mode, dtype, config, calibration=calibration)
    check = None
    if reference is not None:
        check = _compare(lib.output(model, inputs), lib.output(reference, inputs))
    del reference
    gc.collect()
    default = lib.default_xla(model, mode)
    base.update(lib.thread_settings(), default_source=lib.default_source)
    variants = lib.variants(mode, dtype)
    for variant in variants:
        load_before = os.getloadavg()[0]
        if mode == "inference":
            fn = lib.inference(model, inputs, variant)
        else:
            fn = lib.training(model, inputs, labels, variant)
        timed = time_interleaved({"fn": fn}, runs, warmup)["fn"]
        yield {
            **base,
            **variant,
            "default": variant["xla"] == default and variant == [v for v in variants if v["xla"] == default][0],
            "times_s": [round(t, 4) for t in timed["times_s"]],
            "median_s": timed["median_s"],
            "min_s": timed["min_s"],
            # CPU seconds of this process per call: less sensitive than wall
            # time to other processes on a shared machine (but it counts
            # threads spinning while they wait).
            "cpu_median_s": timed["cpu_median_s"],
            "first_call_s": round(timed["first_call_s"], 2),
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "check_vs_float32": check,
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description="One benchmarks.run worker (started by benchmarks.run).")
    parser.add_argument("--library", choices=sorted(LIBRARIES) + ["matmul"], required=True)
    parser.add_argument("--mode", choices=MODES, default="inference")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=warmup_calls, default=2, help="untimed calls first (at least 1)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not runs_dtype(args.library, args.dtype):
        parser.error(f"--dtype {args.dtype} is for the libraries {', '.join(DTYPE_LIBRARIES[args.dtype])} only.")
    backend = getattr(LIBRARIES.get(args.library), "backend", None)
    if backend:  # Before anything imports Keras, which reads it once.
        os.environ["KERAS_BACKEND"] = backend
    if args.library == "matmul":
        print("BENCH " + json.dumps({"library": "matmul", "peaks": matmul_peak()}), flush=True)
        return
    for row in run_worker(
        args.library, args.mode, args.dtype, args.preset, args.batch_size, args.sequence_length, args.runs, args.warmup
    ):
        print("BENCH " + json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
