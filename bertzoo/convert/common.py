"""The one mapping from named arrays into a `BertBackbone`, shared by all readers.

Every reader (Hugging Face, original TF1, keras-hub) turns its checkpoint into
a `SourceModel`: a bertzoo config, the checkpoint's arrays under their own
names, and a naming table that says which source tensor holds each weight of
the model under bertzoo's *canonical* names. `build_backbone` is the single
place where arrays are checked (missing, unexpected, wrong shape) and written
into a model; `write_preset` stores the result as an ordinary preset.

Canonical names are those of `BertBackbone.named_weights()` (e.g.
`embeddings/token`, `attention_{k}/query/kernel`, `pooler/bias`; kernels are
`[in, out]`, as Keras stores them).

Pre-training heads, kept beside the model in `pretraining_heads.safetensors`:

    mlm/transform/{kernel,bias}, mlm/layer_norm/{gamma,beta}, mlm/output_bias,
    mlm/decoder/kernel   (only when not tied to embeddings/token)
    nsp/{kernel,bias}    (BERT's next-sentence / ALBERT's sentence-order head)
"""

import collections
import dataclasses
import datetime
import json
import re
from pathlib import Path

import numpy as np

from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.models.bert_pretrainer import pretraining_head_shapes
from bertzoo.saving.preset import PRETRAINING_HEADS_FILE
from bertzoo.saving.preset import save_preset
from bertzoo.text import BertTokenizer
from bertzoo.text import SentencePieceTokenizer
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.utils import private_api
from bertzoo.utils.checks import vocabulary_overflow

DEFAULT_SEQUENCE_LENGTH = 128
_LIST_LIMIT = 20

# Activation names of each source format -> bertzoo names. Hugging Face's
# "gelu" is the exact erf form and "gelu_new" the tanh one. Google's BERT
# code computed "gelu" with erf when the released BERT checkpoints were
# trained (the tanh form replaced it later), and Hugging Face loads those
# checkpoints with the exact GELU: the TF1 reader maps BERT's "gelu" to
# "gelu_exact", so one checkpoint gives the same model through either
# reader. ALBERT's code has always used the tanh form (Hugging Face's ALBERT
# configs say "gelu_new").
HF_ACTIVATIONS = {
    "gelu": "gelu_exact",
    "gelu_python": "gelu_exact",  # The same erf form, written in Python.
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}
TF1_BERT_ACTIVATIONS = {"gelu": "gelu_exact", "relu": "relu", "tanh": "tanh"}
TF1_ALBERT_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu", "tanh": "tanh"}


class ConversionError(ValueError):
    """A checkpoint that cannot be converted; the message lists every problem."""


@dataclasses.dataclass
class SourceModel:
    """A checkpoint read into memory, ready for `build_backbone`.

    Attributes:
        format: "huggingface", "tf1" or "keras_hub".
        path: where it came from (None for an in-memory keras-hub object).
        config: `BertBackbone` constructor arguments.
        tensors: every array of the checkpoint, by source name, minus `skipped`.
        table: canonical name template -> `(source name template, transform)`;
            templates of layer weights hold `{k}` (and any field that
            `index_fields(k)` returns). Transforms: None, "T" (transpose a
            PyTorch `[out, in]` matrix) or "reshape" (merge attention-head axes).
        head_table: source name -> `(canonical head name, transform)`.
        index_fields: block index -> extra template fields (e.g. ALBERT groups).
        skipped: source name -> why it is not converted (reported, not hidden).
        vocabulary: WordPiece tokens, or None.
        sentencepiece: the path of a SentencePiece model (ALBERT's
            `spiece.model` / `30k-clean.model`), its bytes, or None.
        sentencepiece_options: `SentencePieceTokenizer` options for it (see
            `bertzoo.text.albert_tokenizer_options`).
        preprocessor: preset preprocessor settings.
        notes: anything else the user should know.
        display: source name -> the name as written in the checkpoint, where
            the reader normalised it (e.g. dropped a `bert.` prefix).
    """

    format: str
    path: str
    config: dict
    tensors: dict
    table: dict
    head_table: dict = dataclasses.field(default_factory=dict)
    index_fields: object = None
    skipped: dict = dataclasses.field(default_factory=dict)
    vocabulary: list = None
    sentencepiece: object = None
    sentencepiece_options: dict = dataclasses.field(default_factory=dict)
    preprocessor: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    display: dict = dataclasses.field(default_factory=dict)

    def shown(self, name):
        """`name` as the checkpoint writes it; one it lacks (a missing
        tensor) with the prefix its other names carry (`bert.`), so that a
        missing tensor and a misspelt one read alike."""
        if name in self.display or name in self.tensors:
            return self.display.get(name, name)
        prefixes = collections.Counter(
            original[: -len(key)]
            for key, original in self.display.items()
            if original.endswith(key) and original != key
        )
        return prefixes.most_common(1)[0][0] + name if prefixes else name


@dataclasses.dataclass
class ConversionResult:
    """What `convert_checkpoint` wrote; `str()` gives a readable summary."""

    path: Path
    format: str
    source: str
    config: dict
    parameter_count: int
    heads: dict
    skipped: dict
    notes: list
    has_vocabulary: bool

    def summary(self):
        c = self.config
        lines = [
            f"Converted {self.format} checkpoint {self.source} -> {self.path}",
            f"  BertBackbone: {c['num_layers']} layers, hidden {c['hidden_dim']}, "
            f"{c['num_heads']} heads, intermediate {c['intermediate_dim']}, "
            f"vocabulary {c['vocabulary_size']}, activation {c['activation']}"
            + (f", embedding_dim {c['embedding_dim']}" if c.get("embedding_dim") else "")
            + (f", {c['num_groups']} weight group(s)" if c.get("num_groups") not in (None, c["num_layers"]) else "")
            + f" ({self.parameter_count:,} parameters)",
        ]
        if self.heads:
            lines.append(f"  pre-training heads kept in {PRETRAINING_HEADS_FILE}:")
            lines += [f"    {name} <- {source}" for name, source in self.heads.items()]
        if self.skipped:
            lines.append("  not converted:")
            lines += [f"    {name}: {reason}" for name, reason in self.skipped.items()]
        if not self.has_vocabulary:
            lines.append("  no vocabulary: pass tokenized inputs (preprocessor=None)")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __str__(self):
        return self.summary()


# --- Canonical names ---------------------------------------------------------


_BLOCK = re.compile(r"^(attention|feedforward)_(\d+)/")


def source_name(model, canonical):
    """`(source name, transform)` holding canonical weight `canonical`."""
    match = _BLOCK.match(canonical)
    if match is None:
        template, transform = model.table[canonical]
        return template, transform
    k = int(match.group(2))
    key = f"{match.group(1)}_{{k}}/{canonical[match.end() :]}"
    template, transform = model.table[key]
    fields = model.index_fields(k) if model.index_fields else {}
    return template.format(k=k, **fields), transform


def transform_array(array, transform, shape):
    array = np.asarray(array)
    if transform == "T" and array.ndim == 2:
        return np.ascontiguousarray(array.T)
    if transform == "reshape" and array.size == int(np.prod(shape)):
        return array.reshape(shape)
    return array


def canonical_to_source_shape(shape, transform):
    return tuple(reversed(shape)) if transform == "T" else tuple(shape)


# --- The one place arrays go into a model ------------------------------------


def _listing(title, items):
    items = list(items)
    if not items:
        return []
    shown = items[:_LIST_LIMIT]
    lines = [f"{title} ({len(items)}):"] + [f"  - {item}" for item in shown]
    if len(items) > len(shown):
        lines.append(f"  ... and {len(items) - len(shown)} more")
    return lines


def build_backbone(model):
    """Builds the `BertBackbone` of `model.config` and writes its weights.

    Returns `(backbone, heads, head_sources)`: the model, the pre-training
    head arrays by canonical name and their source names. Raises
    `ConversionError` listing every missing, unexpected and mis-shaped
    tensor at once.
    """

    origin = f"{model.format} checkpoint {model.path}" if model.path else f"{model.format} model"
    try:
        # Its weights come from the checkpoint: they are not drawn at random first (seconds for BERT-base).
        with private_api.fresh_layer_names(), private_api.deferred_initialization() as deferred:
            # float32 whatever the session's dtype policy: a checkpoint's values are stored as they are.
            backbone = BertBackbone(**{"dtype": "float32", **model.config})
    except ValueError as e:
        raise ConversionError(f"The config of {origin} is not a valid BertBackbone config: {e}") from e
    variables = backbone.named_weights()

    used, missing, mismatched, assignments = set(), [], [], []
    pooler = [canonical for canonical in variables if canonical.startswith("pooler/")]
    if all(source_name(model, canonical)[0] not in model.tensors for canonical in pooler):
        # Saved by a masked-LM model (Hugging Face's BertForMaskedLM builds its encoder without one): the
        # pooler keeps its fresh initialization, as Hugging Face itself does when it loads such a file.
        model.notes.append(
            "the checkpoint has no pooler (a masked-LM model saves none): pooled_output starts from a random "
            "initialization, so fine-tune before using it"
        )
        variables = {k: v for k, v in variables.items() if k not in pooler}
    for canonical, variable in variables.items():
        name, transform = source_name(model, canonical)
        if name not in model.tensors:
            missing.append(model.shown(name))
            continue
        used.add(name)
        source = np.asarray(model.tensors[name])
        array = transform_array(source, transform, tuple(variable.shape))
        if tuple(array.shape) != tuple(variable.shape):
            expected = canonical_to_source_shape(variable.shape, transform)
            mismatched.append(f"{model.shown(name)}: shape {tuple(source.shape)}, the config implies {expected}")
            continue
        assignments.append((variable, array))

    heads, head_sources = {}, {}
    expected_heads = pretraining_head_shapes(model.config)
    missing += _partial_heads(model)
    for name, (canonical, transform) in model.head_table.items():
        if name not in model.tensors:
            continue
        used.add(name)
        source = np.asarray(model.tensors[name])
        array = transform_array(source, transform, expected_heads[canonical])
        if tuple(array.shape) != expected_heads[canonical]:
            expected = canonical_to_source_shape(expected_heads[canonical], transform)
            mismatched.append(
                f"{model.shown(name)} (pre-training head): shape {tuple(source.shape)}, the config implies {expected}"
            )
            continue
        heads[canonical] = np.asarray(array, dtype="float32")
        head_sources[canonical] = model.shown(name)

    unexpected = sorted(
        f"{model.shown(name)} {tuple(np.shape(model.tensors[name]))}" for name in model.tensors if name not in used
    )
    if missing or unexpected or mismatched:
        lines = [f"Cannot convert {origin}: its tensors do not match its config."]
        lines += _listing("Missing tensors", missing)
        lines += _listing("Tensors whose shape disagrees with the config", mismatched)
        lines += _listing("Unexpected tensors (not part of this architecture)", unexpected)
        lines.append(
            "Check that the config file belongs to these weights (layer count, hidden size, "
            "vocabulary size, groups) and that the checkpoint is complete. bertzoo converts "
            "encoders and their pre-training heads, not fine-tuned task heads."
        )
        raise ConversionError("\n".join(lines))

    # A pooler the checkpoint lacks keeps its initializer's values, drawn by `fill`.
    deferred.fill(
        lambda: [v.assign(np.asarray(a, dtype=v.dtype)) for v, a in assignments],
        backbone,
        expected=[v for v, _ in assignments],
    )
    return backbone, heads, head_sources


# Head canonical names a checkpoint may leave out of a head it has: the
# masked-LM decoder is stored only when it is not tied to the token embedding.
_OPTIONAL_HEAD_ARRAYS = ("mlm/decoder/kernel",)


def _partial_heads(model):
    """The missing tensors of each pre-training head the checkpoint holds only in part.

    A head (`mlm`, `nsp`: the part of its canonical names before the `/`)
    is optional as a whole, as the pooler is: a checkpoint without any of
    its tensors converts without it. One with some of its tensors but not
    all is incomplete (a damaged or hand-edited checkpoint), so its missing
    tensors are reported with the encoder's, instead of writing a partial
    head that `BertPretrainer.load_pretraining_heads` would refuse later.
    """
    groups = {}
    for name, (canonical, _) in model.head_table.items():
        groups.setdefault(canonical.split("/", 1)[0], []).append((name, canonical))
    missing = []
    for head, members in groups.items():
        present = [name for name, _ in members if name in model.tensors]
        if not present:
            continue
        absent = [
            name for name, canonical in members if name not in model.tensors and canonical not in _OPTIONAL_HEAD_ARRAYS
        ]
        missing += [
            f"{name} (pre-training head {head!r}: the checkpoint holds {len(present)} of its tensors, "
            f"e.g. {model.shown(present[0])})"
            for name in absent
        ]
    return missing


def write_preset(model, destination, overwrite=False):
    """Converts `model` (a `SourceModel`) and writes it as a preset directory
    (through `bertzoo.saving.preset.save_preset`, like `save_to_preset`)."""

    backbone, heads, head_sources = build_backbone(model)
    tokenizer = preprocessor = None
    settings = dict(model.preprocessor)
    if model.sentencepiece is not None:
        tokenizer = SentencePieceTokenizer(model.sentencepiece, **model.sentencepiece_options)
        problem = vocabulary_overflow(
            tokenizer.vocabulary_size(), model.config["vocabulary_size"], "The SentencePiece model"
        )
        if problem:
            source = model.sentencepiece if isinstance(model.sentencepiece, (str, Path)) else model.path
            raise ConversionError(f"{source}: {problem}")
        preprocessor = BertPreprocessor(tokenizer, sequence_length=settings.get("sequence_length", 128))
    elif model.vocabulary is not None:
        tokenizer = BertTokenizer(
            model.vocabulary,
            lowercase=settings.get("lowercase", True),
            strip_accents=settings.get("strip_accents"),
        )
    metadata = {
        "source": {
            "format": model.format,
            "path": model.path,
            "converted": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "conversion": {
            "pretraining_heads": head_sources,
            "skipped": dict(model.skipped),
            "notes": list(model.notes),
        },
    }
    path = save_preset(
        destination,
        backbone,
        tokenizer=tokenizer if preprocessor is None else None,
        preprocessor=preprocessor,
        preprocessor_config=settings if tokenizer is not None and preprocessor is None else None,
        metadata=metadata,
        overwrite=overwrite,
        extra_arrays={PRETRAINING_HEADS_FILE: heads} if heads else None,
    )
    return ConversionResult(
        path=path,
        format=model.format,
        source=str(model.path) if model.path else "(in-memory model)",
        config=backbone.get_config(),
        parameter_count=int(backbone.count_params()),
        heads=head_sources,
        skipped=dict(model.skipped),
        notes=list(model.notes),
        has_vocabulary=tokenizer is not None,
    )


# --- Helpers shared by the readers -------------------------------------------


def map_activation(name, table, origin):
    """The bertzoo activation of a config's `hidden_act` under `table`.

    The name is matched case-insensitively (google-research/bert's
    `get_activation` lowercases it first: "GELU" and "Relu" are valid
    there). Raises `ConversionError` for a name `table` does not hold.
    """
    if name.lower() not in table:
        raise ConversionError(f"{origin}: hidden_act {name!r} is not supported. Supported: {', '.join(sorted(table))}.")
    return table[name.lower()]


# The entries of google-research/bert's (and /albert's) config, which Hugging
# Face kept, and the JSON type of each.
BERT_CONFIG_KINDS = {
    "vocab_size": int,
    "hidden_size": int,
    "num_hidden_layers": int,
    "num_attention_heads": int,
    "intermediate_size": int,
    "hidden_act": str,
    "hidden_dropout_prob": float,
    "attention_probs_dropout_prob": float,
    "max_position_embeddings": int,
    "type_vocab_size": int,
    "initializer_range": float,
    "embedding_size": int,
    "num_hidden_groups": int,
    "inner_group_num": int,
}

# kind -> (what a value must be, test). JSON true/false are Python bools,
# which are ints too: they are neither integers nor numbers here.
_KINDS = {
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
}
_JSON_TYPES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def describe_json(value):
    """`value` as JSON with its JSON type, for error messages: `"30522" (a string)`."""
    if value is None:
        return "null"
    text = json.dumps(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({_JSON_TYPES.get(type(value), type(value).__name__)})"


def read_json_object(path):
    """The JSON object stored in the file `path`, as a dict.

    Raises `ConversionError` naming the file when it is not valid JSON or
    holds something other than an object (`{...}`).
    """
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors.
        raise ConversionError(f"{path} is not valid JSON ({e}).") from e
    if not isinstance(value, dict):
        raise ConversionError(f"{path} holds {describe_json(value)}; expected a JSON object ({{...}}) of settings.")
    return value


def read_config(raw, kinds, defaults, origin):
    """`{key: value}` for every key of `kinds`, read from the config `raw`.

    `kinds` maps a key to the JSON type its value must have: int, float (an
    integer or a decimal number, returned as a float), str or bool. An
    absent key takes its value from `defaults`; a key without a default is
    required. Raises `ConversionError` listing every missing entry and every
    value of the wrong type at once.
    """
    values, missing, wrong = {}, [], []
    for key, kind in kinds.items():
        if key not in raw:
            if key in defaults:
                values[key] = defaults[key]
            else:
                missing.append(key)
            continue
        expected, test = _KINDS[kind]
        if test(raw[key]):
            values[key] = kind(raw[key])
        else:
            wrong.append(f"{key} is {describe_json(raw[key])}, expected {expected}")
    lines = [f"{origin} lacks the required entries {missing}."] if missing else []
    lines += _listing(f"{origin} has entries of the wrong type", wrong)
    if lines:
        raise ConversionError("\n".join(lines))
    return values


def albert_layout(num_layers, num_groups, inner_group_num, origin, float_group_index=False):
    """`(num_layers, num_groups, index_fields)` of an ALBERT encoder in bertzoo terms.

    Each group applies its `inner_group_num` (R) sub-layers in turn.
    BertBackbone shares consecutive layers, layer `i` running group
    `i // (L // G)`, as Hugging Face's and keras-hub's ALBERT do. Google's
    original code (`float_group_index=True`, the TF1 reader) runs layer `i`
    through group `int(i / L * G)`, a float product: the two agree for the
    published configs, but rounding makes them differ for some others (e.g.
    L = G = 22, where it runs layer 15 through group 14), which are refused.
    With R = 1 that is BertBackbone's sharing of consecutive layers. With
    R > 1 it is only expressible when every group runs once (L == G): then
    the L * R sub-layers are ordinary unshared layers.
    """
    if num_layers % num_groups:
        raise ConversionError(
            f"{origin}: num_hidden_layers={num_layers} is not divisible by num_hidden_groups={num_groups}."
        )
    per_group = num_layers // num_groups
    differing = [i for i in range(num_layers) if int(i / num_layers * num_groups) != i // per_group]
    if float_group_index and differing:
        i = differing[0]
        raise ConversionError(
            f"{origin}: with num_hidden_layers={num_layers} and num_hidden_groups={num_groups}, Google's ALBERT code "
            f"assigns layer {i} to group int({i} / {num_layers} * {num_groups}) = "
            f"{int(i / num_layers * num_groups)} (float rounding), not to group {i // (num_layers // num_groups)} "
            f"as the even split does ({len(differing)} layer(s) differ). bertzoo shares consecutive, equal runs "
            "of layers only, so this grouping is not supported; the published ALBERT configs are unaffected."
        )
    R = inner_group_num
    if R > 1 and num_layers != num_groups:
        raise ConversionError(
            f"{origin}: inner_group_num={R} with layers shared across groups "
            f"(num_hidden_layers={num_layers}, num_hidden_groups={num_groups}) repeats "
            "interleaved sub-layers, which BertBackbone's consecutive sharing cannot express."
        )
    layers, groups = (num_layers, num_groups) if R == 1 else (num_layers * R, num_layers * R)
    return layers, groups, (lambda k: {"g": k // R, "r": k % R})


def check_vocabulary_size(vocabulary, config, origin):
    problem = None if vocabulary is None else vocabulary_overflow(len(vocabulary), config["vocabulary_size"])
    if problem:
        raise ConversionError(f"{origin}: {problem}")


def default_sequence_length(max_sequence_length):
    return min(DEFAULT_SEQUENCE_LENGTH, int(max_sequence_length))


def dense_rules(canonical, source, transform=None, weight="kernel", bias="bias", sep="/"):
    """Table entries for a dense layer's kernel and bias."""
    return {
        f"{canonical}/kernel": (f"{source}{sep}{weight}", transform),
        f"{canonical}/bias": (f"{source}{sep}{bias}", None),
    }


def norm_rules(canonical, source, gamma="gamma", beta="beta", sep="/"):
    """Table entries for a LayerNorm's scale and offset."""
    return {
        f"{canonical}/gamma": (f"{source}{sep}{gamma}", None),
        f"{canonical}/beta": (f"{source}{sep}{beta}", None),
    }
