"""`convert_checkpoint`: recognise a checkpoint's layout and write a preset."""

import os
from pathlib import Path

from bertzoo.convert import huggingface
from bertzoo.convert import keras_hub
from bertzoo.convert import tf1
from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import read_json_object
from bertzoo.convert.common import write_preset
from bertzoo.saving.atomic import occupied
from bertzoo.saving.preset import check_preset_target

FORMATS = ("huggingface", "tf1", "keras_hub")

_LAYOUTS = (
    "  - Hugging Face: config.json (model_type bert or albert), model.safetensors, vocab.txt\n"
    "  - original TF1 BERT/ALBERT: bert_config.json or albert_config.json, a checkpoint "
    "(bert_model.ckpt.index + .data-*), vocab.txt\n"
    "  - keras-hub preset: config.json naming keras_hub BertBackbone/AlbertBackbone, "
    "model.weights.h5 (or pass a keras-hub backbone object)"
)


def detect_format(path):
    """Returns "huggingface", "tf1" or "keras_hub" for a checkpoint directory.

    Raises `FileNotFoundError` when `path` does not exist, and
    `ConversionError` when it is a file, a directory of none of these
    layouts, or its `config.json` is not a JSON object.
    """
    path = Path(path).expanduser()
    if not path.exists():
        prefix = path.with_name(path.name + ".index").is_file()
        hint = f" It is a TF checkpoint prefix: pass its directory, {path.parent}." if prefix else ""
        raise FileNotFoundError(f"Checkpoint directory {path} does not exist.{hint}")
    if not path.is_dir():
        raise ConversionError(
            f"{path} is a file; conversion expects the checkpoint's directory. "
            f"Expected one of these layouts:\n{_LAYOUTS}"
        )
    if (path / "config.json").is_file():
        config = read_json_object(path / "config.json")
        if keras_hub.is_keras_hub_config(config):
            return "keras_hub"
        if huggingface.is_huggingface_config(config):
            if not huggingface.has_weights(path) and tf1.find_config(path) and tf1.find_checkpoint(path):
                return "tf1"  # Hugging Face's config beside the original checkpoint (and a pytorch_model.bin).
            return "huggingface"
        if "format_version" in config and "backbone" in config:
            raise ConversionError(
                f"{path} is already a bertzoo preset: load it with from_preset(), no conversion needed."
            )
        if {"hidden_size", "num_hidden_layers", "vocab_size"} <= set(config) and tf1.find_config(path) is None:
            raise ConversionError(
                f"{path / 'config.json'} looks like a Hugging Face config but has no model_type. Add "
                '"model_type": "bert" (or "albert" for an ALBERT checkpoint) to it and convert again.'
            )
    if tf1.find_config(path) is not None:
        return "tf1"
    entries = sorted(p.name for p in path.iterdir())
    shown = ", ".join(entries[:12]) + (f", ... ({len(entries)} entries)" if len(entries) > 12 else "")
    raise ConversionError(
        f"{path} is not a checkpoint bertzoo can convert (it holds: {shown or 'nothing'}). "
        f"Expected one of these layouts:\n{_LAYOUTS}"
    )


def read_checkpoint(source):
    """Reads `source` into a `SourceModel` (see `convert_checkpoint`)."""
    if not isinstance(source, (str, os.PathLike)):
        return keras_hub.read(source)
    path = Path(source).expanduser()
    return {"huggingface": huggingface.read, "tf1": tf1.read, "keras_hub": keras_hub.read}[detect_format(path)](path)


def convert_checkpoint(source, destination, overwrite=False):
    """Converts a checkpoint into a bertzoo preset directory.

    `source` is a directory in one of three layouts, found automatically:
    Hugging Face (`config.json` with model_type bert/albert,
    `model.safetensors`, `vocab.txt`), an original TF1 BERT/ALBERT checkpoint
    (`bert_config.json`/`albert_config.json`, `bert_model.ckpt.*`, `vocab.txt`)
    or a keras-hub preset; or a keras-hub `BertBackbone`/`AlbertBackbone`
    object. The preset is written atomically, records its source and
    conversion date in `metadata.json`, and keeps pre-training heads found
    in the checkpoint in `pretraining_heads.safetensors`.

    Returns a `ConversionResult`; `print()` it for a summary.

    Raises:
        ConversionError (a ValueError): the source is none of the layouts, or
            its tensors do not match its config (the message lists every
            missing, unexpected and mis-shaped tensor).
        FileExistsError: `destination` exists and `overwrite` is False; or
            it is a file, a symbolic link, a mount point or a directory that
            is neither empty nor a bertzoo preset (refused before the
            checkpoint is read).

    Example:
    ```python
    result = bertzoo.convert_checkpoint("all-MiniLM-L6-v2", "presets_out/minilm")
    model = bertzoo.BertClassifier.from_preset("presets_out/minilm", num_classes=2)
    ```
    """
    destination = Path(destination).expanduser()
    check_preset_target(destination)  # Before reading the checkpoint: what no save could replace.
    if occupied(destination) and not overwrite:
        raise FileExistsError(f"{destination} already exists. Pass overwrite=True (CLI: --overwrite) to replace it.")
    return write_preset(read_checkpoint(source), destination, overwrite=overwrite)
