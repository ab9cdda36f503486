"""Whether TensorFlow's fused oneDNN int8 matmul can run in this process.

`bertzoo.layers.Dense` runs int8 inference as TensorFlow's internal
`_QuantizedMatMul` op when it can. The op is not part of TensorFlow's public
API, so its presence and its signature are checked once per process; when
either check fails the layers use Keras's own int8 path and the reason is
logged once (see `fused_int8_status`).
"""

import functools
import logging
import platform

import keras

from bertzoo.utils import private_api
from bertzoo.utils.cpu import cpu_flags
from bertzoo.utils.optional import tf

logger = logging.getLogger("bertzoo")

FUSED_INT8_OP = "_QuantizedMatMul"
# The inputs and attributes bertzoo passes to the op (see
# `bertzoo.layers.dense`); a TensorFlow release that renames any of them
# must not be called with the old ones.
_EXPECTED_INPUTS = ("device_inputs", "host_inputs")
_EXPECTED_ATTRS = frozenset(
    {
        "Tdevice_inputs",
        "Thost_inputs",
        "Tdevice_outputs",
        "Thost_outputs",
        "T1",
        "T2",
        "Tbias",
        "U",
        "Tout",
        "transpose_a",
        "transpose_b",
        "is_weight_const",
        "is_bias_const",
        "fused_ops",
        "input_quant_mode",
        "output_quant_mode",
        "leakyrelu_alpha",
    }
)


def check_fused_int8_op(op_def):
    """`None` when `op_def` (an `OpDef`, or None when the op is not
    registered) has the signature bertzoo calls, else the reason it cannot
    be used."""
    if op_def is None:
        return f"TensorFlow has no {FUSED_INT8_OP} op registered"
    inputs = tuple(arg.name for arg in op_def.input_arg)
    if inputs != _EXPECTED_INPUTS:
        return f"{FUSED_INT8_OP} takes inputs {inputs}, bertzoo expects {_EXPECTED_INPUTS}"
    attrs = {attr.name for attr in op_def.attr}
    missing = sorted(_EXPECTED_ATTRS - attrs)
    if missing:
        return f"{FUSED_INT8_OP} lacks the attributes {missing} that bertzoo sets"
    return None


# Instructions that give oneDNN's int8 matmul exact 32-bit sums; without them
# it uses 16-bit pair sums of u8 x s8 products (vpmaddubsw), which saturate.
INT8_DOT_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def _lacks_int8_dot_products(flags):
    """Whether `flags` (None: unknown) show an x86 CPU without them."""
    return flags is not None and not any(flag in flags for flag in INT8_DOT_PRODUCT_FLAGS)


@functools.cache
def fused_int8_status():
    """`(available, reason)`: whether int8 `Dense` layers can run oneDNN's
    fused kernel here, and why not when they cannot. Logged once.

    Needs the TensorFlow backend, an x86-64 CPU with int8 dot-product
    instructions (VNNI or AMX: without them the kernel's sums saturate),
    TensorFlow built with oneDNN (optimizations on), the op with the expected
    signature, and no GPU (the kernel is CPU-only).

    Example:
    ```python
    available, reason = fused_int8_status()
    ```
    """
    reason = None
    if keras.backend.backend() != "tensorflow":
        reason = f"the Keras backend is {keras.backend.backend()}, not tensorflow"
    elif platform.machine().lower() not in ("x86_64", "amd64"):
        reason = f"the CPU is {platform.machine()}, not x86-64"
    elif not private_api.tensorflow_onednn_enabled():
        reason = (
            "TensorFlow runs without oneDNN (TF_ENABLE_ONEDNN_OPTS=0, off by default on a CPU without VNNI or "
            "AMX, or a build without it)"
        )
    elif _lacks_int8_dot_products(cpu_flags()):
        reason = (
            "the CPU has none of " + ", ".join(INT8_DOT_PRODUCT_FLAGS) + ": oneDNN's int8 matmul adds pairs of "
            "products in 16 bits there, which saturate (several times int8's own error)"
        )
    elif not private_api.unexposed_op_runner_available():
        reason = "this TensorFlow has moved the internals bertzoo calls the fused kernel with"
    else:
        reason = check_fused_int8_op(private_api.tensorflow_op_def(FUSED_INT8_OP))
        if reason is None:
            if tf.config.list_logical_devices("GPU"):
                reason = "a GPU is visible (the fused kernel is CPU-only)"
    if reason is not None:
        logger.info("int8 Dense layers use Keras's int8 ops: %s.", reason)
    return reason is None, reason


def onednn_int8_available():
    """Whether int8 `Dense` layers can run oneDNN's fused kernel here
    (`fused_int8_status()[0]`)."""
    return fused_int8_status()[0]
