"""Reading and writing bertzoo presets.

A preset is either a built-in name (a definition in the top-level `presets/`
folder: architecture and tokenizer settings, no weights) or a directory:

    config.json         class, backbone config, task config, preprocessor config,
                        and the quantization (mode, layers) of a quantized model
    model.weights.h5    backbone weights
    task.weights.h5     the whole task model's weights (task presets only)
    vocabulary.txt      one WordPiece token per line
    metadata.json       versions, parameter count, source, date, weight checksums
    *.safetensors       optional named arrays beside the model (e.g. the
                        pre-training heads of a converted checkpoint)

Loading only reads JSON, text and HDF5 arrays: no pickle, no code execution.
Classes named in `config.json` are looked up in a fixed table of bertzoo
classes, never imported by name.
"""

import datetime
import difflib
import hashlib
import importlib.resources
import json
import logging
import warnings
from pathlib import Path

import keras

from bertzoo.saving.atomic import atomic_directory
from bertzoo.version import __version__

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
VOCABULARY_FILE = "vocabulary.txt"
METADATA_FILE = "metadata.json"
PRETRAINING_HEADS_FILE = "pretraining_heads.safetensors"
FORMAT_VERSION = 1

_PRESET_CLASSES = {}
_warned_random_init = set()
logger = logging.getLogger("bertzoo")


def register_preset_class(cls):
    """Class decorator: lets `config.json` name this class."""
    _PRESET_CLASSES[cls.__name__] = cls
    return cls


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

    Example:
    >>> preset = Preset.resolve("tiny")
    >>> backbone = preset.build_backbone()
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
            definition = builtins[str(preset)]
            config = {
                "class_name": "BertBackbone",
                "backbone": definition["backbone"],
                "task": None,
                "preprocessor": definition.get("preprocessor", {}),
            }
            return cls(str(preset), config)
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
        for key in ("class_name", "backbone"):
            if key not in config:
                raise ValueError(f"{config_path} has no {key!r} entry; the preset is damaged.")
        if config.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
            raise ValueError(
                f"{path} was written by a newer bertzoo (format {config['format_version']}); "
                f"this bertzoo {__version__} reads format {FORMAT_VERSION}. Upgrade bertzoo."
            )
        metadata = {}
        if (path / METADATA_FILE).is_file():
            metadata = json.loads((path / METADATA_FILE).read_text())
        return cls(str(path), config, directory=path, metadata=metadata)

    # --- Contents ---------------------------------------------------------
    @property
    def class_name(self):
        return self.config["class_name"]

    @property
    def task_config(self):
        return dict(self.config.get("task") or {})

    def build_backbone(self, **overrides):
        from bertzoo.models.bert_backbone import BertBackbone

        return BertBackbone(**{**self.config["backbone"], **overrides})

    def vocabulary(self):
        """The preset's vocabulary as a list of tokens."""
        from bertzoo.text.vocabulary import builtin_vocabulary
        from bertzoo.text.vocabulary import load_vocabulary

        size = self.config["backbone"]["vocabulary_size"]
        if self.directory is None:
            return builtin_vocabulary(size)
        path = self.directory / VOCABULARY_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: preset {self.name!r} has no vocabulary, so it cannot "
                "tokenize text. Pass tokenized inputs with preprocessor=None, or add the "
                "vocabulary.txt the model was trained with."
            )
        tokens = load_vocabulary(path)
        if len(tokens) != size:
            raise ValueError(
                f"{path} has {len(tokens)} tokens but the model's embedding table has "
                f"vocabulary_size={size} rows: the vocabulary does not belong to this model."
            )
        return tokens

    def build_preprocessor(self, **overrides):
        from bertzoo.text.preprocessor import BertPreprocessor
        from bertzoo.text.tokenizer import BertTokenizer

        settings = {"sequence_length": 128, "truncate": "round_robin", "lowercase": True}
        settings.update(self.config.get("preprocessor") or {})
        settings.update(overrides)
        tokenizer = BertTokenizer(
            self.vocabulary(),
            lowercase=settings.pop("lowercase"),
            strip_accents=settings.pop("strip_accents", None),
        )
        return BertPreprocessor(tokenizer, **settings)

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
        self._quantize_like_saved(backbone)
        _load_weights(backbone, self._weights_path(BACKBONE_WEIGHTS_FILE))

    def load_task_weights(self, task):
        self._quantize_like_saved(task)
        _load_weights(task, self._weights_path(TASK_WEIGHTS_FILE))

    def _quantize_like_saved(self, model):
        # Quantized weights (int8 kernels + scales) only load into layers
        # quantized the same way: redo the recorded quantization first.
        spec = self.config.get("quantization")
        if spec:
            from bertzoo.compression.quantization import apply_quantization_spec

            apply_quantization_spec(model, spec)

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


def preprocessor_settings(preprocessor):
    """The text settings a preset stores for `preprocessor` (the inverse of
    `Preset.build_preprocessor`, with the vocabulary kept in its own file)."""
    tokenizer = preprocessor.tokenizer
    return {
        "sequence_length": preprocessor.sequence_length,
        "truncate": preprocessor.truncate,
        "lowercase": tokenizer.lowercase,
        "strip_accents": tokenizer.strip_accents,
    }


def _save_model_weights(model, path):
    """`model.save_weights` without the optimizer's state: Keras would also
    write a compiled model's Adam moments, doubling a preset's size."""
    from keras.src.saving import saving_lib

    optimizer = getattr(model, "optimizer", None)
    skip = [optimizer] if optimizer is not None else None
    saving_lib.save_weights_only(model, str(path), objects_to_skip=skip)


def _load_weights(model, path):
    try:
        model.load_weights(str(path))
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"Could not load weights from {path} into {type(model).__name__} "
            f"'{model.name}': {e}. The file is damaged or belongs to a model with a "
            "different configuration."
        ) from e


def save_preset(
    directory,
    backbone,
    task=None,
    tokenizer=None,
    preprocessor_config=None,
    metadata=None,
    overwrite=True,
    extra_arrays=None,
):
    """Writes a preset directory atomically (see the module docstring).

    `tokenizer` provides `vocabulary.txt`; `preprocessor_config` holds the
    text settings (`sequence_length`, `truncate`, `lowercase`, ...).
    `extra_arrays` maps file names (ending in `.safetensors`) to
    `{name: NumPy array}`; each is written with safetensors and checksummed
    in `metadata.json` like the weights (read back with `Preset.load_arrays`).
    """
    from bertzoo.text.vocabulary import save_vocabulary

    model = task if task is not None else backbone
    config = {
        "format_version": FORMAT_VERSION,
        "class_name": type(model).__name__,
        "backbone": _plain_config(backbone),
        "task": task.task_config() if task is not None else None,
        "preprocessor": preprocessor_config,
    }
    from bertzoo.compression.quantization import quantization_spec

    quantization = quantization_spec(model)
    if quantization:
        config["quantization"] = quantization
    with atomic_directory(directory, overwrite=overwrite) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        _save_model_weights(backbone, tmp / BACKBONE_WEIGHTS_FILE)
        weight_files = [BACKBONE_WEIGHTS_FILE]
        if task is not None:
            _save_model_weights(task, tmp / TASK_WEIGHTS_FILE)
            weight_files.append(TASK_WEIGHTS_FILE)
        for filename, arrays in (extra_arrays or {}).items():
            _save_arrays(tmp, filename, arrays)
            weight_files.append(filename)
        if tokenizer is not None:
            save_vocabulary(tokenizer.get_vocabulary(), tmp / VOCABULARY_FILE)
        info = {
            "bertzoo_version": __version__,
            "keras_version": keras.__version__,
            "backend": keras.backend.backend(),
            "class_name": config["class_name"],
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


def _plain_config(backbone):
    config = backbone.get_config()
    for key in ("name", "trainable", "dtype"):
        config.pop(key, None)
    return config
