"""Frozen BERT features for the feature-based approach (BERT paper, section 5.3)."""

import keras
from keras import ops

from bertzoo.models.bert_backbone import BertBackbone

# How each `combine` builds one vector per token from the hidden states
# (`hidden_states[0]` is the embedding output, `[-1]` the last layer's).
COMBINE_MODES = {
    "embeddings": "the embedding output",
    "last_hidden": "the last layer's output",
    "second_to_last_hidden": "the second-to-last layer's output",
    "weighted_sum_last_four": "a learned softmax-weighted sum of the last four layers' outputs",
    "concat_last_four": "the last four layers' outputs concatenated (4 x hidden_dim wide)",
    "weighted_sum_all": "a learned softmax-weighted sum of the embedding output and every layer's output",
}


@keras.saving.register_keras_serializable(package="bertzoo")
class FeatureExtractor(keras.layers.Layer):
    """Token features from a frozen backbone, combined as in the BERT paper's
    feature-based ablation (Table 7), as a layer for your own model.

    The backbone is frozen (`backbone.trainable = False`) and always runs in
    inference mode, so its dropout is off. The weighted sums learn one scalar
    per hidden state, softmax-normalised, and a scale (as ELMo does); those
    are the layer's only trainable weights.

    Inputs: the backbone's dict (`token_ids`, `segment_ids`, `padding_mask`).
    Output: `(batch, length, width)` features, `width` = `hidden_dim`, or
    `4 * hidden_dim` for `"concat_last_four"`.

    Args:
        backbone: a `bertzoo.BertBackbone`.
        combine: one of `COMBINE_MODES` (`"embeddings"`, `"last_hidden"`,
            `"second_to_last_hidden"`, `"weighted_sum_last_four"`,
            `"concat_last_four"`, `"weighted_sum_all"`).

    Example:
    ```python
    backbone = bertzoo.BertBackbone.from_preset("mini", load_weights=False)  # 4 layers: the last four
    inputs = {name: keras.Input((None,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    features = bertzoo.FeatureExtractor(backbone, combine="concat_last_four")(inputs)
    hidden = keras.layers.Bidirectional(keras.layers.LSTM(64, return_sequences=True))(features)
    tagger = keras.Model(inputs, keras.layers.Dense(9)(hidden))  # 9 tags
    ```
    """

    def __init__(self, backbone, combine="concat_last_four", **kwargs):
        if not isinstance(backbone, BertBackbone):
            raise ValueError(
                f"`backbone` must be a bertzoo BertBackbone, got {type(backbone).__name__}. "
                "Build one with bertzoo.BertBackbone.from_preset(...)."
            )
        if combine not in COMBINE_MODES:
            raise ValueError(
                f"Unknown `combine` {combine!r}. Use one of: "
                + "; ".join(f"{name!r} ({what})" for name, what in COMBINE_MODES.items())
                + "."
            )
        needed = {"second_to_last_hidden": 2, "weighted_sum_last_four": 4, "concat_last_four": 4}.get(combine, 1)
        if backbone.num_layers < needed:
            raise ValueError(
                f"combine={combine!r} needs at least {needed} encoder layers; the backbone has "
                f"{backbone.num_layers}. Use 'last_hidden' or a deeper backbone."
            )
        super().__init__(**kwargs)
        self.backbone = backbone
        self.backbone.trainable = False
        self.combine = combine
        self.layer_weights = None
        self.scale = None

    @property
    def _mixed_states(self):
        if self.combine == "weighted_sum_last_four":
            return 4
        if self.combine == "weighted_sum_all":
            return self.backbone.num_layers + 1
        return 0

    def build(self, input_shape=None):
        if self._mixed_states:
            self.layer_weights = self.add_weight(
                shape=(self._mixed_states,), initializer="zeros", name="layer_weights", dtype="float32"
            )
            self.scale = self.add_weight(shape=(), initializer="ones", name="scale", dtype="float32")
        self.built = True

    def call(self, inputs):
        states = self.backbone.compute_features(inputs, training=False)["hidden_states"]
        if self.combine == "embeddings":
            return states[0]
        if self.combine == "last_hidden":
            return states[-1]
        if self.combine == "second_to_last_hidden":
            return states[-2]
        if self.combine == "concat_last_four":
            return ops.concatenate(states[-4:], axis=-1)
        mixed = states[-self._mixed_states :]
        weights = ops.softmax(self.layer_weights)
        total = sum(ops.cast(weights[i], mixed[i].dtype) * mixed[i] for i in range(len(mixed)))
        return ops.cast(self.scale, total.dtype) * total

    def compute_output_spec(self, inputs):
        token_ids = inputs["token_ids"]
        width = self.backbone.hidden_dim * (4 if self.combine == "concat_last_four" else 1)
        return keras.KerasTensor((token_ids.shape[0], token_ids.shape[1], width), dtype=self.backbone.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"backbone": keras.saving.serialize_keras_object(self.backbone), "combine": self.combine})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
