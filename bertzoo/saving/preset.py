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
                        The tokenizer's `vocabulary` is "vocabulary.txt" (a
                        SentencePiece tokenizer's `proto`: "sentencepiece.model").
    model.weights.h5    backbone weights
    task.weights.h5     the task's own (head) weights, without the backbone's
                        (task presets only)
    vocabulary.txt      one WordPiece token per line
    sentencepiece.model a SentencePiece model (ALBERT), instead of vocabulary.txt;
                        checksummed in metadata.json like the weights
    metadata.json       versions, parameter count, source, date, weight checksums
    *.safetensors       optional named arrays beside the model (e.g. the
                        pre-training heads of a converted checkpoint)

Loading only reads JSON, text and HDF5 arrays: no pickle, no code execution.

Loading validates the whole preset before building anything (`Preset.resolve`
and `Preset.check_weights`): `config.json`'s structure, classes, and every
constructor argument through the checks the constructors themselves run
(`validate_config` of the backbone and task classes), a size estimate
(a config describing weights larger than this machine's memory is refused),
the vocabulary, and the weights files: present, regular files inside the
preset directory (a symlink to elsewhere or a directory is refused), and
matching the sizes and SHA-256 checksums recorded in `metadata.json`. A
preset without `metadata.json` (or without a checksum for a weights file it
needs) is refused unless the caller passes `verify_checksums=False`, which
reads the weights unverified. Every failure raises `PresetError` (a
`ValueError`; `PresetFileNotFoundError`, for a missing file, is also a
`FileNotFoundError`), whose message names the file, the key and what was
expected. A checkpoint folder given for a preset (Hugging Face, keras-hub,
original TF1) is named as such, with the `bertzoo convert` command that
makes a preset of it.
Classes named in `config.json` must be registered bertzoo classes or Keras
built-ins (see `bertzoo.saving.serialization`), never imported by name.
Presets written in format 1 load too (`bertzoo.saving.format1`).
"""

import base64
import copy
import datetime
import difflib
import hashlib
import importlib.resources
import inspect
import json
import logging
import math
import os
import shlex
import warnings
from pathlib import Path

import keras

from bertzoo.layers.dense import WeightOnlyInt8Policy
from bertzoo.saving import format1
from bertzoo.saving.atomic import atomic_directory
from bertzoo.saving.atomic import check_directory_target
from bertzoo.saving.serialization import check_config
from bertzoo.saving.serialization import deserialize
from bertzoo.saving.serialization import policy_map_modes
from bertzoo.saving.serialization import retarget_policy_map
from bertzoo.saving.serialization import serialize
from bertzoo.text import vocabulary as vocabulary_lib
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.sentencepiece_tokenizer import SentencePieceTokenizer
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.utils.checks import constructor_arguments
from bertzoo.utils.checks import vocabulary_overflow
from bertzoo.utils.layers import attached_pruning_state
from bertzoo.utils.optional import installed
from bertzoo.utils.private_api import flatten_layers
from bertzoo.utils.private_api import load_weights_only
from bertzoo.utils.private_api import save_weights_only
from bertzoo.version import __version__

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
VOCABULARY_FILE = "vocabulary.txt"
SENTENCEPIECE_FILE = "sentencepiece.model"
METADATA_FILE = "metadata.json"
PRETRAINING_HEADS_FILE = "pretraining_heads.safetensors"
FORMAT_VERSION = 2
PRESET_FILES = frozenset(
    {
        CONFIG_FILE,
        BACKBONE_WEIGHTS_FILE,
        TASK_WEIGHTS_FILE,
        VOCABULARY_FILE,
        SENTENCEPIECE_FILE,
        METADATA_FILE,
        PRETRAINING_HEADS_FILE,
    }
)
# metadata.json entries save_preset writes; `files` and `vocabulary` hold the
# checksums a load verifies.
RESERVED_METADATA_KEYS = frozenset(
    (
        "bertzoo_version",
        "keras_version",
        "backend",
        "class_name",
        "parameter_count",
        "backbone_parameter_count",
        "source_preset",
        "created",
        "files",
        "vocabulary",
    )
)

_warned_random_init = set()
logger = logging.getLogger("bertzoo")
_TOP_LEVEL_KEYS = ("format_version", "backbone", "preprocessor", "task")
_NODE_KEYS = ("module", "class_name", "config", "registered_name")


class PresetError(ValueError):
    """A preset that cannot be loaded: a missing, damaged or invalid file or
    config entry. The message names the file, the key and what was expected.

    Example:
    ```python
    try:
        model = bertzoo.BertClassifier.from_preset("runs/sentiment")
    except bertzoo.PresetError as e:
        print(e)  # e.g. "runs/sentiment/config.json: `backbone.config` is invalid for BertBackbone: `num_layers` is missing ..."
    ```
    """


class PresetFileNotFoundError(PresetError, FileNotFoundError):
    """A `PresetError` for a file the preset needs and lacks; also a
    `FileNotFoundError`, for callers that catch that."""


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


def vocabulary_checksum(tokens):
    """SHA-256 of a vocabulary's tokens in order (not of the file's bytes,
    so line endings, a byte-order mark and trailing blank lines, which
    `load_vocabulary` ignores, do not matter)."""
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


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

    def __init__(self, name, config, directory=None, metadata=None, verify_checksums=True):
        self.name = name
        self.config = config
        self.directory = directory
        self.metadata = {} if metadata is None else metadata
        self.verify_checksums = verify_checksums
        self._verified = {}  # filename -> (size, mtime_ns) of a verified weights file.
        # Built by `validate()` to check the tokenizer's files; handed to the
        # first `build_preprocessor()` without overrides instead of a rebuild.
        self._unused_preprocessor = None

    # --- Resolution -------------------------------------------------------
    @classmethod
    def resolve(cls, preset, verify_checksums=True):
        """The `Preset` of a built-in name or a preset directory, validated
        (see the module docstring); raises `PresetError`.

        `verify_checksums=False` accepts weights without a checksum in
        `metadata.json` (a preset assembled by hand) and reads them unverified.
        """
        if isinstance(preset, Preset):
            if preset.verify_checksums != verify_checksums:
                preset = copy.copy(preset)
                preset.verify_checksums, preset._verified, preset._unused_preprocessor = verify_checksums, {}, None
            return preset
        path = Path(str(preset)).expanduser()
        builtins = builtin_presets()
        builtin = str(preset) in builtins
        config = path / CONFIG_FILE
        # A folder that only shares a built-in's name (./base holding data) is not what was meant.
        if path.is_dir() and (config.exists() or config.is_symlink() or not builtin):
            if builtin:
                logger.warning(
                    "%r names a built-in preset and the preset directory %s; loading the directory. For the "
                    "built-in one, rename the directory or run elsewhere.",
                    str(preset),
                    path.absolute(),
                )
            return cls._from_directory(path, verify_checksums)
        if builtin:
            return cls(str(preset), format1.upgrade(builtins[str(preset)]))
        if path.is_file():
            folder = path.parent if path.name in PRESET_FILES else None
            raise PresetError(
                f"{path} is a file; a preset is a directory (holding {CONFIG_FILE}, the weights and the "
                f"vocabulary){f': pass {str(folder)!r}' if folder is not None else ''}."
            )
        if "://" in str(preset):
            raise PresetError(
                f"{str(preset)!r} names a model hub; bertzoo does not download presets. Convert a local copy "
                "(bertzoo.convert_checkpoint or `bertzoo convert`) and load that directory."
            )
        if os.sep in str(preset) or (os.altsep and os.altsep in str(preset)) or str(preset).startswith("."):
            raise PresetError(
                f"Preset directory {str(preset)!r} does not exist"
                f"{'' if path.is_absolute() else f' (resolved to {path.absolute()})'}; check the path, or name a "
                f"built-in preset: {', '.join(builtins)}."
            )
        hint = difflib.get_close_matches(str(preset), list(builtins), n=3)
        suggestion = f" Did you mean {', '.join(repr(h) for h in hint)}?" if hint else ""
        raise PresetError(
            f"Unknown preset {str(preset)!r}: it is not a directory and not a built-in "
            f"preset.{suggestion} Built-in presets: {', '.join(builtins)}."
        )

    @classmethod
    def _from_directory(cls, path, verify_checksums=True):
        config_path = path / CONFIG_FILE
        if not config_path.exists() and not config_path.is_symlink():
            tf1_config = next((name for name in TF1_CONFIG_FILES if (path / name).is_file()), None)
            if tf1_config is not None:
                raise PresetFileNotFoundError(_checkpoint_message(path, f"an original TF1 checkpoint ({tf1_config})"))
            raise PresetFileNotFoundError(
                f"{path} is not a bertzoo preset: {CONFIG_FILE} is missing. A preset "
                f"directory holds {CONFIG_FILE}, {BACKBONE_WEIGHTS_FILE}, {VOCABULARY_FILE} "
                f"and {METADATA_FILE} (write one with save_to_preset or convert_checkpoint)."
            )
        config = _read_json(path, CONFIG_FILE)
        if not isinstance(config, dict):
            raise PresetError(f"{config_path} holds a JSON {type(config).__name__}; expected an object.")
        version = config.get("format_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise PresetError(f"{config_path}: `format_version` must be a positive integer, got {version!r}.")
        if version > FORMAT_VERSION:  # Before any key check: a newer format may arrange them otherwise.
            raise PresetError(
                f"{path} was written by a newer bertzoo (format {config['format_version']}); "
                f"this bertzoo {__version__} reads format {FORMAT_VERSION}. Upgrade bertzoo."
            )
        for key in ("class_name", "backbone") if version == 1 else ("backbone",):
            if key not in config:
                kind = _checkpoint_kind(config)
                if kind is not None:
                    raise PresetError(_checkpoint_message(path, kind))
                raise PresetError(f"{config_path} has no {key!r} entry; the preset is damaged.")
        if version == 1:
            try:
                config = format1.upgrade(config)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                raise PresetError(f"{config_path} is not a valid format-1 config: {e}") from e
        metadata = {}
        if (path / METADATA_FILE).exists() or (path / METADATA_FILE).is_symlink():
            metadata = _read_json(path, METADATA_FILE)
        preset = cls(str(path), config, directory=path, metadata=metadata, verify_checksums=verify_checksums)
        preset.validate()
        return preset

    # --- Validation -------------------------------------------------------
    def _file(self, filename, required=True):
        """`directory / filename` when it is a regular file inside the
        preset directory (a symlink within it is followed), None when absent
        and not `required`; else PresetError."""
        return _preset_file(self.directory, filename, required)

    def validate(self):
        """Checks the whole preset without building anything (see the module
        docstring): raises `PresetError` naming the file, the key and what
        was expected. `Preset.resolve` calls it; `check_weights` checks the
        weights files a load needs."""
        config_path = self.directory / CONFIG_FILE if self.directory is not None else f"preset {self.name!r}"
        config = self.config
        unknown = [key for key in config if key not in _TOP_LEVEL_KEYS]
        if unknown:
            raise PresetError(
                f"{config_path}: unknown top-level entry {unknown[0]!r}; expected only {list(_TOP_LEVEL_KEYS)}."
            )
        for key in ("backbone", "task", "preprocessor"):
            node = config.get(key)
            if node is None and key != "backbone":
                continue
            if not isinstance(node, dict) or not isinstance(node.get("config"), dict) or "class_name" not in node:
                raise PresetError(
                    f"{config_path}: `{key}` must be a serialized Keras object (a JSON object with "
                    f"{', '.join(repr(k) for k in _NODE_KEYS)}), got {_short(node)}."
                )
            extra = [k for k in node if k not in _NODE_KEYS]
            if extra:
                raise PresetError(
                    f"{config_path}: `{key}` has the unknown entry {extra[0]!r}; expected {list(_NODE_KEYS)}."
                )
        try:
            check_config(config, str(config_path))
        except ValueError as e:
            raise PresetError(str(e)) from e
        backbone_class = self._node_class("backbone", config_path)
        self._validate_node("backbone", backbone_class, dict(config["backbone"]["config"]), config_path)
        if config.get("task") is not None:
            task_class = self._node_class("task", config_path)
            task_config = dict(config["task"]["config"])
            for key in ("backbone", "preprocessor"):
                if task_config.pop(key, None) is not None:
                    raise PresetError(f"{config_path}: `task.config.{key}` must be absent (it is stored in `{key}`).")
            self._validate_node("task", task_class, task_config, config_path)
        if self.directory is None:
            return
        self._validate_metadata()
        for filename in (BACKBONE_WEIGHTS_FILE, TASK_WEIGHTS_FILE):
            self._file(filename, required=False)  # Regular files if present.
        preprocessor = config.get("preprocessor")
        if preprocessor is not None and (
            preprocessor.get("registered_name") != keras.saving.get_registered_name(BertPreprocessor)
            or not isinstance(preprocessor["config"].get("tokenizer"), dict)
        ):
            raise PresetError(
                f"{config_path}: `preprocessor` must be a serialized BertPreprocessor with a `tokenizer`, got "
                f"class {preprocessor.get('class_name')!r}."
            )
        # A tokenizer reads only the preset's own files: a vocabulary is the
        # preset's file name or a list of tokens, never another path.
        tokenizer = ((config.get("preprocessor") or {}).get("config") or {}).get("tokenizer")
        vocabulary = (tokenizer.get("config") or {}).get("vocabulary") if isinstance(tokenizer, dict) else None
        if vocabulary is not None and vocabulary != VOCABULARY_FILE and not isinstance(vocabulary, list):
            raise PresetError(
                f"{config_path}: `preprocessor.config.tokenizer.config.vocabulary` must be "
                f"{VOCABULARY_FILE!r} (the preset's own file) or a list of tokens, got {_short(vocabulary)}."
            )
        # The tokenizer's files are checked by building it (errors are
        # PresetErrors naming the file); without them, or without TensorFlow
        # Text to build it with (the models alone run on JAX or torch), when
        # it is built.
        if self.has_tokenizer_files and installed("tensorflow_text"):
            self._unused_preprocessor = self.build_preprocessor()

    @property
    def has_tokenizer_files(self):
        """Whether the preset directory holds a vocabulary or SentencePiece model."""
        if self.directory is None:
            return False
        return any(self._file(name, required=False) is not None for name in (VOCABULARY_FILE, SENTENCEPIECE_FILE))

    @property
    def tokenizes_text(self):
        """False for a preset saved without a tokenizer (a task built with
        `preprocessor=None`, a checkpoint converted without a vocabulary):
        `config.json` (format 2) has a null `preprocessor`, and no vocabulary
        or SentencePiece file is there or recorded in its `metadata.json` (a
        recorded one that is missing is damage, reported when it is read).
        Its tasks load with `preprocessor=None` and take tokenized inputs."""
        if self.directory is None or self.config.get("preprocessor") is not None or self.has_tokenizer_files:
            return True
        if self.format_version < 2 or not self.metadata:
            return True  # Format 1 and hand-made presets record no tokenizer: a missing file is an error.
        return "vocabulary" in self.metadata or SENTENCEPIECE_FILE in self.metadata.get("files", {})

    def _node_class(self, key, config_path):
        node = self.config[key]
        registered = node.get("registered_name")
        cls = None
        if isinstance(registered, str) and registered.startswith("bertzoo>"):
            cls = keras.saving.get_registered_object(registered)
        kind = "backbone" if key == "backbone" else "task"
        if (
            cls is None
            or not callable(getattr(cls, "validate_config", None))
            or not getattr(cls, "__module__", "").startswith("bertzoo.")
        ):
            raise PresetError(
                f"{config_path}: `{key}` names the class {node.get('class_name')!r} (registered name "
                f"{registered!r}), which is not a bertzoo {kind} class this bertzoo knows; expected e.g. "
                f"{'BertBackbone' if kind == 'backbone' else 'BertClassifier'}."
            )
        return cls

    def _validate_node(self, key, cls, config, config_path):
        dtype = config.get("dtype")
        if isinstance(dtype, dict):
            try:
                deserialize(dtype, str(config_path))
            except (ValueError, TypeError, KeyError) as e:
                raise PresetError(f"{config_path}: `{key}.config.dtype` is not a valid dtype policy: {e}") from e
        elif dtype is not None:
            try:
                keras.dtype_policies.get(dtype)
            except (ValueError, TypeError) as e:
                raise PresetError(
                    f"{config_path}: `{key}.config.dtype` must be a dtype policy name such as 'float32', "
                    f"got {_short(dtype)}."
                ) from e
        try:
            cls.validate_config(config)
        except (ValueError, TypeError) as e:
            raise PresetError(f"{config_path}: `{key}.config` is invalid for {cls.__name__}: {e}") from e

    def _validate_metadata(self):
        if not self.metadata and self._file(METADATA_FILE, required=False) is None:
            return
        path = self.directory / METADATA_FILE
        if not isinstance(self.metadata, dict):
            raise PresetError(f"{path} holds a JSON {type(self.metadata).__name__}; expected an object.")
        vocabulary = self.metadata.get("vocabulary")
        if vocabulary is not None and not (isinstance(vocabulary, dict) and isinstance(vocabulary.get("sha256"), str)):
            raise PresetError(
                f'{path}: `vocabulary` must be {{"tokens": <count>, "sha256": <hex>}}, got {_short(vocabulary)}.'
            )
        files = self.metadata.get("files", {})
        if not isinstance(files, dict):
            raise PresetError(
                f"{path}: `files` must be an object {{file name: {{bytes, sha256}}}}, got {_short(files)}."
            )
        for filename, entry in files.items():
            if (
                not isinstance(entry, dict)
                or isinstance(entry.get("bytes"), bool)
                or not isinstance(entry.get("bytes"), int)
                or entry["bytes"] < 0
                or not isinstance(entry.get("sha256"), str)
                or len(entry["sha256"]) != 64
            ):
                raise PresetError(
                    f'{path}: `files.{filename}` must be {{"bytes": <size>, "sha256": <64 hex digits>}}, '
                    f"got {_short(entry)}."
                )

    def check_weights(self, task=False, backbone=True):
        """Checks, before any model is built, the weights files a load
        needs: `model.weights.h5` (`backbone`) and `task.weights.h5`
        (`task`) present, regular, and matching `metadata.json`'s checksums
        (unless `verify_checksums=False`). Raises `PresetError`."""
        if self.directory is None:
            return
        needed = [TASK_WEIGHTS_FILE] if task else []
        if backbone and not (task and self.format_version == 1):
            needed.insert(0, BACKBONE_WEIGHTS_FILE)
        for filename in needed:
            self._weights_path(filename)

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
        quantized preset (from its dtype policy maps), or None; with
        `"weight_only_layers"` when some int8 layers quantize their kernels
        only (`quantize(..., weight_only=True)`)."""
        modes, weight_only = {}, []
        for node in (self.config["backbone"], self.config.get("task")):
            dtype = (node or {}).get("config", {}).get("dtype")
            if isinstance(dtype, dict) and dtype.get("class_name") == "DTypePolicyMap":
                policy_map = deserialize(dtype, f"{self.name}'s config")
                found = policy_map_modes(policy_map)
                modes.update(found)
                weight_only += [path for path in found if isinstance(policy_map[path], WeightOnlyInt8Policy)]
        if not modes:
            return None
        kinds = sorted(set(modes.values()))
        quantization = {"mode": kinds[0] if len(kinds) == 1 else kinds, "layers": sorted(modes)}
        if weight_only:
            quantization["weight_only_layers"] = sorted(set(weight_only))
        return quantization

    def build_backbone(self, **overrides):
        """Builds the backbone from the saved config, `overrides` replacing
        entries. Its precision is `dtype` (default: Keras's global policy,
        with a warning when the model was saved in another one), as in format
        1; a quantized preset's layers are built quantized."""
        node = copy.deepcopy(self.config["backbone"])
        config = node["config"]
        saved_dtype = config.pop("dtype", None)
        for key in ("name", "trainable"):
            config.pop(key, None)
        dtype = overrides.pop("dtype", None)
        backbone_class = self._node_class("backbone", self.name)
        known = set(constructor_arguments(backbone_class))
        unknown = sorted(set(overrides) - known - {"name", "trainable"})
        if unknown:  # The constructor would swallow them (a typo such as `dropuot=` lost silently).
            raise TypeError(
                f"{backbone_class.__name__}.from_preset got unexpected keyword argument(s) {unknown}; the "
                f"config entries it can override are {sorted(known)}."
            )
        if dtype is None:
            self._warn_of_another_precision(saved_dtype)
        if isinstance(saved_dtype, dict) and saved_dtype.get("class_name") == "DTypePolicyMap":
            saved_map = deserialize(saved_dtype, f"{self.name}'s config")
            int8 = any(getattr(policy, "quantization_mode", None) == "int8" for policy in saved_map.values())
            if int8 and dtype is not None and keras.dtype_policies.get(dtype).compute_dtype == "float16":
                raise ValueError(  # As `bertzoo.quantize` refuses int8 for a float16 model (int4 computes there).
                    f"Preset {self.name!r} is int8-quantized, and Keras's int8 layers do not compute in float16: "
                    "load it with dtype='bfloat16' (or 'float32', the default)."
                )
            policy_map = retarget_policy_map(saved_map, dtype)
            config["dtype"] = keras.dtype_policies.serialize(policy_map)
        elif dtype is not None:
            config["dtype"] = dtype if isinstance(dtype, str) else keras.dtype_policies.serialize(dtype)
        config.update(overrides)
        return deserialize(node, f"{self.name}'s config")

    def _warn_of_another_precision(self, saved_dtype):
        """A warning when the model was saved computing in another precision
        than the global policy it is about to be built in (presets do not
        restore precision: a float32 default saved by habit would otherwise
        override a `mixed_bfloat16` global policy set on purpose)."""
        if saved_dtype is None:
            return
        try:
            saved = deserialize(saved_dtype, f"{self.name}'s config") if isinstance(saved_dtype, dict) else saved_dtype
            saved = keras.dtype_policies.get(saved)
        except (ValueError, TypeError):
            return  # Left to the constructor's own check, which names the problem.
        if isinstance(saved, keras.dtype_policies.DTypePolicyMap):
            saved = saved.default_policy
        built = keras.config.dtype_policy()
        if isinstance(built, keras.dtype_policies.DTypePolicyMap):
            built = built.default_policy
        if saved.name != "float32" and saved.name != built.name:
            logger.warning(
                "Preset %r was saved computing in %s; it is built in %s (Keras's global policy: presets do not "
                "restore precision). Pass dtype=%r to from_preset to compute as it was saved.",
                self.name,
                saved.name,
                built.name,
                saved.name,
            )

    def vocabulary(self):
        """The preset's vocabulary as a list of tokens."""
        size = self.backbone_config["vocabulary_size"]
        if self.directory is None:
            return vocabulary_lib.builtin_vocabulary(size)
        path = self.directory / VOCABULARY_FILE
        if self._file(VOCABULARY_FILE, required=False) is None:
            raise PresetFileNotFoundError(
                f"{path} is missing: preset {self.name!r} has no vocabulary, so it cannot "
                "tokenize text. Pass tokenized inputs with preprocessor=None, or add the "
                "vocabulary.txt the model was trained with."
            )
        try:
            tokens = vocabulary_lib.load_vocabulary(path)
        except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError.
            raise PresetError(f"{path} is not a valid vocabulary (one UTF-8 token per line): {e}") from e
        problem = vocabulary_overflow(len(tokens), size, str(path))
        if problem:
            raise PresetError(problem)
        recorded = self.metadata.get("vocabulary")
        if self.verify_checksums and self.metadata and recorded is None and self.format_version >= 2:
            # save_preset records it whenever it writes a vocabulary (format 1 did not).
            raise PresetError(
                f"{self.directory / METADATA_FILE} records no checksum of {VOCABULARY_FILE} (`vocabulary`), so "
                "its tokens cannot be verified. Re-save the preset, or pass verify_checksums=False to from_preset "
                "to load it unverified."
            )
        if (
            self.verify_checksums
            and isinstance(recorded, dict)
            and recorded.get("sha256") != vocabulary_checksum(tokens)
        ):
            raise PresetError(
                f"{path} does not match the checksum recorded in {METADATA_FILE} (`vocabulary.sha256`): its "
                "tokens were changed, so token ids would not match the model's embeddings. Re-save the preset."
            )
        return tokens

    def build_preprocessor(self, **overrides):
        """Builds the saved `BertPreprocessor` (default settings when the
        preset has none) with the preset's vocabulary; `overrides` replace its
        or its tokenizer's settings (`sequence_length`, `lowercase`, ...).
        Each call returns a new layer (the first may be the one `validate()`
        built: building the tables of a 30k-token vocabulary takes 75-100 ms
        on a 2-core CPU)."""
        if not overrides and self._unused_preprocessor is not None:
            preprocessor, self._unused_preprocessor = self._unused_preprocessor, None
            return preprocessor
        node = copy.deepcopy(self.config.get("preprocessor") or format1.preprocessor_node())
        _fill_sequence_length(node["config"], self.backbone_config.get("max_sequence_length"))  # Saved without one.
        tokenizer = node["config"]["tokenizer"]
        for key, value in overrides.items():
            (tokenizer if key in format1.TOKENIZER_KEYS else node)["config"][key] = value
        source = "its config"
        if tokenizer["config"].get("vocabulary") == VOCABULARY_FILE:
            tokenizer["config"]["vocabulary"] = self.vocabulary()
            source = VOCABULARY_FILE
        if tokenizer["config"].get("proto") == SENTENCEPIECE_FILE:
            source = SENTENCEPIECE_FILE
            # Checksummed like the weights: the pieces decide every token id.
            proto = self._weights_path(SENTENCEPIECE_FILE).read_bytes()
            tokenizer["config"]["proto"] = base64.b64encode(proto).decode("ascii")
        where = self.directory / CONFIG_FILE if self.directory is not None else f"preset {self.name!r}"
        try:
            return deserialize(node, f"{self.name}'s config")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            if isinstance(e, PresetError):
                raise
            raise PresetError(f"{where}: `preprocessor` cannot be built with {source}: {_innermost(e)}") from e

    # --- Weights ----------------------------------------------------------
    def _weights_path(self, filename):
        """The path of a weights file, checked (once per file version):
        present, regular, and matching its recorded size and checksum."""
        path = self._file(filename)
        stat = path.stat()
        if self._verified.get(filename) == (stat.st_size, stat.st_mtime_ns):
            return path
        if self.verify_checksums:
            if not self.metadata:
                raise PresetFileNotFoundError(
                    f"{self.directory / METADATA_FILE} is missing, so the checksum of {filename} cannot be "
                    f"verified. Re-save the preset, or pass verify_checksums=False to from_preset to load "
                    "its weights unverified."
                )
            expected = self.metadata.get("files", {}).get(filename)
            if not expected:
                raise PresetError(
                    f"{self.directory / METADATA_FILE} records no checksum for {filename} (`files.{filename}`): "
                    "the weights cannot be verified. Re-save the preset, or pass verify_checksums=False."
                )
            if stat.st_size != expected["bytes"]:
                raise PresetError(
                    f"{path} is {stat.st_size} bytes but the preset recorded {expected['bytes']} "
                    f"(`files.{filename}.bytes` in {METADATA_FILE}): "
                    "the file is truncated or was modified. Re-save or re-download the preset."
                )
            if sha256_of(path) != expected["sha256"]:
                raise PresetError(
                    f"{path} does not match the checksum recorded in {METADATA_FILE} "
                    f"(`files.{filename}.sha256`): the file is damaged or was modified. Re-save the preset."
                )
        self._verified[filename] = (stat.st_size, stat.st_mtime_ns)
        return path

    def has_weights(self):
        return self.directory is not None and self._file(BACKBONE_WEIGHTS_FILE, required=False) is not None

    def has_task_weights(self):
        return self.directory is not None and self._file(TASK_WEIGHTS_FILE, required=False) is not None

    def load_backbone_weights(self, backbone):
        if self.directory is None:
            self.warn_random_init()
            return
        _load_weights(backbone, self._weights_path(BACKBONE_WEIGHTS_FILE))
        # Keras skips the groups of a weights file the model has no layer for:
        # a config.json of fewer layers than the weights loaded without a word.
        recorded = self.metadata.get("backbone_parameter_count") if isinstance(self.metadata, dict) else None
        if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded != backbone.count_params():
            raise PresetError(
                f"{self.directory / CONFIG_FILE} describes a backbone of {backbone.count_params():,} parameters, but "
                f"{self.directory / METADATA_FILE} records {recorded:,} (`backbone_parameter_count`) for the weights "
                f"saved with it: the config was edited, or the files come from different presets. Restore the "
                "preset's own config.json, or save the model again."
            )

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
            raise PresetFileNotFoundError(f"Preset {self.name!r} is a built-in definition: it has no {filename}.")
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


def _innermost(error):
    """The original error under Keras's re-raised ones (its message, not
    Keras's wrapper with the whole config)."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return error


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _preset_file(directory, filename, required=True):
    """`directory / filename` when it is a regular file inside `directory`
    (a symlink to a file within it is followed), None when absent and not
    `required`; else PresetError."""
    path = directory / filename
    if not path.exists() and not path.is_symlink():
        if required:
            raise PresetFileNotFoundError(f"{path} is missing: preset {str(directory)!r} is incomplete.")
        return None
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as e:  # A symlink loop.
        raise PresetError(f"{path} cannot be resolved ({e}): expected {filename} to be a regular file.") from e
    if resolved.parent != directory.resolve():
        raise PresetError(
            f"{path} is a symlink to {resolved}, outside the preset directory: expected {filename} to be a "
            "regular file in the preset."
        )
    if not resolved.is_file():
        kind = (
            "a directory" if resolved.is_dir() else "not a regular file" if resolved.exists() else "a dangling symlink"
        )
        raise PresetError(f"{path} is {kind}: expected {filename} to be a regular file.")
    return path


# The configs of the checkpoints `bertzoo convert` reads, told apart from a
# preset's by a look at them (bertzoo.convert recognises them fully, but
# saving sits below it): a directory a user took for a preset gets the fix.
TF1_CONFIG_FILES = ("bert_config.json", "albert_config.json")


def _checkpoint_kind(config):
    """What wrote `config` (a `config.json` without a preset's entries):
    "a Hugging Face checkpoint", "a keras-hub preset", or None (unknown)."""
    if "model_type" in config:
        return "a Hugging Face checkpoint"
    if str(config.get("registered_name", "")).startswith("keras_hub>") or str(config.get("module", "")).startswith(
        "keras_hub"
    ):
        return "a keras-hub preset"
    return None


def _checkpoint_message(path, kind):
    return (
        f"{path} is {kind}, not a bertzoo preset: convert it into one first, with "
        f"`bertzoo convert {shlex.quote(str(path))} DEST` "
        f"(Python: `bertzoo.convert_checkpoint({str(path)!r}, DEST)`), then load DEST."
    )


def _read_json(directory, filename):
    path = _preset_file(directory, filename)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors.
        raise PresetError(f"{path} is not valid JSON ({e}); the preset is damaged.") from e


def _load_weights(model, path, objects_to_skip=()):
    try:
        # Presets hold no optimizer state; a task is compiled on construction.
        load_weights_only(model, path, objects_to_skip=_without_optimizer(model, objects_to_skip))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
        raise PresetError(
            f"Could not load weights from {path} into {type(model).__name__} "
            f"'{model.name}': {e}. The file is damaged or belongs to a model with a "
            "different configuration."
        ) from e


def _saved_parameter_count(model):
    """`model.count_params()` as the saved weights hold them: a LoRA layer
    is saved with its update merged into the kernel, and loads without the
    `lora_*` factors."""
    factors = sum(
        math.prod(weight.shape)
        for layer in flatten_layers(model)
        if getattr(layer, "lora_enabled", False)
        for weight in layer.weights
        if weight.name.startswith("lora_")
    )
    return int(model.count_params()) - factors


def _fill_sequence_length(settings, longest):
    """Sets `settings["sequence_length"]`, when absent, to the preprocessor's
    default if the backbone's position table (`longest`) holds it, else to
    `longest`."""
    if "sequence_length" not in settings and isinstance(longest, int):
        default = inspect.signature(BertPreprocessor).parameters["sequence_length"].default
        settings["sequence_length"] = min(default, longest)


def _preprocessor_from_settings(tokenizer, settings):
    """The `BertPreprocessor` that `save_preset(tokenizer=, preprocessor_config=)`
    saves: the packer's settings (`sequence_length`, `truncate`) and, for a
    `BertTokenizer`, text options that replace the tokenizer's own. Built
    here, so a setting no loader could build is refused before anything is
    written."""
    settings = dict(settings or {})
    options = sorted(set(settings) & set(format1.TOKENIZER_KEYS))
    if options and isinstance(tokenizer, SentencePieceTokenizer):
        raise ValueError(
            f"`preprocessor_config` sets {options}, which a SentencePieceTokenizer takes itself: build "
            "the tokenizer with them and pass it, with the packer's settings only (e.g. sequence_length)."
        )
    packer = set(inspect.signature(BertPreprocessor).parameters) - {"tokenizer", "kwargs"}
    unknown = sorted(set(settings) - packer - set(format1.TOKENIZER_KEYS))
    if unknown:
        raise ValueError(
            f"`preprocessor_config` has settings no preprocessor takes: {unknown}. Known: the packer's "
            f"{sorted(packer)} and the WordPiece tokenizer's {list(format1.TOKENIZER_KEYS)}."
        )
    if options and isinstance(tokenizer, BertTokenizer):
        tokenizer = BertTokenizer.from_config({**tokenizer.get_config(), **{k: settings.pop(k) for k in options}})
    return BertPreprocessor(tokenizer, **settings)


def _detach(node, cls, key, filename):
    """Replaces the `key` entry of each `cls` object in the serialized tree
    `node` by `filename` (the file it is saved under); returns that entry."""
    registered = keras.saving.get_registered_name(cls)
    found = []

    def visit(value):
        if isinstance(value, dict):
            if value.get("registered_name") == registered and isinstance(value["config"].get(key), (list, str)):
                if value["config"][key] != filename:
                    found.append(value["config"][key])
                    value["config"][key] = filename
            for item in value.values():
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)

    visit(node)
    if any(entry != found[0] for entry in found):
        raise ValueError(f"The model holds {cls.__name__}s with different `{key}`s; a preset keeps one.")
    return found[0] if found else None


def _is_preset_directory(path):
    """Whether `path` is a directory bertzoo saved a preset to."""
    try:
        return (path / CONFIG_FILE).is_file() and "bertzoo_version" in json.loads((path / METADATA_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return False


def enclosing_preset(path, include_self=False):
    """The bertzoo preset directory `path` lies inside (at any depth; or is,
    with `include_self`), or None."""
    path = Path(path).expanduser().resolve()  # "p/../copy" is beside p, not inside it.
    for candidate in ([path] if include_self else []) + list(path.parents):
        if _is_preset_directory(candidate):
            return candidate
    return None


def _check_replaceable(directory):
    """Refuses to save over a directory that is not empty and not a bertzoo
    preset, or a preset with other files beside its own: the save replaces
    the whole directory. Refuses a directory inside a preset too: that
    preset could not be saved again."""
    target = Path(directory).expanduser()
    outer = enclosing_preset(target)
    if outer is not None:
        raise FileExistsError(
            f"{target} lies inside the preset {outer}, whose directory holds its own files only (its sizes would "
            "count the new preset, and saving it again would refuse to delete it). Save to a directory outside it."
        )
    if not target.is_dir() or target.is_symlink() or not any(target.iterdir()):
        return
    if not _is_preset_directory(target):
        raise FileExistsError(
            f"{target} exists and is not a bertzoo preset; saving a preset replaces the whole directory, so it "
            "refuses to delete what is there. Save to a new or empty directory (e.g. runs/my_model)."
        )
    others = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir() if p.name not in PRESET_FILES)
    if others:  # Notes, an export, a preset saved inside: the save would delete them with the old preset.
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise FileExistsError(
            f"{target} holds a bertzoo preset and other files ({shown}); saving a preset replaces the whole "
            "directory, so it refuses to delete them. Move them out, or save to a new directory."
        )


def check_preset_target(directory):
    """Raises a `FileExistsError` naming the fix when `save_preset` cannot
    write `directory`, overwrite or not: a file, a symbolic link, a mount
    point, or a directory that is neither empty nor a bertzoo preset (alone:
    files of others beside a preset are not deleted either).
    Callers with slow work before the save (quantizing, converting) call it
    first.

    Example:
    ```python
    check_preset_target("runs/int8")  # Fine: missing, empty, or a preset.
    ```
    """
    check_directory_target(directory)
    _check_replaceable(directory)


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
    _check_replaceable(directory)
    model = task if task is not None else backbone
    pruned, _ = attached_pruning_state(model)
    if pruned is not None:
        where = "" if pruned is model else f" (its {type(pruned).__name__} '{pruned.name}')"
        raise ValueError(
            f"{type(model).__name__} '{model.name}'{where} is being pruned (a Pruner's masks and counters are "
            "attached), which a preset does not keep: save `pruner.strip()`, the pruned model itself."
        )
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"`metadata` must be a dict of JSON values (e.g. {{'notes': '...'}}), got {metadata!r}.")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"`metadata` must hold plain JSON values (str, int, float, bool, None, lists and dicts; no NaN or "
            f"infinity, no NumPy scalars: convert them with float()/int()): {e}."
        ) from None
    reserved = sorted(set(metadata or {}) & RESERVED_METADATA_KEYS)
    if reserved:
        raise ValueError(
            f"`metadata` may not set {reserved}: bertzoo writes {sorted(RESERVED_METADATA_KEYS)} itself (the "
            "checksums and versions loading relies on). Put your own entries under other names, e.g. 'notes'."
        )
    config = {"format_version": FORMAT_VERSION, "backbone": serialize(backbone), "preprocessor": None, "task": None}
    preprocessor_node = None
    if task is not None:
        config["task"] = serialize(task)
        task_config = config["task"]["config"]
        task_config.pop("backbone", None)
        preprocessor_node = task_config.pop("preprocessor", None)
    elif preprocessor is not None:
        preprocessor_node = serialize(preprocessor)
    if preprocessor_node is None and preprocessor_config and tokenizer is None:
        # The preprocessor would name a vocabulary file the preset does not have.
        raise ValueError(
            "`preprocessor_config` sets how text is tokenized and packed, but no tokenizer was given: pass "
            "tokenizer= (its vocabulary is saved with the preset), or leave preprocessor_config out for a preset "
            "of tokenized inputs."
        )
    if preprocessor_node is None and tokenizer is not None:
        settings = dict(preprocessor_config or {})
        _fill_sequence_length(settings, getattr(backbone, "max_sequence_length", None))
        preprocessor_node = serialize(_preprocessor_from_settings(tokenizer, settings))
    vocabulary = sentencepiece = None
    if preprocessor_node:
        vocabulary = _detach(preprocessor_node, BertTokenizer, "vocabulary", VOCABULARY_FILE)
        sentencepiece = _detach(preprocessor_node, SentencePieceTokenizer, "proto", SENTENCEPIECE_FILE)
        sentencepiece = base64.b64decode(sentencepiece) if sentencepiece is not None else None
    if vocabulary is None and sentencepiece is None and isinstance(tokenizer, BertTokenizer):
        vocabulary = tokenizer.get_vocabulary()
    problem = None if vocabulary is None else vocabulary_overflow(len(vocabulary), backbone.vocabulary_size)
    if problem:  # Refused before writing: the preset could not be loaded.
        raise ValueError(f"Cannot save a preset whose vocabulary does not fit its model. {problem}")
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
        if sentencepiece is not None:
            (tmp / SENTENCEPIECE_FILE).write_bytes(sentencepiece)
            weight_files.append(SENTENCEPIECE_FILE)
        if vocabulary is not None:
            vocabulary_lib.save_vocabulary(vocabulary, tmp / VOCABULARY_FILE)
        info = {
            "bertzoo_version": __version__,
            "keras_version": keras.__version__,
            "backend": keras.backend.backend(),
            "class_name": type(model).__name__,
            "parameter_count": _saved_parameter_count(model),
            "backbone_parameter_count": _saved_parameter_count(backbone),
            "source_preset": getattr(model, "source_preset", None),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "files": {
                name: {"bytes": (tmp / name).stat().st_size, "sha256": sha256_of(tmp / name)} for name in weight_files
            },
        }
        if vocabulary is not None:
            info["vocabulary"] = {"tokens": len(vocabulary), "sha256": vocabulary_checksum(list(vocabulary))}
        info.update(metadata or {})
        (tmp / METADATA_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return Path(directory).expanduser().absolute()


def _save_arrays(directory, filename, arrays):
    import numpy as np
    from safetensors.numpy import save_file

    reserved = PRESET_FILES - {PRETRAINING_HEADS_FILE}  # The arrays files save_preset writes itself.
    if Path(filename).name != filename or not filename.endswith(".safetensors") or filename in reserved:
        raise ValueError(
            f"extra_arrays file name {filename!r} must be a plain file name ending in '.safetensors' (no folders)."
        )
    save_file({name: np.ascontiguousarray(a) for name, a in arrays.items()}, str(directory / filename))
