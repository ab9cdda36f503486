"""Weight quantization of bertzoo models, via Keras's own `Model.quantize`:
post-training (`quantize`) or after quantization-aware training
(`quantization_aware_training`).

A quantized model's layers hold int8 (or packed int4) kernels plus scales, so
its weights only load into a model quantized the same way. Its config says
which: the backbone's and the task's `dtype` become a
`keras.dtype_policies.DTypePolicyMap` (layer path -> quantized policy), and a
model built from that config (`from_preset`, `from_config`) has those layers
quantized before its weights load (see `bertzoo.saving.serialization`).
"""

import math
import warnings

import keras
import numpy as np
from keras import ops

from bertzoo.compression.calibration import calibration_batches
from bertzoo.compression.distiller import PREDICTIONS_ONLY
from bertzoo.compression.distiller import Distiller
from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.model_copy import pruning_state
from bertzoo.compression.pruner import Pruner
from bertzoo.layers.attention import SelfAttentionBlock
from bertzoo.layers.dense import Dense
from bertzoo.layers.dense import WeightOnlyInt8Policy
from bertzoo.layers.dense import observe_inputs
from bertzoo.models.task import bert_optimizer
from bertzoo.utils import private_api
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import check_bool
from bertzoo.utils.layers import own_dtype_policy

MODES = ("int8", "int4")
# SmoothQuant's migration strength: the best agreement with the float model
# of 0.5, 0.65, 0.8 and 0.9 on each of the three shared sentiment files (README).
DEFAULT_SMOOTHING = 0.8


def _quantize_in_place(model, mode, select):
    # Keras runs a full `gc.collect()` for every float kernel a layer drops
    # while quantizing (see `private_api.one_garbage_collection`): collect once.
    with warnings.catch_warnings(), private_api.one_garbage_collection():
        # Keras warns once per layer type that has no `quantize` (Dropout,
        # LayerNormalization, ...): expected here, and noise to users.
        warnings.filterwarnings("ignore", message=r".*does not have a `quantize` method.*")
        model.quantize(mode, filters=select)


INPUT_RANGES = ("dynamic", "static")


def quantize(
    model,
    mode="int8",
    include_embeddings=True,
    calibration=None,
    smoothing=DEFAULT_SMOOTHING,
    calibration_steps=16,
    input_ranges="dynamic",
    weight_only=False,
):
    """Returns a copy of `model` with its weights quantized to `mode`.

    Post-training quantization with `keras.Model.quantize`: Dense kernels
    (and, with `include_embeddings`, embedding tables) are stored as int8
    with per-channel scales (`"int4"`: packed 4-bit in blocks). int8 Dense
    layers quantize their inputs on the fly and multiply in integers (on
    TensorFlow's x86 CPU build, int8 layers run as one fused oneDNN kernel:
    see `bertzoo.layers.dense`); int4 layers keep their inputs float (Keras
    quantizes int4 weights only). Biases, LayerNorms and the position table
    stay float. The original model is left unchanged.

    With `weight_only=True` int8 Dense layers keep their inputs in the
    compute dtype too and multiply them by the dequantized kernel: the same
    4x smaller kernels with float arithmetic (in float32, closer to the
    float model than dynamic int8). Where integer matmuls are slow (GPUs:
    on an H100 a BERT-base built in `"bfloat16"` and quantized this way ran
    at about 0.88x the bfloat16 model's speed and 1.5x the dynamic int8
    one at batch 32, docs/performance.md's eighth GPU session; on an H200
    at batch 1 it was slower than the float32 model, the ninth); on CPUs it
    is slower than the float model (every call dequantizes the kernels), a
    size option only.

    With `calibration` (int8 only), the inputs of every bertzoo `Dense`
    layer are first smoothed as in SmoothQuant (Xiao et al. 2023): the
    largest magnitude of each input channel over the calibration batches,
    `x_j`, and of each kernel row, `w_j`, give the factor
    `s_j = x_j ** smoothing / w_j ** (1 - smoothing)`; the kernel row is
    multiplied by it and the input channel divided by it on every call
    (`Dense.smooth_inputs`). The product is unchanged, but the few BERT
    channels far larger than the rest no longer set the scale of the whole
    input, which the fused kernel quantizes with one scale per tensor.

    With `input_ranges="static"` (needs `calibration`), each Dense layer also
    keeps the largest smoothed input magnitude seen while calibrating and
    quantizes its inputs with that fixed range (one scale per tensor, values
    beyond it clipped) instead of measuring them on every call: less work
    per call, at the risk of clipping inputs larger than any the calibration
    texts produced (`bertzoo.layers.dense`). The README's compression table
    (`int8st`) has its measured speed and accuracy.

    Args:
        model: a built bertzoo model (a task or a backbone), not quantized.
        mode: `"int8"` or `"int4"`.
        include_embeddings: also quantize embedding tables (per row).
        calibration: None, or inputs the model sees in use: raw strings for
            a task with a preprocessor, a tokenized dict of arrays, or a
            `tf.data.Dataset` of input batches (a dataset's labels, if it
            yields any, are ignored; a path or an `(inputs, labels)` tuple is
            refused).
        smoothing: SmoothQuant's migration strength in [0, 1]: how much of
            the inputs' range moves into the kernel (0.5: evenly; 0.8 kept
            fine-tuned MiniLMs closest to their float predictions).
        calibration_steps: batches of 32 to calibrate on (None: all).
        input_ranges: `"dynamic"` (each call measures its inputs' range, as
            Keras does) or `"static"` (the calibrated range, fixed).
        weight_only: quantize the kernels and not the inputs (above); no
            `calibration` or static `input_ranges` then, since no input is
            quantized. Keras's int4 layers are weight-only either way.

    The result saves to a preset (`save_to_preset`) and loads back with
    `from_preset`, and exports like any model.

    Example:
    ```python
    q = bertzoo.quantize(model, "int8", calibration=train_texts[:512])
    fixed = bertzoo.quantize(model, "int8", calibration=train_texts[:512], input_ranges="static")
    small = bertzoo.quantize(model, "int8", weight_only=True)  # int8 storage, float arithmetic
    q.save_to_preset("runs/sentiment-int8")
    again = bertzoo.BertClassifier.from_preset("runs/sentiment-int8")
    ```
    """
    _check_quantizable(model, mode, MODES)
    smoothing = check_smoothing(smoothing)
    check_input_ranges(input_ranges)
    weight_only = check_weight_only(weight_only)
    calibration_steps = _check_calibration_steps(calibration_steps)
    if calibration is None and not math.isclose(smoothing, DEFAULT_SMOOTHING, rel_tol=1e-6):  # float32 too.
        if weight_only or mode != "int8":
            fix = f"this {'weight-only int8' if weight_only else mode} quantization has no inputs to smooth: drop it"
        else:
            fix = "pass calibration=texts the model will see, or drop it"
        raise ValueError(
            f"smoothing={smoothing} scales each layer's int8 inputs by what calibration texts show, and no "
            f"`calibration` was given; {fix}."
        )
    if weight_only and (calibration is not None or input_ranges != "dynamic"):
        raise ValueError(
            "weight_only=True quantizes no inputs, so input calibration and ranges do not apply: drop `calibration` "
            f"and `input_ranges` (got input_ranges={input_ranges!r}), or pass weight_only=False to quantize the "
            "inputs with them."
        )
    if input_ranges == "static" and calibration is None:
        raise ValueError(
            'input_ranges="static" fixes each layer\'s input range from calibration data: pass `calibration` '
            '(texts the model will see), or use the default input_ranges="dynamic".'
        )
    if calibration is not None:
        _check_calibration(mode, calibration_steps)
    include_embeddings = check_bool("include_embeddings", include_embeddings)
    clone = copy_model(model)
    select = _weight_layers(clone, include_embeddings)
    one_by_one = calibration is not None or (weight_only and mode == "int8")
    if calibration is not None:
        _smooth_inputs(clone, calibration, smoothing, calibration_steps, select, static=input_ranges == "static")
    elif one_by_one:
        _quantize_weights_only(clone, select)
    if one_by_one:
        select = _not_yet_quantized(select)  # Embeddings, which quantize no inputs anyway.
    _quantize_in_place(clone, mode, select)
    if one_by_one:
        private_api.retrack_variables(clone)  # Those layers were quantized one by one.
    return clone


def check_weight_only(weight_only):
    """`weight_only` as a bool; raises ValueError unless it is one (NumPy's
    included).

    Example:
    ```python
    check_weight_only(np.bool_(True))  # True
    ```
    """
    return check_bool("weight_only", weight_only)


def _quantize_weights_only(model, select):
    """Quantizes each selected Dense layer of `model` to int8 under a
    `WeightOnlyInt8Policy` (the policy is what presets record)."""
    layers = [
        layer
        for layer in private_api.flatten_layers(model)
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)) and select(layer)
    ]
    foreign = [layer.path for layer in layers if not isinstance(layer, Dense)]
    if foreign:
        raise ValueError(
            f"weight_only=True needs bertzoo's Dense layers (bertzoo.layers.Dense), whose dtype policy records the "
            f"choice in presets; these are Keras layers: {foreign}. Build them as bertzoo.layers.Dense, or quantize "
            "without weight_only."
        )
    # Each layer drops its float kernel: one garbage collection for all (see `_quantize_in_place`).
    with private_api.one_garbage_collection():
        for layer in layers:
            layer.quantize_under(WeightOnlyInt8Policy(source_name=own_dtype_policy(layer).name))


def check_smoothing(smoothing, allow_none=False):
    """`smoothing` as a Python number; raises ValueError unless it is a migration
    strength in [0, 1] (NumPy numbers included; with `allow_none`, None
    passes).

    Example:
    ```python
    check_smoothing(np.float32(0.5))  # 0.5
    ```
    """
    if smoothing is None and allow_none:
        return None
    number = (int, float, np.integer, np.floating)
    if isinstance(smoothing, (bool, np.bool_)) or not isinstance(smoothing, number) or not 0 <= smoothing <= 1:
        also = " or None" if allow_none else ""
        raise ValueError(f"`smoothing` must be a number in [0, 1] (SmoothQuant's alpha){also}, got {smoothing!r}.")
    if isinstance(smoothing, np.floating):
        return float(str(smoothing))  # The decimal written: np.float32(0.3) -> 0.3, not 0.30000001192092896.
    return smoothing.item() if isinstance(smoothing, np.integer) else smoothing


def check_input_ranges(input_ranges):
    """Raises ValueError unless `input_ranges` is one of `INPUT_RANGES`.

    Example:
    ```python
    check_input_ranges("static")
    ```
    """
    if input_ranges not in INPUT_RANGES:
        raise ValueError(f"`input_ranges` must be one of {list(INPUT_RANGES)}, got {input_ranges!r}.")


def _check_calibration(mode, calibration_steps):
    if mode != "int8":
        raise ValueError(
            f"Calibration (input smoothing) applies to int8, got mode={mode!r}: quantize to int4 without `calibration`."
        )


def _check_calibration_steps(calibration_steps):
    """`calibration_steps` as an int (NumPy's included) or None; checked with or without calibration."""
    if calibration_steps is None:
        return None
    if (
        isinstance(calibration_steps, (bool, np.bool_))
        or not isinstance(calibration_steps, (int, np.integer))
        or calibration_steps < 1
    ):
        raise ValueError(f"`calibration_steps` must be an int >= 1 or None (all batches), got {calibration_steps!r}.")
    return int(calibration_steps)


def _not_yet_quantized(select):
    return lambda layer: select(layer) and not layer.quantization_mode


def input_peaks(model, data, layers, steps=None):
    """`{layer: largest |input| per input channel}` of each of `layers`
    (bertzoo `Dense`) over `model`'s eager forward passes on the calibration
    batches of `data` (see `calibration_batches`), over real tokens only
    where a layer reads one vector per token (padding positions are masked
    out of everything the model computes); layers that did not run are
    left out.

    Example:
    ```python
    peaks = input_peaks(classifier, texts, [classifier.output_dense])
    ```
    """
    wanted = {id(layer) for layer in layers}
    found = {}
    real_rows = None  # Of the current batch: `(sequences, length)` True at real (unpadded) tokens.

    def observe(layer, inputs):
        if id(layer) in wanted:
            values = np.abs(ops.convert_to_numpy(ops.cast(inputs, "float32")))
            # Per-token inputs, `(sequences, length, width)` or flattened to
            # `(sequences * length, width)` as the encoder's layers get them:
            # real tokens only (padding rows would set ranges the model never needs).
            if real_rows is not None and values.ndim == 3 and values.shape[:2] == real_rows.shape:
                values = values[real_rows]
            elif real_rows is not None and values.ndim == 2 and real_rows.shape[1] > 1:
                if values.shape[0] == real_rows.size:
                    values = values[real_rows.reshape(-1)]
            flat = values.reshape(-1, values.shape[-1])
            if not len(flat):
                return
            peak = flat.max(axis=0)
            found[id(layer)] = peak if id(layer) not in found else np.maximum(found[id(layer)], peak)

    batches = 0
    with observe_inputs(observe):
        for batch in calibration_batches(model, data, steps, labelled=False):
            features = batch[0] if isinstance(batch, tuple) else batch
            mask = features.get("padding_mask") if isinstance(features, dict) else None
            if mask is not None:
                mask = np.asarray(ops.convert_to_numpy(mask)).astype(bool)
                real_rows = mask.reshape(-1, mask.shape[-1])  # One row per sequence (per choice, too).
            else:
                real_rows = None
            model(features, training=False)
            batches += 1
    if batches == 0:
        raise ValueError("The calibration data yielded no batches: pass some of the inputs the model will see.")
    return {layer: found[id(layer)] for layer in layers if id(layer) in found}


def smoothing_factors(input_peak, kernel_row_peak, smoothing):
    """SmoothQuant's per-channel factors `x ** smoothing / w ** (1 -
    smoothing)`; 1 where a channel is zero on either side (nothing to
    balance).

    Example:
    ```python
    smoothing_factors([4.0, 1.0], [1.0, 4.0], 0.5)  # [2.0, 0.5]
    ```
    """
    input_peak = np.asarray(input_peak, "float64")
    kernel_row_peak = np.asarray(kernel_row_peak, "float64")
    live = (input_peak > 0) & (kernel_row_peak > 0)
    factors = np.ones_like(input_peak)
    factors[live] = input_peak[live] ** smoothing / kernel_row_peak[live] ** (1 - smoothing)
    return np.clip(factors, 1e-5, 1e5).astype("float32")


def _smooth_inputs(model, data, smoothing, steps, select, static=False):
    layers = [
        layer
        for layer in private_api.flatten_layers(model)
        if isinstance(layer, Dense) and select(layer) and not layer.lora_enabled
    ]
    peaks = input_peaks(model, data, layers, steps)
    # An attention block's query, key and value read the same inputs: one
    # set of factors for the three (from their kernels' joint row peaks)
    # lets them smooth the inputs once.
    groups, grouped = [], set()
    for block in private_api.flatten_layers(model):
        if isinstance(block, SelfAttentionBlock):
            members = [block.query_dense, block.key_dense, block.value_dense]
            if all(member in peaks for member in members):
                groups.append((members, block.path))
                grouped.update(id(member) for member in members)
    groups += [([layer], None) for layer in peaks if id(layer) not in grouped]
    # Each layer quantizes as it is smoothed: one garbage collection for all (see `_quantize_in_place`).
    with private_api.one_garbage_collection():
        for members, group in groups:
            _smooth_group(members, group, peaks, smoothing, static)


def _smooth_group(members, group, peaks, smoothing, static):
    input_peak = np.max([peaks[member] for member in members], axis=0)
    kernel_row_peak = np.max(
        [np.max(np.abs(ops.convert_to_numpy(private_api.dense_kernel_variable(m))), axis=1) for m in members],
        axis=0,
    )
    factors = smoothing_factors(input_peak, kernel_row_peak, smoothing)
    input_range = static_input_range(input_peak, factors) if static else None
    for member in members:
        member.smooth_inputs(factors, group=group, input_range=input_range)


def static_input_range(input_peak, factors):
    """The largest magnitude of the smoothed inputs (`inputs / factors`)
    given each input channel's peak: a layer's fixed int8 range under
    `input_ranges="static"`; 1 when the inputs were all zero (any range
    then quantizes them exactly).

    Example:
    ```python
    static_input_range([4.0, 1.0], [2.0, 0.5])  # 2.0
    ```
    """
    largest = float(np.max(np.asarray(input_peak, "float64") / np.asarray(factors, "float64")))
    if not np.isfinite(largest):
        raise ValueError(
            f"The calibration inputs reached {largest} in a Dense layer's inputs: a static input range needs "
            "finite activations (check the model's weights and the calibration data)."
        )
    return largest if largest > 0 else 1.0


def _check_quantizable(model, mode, modes):
    if mode not in modes:
        raise ValueError(
            f"Unknown quantization mode {mode!r}. bertzoo.quantize supports {list(MODES)} "
            "(post-training; `calibration` texts add input smoothing to int8); quantization_aware_training supports "
            f"{list(QAT_MODES)}."
        )
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"Quantizing needs a built Keras model, got {model!r}.")
    if quantization_mode(model):
        raise ValueError(
            f"{type(model).__name__} '{model.name}' is already quantized "
            f"({quantization_mode(model)}): quantize the float model instead."
        )
    if pruning_state(model) is not None:
        raise ValueError(
            f"{type(model).__name__} '{model.name}' has a Pruner attached: quantize `pruner.strip()` instead."
        )
    if mode == "int8":
        # Keras refuses int8 under float16 only when a layer is quantized: after calibration or a
        # whole quantization-aware fit. Say so first, and name the policies that work.
        weight_layers = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Embedding)
        float16 = [
            layer.path
            for layer in private_api.flatten_layers(model)
            if isinstance(layer, weight_layers) and layer.dtype_policy.compute_dtype == "float16"
        ]
        if float16:
            raise ValueError(
                f"int8 quantization does not work with float16 compute (Keras refuses it), and "
                f"{type(model).__name__} '{model.name}' computes {float16[0]} in float16. Rebuild it in float32 "
                "or bfloat16 first, e.g. from_preset(preset_dir, dtype='mixed_bfloat16')"
                + (", or quantize to int4." if "int4" in modes else ".")
            )


def _weight_layers(model, include_embeddings):
    """A `Model.quantize` filter: the network's built Dense and (with
    `include_embeddings`) Embedding layers. (A task's `quantize` leaves its
    preprocessor's text layers out itself.)"""

    def select(layer):
        if not layer.built:
            return False
        if isinstance(layer, keras.layers.Embedding):
            return include_embeddings
        return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))

    return select


QAT_MODES = ("int8",)


def quantization_aware_training(
    model,
    x,
    y=None,
    *,
    mode="int8",
    epochs=1,
    batch_size=32,
    learning_rate=2e-5,
    distill=True,
    alpha=0.0,
    include_embeddings=True,
    validation_data=None,
    verbose="auto",
):
    """Fine-tunes a copy of `model` with int8 rounding simulated, then
    quantizes it: a `quantize(model, "int8")` that first learns to live with
    the rounding, for when post-training int8 loses too much accuracy.

    While it trains, every Dense layer rounds its inputs and kernel to the
    int8 grids inference will use (`bertzoo.layers.dense`: one input scale
    per tensor, one kernel scale per output channel), passing gradients
    straight through the rounding. With `distill` (the default) the copy
    learns to reproduce `model`'s own predictions (soft targets at
    temperature 2, `Distiller`; `alpha` > 0 mixes in the labels' loss with
    that weight), so it stays close to the float model rather than drifting
    with extra epochs on the labels; `distill=False` fine-tunes on the labels
    alone with the task's loss. `x`/`y`/`validation_data` are what the task's
    `fit` takes (raw texts and labels, tokenized features, or a dataset).
    The optimizer is `bert_optimizer(learning_rate)` over `epochs`.

    Returns the quantized copy; `model` is left unchanged. Embedding tables
    (`include_embeddings`) are quantized at the end but not simulated while
    training: they are rounded per row, weights only, which costs little.

    Example:
    ```python
    q = bertzoo.quantization_aware_training(model, train_texts, train_labels, epochs=1)
    q.evaluate(test_texts, test_labels)
    ```
    """
    _check_quantizable(model, mode, QAT_MODES)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"`epochs` must be an int >= 1, got {epochs!r}.")
    student = copy_model(model)
    network_layer = _weight_layers(student, include_embeddings=False)
    simulated = [
        layer for layer in private_api.flatten_layers(student) if isinstance(layer, Dense) and network_layer(layer)
    ]
    # A pruned (stripped) model keeps its zeros: fixed masks, or training would
    # regrow them (exact zeros in a trained float kernel mean pruning).
    pruner = Pruner.holding_zeros(student)
    for layer in simulated:
        layer.simulate_int8 = True
    try:
        trainer = student
        if distill:
            try:
                trainer = Distiller(model, student, alpha=alpha if y is not None else 0.0, **PREDICTIONS_ONLY)
            except ValueError as e:
                if "soft-target loss" not in str(e):
                    raise
                what = str(e).split(", and the soft-target loss")[0].replace("The teacher's head", "the model's head")
                raise ValueError(
                    f"Quantization-aware training distills the model's own predictions (distill=True, the default), "
                    f"which takes logits of two or more classes, but {what}: pass distill=False to train on the "
                    "labels alone."
                ) from None
        trainer.compile(optimizer=bert_optimizer(learning_rate))
        if pruner is not None:
            pruner.prepare_trainer(trainer)
        trainer.fit(x, y, batch_size=batch_size, epochs=epochs, validation_data=validation_data, verbose=verbose)
    finally:
        for layer in simulated:
            layer.simulate_int8 = False
    if pruner is not None:
        student = pruner.strip()
    _quantize_in_place(student, mode, _weight_layers(student, include_embeddings))
    return student
