"""Post-training weight quantization of bertzoo models, via Keras's own
`Model.quantize`.

A quantized model's layers hold int8 (or packed int4) kernels plus scales, so
its weights only load into a model quantized the same way. Its config says
which: the backbone's and the task's `dtype` become a
`keras.dtype_policies.DTypePolicyMap` (layer path -> quantized policy), and a
model built from that config (`from_preset`, `from_config`) has those layers
quantized before its weights load (see `bertzoo.saving.serialization`).
"""

import warnings

import keras

from bertzoo.compression.model_copy import copy_model
from bertzoo.compression.model_copy import pruning_state
from bertzoo.utils import private_api
from bertzoo.utils import quantization_mode

MODES = ("int8", "int4")


def _quantize_in_place(model, mode, select):
    # Keras runs a full `gc.collect()` for every float kernel a layer drops
    # while quantizing (see `private_api.one_garbage_collection`): collect once.
    with warnings.catch_warnings(), private_api.one_garbage_collection():
        # Keras warns once per layer type that has no `quantize` (Dropout,
        # LayerNormalization, ...): expected here, and noise to users.
        warnings.filterwarnings("ignore", message=r".*does not have a `quantize` method.*")
        model.quantize(mode, filters=select)


def quantize(model, mode="int8", include_embeddings=True):
    """Returns a copy of `model` with its weights quantized to `mode`.

    Post-training quantization with `keras.Model.quantize`: Dense kernels
    (and, with `include_embeddings`, embedding tables) are stored as int8
    with per-channel scales (`"int4"`: packed 4-bit); Dense layers quantize
    their inputs on the fly and multiply in integers (on TensorFlow's x86
    CPU build, int8 layers run as one fused oneDNN kernel: see
    `bertzoo.layers.dense`). Biases, LayerNorms and the position table stay
    float. The original model is left unchanged.

    The result saves to a preset (`save_to_preset`) and loads back with
    `from_preset`, and exports like any model.

    Example:
    ```python
    q = bertzoo.quantize(model, "int8")
    q.save_to_preset("runs/sentiment-int8")
    again = bertzoo.BertClassifier.from_preset("runs/sentiment-int8")
    ```
    """
    if mode not in MODES:
        raise ValueError(
            f"Unknown quantization mode {mode!r}. bertzoo.quantize supports {list(MODES)} "
            "(post-training, no calibration data needed)."
        )
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"`quantize` needs a built Keras model, got {model!r}.")
    if quantization_mode(model):
        raise ValueError(
            f"{type(model).__name__} '{model.name}' is already quantized "
            f"({quantization_mode(model)}): quantize the float model instead."
        )
    if pruning_state(model) is not None:
        raise ValueError(
            f"{type(model).__name__} '{model.name}' has a Pruner attached: quantize `pruner.strip()` instead."
        )
    clone = copy_model(model)

    def select(layer):
        # Only the network's weight layers: a task's preprocessor holds
        # (unbuilt) text layers that `Model.quantize` would otherwise visit.
        if not layer.built or layer.path in preprocessor_paths:
            return False
        if isinstance(layer, keras.layers.Embedding):
            return include_embeddings
        return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))

    preprocessor = getattr(clone, "preprocessor", None)
    preprocessor_paths = set()
    if preprocessor is not None:
        preprocessor_paths = {layer.path for layer in private_api.flatten_layers(preprocessor, include_self=True)}

    _quantize_in_place(clone, mode, select)
    return clone
