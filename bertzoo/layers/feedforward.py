"""Position-wise feed-forward sub-block of a post-LayerNorm BERT layer."""

import keras
from keras import ops

from bertzoo.layers.activations import get_activation
from bertzoo.layers.attention import _flatten
from bertzoo.layers.dense import Dense
from bertzoo.layers.dropout import Dropout
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_rate


@keras.saving.register_keras_serializable(package="bertzoo")
class FeedForwardBlock(keras.layers.Layer):
    """`LayerNorm(x + Dropout(W2 · act(W1 · x)))`, BERT's feed-forward block.

    Example:
    ```python
    block = FeedForwardBlock(intermediate_dim=64)
    block(keras.ops.ones((2, 3, 16))).shape
    # (2, 3, 16)
    ```
    """

    def __init__(
        self,
        intermediate_dim,
        activation="gelu_tanh",
        dropout=0.1,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.activation = activation
        self.dropout = check_rate("dropout", dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.initializer_range = float(initializer_range)
        self._activation_fn = get_activation(activation)
        # The activation goes inside the Dense layer, i.e. in its name scope:
        # only then does TensorFlow's oneDNN remapper fuse matmul + bias + GELU
        # into one kernel.
        self.intermediate_dense = Dense(
            self.intermediate_dim,
            activation=self._activation_fn,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="intermediate",
        )
        self.output_dense = None  # Needs the hidden size: created in build().
        self.dropout_layer = Dropout(self.dropout, dtype=self.dtype_policy, name="dropout")
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm"
        )

    def _initializer(self):
        # A new instance per weight (see SelfAttentionBlock._initializer).
        return keras.initializers.TruncatedNormal(stddev=self.initializer_range)

    def build(self, input_shape):
        self.output_dense = Dense(
            input_shape[-1],
            # Its inputs are activation outputs, one-sided for GELU (>= -0.17):
            # a zero point doubles the int8 resolution (see layers/dense.py).
            asymmetric_int8_inputs=True,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="output",
        )
        self.intermediate_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self.layer_norm.build(input_shape)
        self.built = True

    def call(self, x, training=None):
        # 2-D matmuls for oneDNN's matmul + bias fusion, as in SelfAttentionBlock.
        flat = _flatten(x)
        h = self.intermediate_dense(flat)
        h = self.dropout_layer(self.output_dense(h), training=training)
        return ops.reshape(self.layer_norm(flat + h), ops.shape(x))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "dropout": self.dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
            }
        )
        return config
