"""Token, position and segment embeddings, with optional factorization."""

import keras
from keras import ops

from bertzoo.layers.dense import Dense
from bertzoo.layers.dropout import Dropout
from bertzoo.utils import private_api
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_rate
from bertzoo.utils.checks import concrete_value
from bertzoo.utils.optional import tf


@keras.saving.register_keras_serializable(package="bertzoo")
class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embeddings, sliced to the input length.

    Example:
    ```python
    layer = PositionEmbedding(max_sequence_length=512, embedding_dim=64)
    layer(keras.ops.zeros((2, 10, 64))).shape
    # (10, 64)
    ```
    """

    def __init__(self, max_sequence_length, embedding_dim, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_sequence_length = check_positive_int("max_sequence_length", max_sequence_length)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_sequence_length, self.embedding_dim),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs):
        """Returns the `(sequence_length, embedding_dim)` table for `inputs`."""
        static_length = inputs.shape[1]
        message = (
            f"exceeds the position table (max_sequence_length={self.max_sequence_length}). Truncate the "
            "inputs (e.g. the preprocessor's `sequence_length`) or build the model with a larger "
            "`max_sequence_length`."
        )
        if static_length is not None and static_length > self.max_sequence_length:
            raise ValueError(f"Input sequence length {static_length} {message}")
        length = ops.shape(inputs)[1]
        if static_length is None and keras.backend.backend() == "tensorflow" and not private_api.in_xla_context():
            # A graph traced for any length (`predict` relaxes the shape after a
            # few lengths): checked when it runs, with the same message, instead
            # of the slice's own "Expected size[0] in [0, N]". XLA drops asserts
            # (logging "Ignoring Assert operator" on every compile) and fixes
            # the length when it compiles, where the slice refuses it.
            check = tf.debugging.assert_less_equal(
                length, self.max_sequence_length, message=f"The input sequence length {message}"
            )
            with tf.control_dependencies([check]):
                length = tf.identity(length)
        return ops.cast(
            # convert_to_tensor: JAX >= 0.7 no longer takes a Keras variable here.
            ops.slice(ops.convert_to_tensor(self.embeddings), (0, 0), (length, self.embedding_dim)),
            self.compute_dtype,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_sequence_length": self.max_sequence_length,
                "embedding_dim": self.embedding_dim,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="bertzoo")
class BertEmbeddings(keras.layers.Layer):
    """BERT input embeddings: token + position + segment, LayerNorm, dropout.

    With `embedding_dim` smaller than `hidden_dim` (ALBERT's factorization) the
    tables are `V x E` and a dense projection maps `E -> H` after the
    normalization; `embedding_dim=None` means `E = H` and no projection.

    Example:
    ```python
    layer = BertEmbeddings(vocabulary_size=100, hidden_dim=32, embedding_dim=8)
    ids = keras.ops.ones((2, 5), "int32")
    layer(ids, keras.ops.zeros((2, 5), "int32")).shape
    # (2, 5, 32)
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        embedding_dim=None,
        max_sequence_length=512,
        num_segments=2,
        dropout=0.1,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.embedding_dim = None if embedding_dim is None else check_positive_int("embedding_dim", embedding_dim)
        self.max_sequence_length = check_positive_int("max_sequence_length", max_sequence_length)
        self.num_segments = check_positive_int("num_segments", num_segments)
        self.dropout = check_rate("dropout", dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.initializer_range = float(initializer_range)

        width = self.embedding_dim or self.hidden_dim

        # A new initializer per table (see SelfAttentionBlock._initializer).
        def initializer():
            return keras.initializers.TruncatedNormal(stddev=self.initializer_range)

        self.token_embedding = keras.layers.Embedding(
            self.vocabulary_size,
            width,
            embeddings_initializer=initializer(),
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.position_embedding = PositionEmbedding(
            self.max_sequence_length,
            width,
            initializer=initializer(),
            dtype=self.dtype_policy,
            name="position_embedding",
        )
        self.segment_embedding = keras.layers.Embedding(
            self.num_segments,
            width,
            embeddings_initializer=initializer(),
            dtype=self.dtype_policy,
            name="segment_embedding",
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm"
        )
        self.dropout_layer = Dropout(self.dropout, dtype=self.dtype_policy, name="dropout")
        self.projection = None
        if self.embedding_dim is not None and self.embedding_dim != self.hidden_dim:
            self.projection = Dense(
                self.hidden_dim,
                kernel_initializer=initializer(),
                dtype=self.dtype_policy,
                name="projection",
            )

    def build(self, token_ids_shape, segment_ids_shape=None):
        width = self.embedding_dim or self.hidden_dim
        self.token_embedding.build(token_ids_shape)
        self.position_embedding.build()
        self.segment_embedding.build(token_ids_shape)
        self.layer_norm.build((None, None, width))
        if self.projection is not None:
            self.projection.build((None, None, width))
        self.built = True

    def _check_ids(self, token_ids, segment_ids):
        # Only possible eagerly; in a compiled graph out-of-range ids are not
        # checked (see the README: CPU raises, GPU/XLA gather clamps or zeros).
        for name, ids, limit, arg in (
            ("token id", token_ids, self.vocabulary_size, "vocabulary_size"),
            ("segment id", segment_ids, self.num_segments, "num_segments"),
        ):
            values = concrete_value(ids)
            if values is None or values.size == 0:
                continue
            low, high = int(values.min()), int(values.max())
            if low < 0 or high >= limit:
                bad = high if high >= limit else low
                raise ValueError(
                    f"Found {name} {bad} outside [0, {limit}) ({arg}={limit}). "
                    "Check that the tokenizer's vocabulary matches the model."
                )

    def call(self, token_ids, segment_ids, training=None):
        self._check_ids(token_ids, segment_ids)
        # Keras's int8 Embedding returns float32 under a bfloat16/float16
        # compute dtype (its de-scaling divides by a float32 scale); the cast
        # keeps the sum in the compute dtype and is free when they match.
        x = ops.cast(self.token_embedding(token_ids), self.compute_dtype)
        x = x + self.position_embedding(x)[None, :, :]
        x = x + ops.cast(self.segment_embedding(segment_ids), self.compute_dtype)
        x = self.layer_norm(x)
        x = self.dropout_layer(x, training=training)
        if self.projection is not None:
            x = self.projection(x)
        return x

    def compute_output_shape(self, token_ids_shape, segment_ids_shape=None):
        return tuple(token_ids_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "embedding_dim": self.embedding_dim,
                "max_sequence_length": self.max_sequence_length,
                "num_segments": self.num_segments,
                "dropout": self.dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
            }
        )
        return config
