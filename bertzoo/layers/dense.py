"""`Dense`: Keras's Dense layer, whose int8 inference on CPU runs as one
oneDNN kernel.

After `bertzoo.quantize(model, "int8")` a Dense layer holds an int8 kernel
with per-output-channel scales. Keras computes such a layer as separate ops
(quantize the inputs, int8 matmul, rescale, add the bias, activation), and
TensorFlow has no fast int8 matmul for them outside XLA.

On TensorFlow's CPU build with oneDNN (the default x86 build), bertzoo
instead runs each quantized Dense layer as TensorFlow's oneDNN
`_QuantizedMatMul` kernel: the VNNI int8 matmul with the bias, the
activation (GELU, ReLU, tanh) and the rescaling to float fused in. The
README's performance section, docs/performance.md and `benchmarks/results.jsonl` hold the measured
speeds and the accuracy against the float model
(`python -m benchmarks.run`, `python -m benchmarks.int8_fidelity`).

The inputs are quantized per call with one scale for the whole tensor, as
in PyTorch's dynamic quantization: symmetric int8, or uint8 with a zero
point for one-sided inputs (`asymmetric_int8_inputs`, which BERT's second
feed-forward matmul uses: its inputs are GELU outputs). Keras's own path
uses one scale per token, so the two paths round differently, and with one
scale per tensor an example's output also moves slightly with the other
examples in its batch. Compile with `jit_compile=True` for Keras's
per-token rounding (layers with static input ranges, below, round with
their fixed scale everywhere).

On Keras's torch backend on the CPU, inference (no gradient recorded;
with a static input range, any call but `training=True`) keeps Keras's
arithmetic (per-token input scales, or the static range) but runs the
int8 matmul as PyTorch's int8 kernel (`torch._int_mm`, VNNI/AMX) instead
of the int32 matmul Keras falls back to there: the same integers, so the
same float32 outputs (bertzoo rescales the integer sums in float32 before
casting to a bfloat16 compute dtype; Keras casts first).

Keras's own path (or, with static input ranges, its arithmetic with the
fixed scale) is used wherever the fused kernel does not apply:
- other backends, GPUs and TPUs, and TensorFlow builds without oneDNN;
- a TensorFlow without the op, or whose op has another signature than the
  one bertzoo calls (checked once, reason logged: `fused_int8_status`);
- inside XLA-compiled functions (`jit_compile=True`);
- when gradients may be taken (`training=True` or an active
  `tf.GradientTape`): the fused kernel has no gradient;
- LoRA-enabled layers, and layers quantized with a custom
  `QuantizationConfig` (other input quantizers);
- inside `portable_kernels()`, which bertzoo's exporters enter, so that
  SavedModels, ONNX and LiteRT files hold only standard ops.

One scale per tensor suits inputs whose channels have similar ranges;
BERT's do not (a few hidden channels run far larger than the rest). A
layer quantized with calibration data (`bertzoo.quantize(model, "int8",
calibration=...)`, SmoothQuant: Xiao et al. 2023) divides its inputs,
channel by channel, by smoothing factors before quantizing them, its kernel
rows having been multiplied by the same factors before the kernel was
quantized: the float product is unchanged, and the inputs' ranges are
evened out at the cost of the kernel's. Such a layer's dtype policy is an
`InputSmoothingInt8Policy`, so presets and configs rebuild it with its
`input_scale` weight (the factors' inverses).

Calibration can also fix each layer's input range (`bertzoo.quantize(model,
"int8", calibration=..., input_ranges="static")`): the largest smoothed
input magnitude seen while calibrating becomes the layer's `input_range`
weight, and inference quantizes with one scale for the whole tensor,
`127 / input_range`, instead of measuring the inputs on every call (values
beyond the range are clipped to it). That drops a reduction over the inputs
from every int8 layer and lets XLA fuse the quantizing into the op that
produces the inputs. Gradients pass the rounding straight through, as in
Keras's int8 path (the inputs' gradient is the upstream one times the
dequantized kernel); `training=True` calls and LoRA layers keep Keras's
per-token path.

A layer quantized weight-only (`bertzoo.quantize(model, "int8",
weight_only=True)`, whose layers get a `WeightOnlyInt8Policy`) quantizes
nothing per call: its inputs stay in the compute dtype and meet the
dequantized kernel in a float matmul (Keras's path, with no input
quantizer): int8 storage with float arithmetic, for machines whose integer
matmuls do not pay (the README's GPU rows).

For quantization-aware training a float `Dense` can also *simulate* int8
(`simulate_int8 = True`, set by
`bertzoo.compression.quantization_aware_training`): inputs and kernel are
rounded to the int8 grid the fused kernel uses (one input scale per tensor,
one kernel scale per output channel) and the rounding passes gradients
straight through (Bengio et al.'s straight-through estimator), so training
learns weights that survive the rounding.
"""

import contextlib
import threading

import keras
import numpy as np
from keras import ops

from bertzoo.layers.activations import _gelu_exact
from bertzoo.layers.activations import _gelu_tanh
from bertzoo.utils import private_api
from bertzoo.utils.layers import own_dtype_policy
from bertzoo.utils.onednn import FUSED_INT8_OP
from bertzoo.utils.onednn import onednn_int8_available
from bertzoo.utils.optional import tf
from bertzoo.utils.scopes import ThreadScope

# oneDNN post-op names of the activations it can fuse.
_FUSED_ACTIVATIONS = {
    _gelu_tanh: "GeluApproximate",
    _gelu_exact: "GeluExact",
    keras.activations.relu: "Relu",
    keras.activations.tanh: "Tanh",
}

_PORTABLE = ThreadScope()


def portable_kernels():
    """Within this context, quantized `Dense` layers build only standard
    TensorFlow ops (Keras's own int8 path), e.g. while tracing an export.

    Example:
    ```python
    with portable_kernels():
        tf.saved_model.save(module, path)
    ```
    """
    return _PORTABLE()


def _fused_kernel_applies(layer, inputs, training):
    if _PORTABLE.active() or training or not onednn_int8_available():
        return False
    if layer.lora_enabled or type(layer.inputs_quantizer) is not keras.quantizers.AbsMaxQuantizer:
        return False
    if layer.inputs_quantizer.value_range != (-127, 127) or inputs.shape[-1] is None:
        return False
    if private_api.gradient_tape_active():
        return False
    return not private_api.in_xla_context()


def _torch_int8_matmul_applies(layer, inputs, training):
    if keras.backend.backend() != "torch" or training or layer.lora_enabled:
        return False
    if type(layer.inputs_quantizer) is not keras.quantizers.AbsMaxQuantizer:
        return False
    import torch

    return inputs.device.type == "cpu" and not torch.is_grad_enabled() and private_api.torch_int8_matmul() is not None


def _int8_product(layer, quantized, inputs_scale, kernel, kernel_scale):
    """Keras's int8 Dense product once the inputs are quantized:
    `quantized @ kernel / (kernel_scale * inputs_scale)`, in the layer's
    compute dtype. On PyTorch's CPU the matmul is PyTorch's int8 kernel when
    it accepts the tensors (the same integers as the int32 matmul Keras
    falls back to)."""
    x = None
    torch_matmul = private_api.torch_int8_matmul() if keras.backend.backend() == "torch" else None
    if torch_matmul is not None and quantized.device.type == "cpu":
        try:
            flat = torch_matmul(ops.reshape(quantized, (-1, quantized.shape[-1])).contiguous(), kernel)
            x = ops.reshape(flat, tuple(quantized.shape[:-1]) + (layer.units,))
        except RuntimeError:
            pass  # PyTorch refused the tensors: the portable matmul below.
    if x is None:
        x = ops.matmul(quantized, kernel)
    # Rescaled in float32 (the int32 sums do not fit bfloat16's 8 bits), then
    # cast: Keras casts the sums to the compute dtype first; the same in float32.
    x = ops.divide(ops.cast(x, "float32"), ops.cast(ops.multiply(kernel_scale, inputs_scale), "float32"))
    return ops.cast(x, layer.compute_dtype)


def _bias_and_activation(layer, x):
    if layer.bias is not None:
        x = ops.add(x, layer.bias)
    return layer.activation(x) if layer.activation is not None else x


def _torch_int8_dense(layer, inputs):
    """Keras's int8 Dense arithmetic (per-token input scales) with PyTorch's
    int8 matmul, for inference without gradients."""
    quantized, inputs_scale = layer.inputs_quantizer(inputs, axis=-1)
    kernel = ops.convert_to_tensor(private_api.dense_kernel_variable(layer))
    return _bias_and_activation(layer, _int8_product(layer, quantized, inputs_scale, kernel, layer.kernel_scale))


@keras.saving.register_keras_serializable(package="bertzoo")
class InputSmoothingInt8Policy(keras.dtype_policies.QuantizedDTypePolicy):
    """Keras's int8 policy, for a `Dense` layer that divides its inputs by
    per-channel smoothing factors before quantizing them (this module's
    docstring): built under it, the layer holds an `input_scale` weight.
    `group` names layers that read the same inputs with the same factors
    (an attention block's query, key and value), which then smooth them once.
    With `static_inputs` the layer also holds an `input_range` weight and
    quantizes its (smoothed) inputs with that fixed range.

    Example:
    ```python
    layer.smooth_inputs(factors)  # quantizes the float layer under this policy
    isinstance(own_dtype_policy(layer), InputSmoothingInt8Policy)  # True
    ```
    """

    def __init__(self, mode="int8", source_name=None, group=None, static_inputs=False):
        if mode != "int8":
            raise ValueError(f"InputSmoothingInt8Policy is an int8 policy, got mode={mode!r}.")
        super().__init__(mode, source_name)
        self.group = group
        # With static inputs the layer also holds `input_range` (module docstring).
        self.static_inputs = bool(static_inputs)

    def get_config(self):
        config = {**super().get_config(), "group": self.group}
        if self.static_inputs:  # Only then: presets without it still load in earlier bertzoo versions.
            config["static_inputs"] = True
        return config


@keras.saving.register_keras_serializable(package="bertzoo")
class WeightOnlyInt8Policy(keras.dtype_policies.QuantizedDTypePolicy):
    """Keras's int8 policy for a `Dense` layer that quantizes its kernel
    only: the kernel is stored as int8 with one scale per output channel,
    the inputs stay in the compute dtype, and the product is computed on
    the dequantized kernel (Keras's `Int8QuantizationConfig` without an
    activation quantizer). The policy records that choice, so presets and
    configs rebuild the layer the same way.

    Example:
    ```python
    layer = Dense(4, dtype=WeightOnlyInt8Policy(source_name="float32"))
    layer.build((None, 8))
    layer.inputs_quantizer  # None: the inputs are not quantized
    ```
    """

    def __init__(self, mode="int8", source_name=None):
        if mode != "int8":
            raise ValueError(f"WeightOnlyInt8Policy is an int8 policy, got mode={mode!r}.")
        super().__init__(mode, source_name)


_observers = threading.local()


@contextlib.contextmanager
def observe_inputs(observer):
    """Within this context, every float `Dense` layer's call first calls
    `observer(layer, inputs)` (calibration statistics; `inputs` are symbolic
    when the call is traced, so calibrate with eager calls).

    Example:
    ```python
    peaks = {}
    with observe_inputs(lambda layer, x: peaks.setdefault(layer.path, x)):
        model(features, training=False)
    ```
    """
    previous = getattr(_observers, "observer", None)
    _observers.observer = observer
    try:
        yield
    finally:
        _observers.observer = previous


def _fused_int8_dense(layer, inputs):
    """`activation(inputs @ dequantized kernel + bias)` as one oneDNN kernel."""

    units = layer.units
    x = tf.reshape(tf.cast(inputs, tf.float32), [-1, inputs.shape[-1]])
    kernel = tf.convert_to_tensor(private_api.dense_kernel_variable(layer))
    scale = tf.cast(layer.kernel_scale, tf.float32)
    bias = tf.zeros([units], tf.float32) if layer.bias is None else tf.cast(layer.bias, tf.float32)
    # The ranges are floored at 0: an empty batch's max is -inf, which
    # QuantizeV2 refuses (a zero range it widens itself).
    if layer.asymmetric_int8_inputs and layer.input_range is None:
        # uint8 over [min(x, 0), max(x)]: x - low is quantized, and
        # low * (column sums of the kernel) goes into the bias.
        low = tf.minimum(tf.reduce_min(x), 0.0)
        shifted = x - low
        quantized = tf.raw_ops.QuantizeV2(
            input=shifted,
            min_range=0.0,
            max_range=tf.maximum(tf.reduce_max(shifted), 0.0),
            T=tf.quint8,
            mode="SCALED",
            round_mode="HALF_TO_EVEN",
        )
        column_sums = tf.reduce_sum(tf.cast(kernel, tf.int32), axis=0)
        bias = bias + low * tf.cast(column_sums, tf.float32) / scale
    else:
        # int8 over [-r, r]: the calibrated range (values beyond it are
        # clipped), or this call's max|x|.
        if layer.input_range is not None:
            largest = tf.cast(tf.reshape(layer.input_range, []), tf.float32)
        else:
            largest = tf.maximum(tf.reduce_max(tf.abs(x)), 0.0)
        quantized = tf.raw_ops.QuantizeV2(
            input=x,
            min_range=-largest,
            max_range=largest,
            T=tf.qint8,
            mode="SCALED",
            round_mode="HALF_TO_EVEN",
            narrow_range=True,
        )
    # Keras stores kernel = round(w * kernel_scale): w's range is 127 / scale.
    weight_range = 127.0 / scale
    activation = _FUSED_ACTIVATIONS.get(layer.activation)
    fused_ops = ["BiasAdd"] + ([activation] if activation else []) + ["Dequantize"]
    device_inputs = [quantized.output, tf.bitcast(kernel, tf.qint8), bias]
    host_inputs = [quantized.output_min, quantized.output_max, -weight_range, weight_range]
    y = private_api.run_unexposed_op(
        FUSED_INT8_OP,
        device_inputs + host_inputs,
        tf.float32,
        {
            "Tdevice_inputs": [t.dtype for t in device_inputs],
            "Thost_inputs": [t.dtype for t in host_inputs],
            "Tdevice_outputs": [tf.float32],
            "Thost_outputs": [],
            "T1": quantized.output.dtype,
            "T2": tf.qint8,
            "Tbias": tf.float32,
            "Tout": tf.float32,
            "U": tf.float32,
            "transpose_a": False,
            "transpose_b": False,
            "fused_ops": fused_ops,
            "input_quant_mode": "SCALED",
            "output_quant_mode": "SCALED",
            # Weights may change (set_weights, load_weights): no cached copy.
            # (Cheap with float32 bias and output; bfloat16 ones were slow.)
            "is_weight_const": False,
            "is_bias_const": False,
            "leakyrelu_alpha": 0.2,
        },
    )
    if activation is None and layer.activation is not keras.activations.linear:
        y = layer.activation(y)
    y = tf.cast(y, layer.compute_dtype)
    return tf.reshape(y, tf.concat([tf.shape(inputs)[:-1], [units]], axis=0))


def _static_int8_dense(layer, inputs):
    """Keras's int8 Dense arithmetic with the layer's calibrated input range
    (one scale for the whole tensor) instead of a scale per token measured
    on every call; gradients pass the rounding straight through, as in
    Keras's int8 path."""

    @ops.custom_gradient
    def product(inputs, kernel, kernel_scale, input_range):
        def grad_fn(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            float_kernel = ops.divide(ops.cast(kernel, layer.compute_dtype), kernel_scale)
            return ops.matmul(upstream, ops.transpose(float_kernel)), None, None, None

        scale = ops.divide(127.0, ops.cast(input_range, "float32"))
        quantized = ops.clip(ops.round(ops.multiply(ops.cast(inputs, "float32"), scale)), -127.0, 127.0)
        return _int8_product(layer, ops.cast(quantized, "int8"), scale, kernel, kernel_scale), grad_fn

    kernel = ops.convert_to_tensor(private_api.dense_kernel_variable(layer))
    x = product(inputs, kernel, ops.convert_to_tensor(layer.kernel_scale), ops.convert_to_tensor(layer.input_range))
    return _bias_and_activation(layer, x)


def project_shared_input(layers, inputs, training=None):
    """`[layer(inputs) for layer in layers]` for bertzoo `Dense` layers that
    read the same inputs (an attention block's query, key and value): when
    they were smoothed as one group (`Dense.smooth_inputs(..., group=...)`),
    the inputs are smoothed once for all of them.

    Example:
    ```python
    query, key, value = project_shared_input([q_dense, k_dense, v_dense], x)
    ```
    """
    if all(isinstance(layer, Dense) for layer in layers):
        groups = {layer.input_smoothing_group for layer in layers}
        if len(groups) == 1 and None not in groups:
            inputs = ops.multiply(inputs, ops.cast(layers[0].input_scale, inputs.dtype))
            return [layer(inputs, training=training, inputs_smoothed=True) for layer in layers]
    return [layer(inputs, training=training) for layer in layers]


def _round_straight_through(x):
    """`round(x)` forward, identity backward."""
    return x + ops.stop_gradient(ops.round(x) - x)


def simulated_int8_kernel(kernel, dtype=None):
    """`kernel` rounded as `Model.quantize("int8")` stores it: symmetric,
    one scale per output channel (`127 / max|column|`), computed in float32
    (in bfloat16, `kernel * scale` has steps of 0.5 above 64, which would
    round to other integers than `quantize`'s) and returned in `dtype`
    (default: the kernel's)."""
    dtype = dtype or kernel.dtype
    kernel = ops.cast(kernel, "float32")
    scale = ops.stop_gradient(127.0 / (ops.max(ops.abs(kernel), axis=0, keepdims=True) + keras.config.epsilon()))
    return ops.cast(ops.clip(_round_straight_through(kernel * scale), -127.0, 127.0) / scale, dtype)


def simulated_int8_inputs(x, asymmetric=False):
    """`x` rounded as the fused int8 kernel quantizes it: one scale for the
    whole tensor, symmetric int8 over `[-max|x|, max|x|]`, or with
    `asymmetric` uint8 over `[min(x, 0), max(x)]`. (Keras's own int8 path
    uses a scale per token, which is finer: training at this coarser grid
    covers both.) Computed in float32, returned in `x`'s dtype."""
    dtype = x.dtype
    x = ops.cast(x, "float32")
    if asymmetric:
        low = ops.stop_gradient(ops.minimum(ops.min(x), 0.0))
        scale = ops.stop_gradient(255.0 / (ops.max(x) - low + keras.config.epsilon()))
        rounded = ops.clip(_round_straight_through((x - low) * scale), 0.0, 255.0) / scale + low
    else:
        scale = ops.stop_gradient(127.0 / (ops.max(ops.abs(x)) + keras.config.epsilon()))
        rounded = ops.clip(_round_straight_through(x * scale), -127.0, 127.0) / scale
    return ops.cast(rounded, dtype)


@keras.saving.register_keras_serializable(package="bertzoo")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense`, with int8 inference as one fused oneDNN kernel
    where TensorFlow can run it (see this module's docstring); everything
    else, quantization and saving included, is Keras's.

    Args:
        asymmetric_int8_inputs: how the fused kernel quantizes the inputs:
            False, symmetric int8 over `[-max|x|, max|x|]`; True, uint8 over
            `[min(x, 0), max(x)]`, twice the resolution for one-sided inputs
            such as GELU outputs (BERT's second feed-forward matmul), for a
            column sum of the kernel per call. Keras's own int8 path ignores
            it, and so do layers with a static input range (symmetric int8
            over `[-input_range, input_range]` wherever that range is used).
        **kwargs: `keras.layers.Dense`'s arguments.

    Example:
    ```python
    layer = Dense(4, activation=get_activation("gelu_tanh"))
    layer(keras.ops.ones((2, 8))).shape
    # (2, 4)
    ```
    """

    def __init__(self, units, asymmetric_int8_inputs=False, **kwargs):
        super().__init__(units, **kwargs)
        self.asymmetric_int8_inputs = bool(asymmetric_int8_inputs)
        # Quantization-aware training (see this module's docstring); a
        # training-time switch, not part of the config.
        self.simulate_int8 = False
        # Set by `_int8_build` under an `InputSmoothingInt8Policy` (the
        # second with `static_inputs`).
        self.input_scale = None
        self.input_range = None

    def call(self, inputs, training=None, inputs_smoothed=False):
        observer = getattr(_observers, "observer", None)
        if observer is not None:
            observer(self, inputs)
        if not self.simulate_int8:
            return super().call(inputs, training=training)
        # The stored float32 kernel, not its autocast copy: `quantize` rounds that one.
        kernel = simulated_int8_kernel(private_api.stored_value(self.kernel), dtype=self.compute_dtype)
        x = ops.matmul(simulated_int8_inputs(inputs, self.asymmetric_int8_inputs), kernel)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        return self.activation(x) if self.activation is not None else x

    def _check_static_range_supported(self):
        # Where Keras no longer calls `_int8_call` (renamed), it runs its own
        # int8 path (logged once): right for every layer but one with a
        # static input range, which it would quantize per token instead.
        if not private_api.keras_int8_hooks_available():
            raise RuntimeError(
                f"Keras {keras.__version__}'s Dense has no _int8_call, so layer '{self.name}' cannot use a "
                "static input range (Keras would quantize its inputs per token instead): this needs a Keras "
                'version bertzoo supports (>=3.13), or quantize without input_ranges="static".'
            )

    def _int8_build(self, kernel_shape, config=None):
        self._built_by_int8_build = True  # See `quantize_under`.
        policy = own_dtype_policy(self)
        if isinstance(policy, InputSmoothingInt8Policy) and policy.static_inputs:
            self._check_static_range_supported()
        if isinstance(own_dtype_policy(self), WeightOnlyInt8Policy):
            config = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
        super()._int8_build(kernel_shape, config)
        if isinstance(own_dtype_policy(self), InputSmoothingInt8Policy):
            self.input_scale = self.add_weight(
                name="input_scale", shape=(kernel_shape[0],), initializer="ones", trainable=False, dtype="float32"
            )
            if own_dtype_policy(self).static_inputs:
                self.input_range = self.add_weight(
                    name="input_range", shape=(), initializer="ones", trainable=False, dtype="float32"
                )

    @property
    def input_smoothing_group(self):
        """The smoothing group of this layer's inputs (see
        `InputSmoothingInt8Policy`), None when it has none."""
        return getattr(own_dtype_policy(self), "group", None) if self.input_scale is not None else None

    def quantized_call(self, inputs, training=None, inputs_smoothed=False):
        # `inputs_smoothed`: already multiplied by `input_scale`
        # (`project_shared_input` smooths a group's inputs once).
        if self.input_scale is not None and not inputs_smoothed:
            inputs = ops.multiply(inputs, ops.cast(self.input_scale, inputs.dtype))
        return super().quantized_call(inputs, training=training)

    def save_own_variables(self, store):
        super().save_own_variables(store)
        if self.input_scale is not None:
            store["input_scale"] = self.input_scale
        if self.input_range is not None:
            store["input_range"] = self.input_range

    def load_own_variables(self, store):
        # Keras's loader checks that `store` holds one entry per variable,
        # `input_scale` included, then reads its own by index.
        super().load_own_variables(store)
        if self.input_scale is not None:
            self.input_scale.assign(store["input_scale"])
        if self.input_range is not None:
            self.input_range.assign(store["input_range"])

    def _int8_call(self, inputs, training=None):
        if _fused_kernel_applies(self, inputs, training):
            return _fused_int8_dense(self, inputs)
        if self.input_range is not None and not training and not self.lora_enabled:
            return _static_int8_dense(self, inputs)
        if _torch_int8_matmul_applies(self, inputs, training):
            return _torch_int8_dense(self, inputs)
        return super()._int8_call(inputs, training=training)

    def smooth_inputs(self, factors, group=None, input_range=None):
        """Quantizes this float layer to int8 with smoothed inputs: its
        kernel rows are multiplied by `factors` (one per input channel,
        positive) before the kernel is quantized, and its inputs divided by
        them on every call before they are quantized (this module's
        docstring). The float product is unchanged. `group`: a name shared
        by layers that read the same inputs and get the same factors
        (`project_shared_input` then smooths the inputs once).
        `input_range`: None (the inputs' range is measured on every call,
        as Keras does), or the largest magnitude the smoothed inputs are
        expected to reach, which then fixes their int8 scale (module
        docstring).

        Example:
        ```python
        layer.smooth_inputs(np.sqrt(input_peaks / kernel_row_peaks))
        ```
        """
        if self.quantization_mode is not None:
            raise ValueError(f"Layer '{self.name}' is already quantized ({self.quantization_mode}).")
        if not self.built or self.lora_enabled:
            raise ValueError(f"Layer '{self.name}' must be built and without LoRA to smooth its inputs.")
        kernel = private_api.dense_kernel_variable(self)
        factors = ops.convert_to_tensor(factors, "float32")
        if tuple(factors.shape) != (kernel.shape[0],):
            raise ValueError(
                f"Layer '{self.name}' takes {kernel.shape[0]} input channels: `factors` must have shape "
                f"({kernel.shape[0]},), got {tuple(factors.shape)}."
            )
        if not bool(ops.all(ops.logical_and(factors > 0, ops.isfinite(factors)))):
            raise ValueError(f"Smoothing factors must be positive and finite (layer '{self.name}').")
        if input_range is not None and not (np.isfinite(float(input_range)) and float(input_range) > 0):
            raise ValueError(
                f"`input_range` must be a positive finite number (layer '{self.name}'), got {input_range!r}."
            )
        if input_range is not None:
            self._check_static_range_supported()  # Before the kernel changes.
        # This policy makes `_int8_build` add `input_scale`. Built before the kernel changes: it
        # refuses a float16 compute dtype, which would leave a scaled float kernel behind.
        policy = InputSmoothingInt8Policy(
            source_name=own_dtype_policy(self).name, group=group, static_inputs=input_range is not None
        )
        kernel.assign(ops.cast(ops.cast(kernel, "float32") * factors[:, None], kernel.dtype))
        self.quantize_under(policy)
        self.input_scale.assign(1.0 / factors)
        if input_range is not None:
            self.input_range.assign(float(input_range))

    def quantize_under(self, policy):
        """Quantizes this built float layer to int8 under `policy`, one of
        bertzoo's int8 policies (`InputSmoothingInt8Policy`,
        `WeightOnlyInt8Policy`), which `_int8_build` reads to add the
        layer's extra weights or drop its input quantizer. A preset records
        the policy, so the layer is rebuilt the same way.

        Example:
        ```python
        layer.quantize_under(WeightOnlyInt8Policy(source_name="float32"))
        ```
        """
        self._built_by_int8_build = False
        # Setting a quantized policy quantizes a built layer (Keras).
        self.dtype_policy = policy
        if not self._built_by_int8_build:
            raise RuntimeError(
                f"Keras {keras.__version__} quantized layer '{self.name}' without calling Dense._int8_build, so it "
                f"ignored its {type(policy).__name__}: this needs a Keras version bertzoo supports (>=3.13)."
            )

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes only layers whose type is exactly `Dense` unless
        # told otherwise; this subclass changes nothing that quantizing touches.
        super().quantize(mode, type_check=False, config=config)

    def get_config(self):
        return {**super().get_config(), "asymmetric_int8_inputs": self.asymmetric_int8_inputs}
