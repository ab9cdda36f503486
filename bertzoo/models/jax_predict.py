"""`predict_on_batch` without Keras's per-call state round trip, on JAX.

On the JAX backend Keras's `predict_on_batch` passes every variable into
its jitted step with the buffers donated, gets them all back, and assigns
each one to its variable again (`jax_state_sync`): for BERT-base about 200
Python-level assignments per call, whatever the batch. On a GPU that
bookkeeping costs more than the forward pass itself at small batches
(`python -m benchmarks.call_overhead` on an H100, BERT-base bfloat16, batch
32 x 128: 13.9 ms per `predict_on_batch` against 5.9 ms for the compiled
forward pass alone).

bertzoo's models run `predict_on_batch` there as one cached `jax.jit` of
`stateless_call(..., training=False)` that reads the variables' current
values and returns the outputs only: the same numbers as Keras's step, the
variables left as they are. The host work per call is one walk of the
layers (`model.variables`, in an order that does not change when a layer
is frozen) and one read of each variable's array; the split into trainable
and non-trainable values that `stateless_call` wants is made once, when
the forward pass is traced. Keras's own path still runs whenever this one
might differ: another backend, `run_eagerly`, `jit_compile=False`, a
distribution (sharded state), a layer not built yet, a subclass with its
own `predict_step`, or a model whose inference updates a variable (found
when the forward is traced). Inside a `keras.StatelessScope` it reads the
scope's values, as Keras's step does (whose write-back there would leave
the variables holding the buffers it donated).
"""

import keras
import numpy as np

from bertzoo.utils import private_api


def _applies(model):
    if model.run_eagerly or not model.jit_compile or getattr(model, "_jitted_forward", None) is False:
        return False
    if keras.distribution.distribution() is not None:
        return False
    if type(model).predict_step is not keras.Model.predict_step:
        return False
    # The layers the forward pass runs (a task's preprocessor is not one of them).
    return model.built and all(layer.built for layer in model.layers)


class _UpdatesVariables(Exception):
    """Raised while tracing a forward pass that assigns a variable."""


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

        variables = self.variables
        if private_api.jax_variables_held_by_trainer(variables):
            self.jax_state_sync()  # A callback predicting during `fit`.
        forward = getattr(self, "_jitted_forward", None)
        if forward is None:

            def stateless_forward(values, inputs):
                # Runs when traced: the values come in `self.variables`' order.
                position = {id(v): i for i, v in enumerate(self.variables)}
                trainable = [values[position[id(v)]] for v in self.trainable_variables]
                non_trainable = [values[position[id(v)]] for v in self.non_trainable_variables]
                outputs, updated = self.stateless_call(trainable, non_trainable, inputs, training=False)
                if any(new is not old for new, old in zip(updated, non_trainable)):
                    raise _UpdatesVariables()
                return outputs

            forward = self._jitted_forward = jax.jit(stateless_forward)
        values = private_api.jax_variable_values(variables)
        if any(value is None for value in values):
            # Values another model's trainer holds (this model inside a
            # distiller that is fitting): read as Keras's own step reads them.
            return super().predict_on_batch(x)
        try:
            outputs = forward(values, x)
        except _UpdatesVariables:
            self._jitted_forward = False  # Keras's path from now on: it assigns the updates.
            return super().predict_on_batch(x)
        # Writable copies, as Keras returns (`np.asarray` would give read-only views).
        return keras.tree.map_structure(np.array, outputs)
