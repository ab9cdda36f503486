"""Reads Hugging Face BERT / ALBERT directories (config.json + safetensors).

Weights are read with the safetensors NumPy API, so no PyTorch is needed.
PyTorch `nn.Linear` weights are stored `[out, in]` and are transposed.
"""

from pathlib import Path

import numpy as np

from bertzoo.convert.common import BERT_CONFIG_KINDS
from bertzoo.convert.common import HF_ACTIVATIONS
from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import SourceModel
from bertzoo.convert.common import albert_layout
from bertzoo.convert.common import default_sequence_length
from bertzoo.convert.common import dense_rules
from bertzoo.convert.common import describe_json
from bertzoo.convert.common import map_activation
from bertzoo.convert.common import norm_rules
from bertzoo.convert.common import read_config
from bertzoo.convert.common import read_json_object
from bertzoo.convert.huggingface_tokenizer import read_tokenizer

SUPPORTED_MODEL_TYPES = ("bert", "albert")
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")

CONFIG_KINDS = {
    **BERT_CONFIG_KINDS,
    "layer_norm_eps": float,
    "position_embedding_type": str,
    "is_decoder": bool,
    "add_cross_attention": bool,
}

# Options under which Hugging Face's BERT is not a bidirectional encoder
# (its ALBERT ignores them): option -> what it does there.
_DECODER_OPTIONS = {
    "is_decoder": "applies a causal mask (each token attends only to earlier ones)",
    "add_cross_attention": "adds cross-attention layers over an encoder's outputs",
}


def _defaults(albert):
    """Hugging Face's defaults for the optional config entries."""
    return {
        "hidden_act": "gelu_new" if albert else "gelu",
        "hidden_dropout_prob": 0.0 if albert else 0.1,
        "attention_probs_dropout_prob": 0.0 if albert else 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "position_embedding_type": "absolute",
        "is_decoder": False,
        "add_cross_attention": False,
        "embedding_size": 128,
        "num_hidden_groups": 1,
        "inner_group_num": 1,
    }


def _linear(canonical, source):
    return dense_rules(canonical, source, "T", weight="weight", sep=".")


def _norm(canonical, source):
    return norm_rules(canonical, source, gamma="weight", beta="bias", sep=".")


_EMBEDDINGS = {
    "embeddings/token": ("embeddings.word_embeddings.weight", None),
    "embeddings/position": ("embeddings.position_embeddings.weight", None),
    "embeddings/segment": ("embeddings.token_type_embeddings.weight", None),
    **_norm("embeddings/layer_norm", "embeddings.LayerNorm"),
}

BERT_TABLE = {
    **_EMBEDDINGS,
    **_linear("attention_{k}/query", "encoder.layer.{k}.attention.self.query"),
    **_linear("attention_{k}/key", "encoder.layer.{k}.attention.self.key"),
    **_linear("attention_{k}/value", "encoder.layer.{k}.attention.self.value"),
    **_linear("attention_{k}/output", "encoder.layer.{k}.attention.output.dense"),
    **_norm("attention_{k}/layer_norm", "encoder.layer.{k}.attention.output.LayerNorm"),
    **_linear("feedforward_{k}/intermediate", "encoder.layer.{k}.intermediate.dense"),
    **_linear("feedforward_{k}/output", "encoder.layer.{k}.output.dense"),
    **_norm("feedforward_{k}/layer_norm", "encoder.layer.{k}.output.LayerNorm"),
    **_linear("pooler", "pooler.dense"),
}

_ALBERT_LAYER = "encoder.albert_layer_groups.{g}.albert_layers.{r}"
ALBERT_TABLE = {
    **_EMBEDDINGS,
    **_linear("embeddings/projection", "encoder.embedding_hidden_mapping_in"),
    **_linear("attention_{k}/query", f"{_ALBERT_LAYER}.attention.query"),
    **_linear("attention_{k}/key", f"{_ALBERT_LAYER}.attention.key"),
    **_linear("attention_{k}/value", f"{_ALBERT_LAYER}.attention.value"),
    **_linear("attention_{k}/output", f"{_ALBERT_LAYER}.attention.dense"),
    **_norm("attention_{k}/layer_norm", f"{_ALBERT_LAYER}.attention.LayerNorm"),
    **_linear("feedforward_{k}/intermediate", f"{_ALBERT_LAYER}.ffn"),
    **_linear("feedforward_{k}/output", f"{_ALBERT_LAYER}.ffn_output"),
    **_norm("feedforward_{k}/layer_norm", f"{_ALBERT_LAYER}.full_layer_layer_norm"),
    **_linear("pooler", "pooler"),
}

# Pre-training heads: (masked-LM prefix, sentence head prefix) per model type.
_HEAD_PREFIXES = {
    "bert": (
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions",
        "cls.seq_relationship",
    ),
    "albert": ("predictions.dense", "predictions.LayerNorm", "predictions", "sop_classifier.classifier"),
}


def _head_table(model_type):
    dense, norm, predictions, sentence = _HEAD_PREFIXES[model_type]
    return {
        f"{dense}.weight": ("mlm/transform/kernel", "T"),
        f"{dense}.bias": ("mlm/transform/bias", None),
        f"{norm}.weight": ("mlm/layer_norm/gamma", None),
        f"{norm}.bias": ("mlm/layer_norm/beta", None),
        f"{predictions}.bias": ("mlm/output_bias", None),
        f"{predictions}.decoder.weight": ("mlm/decoder/kernel", "T"),
        f"{sentence}.weight": ("nsp/kernel", "T"),
        f"{sentence}.bias": ("nsp/bias", None),
    }


def is_huggingface_config(config):
    return isinstance(config, dict) and "model_type" in config


def _load_safetensors(file):
    """The arrays of one safetensors file; a `ConversionError` naming it when it is damaged."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(file))
    except (AttributeError, TypeError) as e:  # A dtype NumPy lacks (float8_e4m3fn, ...): safetensors asks numpy for it.
        raise ConversionError(
            f"{file} holds tensors of a type NumPy cannot read ({e}). Save the model in float32, float16 or "
            "bfloat16 (e.g. `model.to(torch.float32).save_pretrained(...)`) and convert that."
        ) from e
    except SafetensorError as e:
        raise ConversionError(
            f"{file} ({file.stat().st_size:,} bytes) is not a readable safetensors file: {e}. It is truncated "
            "or damaged (an interrupted download?): download or save it again."
        ) from e


def _shard_files(index):
    """The safetensors files that `model.safetensors.index.json` lists."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise ConversionError(
            f"{index}: weight_map is {describe_json(weight_map)}; expected an object mapping "
            "each tensor name to the .safetensors file holding it."
        )
    outside = sorted(n for n in set(weight_map.values()) if Path(n).name != n or not n.endswith(".safetensors"))
    if outside:
        raise ConversionError(
            f"{index}: weight_map names files that are not .safetensors files beside it: {outside[:3]}. "
            "A checkpoint's shards are plain file names in its own directory (e.g. model-00001-of-00002.safetensors)."
        )
    return [index.parent / name for name in sorted(set(weight_map.values()))]


def has_weights(path):
    """Whether `path` holds a safetensors checkpoint this reader can read."""
    return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()


def _load_tensors(path):
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = _shard_files(index)
    else:
        others = [n for n in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack") if (path / n).is_file()]
        found = f" It has {', '.join(others)}, which bertzoo does not read (no PyTorch/Flax)." if others else ""
        raise ConversionError(
            f"{path} has a Hugging Face config.json but no model.safetensors (or "
            f"model.safetensors.index.json).{found} Save the model with "
            "`save_pretrained(..., safe_serialization=True)` to get a safetensors file."
        )
    tensors = {}
    for file in files:
        if not file.is_file():
            raise ConversionError(f"{file} is listed in {index.name} but missing.")
        tensors.update(_load_safetensors(file))
    return tensors


def _normalise(names, model_type):
    """Maps normalised names (no `bert.`/`albert.` prefix, LayerNorm
    `weight`/`bias` instead of the legacy `gamma`/`beta`) to the stored ones."""
    prefix = f"{model_type}."
    mapping = {}
    for name in names:
        new = name[len(prefix) :] if name.startswith(prefix) else name
        if new.endswith(".gamma"):
            new = new[: -len("gamma")] + "weight"
        elif new.endswith(".beta"):
            new = new[: -len("beta")] + "bias"
        if new in mapping:
            raise ConversionError(
                f"The checkpoint holds both {mapping[new]!r} and {name!r}, which name the same weight."
            )
        mapping[new] = name
    return mapping


def _check_encoder(hf, albert, origin):
    """Refuses configs under which Hugging Face's model is not the encoder bertzoo builds."""
    if hf["position_embedding_type"] != "absolute":
        raise ConversionError(
            f"{origin}: position_embedding_type={hf['position_embedding_type']!r} is not supported "
            "(bertzoo models use learned absolute positions)."
        )
    for option, effect in _DECODER_OPTIONS.items():
        if hf[option] and not albert:
            raise ConversionError(
                f"{origin}: {option}=true is not supported: Hugging Face's BERT then {effect}, while "
                f"bertzoo models are bidirectional encoders. bertzoo cannot convert a decoder; if these are an "
                f"encoder's weights, set {option} to false in config.json."
            )


def read(path):
    """Reads a Hugging Face BERT or ALBERT directory into a `SourceModel`."""
    path = Path(path)
    origin = f"{path / 'config.json'}"
    raw = read_json_object(path / "config.json")
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(
            f"{origin} has model_type {model_type!r}; bertzoo converts {list(SUPPORTED_MODEL_TYPES)}."
        )
    albert = model_type == "albert"
    hf = read_config(raw, CONFIG_KINDS, _defaults(albert), origin)
    _check_encoder(hf, albert, origin)
    config = {
        "vocabulary_size": hf["vocab_size"],
        "num_layers": hf["num_hidden_layers"],
        "hidden_dim": hf["hidden_size"],
        "num_heads": hf["num_attention_heads"],
        "intermediate_dim": hf["intermediate_size"],
        "activation": map_activation(hf["hidden_act"], HF_ACTIVATIONS, origin),
        "dropout": hf["hidden_dropout_prob"],
        "attention_dropout": hf["attention_probs_dropout_prob"],
        "max_sequence_length": hf["max_position_embeddings"],
        "num_segments": hf["type_vocab_size"],
        "layer_norm_epsilon": hf["layer_norm_eps"],
        "initializer_range": hf["initializer_range"],
    }
    index_fields = None
    if albert:
        embedding_dim = hf["embedding_size"]
        if embedding_dim == hf["hidden_size"]:
            raise ConversionError(
                f"{origin}: embedding_size equals hidden_size ({embedding_dim}); Hugging Face ALBERT "
                "still applies embedding_hidden_mapping_in there, which BertBackbone (no "
                "projection when embedding_dim == hidden_dim) cannot hold."
            )
        layers, groups, index_fields = albert_layout(
            hf["num_hidden_layers"], hf["num_hidden_groups"], hf["inner_group_num"], origin
        )
        config.update(num_layers=layers, num_groups=groups, shared_sublayers="all", embedding_dim=embedding_dim)

    stored = _load_tensors(path)
    names = _normalise(stored, model_type)
    tensors = {name: stored[original] for name, original in names.items()}
    display = {name: original for name, original in names.items() if name != original}

    skipped = {}
    for name in _BUFFERS:
        if name in tensors:
            del tensors[name]
            skipped[names[name]] = "a constant buffer (position/segment ids), not a weight"
    _, _, predictions, _ = _HEAD_PREFIXES[model_type]
    decoder, bias = f"{predictions}.decoder.weight", f"{predictions}.bias"
    token = tensors.get("embeddings.word_embeddings.weight")
    if decoder in tensors and token is not None and np.array_equal(tensors[decoder], token):
        del tensors[decoder]
        skipped[names[decoder]] = "tied to the token embedding (the masked-LM decoder reuses it)"
    decoder_bias = f"{predictions}.decoder.bias"
    if decoder_bias in tensors:
        if bias not in tensors:
            tensors[bias] = tensors.pop(decoder_bias)
            display[bias] = names[decoder_bias]
        elif np.array_equal(tensors[decoder_bias], tensors[bias]):
            del tensors[decoder_bias]
            skipped[names[decoder_bias]] = f"a copy of {names[bias]} (kept as mlm/output_bias)"

    tokenizer = read_tokenizer(path, raw, config, origin)
    preprocessor = {"sequence_length": default_sequence_length(config["max_sequence_length"]), **tokenizer.settings}

    return SourceModel(
        format="huggingface",
        path=str(path.resolve()),
        config=config,
        tensors=tensors,
        table=ALBERT_TABLE if albert else BERT_TABLE,
        head_table=_head_table(model_type),
        index_fields=index_fields,
        skipped=skipped,
        vocabulary=tokenizer.vocabulary,
        sentencepiece=tokenizer.sentencepiece,
        sentencepiece_options=tokenizer.sentencepiece_options,
        preprocessor=preprocessor,
        notes=tokenizer.notes,
        display=display,
    )
