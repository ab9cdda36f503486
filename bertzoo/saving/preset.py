"""Reading and writing bertzoo presets.

A preset is either a built-in name (a definition in the top-level `presets/`
folder: architecture and tokenizer settings, no weights) or a directory:

    config.json         {"format_version": 2, "backbone": ..., "preprocessor": ...,
                        "task": ...}: Keras-serialized objects
                        (`keras.saving.serialize_keras_object`); "task" is the
                        task's config without its backbone and preprocessor
                        (null in a backbone preset). A quantized model's
                        backbone and task configs carry a `DTypePolicyMap`
                        (layer path -> int8/int4 policy) as their `dtype`.
                        The tokenizer's `vocabulary` is "vocabulary.txt".
    model.weights.h5    backbone weights
    task.weights.h5     the task's own (head) weights, without the backbone's
                        (task presets only)
    vocabulary.txt      one WordPiece token per line
    metadata.json       versions, parameter count, source, date, weight checksums
    *.safetensors       optional named arrays beside the model (e.g. the
                        pre-training heads of a converted checkpoint)

Loading only reads JSON, text and HDF5 arrays: no pickle, no code execution.
Classes named in `config.json` must be registered bertzoo classes or Keras
built-ins (see `bertzoo.saving.serialization`), never imported by name.
Presets written in format 1 load too (`bertzoo.saving.format1`).
"""

import copy
import datetime
import difflib
import hashlib
import importlib.resources
import json
import logging
import warnings
from pathlib import Path

import keras

from bertzoo.saving import format1
from bertzoo.saving.atomic import atomic_directory
from bertzoo.saving.serialization import deserialize
from bertzoo.saving.serialization import policy_map_modes
from bertzoo.saving.serialization import retarget_policy_map
from bertzoo.saving.serialization import serialize
from bertzoo.text import vocabulary as vocabulary_lib
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.utils.private_api import flatten_layers
from bertzoo.utils.private_api import load_weights_only
from bertzoo.utils.private_api import save_weights_only
from bertzoo.version import __version__

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
VOCABULARY_FILE = "vocabulary.txt"
METADATA_FILE = "metadata.json"
PRETRAINING_HEADS_FILE = "pretraining_heads.safetensors"
FORMAT_VERSION = 2

_warned_random_init = set()
logger = logging.getLogger("bertzoo")


def _builtin_dir():
    try:
        return importlib.resources.files("bertzoo.builtin_presets")
    except ModuleNotFoundError:  # Running from a source checkout, not installed.
        return Path(__file__).resolve().parents[2] / "presets"


def builtin_presets():
    """Returns `{name: definition}` for every built-in preset."""
    presets = {}
    for entry in _builtin_dir().iterdir():
        if entry.name.endswith(".json"):
            presets[entry.name[: -len(".json")]] = json.loads(entry.read_text())
    return dict(sorted(presets.items(), key=lambda kv: kv[1].get("order", 0)))


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Preset:
    """A resolved preset: a built-in definition or a directory on disk.

    `config` is the preset's format-2 config (a format-1 file or a built-in
    definition is read into one).

    Example:
    ```python
    preset = Preset.resolve("tiny")
    backbone = preset.build_backbone()
    ```
    """

    def __init__(self, name, config, directory=None, metadata=None):
        self.name = name
        self.config = config
        self.directory = directory
        self.metadata = metadata or {}

    # --- Resolution -------------------------------------------------------
    @classmethod
    def resolve(cls, preset):
        if isinstance(preset, Preset):
            return preset
        path = Path(str(preset)).expanduser()
        if path.is_dir():
            return cls._from_directory(path)
        builtins = builtin_presets()
        if str(preset) in builtins:
            return cls(str(preset), format1.upgrade(builtins[str(preset)]))
        hint = difflib.get_close_matches(str(preset), list(builtins), n=3)
        suggestion = f" Did you mean {', '.join(repr(h) for h in hint)}?" if hint else ""
        raise ValueError(
            f"Unknown preset {str(preset)!r}: it is not a directory and not a built-in "
            f"preset.{suggestion} Built-in presets: {', '.join(builtins)}."
        )

    @classmethod
    def _from_directory(cls, path):
        config_path = path / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{path} is not a bertzoo preset: {CONFIG_FILE} is missing. A preset "
                f"directory holds {CONFIG_FILE}, {BACKBONE_WEIGHTS_FILE}, {VOCABULARY_FILE} "
                f"and {METADATA_FILE} (write one with save_to_preset or convert_checkpoint)."
            )
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_path} is not valid JSON ({e}); the preset is damaged.") from e
        version = config.get("format_version", 1)
        for key in ("class_name", "backbone") if version == 1 else ("backbone",):
            if key not in config:
                raise ValueError(f"{config_path} has no {key!r} entry; the preset is damaged.")
        if version > FORMAT_VERSION:
            raise ValueError(
                f"{path} was written by a newer bertzoo (format {config['format_version']}); "
                f"this bertzoo {__version__} reads format {FORMAT_VERSION}. Upgrade bertzoo."
            )
        if version == 1:
            config = format1.upgrade(config)
        metadata = {}
        if (path / METADATA_FILE).is_file():
            metadata = json.loads((path / METADATA_FILE).read_text())
        return cls(str(path), config, directory=path, metadata=metadata)

    # --- Contents ---------------------------------------------------------
    @property
    def format_version(self):
        return self.config.get("format_version", FORMAT_VERSION)

    @property
    def class_name(self):
        """The class of the saved model ("BertClassifier", "BertBackbone", ...)."""
        return (self.config.get("task") or self.config["backbone"])["class_name"]

    def model_class(self):
        """The registered bertzoo class of the saved model (looked up in
        Keras's registry, never imported)."""
        node = self.config.get("task") or self.config["backbone"]
        registered = node.get("registered_name") or ""
        cls = keras.saving.get_registered_object(registered) if registered.startswith("bertzoo>") else None
        if cls is None or not getattr(cls, "__module__", "").startswith("bertzoo."):
            raise ValueError(f"{self.name} holds a {self.class_name}, which this bertzoo cannot build.")
        return cls

    @property
    def backbone_config(self):
        """The backbone's architecture: its constructor arguments without
        `name`, `trainable` and `dtype` (see `quantization`)."""
        config = dict(self.config["backbone"]["config"])
        for key in ("name", "trainable", "dtype"):
            config.pop(key, None)
        return config

    @property
    def head_config(self):
        """The task's own constructor arguments (its config without backbone,
        preprocessor, name and trainable); {} for a backbone preset. A
        quantized head's `dtype` is a `DTypePolicyMap`."""
        task = self.config.get("task")
        config = dict(task["config"]) if task else {}
        for key in ("name", "trainable", "backbone", "preprocessor"):
            config.pop(key, None)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = deserialize(config["dtype"], f"{self.name}'s config")
        return config

    @property
    def quantization(self):
        """`{"mode": "int8", "layers": [quantized layer paths]}` of a
        quantized preset (from its dtype policy maps), or None."""
        modes = {}
        for node in (self.config["backbone"], self.config.get("task")):
            dtype = (node or {}).get("config", {}).get("dtype")
            if isinstance(dtype, dict) and dtype.get("class_name") == "DTypePolicyMap":
                modes.update(policy_map_modes(deserialize(dtype, f"{self.name}'s config")))
        if not modes:
            return None
        kinds = sorted(set(modes.values()))
        return {"mode": kinds[0] if len(kinds) == 1 else kinds, "layers": sorted(modes)}

    def build_backbone(self, **overrides):
        """Builds the backbone from the saved config, `overrides` replacing
        entries. Its precision is `dtype` (default: Keras's global policy),
        as in format 1; a quantized preset's layers are built quantized."""
        node = copy.deepcopy(self.config["backbone"])
        config = node["config"]
        saved_dtype = config.pop("dtype", None)
        for key in ("name", "trainable"):
            config.pop(key, None)
        dtype = overrides.pop("dtype", None)
        if isinstance(saved_dtype, dict) and saved_dtype.get("class_name") == "DTypePolicyMap":
            policy_map = retarget_policy_map(deserialize(saved_dtype, f"{self.name}'s config"), dtype)
            config["dtype"] = keras.dtype_policies.serialize(policy_map)
        elif dtype is not None:
            config["dtype"] = dtype if isinstance(dtype, str) else keras.dtype_policies.serialize(dtype)
        config.update(overrides)
        return deserialize(node, f"{self.name}'s config")

    def vocabulary(self):
        """The preset's vocabulary as a list of tokens."""
        size = self.backbone_config["vocabulary_size"]
        if self.directory is None:
            return vocabulary_lib.builtin_vocabulary(size)
        path = self.directory / VOCABULARY_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: preset {self.name!r} has no vocabulary, so it cannot "
                "tokenize text. Pass tokenized inputs with preprocessor=None, or add the "
                "vocabulary.txt the model was trained with."
            )
        tokens = vocabulary_lib.load_vocabulary(path)
        if len(tokens) != size:
            raise ValueError(
                f"{path} has {len(tokens)} tokens but the model's embedding table has "
                f"vocabulary_size={size} rows: the vocabulary does not belong to this model."
            )
        return tokens

    def build_preprocessor(self, **overrides):
        """Builds the saved `BertPreprocessor` (default settings when the
        preset has none) with the preset's vocabulary; `overrides` replace its
        or its tokenizer's settings (`sequence_length`, `lowercase`, ...)."""
        node = copy.deepcopy(self.config.get("preprocessor") or format1.preprocessor_node())
        tokenizer = node["config"]["tokenizer"]
        for key, value in overrides.items():
            (tokenizer if key in format1.TOKENIZER_KEYS else node)["config"][key] = value
        if tokenizer["config"].get("vocabulary") == VOCABULARY_FILE:
            tokenizer["config"]["vocabulary"] = self.vocabulary()
        return deserialize(node, f"{self.name}'s config")

    # --- Weights ----------------------------------------------------------
    def _weights_path(self, filename):
        path = self.directory / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: preset {self.name!r} is incomplete.")
        expected = self.metadata.get("files", {}).get(filename)
        if expected:
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise ValueError(
                    f"{path} is {size} bytes but the preset recorded {expected['bytes']}: "
                    "the file is truncated or was modified. Re-save or re-download the preset."
                )
            if sha256_of(path) != expected["sha256"]:
                raise ValueError(
                    f"{path} does not match the checksum recorded in {METADATA_FILE}: "
                    "the file is damaged or was modified. Re-save the preset."
                )
        return path

    def has_weights(self):
        return self.directory is not None and (self.directory / BACKBONE_WEIGHTS_FILE).is_file()

    def has_task_weights(self):
        return self.directory is not None and (self.directory / TASK_WEIGHTS_FILE).is_file()

    def load_backbone_weights(self, backbone):
        if not self.has_weights():
            self.warn_random_init()
            return
        _load_weights(backbone, self._weights_path(BACKBONE_WEIGHTS_FILE))

    def load_task_weights(self, task):
        """Loads the whole task: the backbone's weights, then the head's."""
        if self.format_version == 1:  # One file held the whole task.
            _load_weights(task, self._weights_path(TASK_WEIGHTS_FILE))
            return
        path = self._weights_path(TASK_WEIGHTS_FILE)
        self.load_backbone_weights(task.backbone)
        _load_weights(task, path, objects_to_skip=flatten_layers(task.backbone))

    def has_arrays(self, filename=PRETRAINING_HEADS_FILE):
        return self.directory is not None and (self.directory / filename).is_file()

    def load_arrays(self, filename=PRETRAINING_HEADS_FILE):
        """Returns `{name: NumPy array}` from a safetensors file of the preset
        (checksum-verified), e.g. the pre-training heads of a converted
        checkpoint."""
        from safetensors.numpy import load_file

        if self.directory is None:
            raise FileNotFoundError(f"Preset {self.name!r} is a built-in definition: it has no {filename}.")
        return load_file(str(self._weights_path(filename)))

    def warn_random_init(self):
        if self.name not in _warned_random_init:
            _warned_random_init.add(self.name)
            warnings.warn(
                f"Preset {self.name!r} has no pretrained weights on this machine: the model "
                "is randomly initialized. Convert a checkpoint with "
                "`bertzoo.convert_checkpoint(...)` for pretrained weights, or pass "
                "load_weights=False to silence this warning.",
                stacklevel=3,
            )


def _without_optimizer(model, objects=()):
    """`objects` plus `model`'s optimizer: Keras would also write a compiled
    model's Adam moments, doubling a preset's size."""
    optimizer = getattr(model, "optimizer", None)
    return list(objects) + ([optimizer] if optimizer is not None else [])


def _load_weights(model, path, objects_to_skip=()):
    try:
        # Presets hold no optimizer state; a task is compiled on construction.
        load_weights_only(model, path, objects_to_skip=_without_optimizer(model, objects_to_skip))
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"Could not load weights from {path} into {type(model).__name__} "
            f"'{model.name}': {e}. The file is damaged or belongs to a model with a "
            "different configuration."
        ) from e


def _detach_vocabulary(node):
    """Replaces the vocabulary of each `BertTokenizer` in the serialized tree
    `node` by the file name it is saved under; returns that vocabulary."""
    registered = keras.saving.get_registered_name(BertTokenizer)
    found = []

    def visit(value):
        if isinstance(value, dict):
            if value.get("registered_name") == registered and isinstance(value["config"].get("vocabulary"), list):
                found.append(value["config"]["vocabulary"])
                value["config"]["vocabulary"] = VOCABULARY_FILE
            for item in value.values():
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)

    visit(node)
    if any(tokens != found[0] for tokens in found):
        raise ValueError("The model holds tokenizers with different vocabularies; a preset keeps one.")
    return found[0] if found else None


def save_preset(
    directory,
    backbone,
    task=None,
    tokenizer=None,
    preprocessor_config=None,
    metadata=None,
    overwrite=True,
    extra_arrays=None,
    preprocessor=None,
):
    """Writes a preset directory atomically (see the module docstring).

    A task's preprocessor (with its vocabulary) is saved from the task; for a
    backbone, pass `preprocessor`, or `tokenizer` (its vocabulary) and
    `preprocessor_config` (text settings: `sequence_length`, `truncate`,
    `lowercase`, ...). `extra_arrays` maps file names (ending in
    `.safetensors`) to `{name: NumPy array}`; each is written with safetensors
    and checksummed in `metadata.json` like the weights (read back with
    `Preset.load_arrays`).
    """
    model = task if task is not None else backbone
    config = {"format_version": FORMAT_VERSION, "backbone": serialize(backbone), "preprocessor": None, "task": None}
    preprocessor_node = None
    if task is not None:
        config["task"] = serialize(task)
        task_config = config["task"]["config"]
        task_config.pop("backbone", None)
        preprocessor_node = task_config.pop("preprocessor", None)
    elif preprocessor is not None:
        preprocessor_node = serialize(preprocessor)
    if preprocessor_node is None and (tokenizer is not None or preprocessor_config):
        preprocessor_node = format1.preprocessor_node(preprocessor_config, tokenizer)
    vocabulary = _detach_vocabulary(preprocessor_node) if preprocessor_node else None
    if vocabulary is None and tokenizer is not None:
        vocabulary = tokenizer.get_vocabulary()
    config["preprocessor"] = preprocessor_node
    with atomic_directory(directory, overwrite=overwrite) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        save_weights_only(backbone, tmp / BACKBONE_WEIGHTS_FILE, objects_to_skip=_without_optimizer(backbone))
        weight_files = [BACKBONE_WEIGHTS_FILE]
        if task is not None:
            # The head only: the backbone's weights are in model.weights.h5.
            skip = _without_optimizer(task, flatten_layers(backbone))
            save_weights_only(task, tmp / TASK_WEIGHTS_FILE, objects_to_skip=skip)
            weight_files.append(TASK_WEIGHTS_FILE)
        for filename, arrays in (extra_arrays or {}).items():
            _save_arrays(tmp, filename, arrays)
            weight_files.append(filename)
        if vocabulary is not None:
            vocabulary_lib.save_vocabulary(vocabulary, tmp / VOCABULARY_FILE)
        info = {
            "bertzoo_version": __version__,
            "keras_version": keras.__version__,
            "backend": keras.backend.backend(),
            "class_name": type(model).__name__,
            "parameter_count": int(model.count_params()),
            "backbone_parameter_count": int(backbone.count_params()),
            "source_preset": getattr(model, "source_preset", None),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "files": {
                name: {"bytes": (tmp / name).stat().st_size, "sha256": sha256_of(tmp / name)}
                for name in weight_files
            },
        }
        info.update(metadata or {})
        (tmp / METADATA_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return Path(directory)


def _save_arrays(directory, filename, arrays):
    import numpy as np
    from safetensors.numpy import save_file

    reserved = (CONFIG_FILE, BACKBONE_WEIGHTS_FILE, TASK_WEIGHTS_FILE, VOCABULARY_FILE, METADATA_FILE)
    if Path(filename).name != filename or not filename.endswith(".safetensors") or filename in reserved:
        raise ValueError(
            f"extra_arrays file name {filename!r} must be a plain file name ending in "
            "'.safetensors' (no folders)."
        )
    save_file({name: np.ascontiguousarray(a) for name, a in arrays.items()}, str(directory / filename))
