"""The BERT / ALBERT encoder backbone as a Keras functional model."""

import keras

from bertzoo.layers.activations import get_activation
from bertzoo.layers.attention import SelfAttentionBlock
from bertzoo.layers.dense import Dense
from bertzoo.layers.embeddings import BertEmbeddings
from bertzoo.layers.feedforward import FeedForwardBlock
from bertzoo.models.backbone import Backbone
from bertzoo.utils import private_api
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import check_config_keys
from bertzoo.utils.checks import check_keyword_arguments
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_positive_number
from bertzoo.utils.checks import check_rate
from bertzoo.utils.checks import memory_limit_bytes
from bertzoo.utils.layers import PRUNING_STATE_ATTR
from bertzoo.utils.layers import leaf_layers
from bertzoo.utils.private_api import flatten_layers
from bertzoo.utils.private_api import settle_dtype_policy

SHARING_MODES = ("all", "attention", "ffn")


def _per_layer(name, value, num_layers):
    """Expands an int or a list of ints to one positive int per layer."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_layers:
            raise ValueError(
                f"`{name}` has {len(value)} entries but num_layers={num_layers}: "
                "give one value per layer or a single int."
            )
        return [check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [check_positive_int(name, value)] * num_layers


def _compact(values):
    """An int when all layers agree, else the list (keeps configs readable)."""
    return values[0] if len(set(values)) == 1 else list(values)


def _largest(name, value):
    """The largest entry of an int-or-list argument (checked in full later)."""
    if isinstance(value, (list, tuple)) and value:
        return max(check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(value))
    return check_positive_int(name, value)


def derived_head_dim(hidden_dim, num_heads):
    """The head size a backbone takes when `head_dim` is None:
    `hidden_dim // max(num_heads)` (an int or one per layer), or None where
    that does not divide.

    Example:
    ```python
    derived_head_dim(768, 12)  # 64
    derived_head_dim(32, [4, 2])  # 8
    ```
    """
    largest = max(num_heads) if isinstance(num_heads, (list, tuple)) else num_heads
    return hidden_dim // largest if hidden_dim % largest == 0 else None


def _check_size(
    vocabulary_size,
    num_layers,
    hidden_dim,
    num_heads,
    intermediate_dim,
    embedding_dim,
    head_dim,
    max_sequence_length,
    num_segments,
):
    """Refuses (ValueError naming the key) a config whose float32 weights
    would not fit in this machine's memory, from an upper bound of the
    parameter count in O(1), before any per-layer list is built."""
    E, H, L = embedding_dim or hidden_dim, hidden_dim, num_layers
    width = _largest("num_heads", num_heads) * (check_positive_int("head_dim", head_dim) if head_dim else 1)
    width = max(width, H)
    inner = _largest("intermediate_dim", intermediate_dim)
    per_layer = 4 * (H * width + width) + 2 * H * inner + 6 * H
    terms = {
        "vocabulary_size": vocabulary_size * E,
        "max_sequence_length": max_sequence_length * E,
        "num_segments": num_segments * E,
        "layers": L * per_layer,
    }
    total_bytes = 4 * (sum(terms.values()) + E * H + H * H)
    limit = memory_limit_bytes()
    if total_bytes > limit:
        key = max(terms, key=terms.get)
        if key == "layers":
            sizes = {"num_layers": L, "hidden_dim": H, "intermediate_dim": inner, "num_heads": width}
            key = max(sizes, key=sizes.get)
        values = {
            "vocabulary_size": vocabulary_size,
            "max_sequence_length": max_sequence_length,
            "num_segments": num_segments,
            "num_layers": L,
            "hidden_dim": H,
            "intermediate_dim": intermediate_dim,
            "num_heads": num_heads,
        }
        raise ValueError(
            f"`{key}`={values[key]!r} describes a model of about {total_bytes / 2**30:,.0f} GiB of float32 "
            f"weights, more than this machine's {limit / 2**30:,.0f} GiB of memory: the value is absurd "
            "(a damaged config?). Expected a model that fits in memory."
        )


def check_float_policy(dtype):
    """Raises a ValueError naming the fix unless `dtype` (None: Keras's
    global policy) computes in a floating-point type: integer computation is
    quantization's (`bertzoo.quantize`), not a dtype argument's."""
    if dtype is None or isinstance(dtype, keras.dtype_policies.DTypePolicyMap):
        return
    fix = "; to run in int8 or int4, build the float model and quantize it: bertzoo.quantize(model, 'int8')"
    if isinstance(dtype, str) and dtype in ("int8", "int4"):  # Keras reads these as quantized policies.
        raise ValueError(
            f"`dtype` must be a float dtype or a mixed policy (e.g. 'float32', 'mixed_bfloat16'), got {dtype!r}{fix}."
        )
    compute_dtype = keras.dtype_policies.get(dtype).compute_dtype  # Keras names the valid policies.
    if "float" not in compute_dtype:
        raise ValueError(
            f"`dtype` must be a float dtype or a mixed policy (e.g. 'float32', 'mixed_bfloat16'), got {dtype!r}, "
            f"which computes in {compute_dtype}{fix}."
        )


def check_backbone_arguments(
    vocabulary_size,
    num_layers,
    hidden_dim,
    num_heads,
    intermediate_dim,
    embedding_dim=None,
    num_groups=None,
    shared_sublayers="all",
    head_dim=None,
    activation="gelu_tanh",
    dropout=0.1,
    attention_dropout=None,
    max_sequence_length=512,
    num_segments=2,
    layer_norm_epsilon=1e-12,
    initializer_range=0.02,
):
    """The checks `BertBackbone.__init__` runs on its arguments, without
    building anything: raises ValueError naming the first bad argument, else
    returns the normalized values (`num_heads` and `intermediate_dim` as one
    int per layer, the resolved `num_groups`, `head_dim`, `attention_dropout`,
    and which weight set each layer uses, `attention_index` / `ffn_index`)."""
    vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
    num_layers = check_positive_int("num_layers", num_layers)
    hidden_dim = check_positive_int("hidden_dim", hidden_dim)
    if embedding_dim is not None:
        embedding_dim = check_positive_int("embedding_dim", embedding_dim)
    max_sequence_length = check_positive_int("max_sequence_length", max_sequence_length)
    num_segments = check_positive_int("num_segments", num_segments)
    _check_size(
        vocabulary_size,
        num_layers,
        hidden_dim,
        num_heads,
        intermediate_dim,
        embedding_dim,
        head_dim,
        max_sequence_length,
        num_segments,
    )
    heads = _per_layer("num_heads", num_heads, num_layers)
    intermediate = _per_layer("intermediate_dim", intermediate_dim, num_layers)
    num_groups = num_layers if num_groups is None else check_positive_int("num_groups", num_groups)
    if num_layers % num_groups:
        raise ValueError(
            f"`num_layers`={num_layers} is not divisible by `num_groups`={num_groups}: "
            "each group must hold the same number of consecutive layers."
        )
    if shared_sublayers not in SHARING_MODES:
        raise ValueError(f"Unknown `shared_sublayers`={shared_sublayers!r}. Expected one of {list(SHARING_MODES)}.")
    if head_dim is None:
        head_dim = derived_head_dim(hidden_dim, heads)
        if head_dim is None:
            raise ValueError(
                f"`hidden_dim`={hidden_dim} is not divisible by `num_heads`={max(heads)}: "
                "choose a head count that divides the hidden size, or pass `head_dim`."
            )
    head_dim = check_positive_int("head_dim", head_dim)
    if not isinstance(activation, str):
        raise ValueError(f"`activation` must be an activation name, got {activation!r}.")
    get_activation(activation)  # Raises a ValueError for unknown names.
    dropout = check_rate("dropout", dropout)
    attention_dropout = dropout if attention_dropout is None else check_rate("attention_dropout", attention_dropout)
    check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
    check_positive_number("initializer_range", initializer_range)

    # Which weight set each layer uses, per sub-block.
    group_size = num_layers // num_groups
    group_of = [i // group_size for i in range(num_layers)]
    layer_ids = list(range(num_layers))
    attention_index = group_of if shared_sublayers in ("all", "attention") else layer_ids
    ffn_index = group_of if shared_sublayers in ("all", "ffn") else layer_ids
    for index, sizes, name in (
        (attention_index, heads, "num_heads"),
        (ffn_index, intermediate, "intermediate_dim"),
    ):
        first = {}
        for i in range(num_layers):
            j = first.setdefault(index[i], i)
            if sizes[i] != sizes[j]:
                raise ValueError(
                    f"Layers {j} and {i} share weights, so their "
                    f"`{name}` must be equal (got {sizes[j]} and {sizes[i]})."
                )
    return {
        "vocabulary_size": vocabulary_size,
        "num_layers": num_layers,
        "hidden_dim": hidden_dim,
        "num_heads": heads,
        "intermediate_dim": intermediate,
        "embedding_dim": embedding_dim,
        "num_groups": num_groups,
        "head_dim": head_dim,
        "dropout": dropout,
        "attention_dropout": attention_dropout,
        "max_sequence_length": max_sequence_length,
        "num_segments": num_segments,
        "attention_index": attention_index,
        "ffn_index": ffn_index,
    }


@keras.saving.register_keras_serializable(package="bertzoo")
class BertBackbone(Backbone):
    """A BERT-family transformer encoder (BERT, the BERT miniatures, ALBERT).

    Post-LayerNorm transformer layers over token + position + segment
    embeddings, and a tanh pooler on the `[CLS]` position.

    ALBERT is the same network with two switches: `embedding_dim` smaller than
    `hidden_dim` factorizes the embeddings (a `V x E` table plus an `E -> H`
    projection), and `num_groups` smaller than `num_layers` shares weights
    across consecutive layers (`num_groups=1`: one set for all layers).
    `shared_sublayers` picks what a group shares: `"all"`, only
    `"attention"`, or only `"ffn"` (the ALBERT paper's ablation); unshared
    sub-layers get their own weights per layer.

    `num_heads` and `intermediate_dim` may be lists with one entry per layer
    (structured pruning produces such models); `head_dim` then keeps its
    meaning, and defaults to `hidden_dim // max(num_heads)`.

    Args:
        vocabulary_size: number of token ids.
        num_layers: number of transformer layers `L`.
        hidden_dim: hidden size `H`.
        num_heads: attention heads per layer (int or list of `L` ints).
        intermediate_dim: feed-forward size (int or list of `L` ints).
        embedding_dim: embedding size `E`; `None` means `E = H`.
        num_groups: groups of consecutive layers sharing weights; `None` means
            `num_layers` (no sharing, i.e. BERT).
        shared_sublayers: what layers of a group share: "all", "attention", "ffn".
        head_dim: size of each attention head.
        activation: "gelu_tanh" (default, Google's BERT), "gelu_exact", "relu",
            "silu" or "tanh".
        dropout: dropout on embeddings and sub-block outputs.
        attention_dropout: dropout on attention probabilities; `None` means
            `dropout`.
        max_sequence_length: size of the position table.
        num_segments: size of the segment table.
        layer_norm_epsilon: LayerNorm epsilon.
        initializer_range: stddev of the truncated-normal initializer.
        dtype: dtype or `keras.DTypePolicy` for computations and weights.

    Inputs: a dict with `"token_ids"`, `"segment_ids"` and `"padding_mask"`,
    each of shape `(batch, sequence_length)`.
    Outputs: a dict with `"sequence_output"` `(batch, length, H)` and
    `"pooled_output"` `(batch, H)`. Per-layer hidden states and attention
    probabilities are available on request through `compute_features()` or a
    `feature_extractor()` model, at no cost to the default graph.

    Example:
    ```python
    backbone = BertBackbone(vocabulary_size=1000, num_layers=2,
                            hidden_dim=64, num_heads=2, intermediate_dim=128)
    ids = keras.ops.ones((1, 8), "int32")
    out = backbone({"token_ids": ids, "segment_ids": ids * 0,
                    "padding_mask": keras.ops.ones((1, 8), "int32")})
    out["pooled_output"].shape
    # (1, 64)
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        hidden_dim,
        num_heads,
        intermediate_dim,
        embedding_dim=None,
        num_groups=None,
        shared_sublayers="all",
        head_dim=None,
        activation="gelu_tanh",
        dropout=0.1,
        attention_dropout=None,
        max_sequence_length=512,
        num_segments=2,
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        # === Validate the configuration ===
        check_keyword_arguments(type(self), kwargs)
        check_float_policy(dtype)
        checked = check_backbone_arguments(
            vocabulary_size,
            num_layers,
            hidden_dim,
            num_heads,
            intermediate_dim,
            embedding_dim=embedding_dim,
            num_groups=num_groups,
            shared_sublayers=shared_sublayers,
            head_dim=head_dim,
            activation=activation,
            dropout=dropout,
            attention_dropout=attention_dropout,
            max_sequence_length=max_sequence_length,
            num_segments=num_segments,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
        )
        vocabulary_size, num_layers, hidden_dim = (
            checked["vocabulary_size"],
            checked["num_layers"],
            checked["hidden_dim"],
        )
        heads, intermediate = checked["num_heads"], checked["intermediate_dim"]
        embedding_dim, num_groups, head_dim = checked["embedding_dim"], checked["num_groups"], checked["head_dim"]
        dropout, attention_dropout = checked["dropout"], checked["attention_dropout"]
        max_sequence_length, num_segments = checked["max_sequence_length"], checked["num_segments"]
        attention_index, ffn_index = checked["attention_index"], checked["ffn_index"]

        # === Layers ===
        common = dict(
            dropout=dropout,
            layer_norm_epsilon=layer_norm_epsilon,
            initializer_range=initializer_range,
            dtype=dtype,
        )
        self.embeddings = BertEmbeddings(
            vocabulary_size,
            hidden_dim,
            embedding_dim=embedding_dim,
            max_sequence_length=max_sequence_length,
            num_segments=num_segments,
            name="embeddings",
            **common,
        )
        self.attention_blocks = [
            SelfAttentionBlock(
                heads[attention_index.index(k)],
                head_dim,
                attention_dropout=attention_dropout,
                name=f"attention_{k}",
                **common,
            )
            for k in range(max(attention_index) + 1)
        ]
        self.feedforward_blocks = [
            FeedForwardBlock(
                intermediate[ffn_index.index(k)],
                activation=activation,
                name=f"feedforward_{k}",
                **common,
            )
            for k in range(max(ffn_index) + 1)
        ]
        self.pooler = Dense(
            hidden_dim,
            activation="tanh",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=initializer_range),
            dtype=dtype,
            name="pooler",
        )
        self._attention_index = attention_index
        self._ffn_index = ffn_index

        # Keras checks every functional graph using each layer's *first* call
        # (`Layer.output`) to learn how many outputs the layer returns. The
        # default graph calls the attention blocks without probabilities (one
        # output), so a later `feature_extractor(return_attention_scores=True)`
        # (two outputs per block) would fail with "Output ... is not connected
        # to `inputs`". A first symbolic call that returns both outputs, on a
        # throwaway input outside every model, avoids that; it also builds the
        # blocks.
        probe = keras.Input(shape=(None, hidden_dim), name="attention_probe")
        probe_mask = keras.Input(shape=(None,), dtype="int32", name="attention_probe_mask")
        for block in self.attention_blocks:
            block(probe, padding_mask=probe_mask, return_attention_scores=True)

        # === Functional model ===
        inputs = {
            "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            "segment_ids": keras.Input(shape=(None,), dtype="int32", name="segment_ids"),
            "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
        }
        features = self.compute_features(inputs)
        outputs = {
            "sequence_output": features["sequence_output"],
            "pooled_output": features["pooled_output"],
        }
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)
        if dtype is not None:
            # Keras's functional constructor ignores `dtype`: without this the
            # model reports the global policy, `get_config()` drops `dtype`, and
            # `from_config` / `load_model` rebuild a float32 model. A
            # `DTypePolicyMap` (a quantized config) is for the layers, which
            # then keep their own entry; the model takes the map's default.
            policy = keras.dtype_policies.get(dtype)
            if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
                for layer in flatten_layers(self, include_self=False):
                    settle_dtype_policy(layer)
                policy = policy.default_policy
            self.dtype_policy = policy

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.num_heads = _compact(heads)
        self.intermediate_dim = _compact(intermediate)
        self.embedding_dim = embedding_dim
        self.num_groups = num_groups
        self.shared_sublayers = shared_sublayers
        self.head_dim = head_dim
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range

    @classmethod
    def validate_config(cls, config):
        """The constructor's checks on a config (`check_backbone_arguments`,
        including the size estimate), without building anything."""
        check_config_keys(cls, config)
        if not isinstance(config.get("dtype"), dict):  # Else a serialized policy, e.g. a quantized preset's map.
            check_float_policy(config.get("dtype"))
        check_backbone_arguments(**{k: v for k, v in config.items() if k not in ("name", "trainable", "dtype")})

    def layer_blocks(self, index):
        """Returns the `(attention, feed-forward)` blocks used by layer `index`."""
        return (
            self.attention_blocks[self._attention_index[index]],
            self.feedforward_blocks[self._ffn_index[index]],
        )

    def named_weights(self):
        """Every weight of this backbone under its canonical name, in order.

        Returns a dict `{canonical name: keras.Variable}`: the one listing of
        a backbone's weights that checkpoint conversion, pruning and
        structured pruning share. Kernels are `[in, out]` as Keras stores
        them; `k` indexes `attention_blocks` / `feedforward_blocks` (shared
        ALBERT blocks appear once):

            embeddings/token, embeddings/position, embeddings/segment
            embeddings/layer_norm/{gamma,beta}, embeddings/projection/{kernel,bias}
            attention_{k}/{query,key,value,output}/{kernel,bias}
            attention_{k}/layer_norm/{gamma,beta}
            feedforward_{k}/{intermediate,output}/{kernel,bias}
            feedforward_{k}/layer_norm/{gamma,beta}
            pooler/{kernel,bias}

        Kernels and tables are the variables the layers store (not LoRA-merged
        tensors). A quantized backbone holds other weights (int8 values and
        scales) and raises a `ValueError`: name the weights of the float model.
        """

        def dense(prefix, layer):
            return {f"{prefix}/kernel": private_api.dense_kernel_variable(layer), f"{prefix}/bias": layer.bias}

        def norm(prefix, layer):
            return {f"{prefix}/gamma": layer.gamma, f"{prefix}/beta": layer.beta}

        lora = [
            getattr(layer, "path", layer.name) for layer in leaf_layers(self) if getattr(layer, "lora_enabled", False)
        ]
        if lora:
            raise ValueError(
                f"LoRA is enabled on {', '.join(lora)} of {type(self).__name__} '{self.name}': its kernels are "
                "two weights more, which bertzoo's weight names (converters, structured pruning, pruning masks) do "
                "not cover. Merge them first: save_to_preset and from_preset write and load each kernel with its "
                "LoRA update merged in."
            )
        mode = quantization_mode(self)
        if mode:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' is quantized ({mode}): named_weights() names the "
                "weights of the float model. Convert the float model before `bertzoo.quantize` (and quantize "
                "the keras-hub model afterwards, with its own `quantize`)."
            )
        e = self.embeddings
        weights = {
            "embeddings/token": private_api.embeddings_variable(e.token_embedding),
            "embeddings/position": e.position_embedding.embeddings,
            "embeddings/segment": private_api.embeddings_variable(e.segment_embedding),
            **norm("embeddings/layer_norm", e.layer_norm),
        }
        if e.projection is not None:
            weights.update(dense("embeddings/projection", e.projection))
        for k, block in enumerate(self.attention_blocks):
            for part in ("query", "key", "value", "output"):
                weights.update(dense(f"attention_{k}/{part}", getattr(block, f"{part}_dense")))
            weights.update(norm(f"attention_{k}/layer_norm", block.layer_norm))
        for k, block in enumerate(self.feedforward_blocks):
            weights.update(dense(f"feedforward_{k}/intermediate", block.intermediate_dense))
            weights.update(dense(f"feedforward_{k}/output", block.output_dense))
            weights.update(norm(f"feedforward_{k}/layer_norm", block.layer_norm))
        weights.update(dense("pooler", self.pooler))
        # A Pruner attached to the backbone itself adds its masks and counters.
        state = getattr(self, PRUNING_STATE_ATTR, None)
        own = len(self.weights) - (len(state.weights) if state is not None else 0)
        if len(weights) != own:
            raise RuntimeError(
                f"named_weights() names {len(weights)} weights but {type(self).__name__} '{self.name}' has "
                f"{own}: the canonical naming is out of date with the model."
            )
        return weights

    def compute_features(self, inputs, training=None, return_attention_scores=False, return_value_states=False):
        """Runs the encoder and returns every intermediate the caller asks for.

        Works on symbolic inputs (to build models) and on real tensors (inside
        custom train steps, e.g. distillation).

        Returns a dict with `sequence_output`, `pooled_output`,
        `hidden_states` (a list of `num_layers + 1` tensors: the embedding
        output, then each layer's output) and, with
        `return_attention_scores=True`, `attention_scores` (a list of
        `num_layers` float32 tensors of shape `(batch, heads, length, length)`,
        the softmax probabilities) and, with `return_value_states=True`,
        `value_states` (a list of `num_layers` tensors of shape `(batch, length,
        num_heads * head_dim)`: each layer's attention values, heads side by
        side; one extra value projection per layer).
        """
        x = self.embeddings(inputs["token_ids"], inputs["segment_ids"], training=training)
        mask = inputs["padding_mask"]
        hidden_states = [x]
        attention_scores = []
        value_states = []
        for i in range(len(self._attention_index)):
            attention, feedforward = self.layer_blocks(i)
            if return_value_states:
                value_states.append(attention.value_states(x))
            if return_attention_scores:
                x, probs = attention(x, padding_mask=mask, training=training, return_attention_scores=True)
                attention_scores.append(probs)
            else:
                x = attention(x, padding_mask=mask, training=training)
            x = feedforward(x, training=training)
            hidden_states.append(x)
        features = {
            "sequence_output": x,
            "pooled_output": self.pooler(x[:, 0, :]),
            "hidden_states": hidden_states,
        }
        if return_attention_scores:
            features["attention_scores"] = attention_scores
        if return_value_states:
            features["value_states"] = value_states
        return features

    def feature_extractor(self, return_attention_scores=False):
        """A functional model, sharing this backbone's weights, that also
        outputs every layer's hidden states (and attention probabilities).

        Example:
        ```python
        extractor = backbone.feature_extractor(return_attention_scores=True)
        len(extractor(inputs)["hidden_states"]) == backbone.num_layers + 1
        ```
        """
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in ("token_ids", "segment_ids", "padding_mask")
        }
        outputs = self.compute_features(inputs, return_attention_scores=return_attention_scores)
        return keras.Model(inputs, outputs, name=f"{self.name}_features")

    @property
    def token_embedding(self):
        return self.embeddings.token_embedding

    def get_config(self):
        # What the constructor derives is saved as None, so it is derived
        # again: `from_preset(..., num_layers=4)` of a saved plain BERT stays
        # unshared, `dropout=0.0` turns the attention dropout off too, as for
        # a model built with those arguments.
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "embedding_dim": self.embedding_dim,
                "num_groups": None if self.num_groups == self.num_layers else self.num_groups,
                "shared_sublayers": self.shared_sublayers,
                "head_dim": None
                if self.head_dim == derived_head_dim(self.hidden_dim, self.num_heads)
                else self.head_dim,
                "activation": self.activation,
                "dropout": self.dropout,
                "attention_dropout": None if self.attention_dropout == self.dropout else self.attention_dropout,
                "max_sequence_length": self.max_sequence_length,
                "num_segments": self.num_segments,
                "layer_norm_epsilon": float(self.layer_norm_epsilon),  # Not a NumPy float: configs are JSON.
                "initializer_range": float(self.initializer_range),
            }
        )
        return config


def count_backbone_parameters(config):
    """Parameter count of a `BertBackbone` config, without building it.

    Lets `list_presets()` report the large presets instantly; the tests check
    it against built models.
    """
    c = dict(config)
    L, H = c["num_layers"], c["hidden_dim"]
    E = c.get("embedding_dim") or H
    heads = _per_layer("num_heads", c["num_heads"], L)
    inter = _per_layer("intermediate_dim", c["intermediate_dim"], L)
    head_dim = c.get("head_dim") or derived_head_dim(H, heads)
    groups = c.get("num_groups") or L
    mode = c.get("shared_sublayers", "all")
    group_size = L // groups
    firsts = range(0, L, group_size)
    attn_layers = firsts if mode in ("all", "attention") else range(L)
    ffn_layers = firsts if mode in ("all", "ffn") else range(L)
    total = (c["vocabulary_size"] + c.get("max_sequence_length", 512) + c.get("num_segments", 2)) * E
    total += 2 * E  # Embedding LayerNorm.
    if E != H:
        total += E * H + H
    for i in attn_layers:
        width = heads[i] * head_dim
        total += 3 * (H * width + width) + width * H + H + 2 * H
    for i in ffn_layers:
        total += H * inter[i] + inter[i] + inter[i] * H + H + 2 * H
    total += H * H + H  # Pooler.
    return total
