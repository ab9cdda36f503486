"""keras-hub `BertBackbone` / `AlbertBackbone` <-> bertzoo, both directions.

keras-hub stores attention kernels per head (`[H, heads, head_dim]`,
`[heads, head_dim, H]`); bertzoo's are plain matrices, so they are reshaped.
keras-hub's BERT and ALBERT always use the tanh approximation of GELU and
LayerNorm epsilon 1e-12, so models going to keras-hub must have those.
"""

import json
import warnings
from pathlib import Path

import numpy as np

from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import SourceModel
from bertzoo.convert.common import albert_layout
from bertzoo.convert.common import check_vocabulary_size
from bertzoo.convert.common import default_sequence_length
from bertzoo.convert.common import dense_rules
from bertzoo.convert.common import norm_rules
from bertzoo.convert.common import source_name
from bertzoo.models.bert_backbone import BertBackbone

KERAS_HUB_ACTIVATION = "gelu_tanh"
KERAS_HUB_EPSILON = 1e-12


def _layer_table(layer):
    attention = f"{layer}/self_attention_layer"
    return {
        **dense_rules("attention_{k}/query", f"{attention}/query", "reshape"),
        **dense_rules("attention_{k}/key", f"{attention}/key", "reshape"),
        **dense_rules("attention_{k}/value", f"{attention}/value", "reshape"),
        **dense_rules("attention_{k}/output", f"{attention}/attention_output", "reshape"),
        **norm_rules("attention_{k}/layer_norm", f"{layer}/self_attention_layer_norm"),
        **dense_rules("feedforward_{k}/intermediate", f"{layer}/feedforward_intermediate_dense"),
        **dense_rules("feedforward_{k}/output", f"{layer}/feedforward_output_dense"),
        **norm_rules("feedforward_{k}/layer_norm", f"{layer}/feedforward_layer_norm"),
    }


def _table(albert):
    table = {
        "embeddings/token": ("token_embedding/embeddings", None),
        "embeddings/position": ("position_embedding/embeddings", None),
        "embeddings/segment": ("segment_embedding/embeddings", None),
        **norm_rules("embeddings/layer_norm", "embeddings_layer_norm"),
        **dense_rules("pooler", "pooled_dense"),
    }
    if albert:
        table.update(dense_rules("embeddings/projection", "embedding_projection"))
        table.update(_layer_table("group_{g}_inner_layer_{r}"))
    else:
        table.update(_layer_table("transformer_layer_{k}"))
    # Bias of a per-head dense layer is [heads, head_dim]: reshape it too.
    for key, (name, _transform) in list(table.items()):
        if "/self_attention_layer/" in name and name.endswith("/bias"):
            table[key] = (name, "reshape")
    return table


def _keras_hub_classes():
    import keras_hub

    return keras_hub.models.BertBackbone, keras_hub.models.AlbertBackbone


def is_keras_hub_config(config):
    registered = str(config.get("registered_name", ""))
    return registered.startswith("keras_hub>") or str(config.get("module", "")).startswith("keras_hub")


def _variables(model):
    variables = {}
    for variable in model.weights:
        if variable.path in variables:
            raise ConversionError(f"The keras-hub model has two weights at {variable.path!r}.")
        variables[variable.path] = variable
    return variables


def _json_field(path, *keys):
    """`path`'s JSON value at `keys`, or None where the file or a key is missing."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _load_preset_part(cls, path, *files):
    """`cls.from_preset(path)`; keras-hub's own errors about a damaged preset
    (a KeyError, an h5py or JSON error that names no file) become a
    `ConversionError` naming the preset and the files it was reading."""
    try:
        return cls.from_preset(str(path))
    except (KeyError, AttributeError, TypeError, ValueError, OSError) as e:
        raise ConversionError(
            f"{path} is not a loadable keras-hub preset: reading {' and '.join(files)} with "
            f"keras_hub.{cls.__name__}.from_preset failed ({type(e).__name__}: {e}). Check those files (a "
            "hand edit, an interrupted copy?) or save the preset again with keras-hub's save_to_preset."
        ) from e


def read(source):
    """Reads a keras-hub BERT/ALBERT backbone (object, task, or preset directory)."""
    import keras_hub

    bert_cls, albert_cls = _keras_hub_classes()
    path, tokenizer, head, sequence_length = None, None, None, None
    if isinstance(source, (str, Path)):
        path = Path(source)
        backbone = _load_preset_part(keras_hub.models.Backbone, path, "config.json", "model.weights.h5")
        if (path / "tokenizer.json").is_file():
            tokenizer = _load_preset_part(keras_hub.tokenizers.Tokenizer, path, "tokenizer.json", "assets/")
        if (path / "task.json").is_file():
            head = _json_field(path / "task.json", "class_name") or "task"
        sequence_length = _json_field(path / "preprocessor.json", "config", "sequence_length")
    else:
        backbone = source
        if not isinstance(source, (bert_cls, albert_cls)) and hasattr(source, "backbone"):
            backbone = source.backbone
            head = type(source).__name__
            preprocessor = getattr(source, "preprocessor", None)
            tokenizer = getattr(preprocessor, "tokenizer", None)
            sequence_length = getattr(preprocessor, "sequence_length", None)
    if not isinstance(backbone, (bert_cls, albert_cls)):
        raise ConversionError(
            f"bertzoo converts keras-hub BertBackbone and AlbertBackbone models, got {type(backbone).__name__}."
        )
    albert = isinstance(backbone, albert_cls)
    kh = backbone.get_config()
    origin = f"keras-hub {type(backbone).__name__} {str(path) if path else repr(backbone.name)}"
    config = {
        "vocabulary_size": kh["vocabulary_size"],
        "num_layers": kh["num_layers"],
        "hidden_dim": kh["hidden_dim"],
        "num_heads": kh["num_heads"],
        "intermediate_dim": kh["intermediate_dim"],
        "activation": KERAS_HUB_ACTIVATION,
        "dropout": float(kh["dropout"]),
        "max_sequence_length": kh["max_sequence_length"],
        "num_segments": kh["num_segments"],
        "layer_norm_epsilon": KERAS_HUB_EPSILON,
    }
    index_fields = None
    if albert:
        if kh["embedding_dim"] == kh["hidden_dim"]:
            raise ConversionError(
                f"{origin}: embedding_dim equals hidden_dim ({kh['hidden_dim']}) but keras-hub "
                "ALBERT still projects the embeddings, which BertBackbone cannot hold."
            )
        layers, groups, index_fields = albert_layout(
            kh["num_layers"], kh["num_groups"], kh["num_inner_repetitions"], origin
        )
        config.update(num_layers=layers, num_groups=groups, shared_sublayers="all", embedding_dim=kh["embedding_dim"])

    vocabulary, sentencepiece, notes, preprocessor = None, None, [], {}
    if isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer):
        vocabulary = list(tokenizer.get_vocabulary())
        check_vocabulary_size(vocabulary, config, origin)
        preprocessor["lowercase"] = bool(tokenizer.lowercase)
        preprocessor["strip_accents"] = bool(tokenizer.strip_accents)
    elif isinstance(tokenizer, keras_hub.tokenizers.SentencePieceTokenizer) and tokenizer.proto is not None:
        # keras-hub's ALBERT tokenizer is the model's SentencePiece alone (no
        # lower-casing or ALBERT preprocessing): SentencePieceTokenizer's defaults.
        sentencepiece = bytes(tokenizer.proto)
    elif tokenizer is not None:
        notes.append(
            f"the keras-hub {type(tokenizer).__name__} is neither a WordPiece nor a SentencePiece tokenizer: "
            "the preset has no vocabulary."
        )
    if isinstance(sequence_length, int) and not isinstance(sequence_length, bool):
        preprocessor["sequence_length"] = min(sequence_length, config["max_sequence_length"])
    preprocessor = {"sequence_length": default_sequence_length(config["max_sequence_length"]), **preprocessor}
    if head is not None:
        # The Hugging Face reader refuses task heads outright; a keras-hub task
        # is a model object the user holds, so its encoder converts and the
        # summary says what was left behind.
        notes.append(
            f"the keras-hub {head} head is not converted (bertzoo converts encoders): fine-tune a bertzoo task "
            "built on this preset."
        )

    return SourceModel(
        format="keras_hub",
        path=str(path.resolve()) if path else None,
        config=config,
        tensors={name: v.numpy() for name, v in _variables(backbone).items()},
        table=_table(albert),
        index_fields=index_fields,
        vocabulary=vocabulary,
        sentencepiece=sentencepiece,
        preprocessor=preprocessor,
        notes=notes,
    )


def _check_expressible(backbone):
    """Every reason the bertzoo model cannot be a keras-hub BERT/ALBERT."""
    c = backbone.get_config()
    problems = []
    if c["layer_norm_epsilon"] != KERAS_HUB_EPSILON:
        problems.append(f"layer_norm_epsilon={c['layer_norm_epsilon']} (keras-hub fixes 1e-12)")
    for key in ("num_heads", "intermediate_dim"):
        if not isinstance(c[key], int):
            problems.append(f"per-layer {key}={c[key]} (keras-hub layers are all the same size)")
    if isinstance(c["num_heads"], int) and backbone.head_dim * c["num_heads"] != c["hidden_dim"]:
        problems.append(
            f"head_dim={backbone.head_dim} x num_heads={c['num_heads']} != hidden_dim={c['hidden_dim']} "
            "(keras-hub uses hidden_dim // num_heads)"
        )
    shared = backbone.num_groups != backbone.num_layers
    if shared and c["shared_sublayers"] != "all":
        problems.append(f"shared_sublayers={c['shared_sublayers']!r} (keras-hub ALBERT shares whole layers)")
    if shared and backbone.embeddings.projection is None:
        problems.append(
            "shared layers without factorized embeddings (keras-hub's ALBERT always projects "
            "embedding_dim -> hidden_dim, its BERT never shares)"
        )
    return problems


def to_keras_hub(backbone, allow_gelu_approximation=False):
    """Returns a keras-hub `BertBackbone` or `AlbertBackbone` with the same weights.

    `backbone` is a `bertzoo.BertBackbone` or a preset (name or directory).
    Models with factorized embeddings (`embedding_dim < hidden_dim`) become
    an `AlbertBackbone`, others a `BertBackbone`.

    keras-hub's BERT and ALBERT always use the tanh approximation of GELU.
    A model with another activation is refused, unless
    `allow_gelu_approximation=True` and it uses the exact GELU: then the
    keras-hub model computes a slightly different function (a warning says
    so; on all-MiniLM-L6-v2 the sequence output moves by up to 2.6e-3).

    Raises:
        ValueError: the model cannot be expressed in keras-hub (the message
            lists why: activation, epsilon, per-layer sizes, partial sharing).

    Example:
    ```python
    kh = bertzoo.convert.to_keras_hub("presets_out/albert")
    back = bertzoo.convert_checkpoint(kh, "presets_out/albert_again")
    ```
    """

    if not isinstance(backbone, BertBackbone):
        backbone = BertBackbone.from_preset(backbone)
    problems = _check_expressible(backbone)
    activation = backbone.activation
    if activation != KERAS_HUB_ACTIVATION:
        if activation == "gelu_exact" and allow_gelu_approximation:
            warnings.warn(
                "The model uses the exact GELU; keras-hub's BERT/ALBERT use the tanh approximation, "
                "so the keras-hub model's outputs differ slightly from this model's.",
                stacklevel=2,
            )
        else:
            hint = " (pass allow_gelu_approximation=True to accept the tanh form)" if activation == "gelu_exact" else ""
            problems.append(f"activation={activation!r}: keras-hub BERT/ALBERT use 'gelu_tanh' only{hint}")
    if problems:
        raise ValueError(
            f"BertBackbone '{backbone.name}' cannot be expressed as a keras-hub model:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    if backbone.attention_dropout != backbone.dropout:
        warnings.warn(
            f"keras-hub has one dropout rate; using dropout={backbone.dropout} "
            f"(attention_dropout={backbone.attention_dropout} is dropped).",
            stacklevel=2,
        )

    bert_cls, albert_cls = _keras_hub_classes()
    albert = backbone.embeddings.projection is not None
    common = dict(
        vocabulary_size=backbone.vocabulary_size,
        num_layers=backbone.num_layers,
        num_heads=backbone.num_heads,
        hidden_dim=backbone.hidden_dim,
        intermediate_dim=backbone.intermediate_dim,
        dropout=backbone.dropout,
        max_sequence_length=backbone.max_sequence_length,
        num_segments=backbone.num_segments,
        dtype=backbone.dtype_policy,
    )
    if albert:
        target = albert_cls(embedding_dim=backbone.embedding_dim, num_groups=backbone.num_groups, **common)
    else:
        target = bert_cls(**common)

    layout = SourceModel(
        format="keras_hub",
        path=None,
        config={},
        tensors={},
        table=_table(albert),
        index_fields=(lambda k: {"g": k, "r": 0}) if albert else None,
    )
    targets = _variables(target)
    assigned = set()
    for canonical, variable in backbone.named_weights().items():
        name, _ = source_name(layout, canonical)
        destination = targets[name]
        destination.assign(np.reshape(variable.numpy(), destination.shape))
        assigned.add(name)
    left = sorted(set(targets) - assigned)
    if left:
        raise RuntimeError(f"bertzoo.convert.to_keras_hub left keras-hub weights unset: {left}")
    return target
