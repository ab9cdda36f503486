"""Base class for bertzoo backbones: config and preset handling."""

import keras

from bertzoo.models.compile_defaults import MeasuredJitCompileMixin
from bertzoo.models.early_attributes import EarlyAttributesMixin
from bertzoo.models.input_keys import DeclaredInputsMixin
from bertzoo.models.jax_predict import JaxPredictOnBatchMixin
from bertzoo.models.serving import ExportMixin
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import save_preset
from bertzoo.saving.serialization import quantized_policy_map
from bertzoo.utils.checks import check_config_keys
from bertzoo.utils.private_api import deferred_initialization
from bertzoo.utils.private_api import flatten_layers


class Backbone(
    MeasuredJitCompileMixin, ExportMixin, DeclaredInputsMixin, EarlyAttributesMixin, JaxPredictOnBatchMixin, keras.Model
):
    """A functional encoder whose constructor arguments are its config.

    Subclasses build their graph in `__init__` and list their constructor
    arguments in `get_config()`. Like the task models, a backbone decides
    `jit_compile="auto"` by measuring where it runs, uncompiled too
    (`backbone.predict(features)` takes the measured choice). A quantized
    backbone's config holds, as its `dtype`, a
    `keras.dtype_policies.DTypePolicyMap` from each quantized layer's path
    to its policy: built from that config, the layers are quantized from the
    start, so saved int8/int4 weights load directly.
    """

    source_preset = None

    def compile(self, *args, jit_compile="auto", **kwargs):
        """Keras's `compile`, with `jit_compile="auto"` decided when a step is
        first built, by measuring (see `bertzoo.explain_fast_path`)."""
        super().compile(*args, jit_compile=self._provisional_jit_compile(jit_compile, self), **kwargs)

    def get_config(self):
        layers = flatten_layers(self, include_self=False)
        dtype = quantized_policy_map(layers, self.dtype_policy) or self.dtype_policy
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(dtype),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    @classmethod
    def validate_config(cls, config):
        """Raises ValueError naming the first bad entry of `config` (the
        constructor's arguments, as `get_config` gives them), without
        building anything: the checks the constructor runs. Preset loading
        calls it before building. Subclasses add their argument checks."""
        check_config_keys(cls, config)

    @classmethod
    def from_preset(cls, preset, load_weights=True, verify_checksums=True, **kwargs):
        """Builds the backbone of a built-in preset name or a preset directory.

        `kwargs` override config entries (e.g. `dtype`, `dropout`). Precision
        is not restored: without `dtype` the backbone computes in Keras's
        global policy, whatever it was saved in. The whole
        preset is validated before anything is built; every problem raises
        `bertzoo.PresetError`. `verify_checksums=False` loads weights that
        `metadata.json` holds no checksum for (e.g. a preset without
        `metadata.json`), unverified.

        Example:
        ```python
        backbone = bertzoo.BertBackbone.from_preset("tiny", load_weights=False)
        ```
        """
        preset = Preset.resolve(preset, verify_checksums=verify_checksums)
        if load_weights:
            preset.check_weights()
        # Weights about to be loaded are not drawn at random first (seconds for BERT-base).
        with deferred_initialization(enabled=load_weights and preset.has_weights()) as deferred:
            backbone = preset.build_backbone(**kwargs)
        if load_weights:
            deferred.fill(lambda: preset.load_backbone_weights(backbone), backbone)
        backbone.source_preset = preset.name
        return backbone

    def save_to_preset(self, directory, tokenizer=None, preprocessor_config=None, metadata=None, preprocessor=None):
        """Writes this backbone (and optionally a preprocessor, or a tokenizer
        and text settings) as a preset directory.

        Example:
        ```python
        backbone.save_to_preset("runs/my_backbone", tokenizer=tokenizer)
        ```
        """
        return save_preset(
            directory,
            self,
            tokenizer=tokenizer,
            preprocessor_config=preprocessor_config,
            metadata=metadata,
            preprocessor=preprocessor,
        )
