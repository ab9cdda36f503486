"""BERT's fine-tuning optimizer: AdamW with one fused update kernel per
variable on TensorFlow, and `bert_optimizer`, the recipe tasks compile with."""

import keras

from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.utils import private_api


@keras.saving.register_keras_serializable(package="bertzoo")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, same arguments and the same arithmetic, whose
    Adam update runs as TensorFlow's fused `ResourceApplyAdam` kernel.

    Keras's own update step is about ten element-wise ops per variable
    (moments, square root, division, assignment), each a full pass over the
    variable's memory when not compiled with XLA. For BERT-base's 110M float32
    parameters that is gigabytes of memory traffic per step on CPUs, where
    XLA is often off for speed (see `bertzoo.utils.device`). The fused kernel
    reads and writes each variable and its two moments once (the gain is in
    the README's performance notes).

    The fused path is taken on the TensorFlow backend, outside `tf.distribute`
    strategies, for float32 variables without `amsgrad`, when this Keras
    release exposes Adam's moment slots (`private_api.adam_moments`);
    everything else (JAX, torch, replicas, other dtypes) runs Keras's update
    unchanged.
    Weight decay and gradient clipping are Keras's, before the update.

    Example:
    ```python
    optimizer = AdamW(learning_rate=5e-5, weight_decay=0.01, global_clipnorm=1.0)
    model.compile(optimizer=optimizer)
    ```
    """

    def _fused_update(self, variable):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return False
        import tensorflow as tf

        if tf.distribute.has_strategy() or not isinstance(variable, tf.Variable):
            return False
        return variable.dtype == tf.float32

    def update_step(self, gradient, variable, learning_rate):
        moments = private_api.adam_moments(self, variable) if self._fused_update(variable) else None
        if moments is None:
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        m, v = moments
        # lr * sqrt(1 - b2^t) / (1 - b1^t) and eps added to sqrt(v), as in
        # Keras's Adam; the kernel does the same arithmetic in one pass.
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), local_step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), local_step),
            lr=tf.cast(learning_rate, dtype),
            beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.convert_to_tensor(tf.cast(gradient, dtype)),
            use_locking=False,
        )


def bert_optimizer(learning_rate=5e-5):
    """AdamW as BERT is fine-tuned: weight decay 0.01 (not on biases and
    LayerNorm), `WarmupLinearDecay` to `learning_rate` with 10% warm-up,
    global gradient-norm clipping at 1. `compile(optimizer="auto")` uses it.

    Example:
    ```python
    model.compile(optimizer=bert_optimizer(1e-3))
    ```
    """
    optimizer = AdamW(
        learning_rate=WarmupLinearDecay(learning_rate, warmup_fraction=0.1),
        weight_decay=0.01,
        epsilon=1e-6,
        global_clipnorm=1.0,
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer
