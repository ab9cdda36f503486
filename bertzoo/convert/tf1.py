"""Reads original TF1 checkpoints of google-research/bert and /albert.

A directory holds `bert_config.json` (or `albert_config.json`), a checkpoint
(`bert_model.ckpt.index` + `.data-*`: the one its `checkpoint` file names, or
else its single `*.index`) and, for BERT, `vocab.txt`. Kernels are already `[in, out]`. Optimizer slots (`adam_m`,
`adam_v`) and `global_step` are skipped; the masked-LM and next-sentence
(ALBERT: sentence-order) heads under `cls/` are kept.

BERT's `"hidden_act": "gelu"` becomes the exact (erf) GELU, which Google's
BERT code computed when the released checkpoints were trained and which
Hugging Face loads them with; ALBERT's becomes the tanh approximation its
code uses. Whether a WordPiece vocabulary is cased is read from `vocab.txt`
(uppercase letters in its ordinary tokens), the directory name
(`cased_...`, `uncased_...`) deciding only when the vocabulary cannot tell.
"""

import contextlib
import re
from pathlib import Path

from bertzoo.convert.common import BERT_CONFIG_KINDS
from bertzoo.convert.common import TF1_ALBERT_ACTIVATIONS
from bertzoo.convert.common import TF1_BERT_ACTIVATIONS
from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import SourceModel
from bertzoo.convert.common import albert_layout
from bertzoo.convert.common import check_vocabulary_size
from bertzoo.convert.common import default_sequence_length
from bertzoo.convert.common import dense_rules
from bertzoo.convert.common import map_activation
from bertzoo.convert.common import norm_rules
from bertzoo.convert.common import read_config
from bertzoo.convert.common import read_json_object
from bertzoo.text import albert_tokenizer_options
from bertzoo.text import load_vocabulary
from bertzoo.utils.optional import tf

CONFIG_FILES = ("bert_config.json", "albert_config.json")
OPTIMIZER_SLOTS = ("adam_m", "adam_v")
CONFIG_KINDS = {**BERT_CONFIG_KINDS, "net_structure_type": int}
# The defaults of google-research/bert's BertConfig (and /albert's AlbertConfig,
# which differs in type_vocab_size: ALBERT_CONFIG_DEFAULTS).
CONFIG_DEFAULTS = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 16,
    "initializer_range": 0.02,
    "embedding_size": None,  # ALBERT: the hidden size.
    "num_hidden_groups": 1,
    "inner_group_num": 1,
    "net_structure_type": 0,
}
ALBERT_CONFIG_DEFAULTS = {**CONFIG_DEFAULTS, "type_vocab_size": 2}

_EMBEDDINGS = {
    "embeddings/token": ("bert/embeddings/word_embeddings", None),
    "embeddings/position": ("bert/embeddings/position_embeddings", None),
    "embeddings/segment": ("bert/embeddings/token_type_embeddings", None),
    **norm_rules("embeddings/layer_norm", "bert/embeddings/LayerNorm"),
}
_POOLER = dense_rules("pooler", "bert/pooler/dense")

_LAYER = "bert/encoder/layer_{k}"
BERT_TABLE = {
    **_EMBEDDINGS,
    **dense_rules("attention_{k}/query", f"{_LAYER}/attention/self/query"),
    **dense_rules("attention_{k}/key", f"{_LAYER}/attention/self/key"),
    **dense_rules("attention_{k}/value", f"{_LAYER}/attention/self/value"),
    **dense_rules("attention_{k}/output", f"{_LAYER}/attention/output/dense"),
    **norm_rules("attention_{k}/layer_norm", f"{_LAYER}/attention/output/LayerNorm"),
    **dense_rules("feedforward_{k}/intermediate", f"{_LAYER}/intermediate/dense"),
    **dense_rules("feedforward_{k}/output", f"{_LAYER}/output/dense"),
    **norm_rules("feedforward_{k}/layer_norm", f"{_LAYER}/output/LayerNorm"),
    **_POOLER,
}

_INNER = "bert/encoder/transformer/group_{g}/inner_group_{r}"
ALBERT_TABLE = {
    **_EMBEDDINGS,
    **dense_rules("embeddings/projection", "bert/encoder/embedding_hidden_mapping_in"),
    **dense_rules("attention_{k}/query", f"{_INNER}/attention_1/self/query"),
    **dense_rules("attention_{k}/key", f"{_INNER}/attention_1/self/key"),
    **dense_rules("attention_{k}/value", f"{_INNER}/attention_1/self/value"),
    **dense_rules("attention_{k}/output", f"{_INNER}/attention_1/output/dense"),
    **norm_rules("attention_{k}/layer_norm", f"{_INNER}/LayerNorm"),
    **dense_rules("feedforward_{k}/intermediate", f"{_INNER}/ffn_1/intermediate/dense"),
    **dense_rules("feedforward_{k}/output", f"{_INNER}/ffn_1/intermediate/output/dense"),
    **norm_rules("feedforward_{k}/layer_norm", f"{_INNER}/LayerNorm_1"),
    **_POOLER,
}

HEAD_TABLE = {
    "cls/predictions/transform/dense/kernel": ("mlm/transform/kernel", None),
    "cls/predictions/transform/dense/bias": ("mlm/transform/bias", None),
    "cls/predictions/transform/LayerNorm/gamma": ("mlm/layer_norm/gamma", None),
    "cls/predictions/transform/LayerNorm/beta": ("mlm/layer_norm/beta", None),
    "cls/predictions/output_bias": ("mlm/output_bias", None),
    # Stored [2, hidden] (it is used with transpose_b=True).
    "cls/seq_relationship/output_weights": ("nsp/kernel", "T"),
    "cls/seq_relationship/output_bias": ("nsp/bias", None),
}


def find_config(path):
    for name in CONFIG_FILES:
        if (path / name).is_file():
            return path / name
    return None


def find_checkpoint(path):
    """The checkpoint prefix in `path`, or None when there is none.

    A `checkpoint` file (TF's Saver writes one) names the prefix. The Saver
    records it as an absolute path, which in a copied or moved directory is
    the original's: then the prefix of the same name in `path` is used.
    A checkpoint outside `path` is never read.
    """

    recorded = _recorded_prefix(path)
    if recorded is not None:
        return _prefix_in(path, recorded)
    indexes = sorted(path.glob("*.index"))
    if len(indexes) > 1:
        raise ConversionError(
            f"{path} holds several TF checkpoints ({', '.join(p.name for p in indexes)}); "
            "keep one, or add a `checkpoint` file naming the one to convert."
        )
    return str(indexes[0])[: -len(".index")] if indexes else None


def _recorded_prefix(path):
    """The prefix that the `checkpoint` file in `path` names (joined to `path`
    when relative), or None when there is no such file (or TF ignores it)."""
    if not (path / "checkpoint").is_file():
        return None
    try:
        state = tf.train.get_checkpoint_state(str(path))
    except ValueError as e:  # No model_checkpoint_path, or not text (UnicodeDecodeError).
        raise ConversionError(
            f"{path / 'checkpoint'} is not a TF checkpoint state file naming a checkpoint ({e}). Correct it, "
            f"or delete it: then bertzoo converts the one *.index checkpoint in {path}."
        ) from e
    return Path(state.model_checkpoint_path) if state else None


def _prefix_in(path, recorded):
    """`recorded` when it lies in `path`, else the prefix of the same name in `path`.

    Raises `ConversionError` when `path` has no such checkpoint.
    """
    inside = recorded.resolve().is_relative_to(path.resolve())
    prefix = recorded if inside else path / recorded.name
    if Path(f"{prefix}.index").is_file():
        return str(prefix)
    record = path / "checkpoint"
    if inside:
        problem = f"{record} names the checkpoint {recorded}, but {recorded}.index does not exist."
    else:
        problem = (
            f"{record} names the checkpoint {recorded}, outside {path} (the directory was copied or moved "
            f"from where it was saved), and {path} has no {recorded.name}.index of its own; bertzoo reads "
            f"only checkpoints inside {path}."
        )
    found = ", ".join(p.name for p in sorted(path.glob("*.index"))) or "none"
    raise ConversionError(
        f"{problem} Checkpoints in {path}: {found}. Put the checkpoint's .index and .data-* files in {path}, "
        f"or correct or delete {record} so that it names one there."
    )


@contextlib.contextmanager
def _damage_reported(prefix):
    """Turns TF's errors on reading a damaged checkpoint into a `ConversionError` naming its files."""
    try:
        yield
    except tf.errors.OpError as e:
        prefix = Path(prefix)
        shards = sorted(p.name for p in prefix.parent.glob(f"{prefix.name}.data-*"))
        files = ", ".join([f"{prefix.name}.index", *shards]) if shards else f"{prefix.name}.index, no .data-* shard"
        raise ConversionError(
            f"Cannot read the TF checkpoint {prefix} ({files}): {e.message}. Its files are damaged or "
            "incomplete (a truncated copy or download, or a missing shard); a complete checkpoint has its "
            ".index file and every .data-NNNNN-of-NNNNN shard: copy them again."
        ) from e


# Special tokens of a WordPiece vocabulary: [CLS], [unused0], [PAD], ...
_BRACKETED = re.compile(r"^\[[^\]]*\]$")


def vocabulary_is_cased(vocabulary):
    """Whether a WordPiece vocabulary keeps case: some ordinary token (not a
    bracketed special such as `[CLS]` or `[unused0]`) has an uppercase
    letter. An uncased vocabulary was built from lowercased text and has none."""
    return any(not _BRACKETED.match(token) and token.lower() != token for token in vocabulary)


def _lowercase(path, vocabulary, notes):
    """Whether the tokenizer of the checkpoint in `path` lowercases its text.

    A vocabulary with uppercase tokens is cased, whatever the directory is
    called (it may have been renamed). One without can belong to either
    (a small or non-Latin vocabulary), so the directory name decides:
    Google's say "cased_..." or "uncased_..." (BERT); ALBERT and unnamed
    ones are uncased. Disagreements and guesses are added to `notes`.
    """
    name = path.resolve().name.lower()
    named = "cased" if "cased" in name and "uncased" not in name else "uncased" if "uncased" in name else None
    if vocabulary is None:
        return named != "cased"
    if vocabulary_is_cased(vocabulary):
        if named == "uncased":
            notes.append(
                f"lowercase=False: vocab.txt has uppercase tokens, so the model is cased, although the directory "
                f"name {path.resolve().name!r} says uncased (renamed?)."
            )
        return False
    if named == "cased":
        notes.append(
            f"lowercase=False taken from the directory name {path.resolve().name!r}, although vocab.txt has no "
            "uppercase tokens: if the model is uncased, set the preprocessor's lowercase=True."
        )
        return False
    if named is None:
        notes.append(
            "lowercase=True assumed (vocab.txt has no uppercase tokens and the directory name does not say "
            "cased/uncased)."
        )
    return True


def read(path):
    """Reads an original BERT or ALBERT TF1 checkpoint directory into a `SourceModel`."""

    path = Path(path)
    config_path = find_config(path)
    if config_path is None:
        raise ConversionError(f"{path} has no {' or '.join(CONFIG_FILES)}.")
    origin = str(config_path)
    prefix = find_checkpoint(path)
    if prefix is None:
        raise ConversionError(
            f"{path} has {config_path.name} but no TF checkpoint (e.g. bert_model.ckpt.index "
            "and bert_model.ckpt.data-00000-of-00001)."
        )
    raw = read_json_object(config_path)
    with _damage_reported(prefix):
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
    if any(name.endswith(".ATTRIBUTES/VARIABLE_VALUE") for name in shapes):
        raise ConversionError(
            f"{prefix} is an object-based TF2 checkpoint (e.g. TF Model Garden), not an original "
            "TF1 BERT/ALBERT checkpoint (variables like bert/encoder/layer_0/...); bertzoo does "
            "not read that layout."
        )
    albert = (
        config_path.name == "albert_config.json"
        or "embedding_size" in raw
        or any(name.startswith("bert/encoder/transformer/") for name in shapes)
    )
    values = read_config(raw, CONFIG_KINDS, ALBERT_CONFIG_DEFAULTS if albert else CONFIG_DEFAULTS, origin)
    if values["net_structure_type"] != 0:
        raise ConversionError(f"{origin}: net_structure_type={values['net_structure_type']} is not supported.")
    config = {
        "vocabulary_size": values["vocab_size"],
        "num_layers": values["num_hidden_layers"],
        "hidden_dim": values["hidden_size"],
        "num_heads": values["num_attention_heads"],
        "intermediate_dim": values["intermediate_size"],
        "activation": map_activation(
            values["hidden_act"], TF1_ALBERT_ACTIVATIONS if albert else TF1_BERT_ACTIVATIONS, origin
        ),
        "dropout": values["hidden_dropout_prob"],
        "attention_dropout": values["attention_probs_dropout_prob"],
        "max_sequence_length": values["max_position_embeddings"],
        "num_segments": values["type_vocab_size"],
        # tf.contrib.layers.layer_norm, used by both code bases, fixes epsilon at 1e-12.
        "layer_norm_epsilon": 1e-12,
        "initializer_range": values["initializer_range"],
    }
    index_fields = None
    if albert:
        embedding_dim = values["hidden_size"] if values["embedding_size"] is None else values["embedding_size"]
        layers, groups, index_fields = albert_layout(
            values["num_hidden_layers"],
            values["num_hidden_groups"],
            values["inner_group_num"],
            origin,
            float_group_index=True,
        )
        config.update(
            num_layers=layers,
            num_groups=groups,
            shared_sublayers="all",
            # ALBERT's code adds embedding_hidden_mapping_in only when E != H.
            embedding_dim=None if embedding_dim == values["hidden_size"] else embedding_dim,
        )

    tensors, slots = {}, []
    with _damage_reported(prefix):
        for name in sorted(shapes):
            if name == "global_step" or name.rsplit("/", 1)[-1] in OPTIMIZER_SLOTS:
                slots.append(name)
            else:
                tensors[name] = reader.get_tensor(name)
    skipped = {}
    if slots:
        skipped[f"{len(slots)} optimizer variables (*/adam_m, */adam_v, global_step)"] = (
            "training state, not model weights"
        )

    vocabulary, sentencepiece, notes = None, None, []
    if not albert and values["hidden_act"].lower() == "gelu":
        notes.append(
            'hidden_act "gelu" converted to the exact (erf) GELU: Google\'s BERT code computed it so when the '
            "released checkpoints were trained (the tanh approximation came later; ALBERT uses it), and Hugging "
            "Face loads them with it, so both converters give the same model."
        )
    if (path / "vocab.txt").is_file():
        vocabulary = load_vocabulary(path / "vocab.txt")
        check_vocabulary_size(vocabulary, config, origin)
    else:
        models = sorted(path.glob("*.model"))
        if len(models) > 1:
            raise ConversionError(
                f"{origin}: several SentencePiece models ({', '.join(m.name for m in models)}); keep the one the "
                "checkpoint was trained with (ALBERT's is 30k-clean.model)."
            )
        sentencepiece = models[0] if models else None
    lowercase = _lowercase(path, vocabulary, notes)

    return SourceModel(
        format="tf1",
        path=str(path.resolve()),
        config=config,
        tensors=tensors,
        table=ALBERT_TABLE if albert else BERT_TABLE,
        head_table=HEAD_TABLE,
        index_fields=index_fields,
        skipped=skipped,
        vocabulary=vocabulary,
        sentencepiece=sentencepiece,
        sentencepiece_options=albert_tokenizer_options() if sentencepiece is not None else {},
        preprocessor={
            "sequence_length": default_sequence_length(config["max_sequence_length"]),
            "lowercase": lowercase,
        },
        notes=notes,
    )
