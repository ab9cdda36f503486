"""Per-device choices for the fast path: when to compile steps with XLA.

`jit_compile="auto"` on the TensorFlow backend is decided by measuring the
model on the machine at hand (`bertzoo.utils.fast_path`, cached on disk);
the rules below apply only where nothing can be measured (a dtype policy
instead of a model, a model without symbolic inputs, or
`BERTZOO_JIT_COMPILE=rule`). The figures behind them:

| where | model | XLA (the rule) | why |
|---|---|---|---|
| GPU, TPU | any | on | XLA's usual win: fused elementwise work |
| CPU | float32 | off | about as fast either way on the CPUs measured, and no compile time |
| CPU | bfloat16 / float16 compute | off | XLA:CPU's bf16 dots were far slower than oneDNN's AVX512-BF16 kernels (without AVX512-BF16 the measurement picks XLA) |
| CPU | int8-quantized layers, TensorFlow with oneDNN | off | the fused oneDNN int8 kernel (`bertzoo.layers.dense`) runs only outside XLA |
| CPU | other quantized layers (int4; int8 without oneDNN) | on | Keras's int8 ops have no fast matmul kernel outside XLA |
| any | multi-replica `tf.distribute` strategy | off | Keras cannot compile those steps, see `jit_compile_supported` |

The measured figures behind the rule (by machine) are in
docs/performance.md and `benchmarks/results.jsonl`; on another CPU the
measurement, not this table, decides.

TPUStrategy compiles every step with XLA whatever `jit_compile` says, so
"off" there only drops a redundant nested compilation. The JAX backend always
compiles (its only fast path); the torch backend never (Keras's default).
"""

import contextlib
import functools
import logging

import keras

from bertzoo.utils import fast_path
from bertzoo.utils.fast_path import jit_compile_supported  # noqa: F401 (this module's API; defined low, for fast_path)
from bertzoo.utils.layers import quantization_mode
from bertzoo.utils.onednn import onednn_int8_available
from bertzoo.utils.optional import tf

logger = logging.getLogger("bertzoo")


def accelerator():
    """Returns "gpu", "tpu" or "cpu" for the current Keras backend's devices."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
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


def strategy_scope_of(model):
    """The scope of the `tf.distribute` strategy `model` was built under,
    when it is not the one in scope now (else a no-op context): what is
    built for the model outside that scope (a trainer around it, an
    optimizer's slots) must be made in it, as the model's variables were.

    Example:
    ```python
    with strategy.scope():
        student = bertzoo.BertClassifier.from_preset("tiny")
    with strategy_scope_of(student):
        distiller = bertzoo.Distiller(teacher, student)  # Mirrored like the student.
    ```
    """
    strategy = getattr(model, "distribute_strategy", None)  # The TensorFlow backend's.
    if strategy is None or strategy is tf.distribute.get_strategy():
        return contextlib.nullcontext()
    return strategy.scope()


@functools.cache
def _log_multi_replica_once():
    logger.warning(
        "Compiling without XLA (jit_compile=False): Keras cannot "
        "XLA-compile the steps of a multi-replica tf.distribute strategy "
        "(one XLA computation runs on one device). See "
        "bertzoo.utils.device.jit_compile_supported."
    )


def default_jit_compile(model_or_policy=None, strategy=None, mode=None):
    """Whether bertzoo compiles train/predict steps with XLA by default: the
    measured choice for a model, or the rule where nothing can be measured.

    Args:
        model_or_policy: the model (or layer) to compile, or a dtype policy
            or policy name; None means the global policy. Pass the model when
            you have it: whether its layers are int8-quantized decides, and
            `quantize()` leaves the model's own policy unchanged.
        strategy: the `tf.distribute` strategy the model trains under; None
            looks at the strategy in scope.
        mode: "train", "test" or "predict" to measure (and return the choice
            for) that mode only, as `fit`/`evaluate`/`predict` do when they
            first build their step; None measures both and returns the
            training step's choice.

    On the JAX backend always (its only compiled path); on the torch
    backend never (Keras's own default): `fast_path.backend_jit_compile`.
    Never under a multi-replica `tf.distribute` strategy, where Keras cannot
    compile its steps (`jit_compile_supported`), with a reason logged once.
    Otherwise (TensorFlow) `$BERTZOO_JIT_COMPILE=0|1` pins; a built model is
    measured on this machine, training step and inference, and the training
    step's faster path returned (`fast_path.choose_jit_compile`, cached on
    disk; the per-mode choice is `fast_path.jit_compile_for(model, mode)`).
    The rule, for a dtype policy or where nothing can be measured: XLA on
    GPU/TPU; on CPU only for quantized layers that oneDNN's fused int8
    kernel cannot run (see this module's docstring).

    Example:
    ```python
    default_jit_compile("mixed_bfloat16")  # False on a CPU-only machine (the rule).
    default_jit_compile("int4_from_float32")  # True (the rule).
    default_jit_compile(model)  # Measured (or cached) for this model here.
    ```
    """
    quantized = quantization_mode(model_or_policy)
    backend = keras.backend.backend()
    if backend != "tensorflow":
        rule = fast_path.backend_jit_compile(backend)
        return fast_path.rule_choice(model_or_policy, rule, f"the {backend} backend's rule")
    if not jit_compile_supported(strategy):
        _log_multi_replica_once()
        return fast_path.rule_choice(model_or_policy, False, "a multi-replica tf.distribute strategy")
    # The rule: on CPU only quantized models without bertzoo's fused oneDNN
    # int8 kernel gain from XLA (see the module docstring).
    fused = quantized in (None, "int8") and onednn_int8_available()
    rule = accelerator() != "cpu" or bool(quantized and not fused)
    report = fast_path.auto_jit_compile(model_or_policy, rule, mode=mode)
    return report.jit_compile if mode is None else report.choice(mode)


def resolve_jit_compile(jit_compile, model, strategy=None, mode=None, record_pin=True):
    """The `jit_compile` value to hand to `keras.Model.compile`.

    `"auto"` becomes `default_jit_compile(model, strategy, mode)` (measured
    for a model: for `mode` only when given, else the training step's
    choice; the per-mode one is `fast_path.jit_compile_for(model, mode)`);
    `True` under a multi-replica
    strategy raises a `ValueError` naming the fix, instead of the
    device-placement error `fit()` would raise later. An explicit True/False
    pins both modes (recorded for `model` unless `record_pin` is False: a
    trainer compiling its own step around `model`). Any other value is a
    ValueError.

    Example:
    ```python
    resolve_jit_compile("auto", model)  # True or False, as measured here.
    ```
    """
    if not (jit_compile is True or jit_compile is False or jit_compile == "auto"):
        # Keras takes any truthy value for XLA: "false" would compile.
        raise ValueError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}.")
    if jit_compile == "auto":
        return default_jit_compile(model, strategy, mode)
    if jit_compile is True and not jit_compile_supported(strategy):
        raise ValueError(
            "jit_compile=True cannot be used under a tf.distribute strategy with several "
            "replicas: Keras compiles the whole multi-replica step as one XLA computation, "
            "which runs on a single device and cannot reach the other replicas' variables "
            "('Trying to access resource ... located in device ...:1 from device ...:0'). "
            "Use jit_compile='auto' (turns XLA off there) or jit_compile=False."
        )
    if record_pin:
        fast_path.record_pinned(model, jit_compile)
    return jit_compile
