"""Multi-head self-attention sub-block of a post-LayerNorm BERT layer."""

import keras
from keras import ops

from bertzoo.layers.dense import Dense
from bertzoo.layers.dense import project_shared_input
from bertzoo.layers.dropout import Dropout
from bertzoo.utils import device
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_rate


def _fused_attention_available(dtype):
    """Whether `keras.ops.dot_product_attention` has a fused kernel behind it
    on this backend for `dtype` (JAX and torch: cuDNN / flash attention on
    GPUs, their own CPU kernels). TensorFlow's is the einsum form of
    `_head_major_attention`. JAX's on a CPU asks XLA for float16 matmuls
    that accumulate in float32, which XLA:CPU does not have ("The precision
    'F16_F16_F32' is not supported by dot_general on CPU")."""
    backend = keras.backend.backend()
    if backend == "jax" and keras.backend.standardize_dtype(dtype) == "float16":
        return device.accelerator() != "cpu"
    return backend != "tensorflow"


def _head_major_attention(query, key, value, mask, scale, probs_hook=None):
    """Scaled dot-product attention of `(batch, length, heads, head_dim)`
    inputs as batched matmuls over `(batch, heads, ...)` operands.

    The function `keras.ops.dot_product_attention` computes (logits in
    float32, -1e9 at masked keys, softmax in float32, probabilities cast
    back), except that the query is scaled before the matmul, as keras-hub's
    `MultiHeadAttention` does (Keras scales the float32 logits), written as
    matmuls on head-major transposes instead of einsums: TensorFlow without
    XLA runs einsums like these through extra layout copies inside the op (22%
    of an int8 MiniLM forward pass at batch 32 in TF's profiler), while a
    batched matmul goes straight to oneDNN. Under XLA both forms compile
    alike. `probs_hook(probs)` (attention dropout) is applied to the
    probabilities before they weight the values.

    Returns `(context, probs)`: `(batch, length, heads, head_dim)` and the
    float32 `(batch, heads, length, length)` probabilities.
    """
    # The query is scaled before the matmul, as keras-hub does: in float16 an
    # unscaled product overflows at sqrt(head_dim) times smaller scores (the
    # price: the scaled query is rounded to the compute dtype).
    logits = ops.matmul(_heads_first(ops.multiply(query, scale)), _heads_first(key, keys=True))
    logits = ops.cast(logits, "float32")
    if mask is not None:
        # Adding a (batch, 1, 1, length) bias is cheaper than selecting over
        # the whole (batch, heads, length, length) tensor; the softmax is the
        # same (exp(-1e9 + logit - max) is 0 in float32 as exp(-1e9 - max) is).
        logits = logits + ops.where(mask, 0.0, -1e9)
    # Over one key the softmax is exp(0) = 1 (a padded key too), with the softmax's zero
    # gradient (`ones_like` would have none); Keras's softmax warns on such an axis.
    if logits.shape[-1] == 1:
        probs = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
    else:
        probs = ops.softmax(logits, axis=-1)
    weights = ops.cast(probs, value.dtype)
    if probs_hook is not None:
        weights = probs_hook(weights)
    context = ops.matmul(weights, _heads_first(value))
    return _heads_first(context), probs


def _heads_first(x, keys=False):
    """Swaps axes 1 and 2 of a 4-D tensor (`(batch, length, heads, dim)` <->
    `(batch, heads, length, dim)`); `keys`: `(batch, length, heads, dim)` ->
    `(batch, heads, dim, length)`. With one head (a structurally pruned
    layer) without a 4-D transpose: tf2onnx turns that into a reshape whose
    shape constant it shares across layers, which ONNX Runtime then cannot
    run."""
    if x.shape[2] == 1:  # (batch, length, 1, dim)
        rows = ops.squeeze(x, axis=2)
        return ops.expand_dims(ops.swapaxes(rows, 1, 2) if keys else rows, axis=1)
    if x.shape[1] == 1 and not keys:  # (batch, 1, length, dim)
        return ops.expand_dims(ops.squeeze(x, axis=1), axis=2)
    return ops.transpose(x, (0, 2, 3, 1) if keys else (0, 2, 1, 3))


def _flatten(x):
    """`(..., hidden)` -> `(rows, hidden)`, keeping a static hidden size."""
    hidden = x.shape[-1] if x.shape[-1] is not None else ops.shape(x)[-1]
    return ops.reshape(x, (-1, hidden))


@keras.saving.register_keras_serializable(package="bertzoo")
class SelfAttentionBlock(keras.layers.Layer):
    """Self-attention, output projection, dropout, residual and LayerNorm.

    Computes `LayerNorm(x + Dropout(Attention(x)))` as in BERT. The number of
    heads times `head_dim` need not equal the hidden size, so structurally
    pruned layers (fewer heads, same `head_dim`) are ordinary instances.

    On JAX and torch, attention takes the fused
    `keras.ops.dot_product_attention` path unless attention probabilities are
    requested (`return_attention_scores=True`) or attention dropout is active
    during training, which the fused op cannot apply. Otherwise, and always on
    TensorFlow, it runs as batched matmuls over head-major operands
    (`_head_major_attention`); both paths compute the same function.

    `padding_mask` is `(batch, length)`: a nonzero (or True) entry is a real
    token, zero (False) a padded one that no query attends to. A row with no
    real token attends evenly over its padded keys, as Hugging Face's eager
    attention does (keras-hub's softmax gives such a row zeros): its outputs
    are finite and mean nothing.

    Example:
    ```python
    block = SelfAttentionBlock(num_heads=2, head_dim=8)
    x = keras.ops.ones((1, 4, 16))
    out, probs = block(x, padding_mask=keras.ops.ones((1, 4), "bool"),
                       return_attention_scores=True)
    probs.shape
    # (1, 2, 4, 4)
    ```
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate("attention_dropout", attention_dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.initializer_range = float(initializer_range)

        width = self.num_heads * self.head_dim
        self.query_dense = Dense(width, kernel_initializer=self._initializer(), dtype=self.dtype_policy, name="query")
        self.key_dense = Dense(width, kernel_initializer=self._initializer(), dtype=self.dtype_policy, name="key")
        self.value_dense = Dense(width, kernel_initializer=self._initializer(), dtype=self.dtype_policy, name="value")
        self.output_dense = None  # Needs the hidden size: created in build().
        self.probs_dropout = Dropout(self.attention_dropout, dtype=self.dtype_policy, name="probs_dropout")
        self.output_dropout = Dropout(self.dropout, dtype=self.dtype_policy, name="output_dropout")
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm"
        )

    def _initializer(self):
        # A new instance per weight: Keras gives an unseeded initializer one
        # fixed seed, so a shared instance would start Q, K, V and the output
        # projection with identical kernels.
        return keras.initializers.TruncatedNormal(stddev=self.initializer_range)

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        self.output_dense = Dense(
            hidden_dim, kernel_initializer=self._initializer(), dtype=self.dtype_policy, name="output"
        )
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.num_heads * self.head_dim,))
        self.layer_norm.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, training=None, return_attention_scores=False):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        # The dense layers see a (batch * length, hidden) matrix: without XLA,
        # TensorFlow's oneDNN pass then fuses each matmul with its bias add,
        # which a 3-D input (matmul via tensordot's reshapes) misses. Same math.
        flat = _flatten(x)

        def split_heads(t):
            return ops.reshape(t, (batch, length, self.num_heads, self.head_dim))

        projections = project_shared_input([self.query_dense, self.key_dense, self.value_dense], flat, training)
        query, key, value = (split_heads(p) for p in projections)
        mask = None
        if padding_mask is not None:
            # (B, 1, 1, S). Not `[:, None, None, :]`: with a dynamic length that slice is a
            # StridedSlice LiteRT has no builtin kernel for (it would need TF "select" ops).
            mask = ops.expand_dims(ops.expand_dims(ops.cast(padding_mask, "bool"), 1), 1)

        use_dropout = bool(training) and self.attention_dropout > 0
        if return_attention_scores or use_dropout or not _fused_attention_available(query.dtype):
            context, probs = _head_major_attention(
                query,
                key,
                value,
                mask,
                1.0 / (self.head_dim**0.5),
                probs_hook=(lambda p: self.probs_dropout(p, training=training)) if use_dropout else None,
            )
        else:
            probs = None
            if mask is not None and keras.backend.backend() == "jax":
                # JAX's cuDNN attention takes a mask only as a bias spanning (length, length):
                # given (B, 1, 1, S) it raises "Bias must have same seq length as QKV"
                # (jax-ml/jax#28974) and Keras falls back to XLA's attention on GPUs. Under
                # XLA the broadcast is fused away.
                mask = ops.broadcast_to(mask, (batch, 1, length, length))
            context = ops.dot_product_attention(query, key, value, mask=mask)

        context = ops.reshape(context, (-1, self.num_heads * self.head_dim))
        attended = self.output_dropout(self.output_dense(context), training=training)
        outputs = ops.reshape(self.layer_norm(flat + attended), ops.shape(x))
        if return_attention_scores:
            return outputs, probs
        return outputs

    def value_states(self, x):
        """The value vectors of `x`, heads side by side: `(batch, length,
        num_heads * head_dim)` (MiniLM's value-relation distillation reads them)."""
        values = self.value_dense(_flatten(x))
        return ops.reshape(values, (ops.shape(x)[0], ops.shape(x)[1], self.num_heads * self.head_dim))

    def compute_output_spec(self, x, padding_mask=None, training=None, return_attention_scores=False):
        out = keras.KerasTensor(x.shape, dtype=self.compute_dtype)
        if return_attention_scores:
            probs = keras.KerasTensor((x.shape[0], self.num_heads, x.shape[1], x.shape[1]), dtype="float32")
            return out, probs
        return out

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
            }
        )
        return config
