"""`predict_on_batch` without Keras's per-call state round trip, on JAX.

On the JAX backend Keras's `predict_on_batch` passes every variable into
its jitted step with the buffers donated, gets them all back, and assigns
each one to its variable again (`jax_state_sync`): for BERT-base about 200
Python-level assignments per call, whatever the batch. On a GPU that
bookkeeping costs more than the forward pass itself at small batches
(`python -m benchmarks.call_overhead` on an H100, BERT-base bfloat16, batch
32 x 128: 13.9 ms per `predict_on_batch` against 5.9 ms for the compiled
forward pass alone).

Inference changes no variable (no dropout, no statistics), so bertzoo's
models run `predict_on_batch` there as one cached `jax.jit` of
`stateless_call(..., training=False)` that reads the variables' current
values and returns the outputs only: the same numbers as Keras's step, the
variables left as they are. Keras's own path still runs whenever this one
might differ: another backend, `run_eagerly`, `jit_compile=False`, a
distribution (sharded state), or a layer not built yet.
"""

import keras
import numpy as np


def _applies(model):
    if model.run_eagerly or not model.jit_compile:
        return False
    if keras.distribution.distribution() is not None:
        return False
    # The layers the forward pass runs (a task's preprocessor is not one of them).
    return model.built and all(layer.built for layer in model.layers)


class JaxPredictOnBatchMixin:
    """Mix in before the Keras model class: `predict_on_batch` as above.

    Example:
    ```python
    backbone = bertzoo.BertBackbone.from_preset("tiny")
    backbone.compile(jit_compile=True)
    outputs = backbone.predict_on_batch(features)  # NumPy, as Keras returns
    ```
    """

    def make_predict_function(self, force=False):
        if force or getattr(self, "predict_function", None) is None:
            # A new Keras predict function (after `compile`) means a new forward too.
            self._jitted_forward = None
        return super().make_predict_function(force)

    def predict_on_batch(self, x):
        if keras.backend.backend() != "jax":
            return super().predict_on_batch(x)
        self.make_predict_function()  # Resolves "auto" compile choices first.
        if not _applies(self):
            return super().predict_on_batch(x)
        import jax

        # Variables purged during `fit` (a callback predicting) come back first.
        self.jax_state_sync()
        forward = getattr(self, "_jitted_forward", None)
        if forward is None:

            def stateless_forward(trainable, non_trainable, inputs):
                return self.stateless_call(trainable, non_trainable, inputs, training=False)[0]

            forward = self._jitted_forward = jax.jit(stateless_forward)
        outputs = forward(
            [v.value for v in self.trainable_variables], [v.value for v in self.non_trainable_variables], x
        )
        return keras.tree.map_structure(np.asarray, outputs)
