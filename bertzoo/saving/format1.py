"""Reading presets written in format 1 (bertzoo before preset format 2).

Format 1's `config.json` held `class_name`, the backbone's constructor
arguments (`backbone`), the task's own arguments (`task`), text settings
(`preprocessor`: `sequence_length`, `truncate`, `lowercase`,
`strip_accents`) and, for a quantized model, `quantization`
(`{"mode": "int8", "layers": [layer paths]}`). Its `task.weights.h5` held the
whole task, backbone included. `upgrade` turns such a config (and the
definitions of the built-in presets, which have the same shape) into the
format-2 config of `bertzoo.saving.preset`; `Preset` then loads both alike,
except that a format-1 task file is read into the whole task.
"""

import functools
import warnings

import keras

from bertzoo.saving.serialization import registered_node
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.tokenizer import BertTokenizer

VOCABULARY_FILE = "vocabulary.txt"
# A `BertTokenizer`'s text options (the rest of a preprocessor's settings are the packer's).
TOKENIZER_KEYS = ("lowercase", "strip_accents", "max_chars_per_word", "split_on_cjk", "special_tokens_in_strings")


def preprocessor_node(settings=None):
    """The serialized `BertPreprocessor` for format-1 text `settings`, with
    the vocabulary kept in `vocabulary.txt`."""
    settings = dict(settings or {})
    tokenizer_config = {k: settings.pop(k) for k in TOKENIZER_KEYS if k in settings}
    tokenizer_config["vocabulary"] = VOCABULARY_FILE
    return registered_node(
        BertPreprocessor, {**settings, "tokenizer": registered_node(BertTokenizer, tokenizer_config)}
    )


@functools.cache
def _policy_mode(mode):
    """The full policy mode (e.g. "int4/128") `Model.quantize(mode)`, which
    wrote format 1's quantized presets, gives a layer."""
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(256, dtype="float32")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize(mode)
    return model.layers[-1].dtype_policy.get_config()["mode"]


def _policy_map(quantization):
    """Format 1's quantization record as the dtype policy map of format 2."""
    mode = quantization.get("mode")
    if mode not in ("int8", "int4"):
        raise ValueError(
            f"The preset was quantized with mode {mode!r}, which this bertzoo cannot rebuild "
            f"(known: {['int8', 'int4']}). Upgrade bertzoo."
        )
    base = keras.config.dtype_policy()
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=base)
    for path in quantization.get("layers") or []:
        policy_map[path] = keras.dtype_policies.get(f"{_policy_mode(mode)}_from_{base.name}")
    return keras.dtype_policies.serialize(policy_map)


def upgrade(config):
    """A format-1 config (or a built-in definition) as a format-2 config."""
    backbone_config = dict(config["backbone"])
    quantization = config.get("quantization")
    if quantization:
        backbone_config["dtype"] = _policy_map(quantization)
    # Class names only: the classes are looked up in Keras's registry when
    # the preset is built, never imported from here.
    backbone = {
        "module": "bertzoo.models.bert_backbone",
        "class_name": "BertBackbone",
        "config": backbone_config,
        "registered_name": "bertzoo>BertBackbone",
    }
    task = None
    class_name = config.get("class_name", "BertBackbone")
    if class_name != "BertBackbone" or config.get("task") is not None:
        task_config = dict(config.get("task") or {})
        if quantization:
            # Paths of the head's layers; the backbone's own entries match none of them.
            task_config["dtype"] = _policy_map(quantization)
        task = {
            "module": None,
            "class_name": class_name,
            "config": task_config,
            "registered_name": f"bertzoo>{class_name}",
        }
    settings = config.get("preprocessor")
    return {
        "format_version": 1,
        "backbone": backbone,
        "preprocessor": preprocessor_node(settings) if settings is not None else None,
        "task": task,
    }
