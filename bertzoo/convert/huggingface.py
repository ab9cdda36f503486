"""Reads Hugging Face BERT / ALBERT directories (config.json + safetensors).

Weights are read with the safetensors NumPy API, so no PyTorch is needed.
PyTorch `nn.Linear` weights are stored `[out, in]` and are transposed.
"""

import dataclasses
from pathlib import Path

import numpy as np

from bertzoo.convert.common import BERT_CONFIG_KINDS
from bertzoo.convert.common import HF_ACTIVATIONS
from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import SourceModel
from bertzoo.convert.common import albert_layout
from bertzoo.convert.common import check_vocabulary_size
from bertzoo.convert.common import default_sequence_length
from bertzoo.convert.common import dense_rules
from bertzoo.convert.common import describe_json
from bertzoo.convert.common import map_activation
from bertzoo.convert.common import norm_rules
from bertzoo.convert.common import read_config
from bertzoo.convert.common import read_json_object
from bertzoo.text import albert_tokenizer_options
from bertzoo.text import load_vocabulary
from bertzoo.text.tokenizer import SPECIAL_TOKENS

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


# The tokenizer classes whose splitting bertzoo's tokenizers reproduce, per
# model type. Another class over the same vocabulary (e.g. BertJapaneseTokenizer,
# which splits words with MeCab or into single characters) gives other ids.
_TOKENIZER_CLASSES = {
    "bert": ("BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast"),
    "albert": ("AlbertTokenizer", "AlbertTokenizerFast"),
}
# transformers' classes that run whatever `tokenizer.json` describes.
_GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
_NO_VOCABULARY = "the weights are converted without it (pass tokenized inputs, preprocessor=None)"


@dataclasses.dataclass
class _Tokenizer:
    """What `_read_tokenizer` found: a WordPiece vocabulary or a SentencePiece
    model (or neither), preprocessor settings and notes for the user."""

    vocabulary: list = None
    sentencepiece: Path = None
    sentencepiece_options: dict = dataclasses.field(default_factory=dict)
    settings: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)


def _read_tokenizer(path, model_type, config, origin):
    """The checkpoint's tokenizer: `vocab.txt` or `spiece.model`, else the
    WordPiece model of `tokenizer.json` (transformers 5 saves only that), with
    `tokenizer_config.json`'s settings and the added tokens that continue the
    vocabulary. A tokenizer bertzoo would not reproduce (another class, other
    special-token names, no basic tokenization) leaves the vocabulary out,
    with a note: its ids would differ without an error."""
    tokenizer = _Tokenizer()
    tokenizer_config = {}
    if (path / "tokenizer_config.json").is_file():
        tokenizer_config = read_json_object(path / "tokenizer_config.json")
    fast = read_json_object(path / "tokenizer.json") if (path / "tokenizer.json").is_file() else {}
    normalizer = fast.get("normalizer") if isinstance(fast.get("normalizer"), dict) else {}
    if normalizer.get("type") != "BertNormalizer":
        normalizer = {}

    def setting(name, fast_name, default):
        value = tokenizer_config.get(name)
        return normalizer.get(fast_name, default) if value is None else value

    lowercase = bool(setting("do_lower_case", "lowercase", True))
    tokenizer.settings["lowercase"] = lowercase
    if setting("strip_accents", "strip_accents", None) is not None:
        tokenizer.settings["strip_accents"] = bool(setting("strip_accents", "strip_accents", None))

    tokenizer_class = tokenizer_config.get("tokenizer_class")
    if tokenizer_class in _GENERIC_TOKENIZER_CLASSES and _is_bert_tokenizer_json(fast):
        tokenizer_class = None  # A generic class running BERT's tokenizer.json.
    if tokenizer_class is not None and tokenizer_class not in _TOKENIZER_CLASSES[model_type]:
        tokenizer.notes.append(
            f"{path / 'tokenizer_config.json'} names tokenizer_class {tokenizer_class!r}, which splits text unlike "
            f"{_TOKENIZER_CLASSES[model_type][0]} (the tokenizer bertzoo reproduces), so its vocabulary would give "
            f"other ids: {_NO_VOCABULARY}"
        )
        return tokenizer
    if tokenizer_config.get("do_basic_tokenize") is False:
        tokenizer.notes.append(
            f"{path / 'tokenizer_config.json'} sets do_basic_tokenize false (no splitting at punctuation, "
            f"no lowercasing), which bertzoo's WordPiece tokenizer does not reproduce: {_NO_VOCABULARY}"
        )
        return tokenizer

    if (path / "spiece.model").is_file() and not (path / "vocab.txt").is_file():
        tokenizer.sentencepiece = path / "spiece.model"
        tokenizer.sentencepiece_options = albert_tokenizer_options(
            lowercase, bool(tokenizer_config.get("keep_accents", False))
        )
        return tokenizer
    if (path / "vocab.txt").is_file():
        source = path / "vocab.txt"
        vocabulary = load_vocabulary(source)
    elif fast:
        source = path / "tokenizer.json"
        vocabulary = _wordpiece_vocabulary(fast, source, tokenizer.notes)
        if vocabulary is None:
            return tokenizer
    else:
        return tokenizer
    if setting("tokenize_chinese_chars", "handle_chinese_chars", None) is not None:
        tokenizer.settings["split_on_cjk"] = bool(setting("tokenize_chinese_chars", "handle_chinese_chars", None))
    vocabulary = _with_added_tokens(vocabulary, source, _added_tokens(path, fast, vocabulary), tokenizer.notes)
    missing = [token for token in SPECIAL_TOKENS if token not in set(vocabulary)]
    if missing:
        tokenizer.notes.append(
            f"{source} lacks {', '.join(missing)}, which bertzoo's WordPiece tokenizer needs: {_NO_VOCABULARY}. "
            "To convert the vocabulary too, rename the checkpoint's own special tokens to "
            f"{', '.join(SPECIAL_TOKENS)} in place (same lines, so every id stays)."
        )
        return tokenizer
    check_vocabulary_size(vocabulary, config, origin)
    tokenizer.vocabulary = vocabulary
    return tokenizer


def _is_bert_tokenizer_json(fast):
    """Whether `tokenizer.json` describes BERT's tokenizer: its normalizer,
    pre-tokenizer and WordPiece model."""
    parts = [
        fast.get(key) if isinstance(fast.get(key), dict) else {} for key in ("normalizer", "pre_tokenizer", "model")
    ]
    return [part.get("type") for part in parts] == ["BertNormalizer", "BertPreTokenizer", "WordPiece"]


def _wordpiece_vocabulary(fast, source, notes):
    """The vocabulary of `tokenizer.json`'s WordPiece model, in id order, or
    None (with a note) for another model or a vocabulary with gaps."""
    model = fast.get("model") if isinstance(fast.get("model"), dict) else {}
    vocab = model.get("vocab")
    if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##":
        kind = model.get("type") if isinstance(model.get("type"), str) else None
        hint = " (ALBERT's SentencePiece model is read from spiece.model: copy it beside config.json)"
        notes.append(
            f"{source} holds {f'a {kind}' if kind else 'no known'} tokenizer model, not BERT's WordPiece with "
            "'##' continuations"
            f"{hint if kind == 'Unigram' else ''}: {_NO_VOCABULARY}"
        )
        return None
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        notes.append(f"{source}: the WordPiece vocabulary's ids are not 0, 1, ..., n-1 without gaps: {_NO_VOCABULARY}")
        return None
    return sorted(vocab, key=vocab.get)


def _added_tokens(path, fast, vocabulary):
    """`{token: id}` of the tokens Hugging Face added beyond the vocabulary
    (`added_tokens.json`, or `tokenizer.json`'s added_tokens)."""
    added = {}
    if (path / "added_tokens.json").is_file():
        added = read_json_object(path / "added_tokens.json")
    elif isinstance(fast.get("added_tokens"), list):
        added = {t.get("content"): t.get("id") for t in fast["added_tokens"] if isinstance(t, dict)}
    size = len(vocabulary)
    return {
        token: i
        for token, i in added.items()
        if isinstance(token, str) and not (isinstance(i, int) and i < size and vocabulary[i] == token)
    }


def _with_added_tokens(vocabulary, source, added, notes):
    """`vocabulary` with the `added` tokens appended when their ids continue it."""
    if not added:
        return vocabulary
    size = len(vocabulary)
    ids = sorted(i for i in added.values() if isinstance(i, int) and not isinstance(i, bool))
    shown = ", ".join(repr(t) for t in list(added)[:5]) + (", ..." if len(added) > 5 else "")
    if ids != list(range(size, size + len(added))) or set(added) & set(vocabulary):
        notes.append(
            f"the added tokens ({shown}) do not take the ids after {source}'s last one ({size - 1}), so they "
            "are not converted: bertzoo tokenizes them as ordinary text"
        )
        return vocabulary
    span = f"id {size}" if len(added) == 1 else f"ids {size}-{size + len(added) - 1}"
    notes.append(
        f"the added tokens ({shown}) take {span} after {source}'s: "
        "bertzoo matches them as whole words of the normalised text (lowercased when the vocabulary is, split "
        "at spaces and punctuation), where Hugging Face matches them anywhere in the raw text"
    )
    return vocabulary + sorted(added, key=added.get)


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

    tokenizer = _read_tokenizer(path, model_type, config, origin)
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
