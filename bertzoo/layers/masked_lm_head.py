"""BERT's masked-language-model output head."""

import keras
from keras import ops

from bertzoo.layers.activations import get_activation
from bertzoo.layers.dense import Dense
from bertzoo.utils.checks import check_positive_int


@keras.saving.register_keras_serializable(package="bertzoo")
class MaskedLMHead(keras.layers.Layer):
    """Predicts the tokens at chosen positions of a sequence (BERT's `cls/predictions`).

    Gathers the hidden states at `mask_positions`, transforms them (dense to
    the embedding width `E`, the encoder's activation, LayerNorm) and scores
    every vocabulary entry against the token embedding table, plus a
    per-token output bias. With ALBERT's factorization (`E < H`) the
    transform maps `H -> E` and decodes against the `V x E` table.

    Args:
        token_embedding: the backbone's `keras.layers.Embedding`; the decoder
            reuses (ties to) its table. None gives an untied decoder kernel
            of its own, which then needs `vocabulary_size` and `embedding_dim`.
        vocabulary_size: number of output tokens (untied decoder only).
        embedding_dim: width `E` of the transform (untied decoder only).
        activation: a bertzoo activation name (the backbone's).
        layer_norm_epsilon: LayerNorm epsilon.
        initializer_range: stddev of the truncated-normal initializer.

    `call(sequence_output, mask_positions)`: `(batch, length, H)` and int
    `(batch, slots)` -> logits `(batch, slots, vocabulary_size)`.

    The tied table is not part of this layer's config: a head rebuilt from
    `get_config()` alone is untied. Tasks (`bertzoo.BertPretrainer`) rebuild it
    from their backbone instead.

    Example:
    ```python
    head = MaskedLMHead(backbone.embeddings.token_embedding, activation="gelu_tanh")
    logits = head(outputs["sequence_output"], mask_positions)
    ```
    """

    def __init__(
        self,
        token_embedding=None,
        vocabulary_size=None,
        embedding_dim=None,
        activation="gelu_tanh",
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if token_embedding is not None:
            vocabulary_size = token_embedding.input_dim
            embedding_dim = token_embedding.output_dim
        elif vocabulary_size is None or embedding_dim is None:
            raise ValueError(
                "MaskedLMHead needs the backbone's `token_embedding` (tied decoder) or both "
                "`vocabulary_size` and `embedding_dim` (untied decoder)."
            )
        self.token_embedding = token_embedding
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.activation = activation
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.initializer_range = float(initializer_range)
        self.transform = Dense(
            self.embedding_dim,
            activation=get_activation(activation),
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=self.initializer_range),
            dtype=self.dtype_policy,
            name="transform",
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm"
        )

    @property
    def tied(self):
        return self.token_embedding is not None

    def build(self, sequence_output_shape, mask_positions_shape=None):
        self.transform.build(tuple(sequence_output_shape))
        self.layer_norm.build(tuple(sequence_output_shape[:-1]) + (self.embedding_dim,))
        if not self.tied:
            self.decoder_kernel = self.add_weight(
                name="decoder_kernel",
                shape=(self.embedding_dim, self.vocabulary_size),
                initializer=keras.initializers.TruncatedNormal(stddev=self.initializer_range),
            )
        self.output_bias = self.add_weight(name="output_bias", shape=(self.vocabulary_size,), initializer="zeros")
        self.built = True

    def decoder_matrix(self):
        """The `E x V` matrix the transformed states are multiplied with."""
        if not self.tied:
            return self.decoder_kernel
        embedding = self.token_embedding
        if getattr(embedding, "quantization_mode", None):
            # A quantized table (int8 / int4 plus scales) is read back through
            # the layer, which dequantizes the rows it returns.
            table = embedding(ops.arange(self.vocabulary_size, dtype="int32"))
        else:
            table = embedding.embeddings
        return ops.transpose(table)

    def call(self, sequence_output, mask_positions):
        positions = ops.cast(mask_positions, "int32")
        # expand_dims, not `[:, :, None]`: LiteRT has no builtin kernel for a strided slice adding an axis.
        x = ops.take_along_axis(sequence_output, ops.expand_dims(positions, -1), axis=1)
        x = self.layer_norm(self.transform(x))
        logits = ops.matmul(x, ops.cast(self.decoder_matrix(), self.compute_dtype))
        return logits + ops.cast(self.output_bias, self.compute_dtype)

    def compute_output_shape(self, sequence_output_shape, mask_positions_shape):
        return (sequence_output_shape[0], mask_positions_shape[1], self.vocabulary_size)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
            }
        )
        return config
