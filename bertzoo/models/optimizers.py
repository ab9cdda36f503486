"""BERT's fine-tuning optimizer: AdamW whose whole step per variable is one
fused kernel on TensorFlow, and `bert_optimizer`, the recipe tasks compile with."""

import weakref

import keras

from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.utils import private_api
from bertzoo.utils.checks import check_non_negative_number
from bertzoo.utils.optional import tf

# Variables BERT's recipe does not decay: biases and LayerNorm's scale and offset.
NO_WEIGHT_DECAY = ("bias", "gamma", "beta")
# Adam's slot variables that are float32 for bfloat16 and float16 variables.
_FLOAT32_MOMENTS = ("momentum", "velocity", "velocity_hat")


def _global_norm(parts):
    """The square root of the sum of every tensor's squares, in float32:
    Keras's global gradient norm up to rounding. `tf.nn.l2_loss` squares and
    sums in one pass, where `reduce_sum(square(p))` first writes a squared
    copy of each gradient (BERT-base, 109M gradient values, 2-core CPU: 13
    against 23 ms)."""
    return tf.sqrt(2.0 * tf.add_n([tf.nn.l2_loss(tf.cast(p, tf.float32)) for p in parts]))


def _apply_fused_step(optimizer, grads, variables):
    """AdamW's step as one XLA kernel per variable: the global-norm clipping
    scale, the decoupled weight decay and the Adam update, in Keras's
    arithmetic. Returns False (Keras's own step runs) where it does not apply."""
    plan = optimizer._fused_step_plan(grads, variables)
    if plan is None:
        return False

    scale = tf.constant(1.0)
    if optimizer.global_clipnorm:
        # Keras's clip_by_global_norm (the norm up to rounding): min(1,
        # clipnorm / norm), NaN for a non-finite norm. Keras squares an
        # embedding's sparse gradient (IndexedSlices) slice by slice, before
        # repeated rows are summed; so does this.
        clip = optimizer.global_clipnorm
        parts = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
        norm = _global_norm(parts)
        scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
    step = tf.cast(optimizer.iterations + 1, tf.float32)
    scalars = {
        "scale": scale,
        "learning_rate": tf.cast(optimizer.learning_rate, tf.float32),
        # Keras's Adam takes 1 - beta in Python (double precision), then float32.
        "one_minus_beta_1": tf.constant(1 - optimizer.beta_1, tf.float32),
        "one_minus_beta_2": tf.constant(1 - optimizer.beta_2, tf.float32),
        "epsilon": tf.constant(optimizer.epsilon, tf.float32),
        "beta_1_power": tf.pow(tf.constant(optimizer.beta_1, tf.float32), step),
        "beta_2_power": tf.pow(tf.constant(optimizer.beta_2, tf.float32), step),
    }
    weight_decay = tf.constant(optimizer.weight_decay or 0.0, tf.float32)
    no_decay = tf.constant(0.0)
    kernel = _adamw_kernel(optimizer)
    for gradient, variable, (m, v, decays) in zip(grads, variables, plan):
        kernel(
            _tf_variable(variable),
            _tf_variable(m),
            _tf_variable(v),
            tf.convert_to_tensor(gradient),
            weight_decay if decays else no_decay,
            **scalars,
        )
    return True


def _clip_gradients(optimizer, grads):
    """Global-norm clipping where Keras's own would be wrong or fail on
    TensorFlow; None (Keras's clipping) elsewhere.

    - Under a `tf.distribute` strategy of several replicas: the gradient
      summed over the replicas is clipped, what one device computes. Keras
      clips each replica's gradient before the replicas' gradients are
      summed, so under `MirroredStrategy` `global_clipnorm=1` bounds each
      replica's share, not the step. Here the replicas' gradients are summed
      first (one extra all-reduce of the gradients, only when clipping by
      global norm under several replicas), Keras's clip factor is computed
      from the sum's norm, and every replica's gradient is multiplied by that
      one factor: Keras's own all-reduce then sums them to the clipped sum.
    - When an embedding's sparse gradient is not float32 (a model built with
      `dtype="bfloat16"`): Keras's factor is float32 and multiplying it into
      a bfloat16 `IndexedSlices` fails ("Incompatible tensor conversion
      requested to dtype float32 for IndexedSlices"). Here the norm is taken
      in float32 and the factor cast to each gradient's dtype.
    """
    if keras.backend.backend() != "tensorflow" or not (optimizer.global_clipnorm or 0) > 0:
        return None
    context = tf.distribute.get_replica_context()
    present = [g for g in grads if g is not None]
    if context is not None and context.num_replicas_in_sync > 1:
        present = context.all_reduce(tf.distribute.ReduceOp.SUM, present)
    elif not any(isinstance(g, tf.IndexedSlices) and g.dtype != tf.float32 for g in present):
        return None
    # Keras's clip_by_global_norm: an embedding's sparse gradient squared
    # slice by slice (under replicas, their slices side by side), min(1,
    # clipnorm / norm), NaN for a non-finite norm.
    parts = [g.values if isinstance(g, tf.IndexedSlices) else g for g in present]
    norm = _global_norm(parts)
    clip = optimizer.global_clipnorm
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
    # As Keras's clipping does, `gradient * scale`: a sparse gradient becomes dense.
    return [g * tf.cast(scale, g.dtype) if g is not None else None for g in grads]


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


# One kernel (a traced function) per optimizer: traced inside a model's
# training step, it keeps references to that model's variables, so it must
# not be called for another model's once those are gone
# (`tests/test_optimizers.py`).
_KERNELS = weakref.WeakKeyDictionary()


def _adamw_kernel(optimizer):
    """The XLA-compiled AdamW step of one variable, built once per optimizer."""
    if optimizer in _KERNELS:
        return _KERNELS[optimizer]

    @tf.function(jit_compile=True, autograph=False, reduce_retracing=True)
    def adamw_step(
        variable,
        m,
        v,
        gradient,
        weight_decay,
        scale,
        learning_rate,
        one_minus_beta_1,
        one_minus_beta_2,
        epsilon,
        beta_1_power,
        beta_2_power,
    ):
        # The expressions of Keras's clip_by_global_norm, AdamW weight decay
        # (before the update) and Adam.update_step, in their order.
        g = tf.cast(gradient, tf.float32) * scale
        decayed = variable - variable * weight_decay * learning_rate
        m_new = m + (g - m) * one_minus_beta_1
        v_new = v + (tf.square(g) - v) * one_minus_beta_2
        alpha = learning_rate * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m.assign(m_new)
        v.assign(v_new)
        variable.assign(decayed - (m_new * alpha) / (tf.sqrt(v_new) + epsilon))

    _KERNELS[optimizer] = adamw_step
    return adamw_step


@private_api.route_gradient_clipping(clip=_clip_gradients)
@private_api.route_gradient_application(apply_step=_apply_fused_step)
@keras.saving.register_keras_serializable(package="bertzoo")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, same arguments and the same arithmetic, whose
    step runs as one fused kernel per variable on TensorFlow.

    Keras's step is a chain of element-wise ops per variable: the clipping
    multiply, the weight decay (multiply, subtract, assign), then Adam's
    moments, square root, division and assignment, each a full pass over the
    variable's memory when the step is not compiled with XLA (on CPUs XLA is
    often off for speed, see `bertzoo.utils.device`). For BERT-base's 110M
    float32 parameters that is gigabytes of memory traffic per step. Here the
    global gradient norm is computed first (one pass per gradient), then
    each variable's whole step, clip scale, decay and Adam update, is one
    XLA kernel that reads the variable, its two moments and its gradient
    once and writes them back (the gain is in docs/performance.md,
    "Fast paths").

    The fused step is taken on the TensorFlow backend outside `tf.distribute`
    strategies, for float32 variables, without `amsgrad`, per-variable
    `clipnorm` or `clipvalue`, gradient accumulation or EMA, when this Keras
    release exposes what it needs (`private_api.route_gradient_application`,
    `adam_moments`, `weight_decay_applies`); everything else (JAX, torch,
    replicas, other dtypes and options) runs Keras's step, with two changes
    to `global_clipnorm` (`_clip_gradients`): under a `tf.distribute`
    strategy of several replicas it clips the gradient summed over the
    replicas, as on one device (Keras clips each replica's share), and it
    clips a bfloat16 embedding's sparse gradient, where Keras's clipping fails.

    Example:
    ```python
    optimizer = AdamW(learning_rate=5e-5, weight_decay=0.01, global_clipnorm=1.0)
    model.compile(optimizer=optimizer)
    ```

    Variables excluded from weight decay by name
    (`exclude_from_weight_decay(var_names=...)`, as `bert_optimizer` does for
    biases and LayerNorm) stay excluded through `get_config` /
    `from_config`, `keras.optimizers.serialize` and a saved `.keras` model:
    Keras's AdamW keeps them only in the live object, and a reloaded one
    decays every variable. They are the config's
    `exclude_from_weight_decay_names`. Exclusions by variable
    (`var_list=...`) are not saved: a variable object does not survive a
    reload.
    """

    def __init__(self, *args, exclude_from_weight_decay_names=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._excluded_var_names = []
        if exclude_from_weight_decay_names:
            self.exclude_from_weight_decay(var_names=list(exclude_from_weight_decay_names))

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Keras's `exclude_from_weight_decay` (before `build`), with
        `var_names` kept for `get_config`. Like Keras's, a call replaces the
        exclusions of earlier calls."""
        if var_names is not None and (isinstance(var_names, str) or not all(isinstance(n, str) for n in var_names)):
            raise ValueError(f"`var_names` must be a list of strings (regex patterns), got {var_names!r}.")
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        self._excluded_var_names = sorted(set(var_names or ()))

    def get_config(self):
        config = super().get_config()
        config["exclude_from_weight_decay_names"] = list(getattr(self, "_excluded_var_names", []))
        return config

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        """Keras's, but Adam's moments of a bfloat16 or float16 variable are
        float32: in float16 the second moment of a gradient below about 1e-2
        (`(1 - beta_2) * g**2` under float16's smallest value, 6e-8)
        underflows to zero and the step is far too large (31x in a
        measured case); bfloat16's 8 bits of precision round small moment
        updates away. The gradient accumulators and EMA keep the variable's dtype."""
        low_precision = keras.backend.standardize_dtype(reference_variable.dtype) in ("bfloat16", "float16")
        if name not in _FLOAT32_MOMENTS or not low_precision:
            return super().add_variable_from_reference(reference_variable, name=name, initializer=initializer)
        # Keras's naming (`{variable path}_{name}`), with a float32 dtype.
        if hasattr(reference_variable, "path"):
            prefix = reference_variable.path.replace("/", "_")
        else:
            prefix = str(reference_variable.name).replace("/", "_").replace(":", "_")
        return self.add_variable(
            shape=reference_variable.shape,
            initializer=initializer,
            dtype="float32",
            name=f"{prefix}_{name}",
            layout=getattr(reference_variable, "_layout", None),
        )

    def update_step(self, gradient, variable, learning_rate):
        """Keras's Adam step; for bfloat16 or float16 weights, its arithmetic
        in float32 (and their moments float32: `add_variable_from_reference`).
        Keras casts the betas to the variable's dtype, and
        `beta_2=0.999` is 1.0 in bfloat16: `1 - beta_2 ** t` is then 0 and
        every step of a `dtype="bfloat16"` model is zero (keras-hub issue
        2629). Here the moments are updated and the step computed from the
        float32 values and stored back in the variables' dtype."""
        if keras.backend.standardize_dtype(variable.dtype) not in ("bfloat16", "float16"):
            return super().update_step(gradient, variable, learning_rate)
        ops = keras.ops
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        step = ops.cast(self.iterations + 1, "float32")
        # A sparse gradient (an embedding's, unclipped) is summed into a dense one here.
        gradient = ops.cast(ops.convert_to_tensor(gradient), "float32")
        m_old, v_old = ops.cast(m, "float32"), ops.cast(v, "float32")
        m_new = m_old + (gradient - m_old) * (1 - self.beta_1)
        v_new = v_old + (ops.square(gradient) - v_old) * (1 - self.beta_2)
        self.assign(m, ops.cast(m_new, m.dtype))
        self.assign(v, ops.cast(v_new, v.dtype))
        if self.amsgrad:
            v_hat = self._velocity_hats[index]
            v_new = ops.maximum(ops.cast(v_hat, "float32"), v_new)
            self.assign(v_hat, ops.cast(v_new, v_hat.dtype))
        alpha = (
            ops.cast(learning_rate, "float32")
            * ops.sqrt(1 - ops.power(ops.cast(self.beta_2, "float32"), step))
            / (1 - ops.power(ops.cast(self.beta_1, "float32"), step))
        )
        updated = ops.cast(variable, "float32") - m_new * alpha / (ops.sqrt(v_new) + self.epsilon)
        self.assign(variable, ops.cast(updated, variable.dtype))

    def _fused_step_plan(self, grads, variables):
        """Per variable `(m, v, decays)` for the fused step, or None where
        it does not apply (Keras's own step runs)."""
        if keras.backend.backend() != "tensorflow" or self.amsgrad or self.clipnorm or self.clipvalue:
            return None
        if self.gradient_accumulation_steps or self.use_ema:
            return None
        if not all(isinstance(x, (int, float)) for x in (self.beta_1, self.beta_2, self.epsilon)):
            return None

        if tf.distribute.has_strategy():
            return None
        if not self.global_clipnorm and any(isinstance(g, tf.IndexedSlices) for g in grads):
            # Keras updates Adam's moments from a sparse gradient slice by
            # slice (repeated rows differ from the summed dense gradient);
            # clipping would have made it dense.
            return None
        plan = []
        for variable in variables:
            stored = _tf_variable(variable)
            if not isinstance(stored, tf.Variable) or stored.dtype != tf.float32:
                return None
            moments = private_api.adam_moments(self, variable)
            decays = bool(self.weight_decay) and private_api.weight_decay_applies(self, variable)
            if moments is None or decays is None:
                return None
            plan.append((*moments, decays))
        return plan


def bert_optimizer(learning_rate=5e-5):
    """AdamW as BERT is fine-tuned: weight decay 0.01 (not on biases and
    LayerNorm), `WarmupLinearDecay` to `learning_rate` with 10% warm-up,
    global gradient-norm clipping at 1. `compile(optimizer="auto")` uses it.

    Example:
    ```python
    model.compile(optimizer=bert_optimizer(1e-3))
    ```
    """
    check_non_negative_number("learning_rate", learning_rate)  # A negative one would climb the loss; 0 trains nothing.
    optimizer = AdamW(
        learning_rate=WarmupLinearDecay(learning_rate, warmup_fraction=0.1),
        weight_decay=0.01,
        epsilon=1e-6,
        global_clipnorm=1.0,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_WEIGHT_DECAY))
    return optimizer
