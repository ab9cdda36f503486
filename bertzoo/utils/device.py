"""Per-device choices for the fast path."""

import keras


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


def default_jit_compile(dtype_policy=None):
    """Whether bertzoo compiles train/predict steps with XLA by default.

    XLA pays off on GPU/TPU at every precision. On CPU it does for float32,
    but low-precision (bfloat16/float16) XLA on CPU is far slower than
    TensorFlow's oneDNN kernels (measured about 3x on our CI machine), so
    mixed-precision models on CPU run without XLA. See README "Performance".
    """
    policy = keras.dtype_policies.get(dtype_policy or keras.config.dtype_policy())
    if accelerator() != "cpu":
        return True
    return policy.compute_dtype == "float32" and not policy.name.startswith("int")
