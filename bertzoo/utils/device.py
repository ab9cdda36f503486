"""Per-device choices for the fast path: when to compile steps with XLA.

The policy (`default_jit_compile`) comes from measurements with
`python -m benchmarks.run` (BERT-base, batch 8, length 128; figures in
`benchmarks/results.jsonl` and the README's "Performance" table):

| where | weights / compute | XLA | why |
|---|---|---|---|
| GPU, TPU | any | on | fuses the elementwise work between matmuls |
| CPU | float32 | on | about as fast as TF's oneDNN kernels for inference, faster training steps |
| CPU | bfloat16 / float16 compute | off | XLA:CPU's low-precision dots are ~3x slower than oneDNN's AVX-512-BF16 kernels |
| CPU | int8-quantized layers | on | TF has no fast int8 matmul kernel outside XLA (~10x slower) |
| any | multi-replica `tf.distribute` strategy | off | see `jit_compile_supported` |

TPUStrategy compiles every step with XLA whatever `jit_compile` says, so
"off" there only drops a redundant nested compilation.
"""

import logging

import keras

logger = logging.getLogger("bertzoo")

_LOW_PRECISION = ("bfloat16", "float16")


def accelerator():
    """Returns "gpu", "tpu" or "cpu" for the current Keras backend's devices."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("TPU"):
            return "tpu"
        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    if backend == "jax":
        import jax

        return jax.default_backend() if jax.default_backend() in ("gpu", "tpu") else "cpu"
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def _precision(model_or_policy):
    """`(compute_dtype, quantized)` of a model, layer or dtype policy.

    For a model, the layers decide: a classifier built on a bfloat16
    backbone reports the global (float32) policy itself, and `quantize()`
    changes the policies of the Dense/Embedding layers, not the model's.
    """
    if model_or_policy is None or isinstance(model_or_policy, (str, keras.DTypePolicy)):
        policy = keras.dtype_policies.get(model_or_policy or keras.config.dtype_policy())
        return policy.compute_dtype, bool(policy.quantization_mode)
    if not isinstance(model_or_policy, keras.layers.Layer):
        raise TypeError(
            "default_jit_compile() takes a Keras model or layer, a dtype policy or a "
            f"policy name, got {type(model_or_policy).__name__}."
        )
    layers = [model_or_policy] + list(model_or_policy._flatten_layers(include_self=False, recursive=True))
    quantized = any(getattr(layer, "quantization_mode", None) for layer in layers)
    low = [layer.compute_dtype for layer in layers if layer.compute_dtype in _LOW_PRECISION]
    return (low[0] if low else "float32"), quantized


def _replicas(strategy):
    """`(num_replicas, is_tpu)` of a `tf.distribute` strategy (or None)."""
    if strategy is None or keras.backend.backend() != "tensorflow":
        return 1, False
    return int(strategy.num_replicas_in_sync), "TPU" in type(strategy).__name__


def jit_compile_supported(strategy=None):
    """Whether Keras `fit`/`predict` steps can be XLA-compiled under `strategy`.

    No for a `tf.distribute` strategy with several replicas (MirroredStrategy,
    MultiWorkerMirroredStrategy): Keras's TensorFlow trainer wraps the whole
    `strategy.run(train_step)` call, i.e. every replica's computation, in one
    `tf.function(jit_compile=True)`, and one XLA computation runs on one
    device. Reading the second replica's variables from it fails with
    "Trying to access resource .../replica_1/... located in device CPU:1 from
    device CPU:0" (GPU:1 / GPU:0 alike). Keras's own `jit_compile="auto"`
    turns XLA off under a strategy for this reason. TensorFlow itself
    supports XLA per replica only for a `jit_compile=True` `tf.function`
    passed directly to `strategy.run` on GPUs, which `fit()` never does.

    `strategy=None` looks at the strategy in scope (TensorFlow backend).

    Example:
    >>> with tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]).scope():
    ...     jit_compile_supported()
    False
    """
    if strategy is None and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    replicas, is_tpu = _replicas(strategy)
    return replicas == 1 or is_tpu


def default_jit_compile(model_or_policy=None, strategy=None):
    """Whether bertzoo compiles train/predict steps with XLA by default.

    Args:
        model_or_policy: the model (or layer) to compile, or a dtype policy
            or policy name; None means the global policy. Pass the model when
            you have it: its layers' compute dtype and int8 quantization
            decide, not the model's own policy.
        strategy: the `tf.distribute` strategy the model trains under; None
            looks at the strategy in scope.

    On the JAX backend always (its only compiled path); on the torch
    backend never (Keras's own default). TensorFlow backend: XLA on GPU/TPU
    always. On CPU: on for float32 and for int8-quantized
    models, off for bfloat16/float16 compute (oneDNN's kernels are faster);
    off under a multi-replica `tf.distribute` strategy on any device, where
    Keras cannot compile its steps (`jit_compile_supported`), with a logged
    reason. See this module's docstring for the measurements.

    Example:
    >>> default_jit_compile("mixed_bfloat16")  # On a CPU-only machine.
    False
    """
    compute_dtype, quantized = _precision(model_or_policy)
    backend = keras.backend.backend()
    if backend != "tensorflow":
        # JAX: jit_compile=False means op-by-op eager execution, always
        # slower. Torch: True means torch.compile, which Keras's "auto" avoids.
        return backend == "jax"
    if accelerator() != "cpu":
        wanted = True
    elif compute_dtype in _LOW_PRECISION and not quantized:
        wanted = False
    else:
        wanted = True
    if wanted and not jit_compile_supported(strategy):
        logger.warning(
            "Compiling without XLA (jit_compile=False): Keras cannot "
            "XLA-compile the steps of a multi-replica tf.distribute strategy "
            "(one XLA computation runs on one device). See "
            "bertzoo.utils.device.jit_compile_supported."
        )
        return False
    return wanted


def resolve_jit_compile(jit_compile, model, strategy=None):
    """The `jit_compile` value to hand to `keras.Model.compile`.

    `"auto"` becomes `default_jit_compile(model, strategy)`; `True` under a
    multi-replica strategy raises a `ValueError` naming the fix, instead of
    the device-placement error `fit()` would raise later.

    Example:
    >>> resolve_jit_compile("auto", model)
    True
    """
    if jit_compile == "auto":
        return default_jit_compile(model, strategy)
    if jit_compile is True and not jit_compile_supported(strategy):
        raise ValueError(
            "jit_compile=True cannot be used under a tf.distribute strategy with several "
            "replicas: Keras compiles the whole multi-replica step as one XLA computation, "
            "which runs on a single device and cannot reach the other replicas' variables "
            "('Trying to access resource ... located in device ...:1 from device ...:0'). "
            "Use jit_compile='auto' (turns XLA off there) or jit_compile=False."
        )
    return jit_compile
