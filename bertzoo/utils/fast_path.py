"""Choose the execution path by measuring it, where the model runs.

`jit_compile="auto"` (see `bertzoo.utils.device.resolve_jit_compile`) used
to read a per-device table measured on one machine; another CPU can want the
other path (XLA's int8 and bfloat16 kernels against oneDNN's differ by
generation: AVX512-BF16, VNNI, AMX). Here the candidates are timed instead,
for this model's input shapes on this machine:

- inference: `model(x, training=False)` in `tf.function(jit_compile=False)`
  and in `tf.function(jit_compile=True)`;
- a training-step proxy: the gradient of a scalar of the outputs
  (`model(x, training=True)`) with respect to the trainable variables, XLA
  off and on (no optimizer update); for a trainer around other models (a
  `Distiller`, see `trainer_parts`), the gradient of its own loss, so the
  teacher's forward pass is timed too.

Each candidate is called once to trace and compile (timed and reported as
its compile time, not counted), then the candidates run interleaved, a few
rounds, and the median of each decides, per mode ("predict", "train"); a
mode whose candidates are far apart (every run of one at least
`CLEAR_GAIN` faster than every run of the other, two runs each at least) is
decided after the second round. `fit`, `evaluate` and `predict` each measure
only their own mode, the first time they build their step. The model's
non-trainable variables (dropout seed states) are restored afterwards, so
measuring leaves no trace in later training.

The choice is cached on disk (`$BERTZOO_CACHE_DIR/fast_path.json`, default
`~/.cache/bertzoo/fast_path.json`), keyed by a hash of the device (CPU model
and the flags that pick kernels, core count, GPU names), the library
versions, a hash of bertzoo's own source (a checkout keeps its version
number across commits) and the model's signature (classes, backbone config,
dtype policies, quantization modes of its layers, input shapes, whether the
fused oneDNN int8 kernel is available), so another process on the same
machine reuses it (processes writing at once take turns through a lock file
beside it, `fast_path.json.lock`, and keep each other's entries). Every
choice is logged at INFO; `explain_fast_path(model)` returns a report whose
`str()` is a readable table.

Pinning: `BERTZOO_JIT_COMPILE=0|1` pins XLA off/on for `"auto"`,
`BERTZOO_JIT_COMPILE=rule` skips measuring (the rule in
`bertzoo.utils.device.default_jit_compile` decides, e.g. for test suites),
`auto` or unset measures. An explicit `compile(jit_compile=True/False)` pins
too. The JAX backend always compiles and the torch backend never
(`backend_jit_compile`); multi-replica `tf.distribute` strategies never
(`bertzoo.utils.device.jit_compile_supported`).

Example:
```python
report = explain_fast_path(model)  # Measures, or reads the cache.
print(report)  # Candidates, medians, compile times, chosen, source, cache key.
report.predict, report.train  # The per-mode choice.
```
"""

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import statistics
import tempfile
import threading
import time
import weakref
from pathlib import Path

import keras
import numpy as np

from bertzoo.utils import private_api
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.cpu import cpu_flags
from bertzoo.utils.cpu import read_cpuinfo as _read_cpuinfo  # Replaced in tests.
from bertzoo.utils.layers import quantization_mode
from bertzoo.utils.onednn import onednn_int8_available
from bertzoo.utils.optional import tf

try:
    import fcntl
except ImportError:  # Windows: no advisory file locks (see `_cache_lock`).
    fcntl = None

logger = logging.getLogger("bertzoo")

PIN_ENV = "BERTZOO_JIT_COMPILE"
CACHE_DIR_ENV = "BERTZOO_CACHE_DIR"
# Bump when the measurement or the key changes meaning. Each format has a
# file of its own, so bertzoo versions sharing a cache directory never drop
# each other's entries.
CACHE_FORMAT = 1
CACHE_FILE_NAME = "fast_path.json" if CACHE_FORMAT == 1 else f"fast_path.v{CACHE_FORMAT}.json"
MAX_CACHE_ENTRIES = 512
# How long a cache update waits for another process's lock before going ahead without it.
LOCK_WAIT_S = 10.0
MODES = ("predict", "train")
# /proc/cpuinfo flags that decide which kernels TensorFlow/XLA/oneDNN use.
CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Environment variables that change which kernels run or on how many threads
# (read by TensorFlow, oneDNN and XLA when they start): part of the key when set.
KERNEL_ENVIRONMENT = (
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "OMP_NUM_THREADS",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
    "TF_XLA_FLAGS",
    "XLA_FLAGS",
)
DEFAULT_BATCH_SIZE = 8
DEFAULT_SEQUENCE_LENGTH = 128
DEFAULT_RUNS = 3
# Timed runs stop after this many seconds (compiles not counted), once every
# candidate has run at least once.
DEFAULT_BUDGET_SECONDS = 10.0
# XLA must be faster by this fraction to be chosen: below it the difference
# is noise, and the path without XLA has no compile cost.
MIN_GAIN = 0.02
# A mode is decided after fewer than `runs` rounds (two at least) when every
# run of one candidate beat every run of the other by this fraction: more
# rounds could not change the choice, only the cost.
CLEAR_GAIN = 0.2

_lock = threading.RLock()
_memory = {}  # Cache key -> entry (the JSON form), this process.
_recorded = weakref.WeakKeyDictionary()  # Model -> its last FastPathReport.


# --- The rules that are not measured ---------------------------------------


def backend_jit_compile(backend=None):
    """The fixed choice of a non-TensorFlow Keras backend, or None where it
    is measured (TensorFlow).

    JAX: True, always (`jit_compile=False` there is op-by-op eager
    execution, slower everywhere). Torch: False, always (True means
    `torch.compile`, which Keras's own "auto" avoids).

    Example:
    ```python
    backend_jit_compile("jax")  # True
    backend_jit_compile("torch")  # False
    backend_jit_compile("tensorflow")  # None: measured
    ```
    """
    backend = backend or keras.backend.backend()
    if backend == "jax":
        return True
    if backend == "tensorflow":
        return None
    return False


def pinned_jit_compile(environ=None):
    """What `$BERTZOO_JIT_COMPILE` pins: True, False, "rule" (decide by the
    rule, without measuring) or None (unset or "auto": measure).

    Raises a ValueError naming the accepted values for anything else.
    """
    value = (os.environ if environ is None else environ).get(PIN_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "on", "yes", "xla"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    if value == "rule":
        return "rule"
    raise ValueError(f"{PIN_ENV}={value!r}: use 0, 1, auto or rule.")


# --- Where the model runs, and what it is -----------------------------------


@functools.cache
def _host_description():
    text = _read_cpuinfo()
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    flags = cpu_flags(text) or set()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return {
        "cpu": fields.get("model name") or platform.processor() or platform.machine(),
        "cpu_flags": [flag for flag in CPU_FLAGS if flag in flags],
        "cores": cores,
    }


def device_description():
    """What the measurement depends on about this machine: the CPU model,
    the CPU flags in `CPU_FLAGS`, the cores this process may use,
    TensorFlow's thread settings, the `KERNEL_ENVIRONMENT` variables that
    are set, and the GPUs (names) or TPUs it sees.

    `kind` is "gpu", "tpu" or "cpu": the device the model runs on.
    """
    described = dict(_host_description())
    environment = {name: os.environ[name] for name in KERNEL_ENVIRONMENT if name in os.environ}
    if environment:  # Absent when none is set, so the keys of earlier entries still match.
        described["environment"] = environment
    described["kind"], described["accelerators"] = "cpu", []
    if keras.backend.backend() == "tensorflow":
        tpus = tf.config.list_logical_devices("TPU")
        gpus = tf.config.list_physical_devices("GPU")
        if tpus:
            described["kind"], described["accelerators"] = "tpu", [device.name for device in tpus]
        elif gpus:
            names = []
            for gpu in gpus:
                try:
                    names.append(tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name))
                except (ValueError, RuntimeError):
                    names.append(gpu.name)
            described["kind"], described["accelerators"] = "gpu", names
        described["threads"] = [
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        ]
    return described


def _distribution_version(*names):
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def _bertzoo_version():
    found = _distribution_version("bertzoo")
    if found:
        return found
    # A checkout on PYTHONPATH, not installed: read it (utils imports nothing above it).
    text = (Path(__file__).resolve().parents[1] / "version.py").read_text()
    return text.split("__version__", 1)[1].split("=", 1)[1].split("\n")[0].strip().strip("\"'")


def source_hash(package_directory):
    """A short hash (hex, 16 characters) of the `.py` files under
    `package_directory`: their paths relative to it and their contents."""
    digest = hashlib.sha256()
    directory = Path(package_directory)
    for path in sorted(directory.rglob("*.py")):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def _bertzoo_source_hash():
    # An editable or source checkout keeps its version number across commits:
    # its code, not the number, says whether a kernel changed. Once per process
    # (about 1 MB of source).
    return source_hash(Path(__file__).resolve().parents[1])


def library_versions():
    """`{name: version}` of the Keras backend, TensorFlow, Keras and bertzoo,
    and `bertzoo_source`, a hash of bertzoo's own code (`source_hash`): a
    change to it (a checkout at another commit, an edited kernel) measures
    again."""
    versions = {
        "backend": keras.backend.backend(),
        "keras": keras.version(),
        "bertzoo": _bertzoo_version(),
        "bertzoo_source": _bertzoo_source_hash(),
    }
    if keras.backend.backend() == "tensorflow":
        versions["tensorflow"] = tf.__version__
    else:
        versions["tensorflow"] = _distribution_version("tensorflow", "tensorflow-cpu")
    return versions


def _input_structure(model):
    """`{name: KerasTensor}` of a built functional model's inputs, or None."""
    try:
        structure = model.input
    except (AttributeError, ValueError, RuntimeError):
        return None
    if isinstance(structure, dict):
        return dict(structure)
    flat = keras.tree.flatten(structure)
    if not flat or not all(hasattr(t, "shape") and hasattr(t, "dtype") for t in flat):
        return None
    return {getattr(t, "name", None) or f"input_{i}": t for i, t in enumerate(flat)}


def trainer_parts(model):
    """What a trainer wrapping other models (a `bertzoo.Distiller`) is
    measured with, from its `fast_path_parts()`: `{"inputs": the functional
    model whose inputs it takes, "models": {role: model} (their signatures
    key the cache), "settings": {JSON values that change the step},
    "train_loss": inputs -> the scalar its training step differentiates}`;
    None for a plain model.

    Example:
    ```python
    trainer_parts(distiller)["models"]  # {"teacher": ..., "student": ...}
    ```
    """
    hook = getattr(model, "fast_path_parts", None)
    return hook() if callable(hook) else None


def _inputs_model(model):
    parts = trainer_parts(model)
    return parts["inputs"] if parts else model


def measurable(model):
    """Whether `model` can be measured: a built Keras model with symbolic
    inputs (a functional model, as every bertzoo task and backbone is), or
    a trainer around one (`trainer_parts`)."""
    if not isinstance(model, keras.layers.Layer):
        return False
    inputs = _inputs_model(model)
    return isinstance(inputs, keras.layers.Layer) and inputs.built and _input_structure(inputs) is not None


def measurement_sequence_length(model):
    """The sequence length the model is measured at: its preprocessor's when
    it has one, else min(backbone `max_sequence_length`, 128)."""
    model = _inputs_model(model)
    length = getattr(getattr(model, "preprocessor", None), "sequence_length", None)
    if length:
        return int(length)
    backbone = getattr(model, "backbone", model)
    longest = getattr(backbone, "max_sequence_length", None)
    return min(int(longest), DEFAULT_SEQUENCE_LENGTH) if longest else DEFAULT_SEQUENCE_LENGTH


def input_shapes(model, batch_size=DEFAULT_BATCH_SIZE, sequence_length=None):
    """`{input name: (shape, dtype)}` the model is measured with: unknown
    dimensions become `batch_size` (the first) and `sequence_length`, or
    the length `model.measurement_lengths(sequence_length)` gives an input."""
    model = _inputs_model(model)
    structure = _input_structure(model)
    if structure is None:
        raise ValueError(f"{type(model).__name__} has no symbolic inputs to measure with (build it first).")
    sequence_length = sequence_length or measurement_sequence_length(model)
    # Inputs of another length (a pre-trainer's masked positions) say so.
    lengths = model.measurement_lengths(sequence_length) if hasattr(model, "measurement_lengths") else {}
    shapes = {}
    for name, tensor in sorted(structure.items()):
        length = lengths.get(name, sequence_length)
        shape = [d if d is not None else (batch_size if i == 0 else length) for i, d in enumerate(tensor.shape)]
        shapes[name] = (tuple(int(d) for d in shape), str(keras.backend.standardize_dtype(tensor.dtype)))
    return shapes


def example_inputs(shapes):
    """Inputs for `input_shapes(...)`: zeros, and ones for padding masks
    (an all-padding row is not what the model sees)."""
    return {
        name: (np.ones if "mask" in name else np.zeros)(shape, dtype=dtype) for name, (shape, dtype) in shapes.items()
    }


def _config(layer):
    try:
        config = dict(layer.get_config())
    except (NotImplementedError, TypeError, AttributeError):
        return None
    for name in ("name", "trainable"):
        config.pop(name, None)
    return config


def _shapes_hash(weights):
    shapes = [(tuple(int(d) for d in w.shape), str(w.dtype)) for w in weights]
    return hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]


def model_signature(model, batch_size=DEFAULT_BATCH_SIZE, sequence_length=None):
    """What about `model` the measured choice depends on (JSON-ready); for
    a trainer (`trainer_parts`), that of each model it runs, its settings
    and what it trains."""
    sequence_length = sequence_length or measurement_sequence_length(model)
    signature = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        # What the training step differentiates (a frozen backbone is another step).
        "trainable_weights": _shapes_hash(model.trainable_weights),
        "inputs": {
            name: [list(shape), dtype]
            for name, (shape, dtype) in input_shapes(model, batch_size, sequence_length).items()
        },
    }
    parts = trainer_parts(model)
    if parts is not None:
        signature["parts"] = {
            role: model_signature(part, batch_size, sequence_length) for role, part in parts["models"].items()
        }
        signature["settings"] = parts.get("settings", {})
        return signature
    backbone = getattr(model, "backbone", None)
    layers = private_api.flatten_layers(model, include_self=True, recursive=True)
    signature.update(
        {
            "backbone_class": f"{type(backbone).__module__}.{type(backbone).__qualname__}"
            if backbone is not None
            else None,
            "backbone_config": _config(backbone) if backbone is not None else _config(model),
            "dtype_policy": model.dtype_policy.name,
            "layer_dtype_policies": sorted(
                {layer.dtype_policy.name for layer in layers if hasattr(layer, "dtype_policy")}
            ),
            "quantization_mode": quantization_mode(model),
            "weights": _shapes_hash(model.weights),
            "parameters": int(sum(int(np.prod(w.shape)) for w in model.weights)),
            "onednn_int8": bool(onednn_int8_available()),
        }
    )
    return signature


def cache_key(device, versions, signature):
    """The hash the cache is keyed by (hex, 32 characters)."""
    payload = {"format": CACHE_FORMAT, "device": device, "versions": versions, "model": signature}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_file():
    """`$BERTZOO_CACHE_DIR/fast_path.json`, else `~/.cache/bertzoo/fast_path.json`."""
    directory = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "bertzoo"
    return Path(directory).expanduser() / CACHE_FILE_NAME


# --- The disk cache -----------------------------------------------------------


def _read_cache(path, keep_unknown=False):
    """`{key: entry}` from `path`; {} when missing, and when unreadable (with a
    logged warning: the file is rewritten at the next measurement). Entries
    of another layout are left out, or with `keep_unknown` kept as they are
    (a writer keeps what another bertzoo version of this format wrote)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        logger.warning("Ignoring the fast-path cache %s: %s.", path, e)
        return {}
    try:
        data = json.loads(data)  # Bytes that are not UTF-8: a ValueError too.
        if (
            not isinstance(data, dict)
            or data.get("format") != CACHE_FORMAT
            or not isinstance(data.get("entries"), dict)
        ):
            raise ValueError(f"not a format-{CACHE_FORMAT} bertzoo fast-path cache")
        return {k: v for k, v in data["entries"].items() if keep_unknown or _valid_entry(v)}
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep to parse.
        logger.warning("Ignoring the unreadable fast-path cache %s (%s); it will be rewritten.", path, e)
        return {}


def _valid_entry(entry):
    """Whether a cache entry has the layout and value types `_to_entry`
    writes (a damaged or hand-edited one is dropped, so that model is
    measured again)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("modes"), dict):
        return False
    for mode, decided in entry["modes"].items():
        if (
            mode not in MODES
            or not isinstance(decided, dict)
            or not any(decided.get("chosen") is v for v in (True, False, None))
        ):
            return False
        candidates = decided.get("candidates", [])
        if not isinstance(candidates, list) or not all(isinstance(c, dict) for c in candidates):
            return False
    if not isinstance(entry.get("measured_at"), str):
        return False
    try:  # The values' types: the report must build and print (`explain_fast_path`), which reads every field.
        report = _from_entry(entry, "", None, None)
        str(report), report.summary()
    except Exception as e:  # Whatever a damaged entry raises (OverflowError from 10**400 too): measured again.
        logger.debug("Dropping a fast-path cache entry whose report fails (%s: %s).", type(e).__name__, e)
        return False
    return True


@contextlib.contextmanager
def _cache_lock(path):
    """Holds an exclusive advisory lock on `<path>.lock` while this process
    reads, updates and replaces the cache, so that processes measuring at
    the same time keep each other's entries. Best effort: where no lock can
    be had (no `fcntl` on Windows, a lock file that cannot be opened, a
    network filesystem without `flock`, a holder that does not let go
    within `LOCK_WAIT_S`) the update goes ahead unlocked, as before there
    were locks; a concurrent writer may then drop an entry, which is
    measured again."""
    descriptor = _open_lock_file(path) if fcntl is not None else None
    try:
        if descriptor is not None:
            _take_lock(descriptor, path)
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)  # Releases the lock.


def _open_lock_file(path):
    """A descriptor of `<path>.lock` (created 0644), or None. Read-only where
    another user's file allows no more: `flock` needs no write access
    (except on NFS, where `_take_lock` then goes without)."""
    lock_path = path.with_name(path.name + ".lock")
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            descriptor = os.open(lock_path, flags, 0o644)
        except OSError:
            continue
        try:
            os.fchmod(descriptor, 0o644)  # The umask would shut the other users of a shared directory out.
        except OSError:
            pass  # Another user's file: theirs to set.
        return descriptor
    logger.debug("No lock file %s: updating the fast-path cache unlocked.", lock_path)
    return None


def _take_lock(descriptor, path):
    """Takes the lock, waiting up to `LOCK_WAIT_S`; where it cannot, logs why
    and returns, and the caller goes on unlocked."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                logger.warning(
                    "Another process has held the fast-path cache lock %s.lock for over %.0f s; "
                    "updating the cache without it.",
                    path,
                    LOCK_WAIT_S,
                )
                return
            time.sleep(0.01)
        except OSError as e:  # E.g. NFS without flock, ENOLCK.
            logger.debug("Cannot lock %s.lock (%s): updating the fast-path cache unlocked.", path, e)
            return


def _write_cache(path, key, entry):
    """Adds `entry` to the cache at `path`: under `_cache_lock`, read, update,
    write to a temporary file in the same directory and `os.replace` it
    (atomic: a reader, which takes no lock, sees the old file or the new
    one). Failures are logged, never raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _cache_lock(path):
            _update_cache(path, key, entry)
    except OSError as e:
        logger.warning("Could not write the fast-path cache %s: %s.", path, e)


def _update_cache(path, key, entry):
    entries = _read_cache(path, keep_unknown=True)
    if _valid_entry(entries.get(key)):  # Another process measured this model's other mode meanwhile: keep it too.
        entry = {**entry, "modes": {**entries[key]["modes"], **entry["modes"]}}
    entries[key] = entry

    def measured_at(k):  # Entries of another layout sort first.
        when = entries[k].get("measured_at") if isinstance(entries[k], dict) else None
        return when if isinstance(when, str) else ""

    if len(entries) > MAX_CACHE_ENTRIES:  # Oldest first out.
        for old in sorted(entries, key=measured_at)[: len(entries) - MAX_CACHE_ENTRIES]:
            del entries[old]
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):  # mkstemp's 0600 would hide a shared $BERTZOO_CACHE_DIR's file from others.
            os.fchmod(descriptor, 0o644)
        with os.fdopen(descriptor, "w") as f:
            json.dump({"format": CACHE_FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def clear_memory_cache():
    """Forgets this process's measured choices (the disk cache stays), as a
    new process would start."""
    with _lock:
        _memory.clear()


# --- The report ---------------------------------------------------------------


@dataclasses.dataclass
class Candidate:
    """One timed candidate: `mode` ("predict" or "train") with `jit_compile`."""

    mode: str
    jit_compile: bool
    median_s: float = None
    runs_s: list = dataclasses.field(default_factory=list)
    compile_s: float = None
    error: str = None

    @property
    def name(self):
        return f"{self.mode}/{'xla' if self.jit_compile else 'no_xla'}"


@dataclasses.dataclass
class FastPathReport:
    """What was chosen for a model, and why.

    `predict` and `train` are the per-mode `jit_compile` choices (None: not
    decided here, the rule applies). `source` is "measured", "cache",
    "pinned" or "rule". `str(report)` is a readable table.
    """

    model: str
    source: str
    predict: bool = None
    train: bool = None
    candidates: list = dataclasses.field(default_factory=list)
    reason: str = ""
    cost_s: float = None
    measured_at: str = None
    key: str = None
    cache_file: str = None
    device: dict = None
    versions: dict = None
    inputs: dict = None

    def choice(self, mode):
        """The `jit_compile` choice for "predict", "test" (as predict) or "train"."""
        if mode not in ("predict", "test", "train"):
            raise ValueError(f"mode must be 'predict', 'test' or 'train', got {mode!r}.")
        return self.train if mode == "train" else self.predict

    @property
    def jit_compile(self):
        """The single value for `keras.Model.compile`: the training step's
        choice (what `fit` runs), else the inference one."""
        return self.train if self.train is not None else self.predict

    def summary(self):
        """One line, as logged."""
        chosen = f"predict jit_compile={self.predict}, train jit_compile={self.train}"
        if self.source == "measured":
            how = f"measured in {self.cost_s:.1f} s: " + ", ".join(
                f"{c.name} failed ({c.error})"
                if c.error
                else f"{c.name} {_ms(c.median_s)}"
                + (f" (compile {c.compile_s:.1f} s)" if c.compile_s is not None else "")
                for c in self.candidates
            )
        elif self.source == "cache":
            how = f"cached, measured {self.measured_at}"
        else:
            how = self.reason
        if self.source in ("measured", "cache") and self.reason:
            how = f"{how}; {self.reason}"
        where = f"; cache key {self.key} in {self.cache_file}" if self.key else ""
        return f"Fast path for {self.model}: {chosen} ({self.source}: {how}{where})."

    def __str__(self):
        lines = [f"Fast path for {self.model}  (source: {self.source}{', ' + self.reason if self.reason else ''})"]
        if self.candidates:
            header = ("mode", "jit_compile", "median", "runs", "compile", "chosen")
            rows = []
            for c in self.candidates:
                chosen = "*" if c.error is None and self.choice(c.mode) == c.jit_compile else ""
                median = f"failed: {c.error}" if c.error else _ms(c.median_s)
                compiled = f"{c.compile_s:.2f} s" if c.compile_s is not None else "-"
                rows.append((c.mode, str(c.jit_compile), median, str(len(c.runs_s)), compiled, chosen))
            widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
            for row in [header, *rows]:
                lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        lines.append(f"chosen: predict jit_compile={self.predict}, train jit_compile={self.train}")
        if self.inputs:
            lines.append(
                "inputs: " + ", ".join(f"{name} {tuple(shape)} {dtype}" for name, (shape, dtype) in self.inputs.items())
            )
        if self.cost_s is not None:
            lines.append(f"cost: {self.cost_s:.2f} s" + (f" (measured {self.measured_at})" if self.measured_at else ""))
        if self.device:
            flags = " ".join(self.device.get("cpu_flags", [])) or "no listed flags"
            accelerators = ", ".join(self.device.get("accelerators", []))
            lines.append(
                f"device: {self.device.get('kind')}; {self.device.get('cpu')} ({flags}), {self.device.get('cores')} cores"
                + (f"; {accelerators}" if accelerators else "")
            )
        if self.versions:
            lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items())))
        if self.key:
            lines.append(f"cache: key {self.key} in {self.cache_file}")
        return "\n".join(lines)


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _record(model, report, keep=True):
    """Logs `report` and, with `keep`, records it as `model`'s choice."""
    if keep and isinstance(model, keras.layers.Layer):
        with _lock:
            _recorded[model] = report
    logger.info("%s", report.summary())
    return report


def _name(model_or_policy):
    if isinstance(model_or_policy, keras.layers.Layer):
        return type(model_or_policy).__name__
    return f"dtype policy {model_or_policy}"


def _rule_report(model_or_policy, value, reason, source="rule", keep=True):
    report = FastPathReport(model=_name(model_or_policy), source=source, predict=value, train=value, reason=reason)
    return _record(model_or_policy, report, keep)


def rule_choice(model_or_policy, value, reason):
    """Records (for a model) and logs a choice made by a rule, not measured;
    returns `value`."""
    _rule_report(model_or_policy, value, reason)
    return value


def record_pinned(model, value, reason="jit_compile passed to compile()"):
    """Records that `model` was compiled with an explicit `jit_compile`, so
    the per-mode choice (`jit_compile_for`) follows it."""
    if isinstance(model, keras.layers.Layer):
        report = FastPathReport(model=_name(model), source="pinned", predict=value, train=value, reason=reason)
        _record(model, report)
    return value


def forget_choice(model):
    """Drops the choice recorded for `model` unless it is a pin, for a
    model whose weights changed kind in place (Keras's `Model.quantize`):
    the next step decides again, for what the model now holds."""
    with _lock:
        recorded = _recorded.get(model)
        if recorded is not None and recorded.source != "pinned":
            del _recorded[model]


def forget_pin(model):
    """Drops a pinned choice recorded for `model`, for a
    `compile(jit_compile="auto")` after a pinned one: `explain_fast_path`
    then tells what "auto" chooses, and the next step decides. A choice
    "auto" made stays: it is what "auto" chooses again."""
    with _lock:
        recorded = _recorded.get(model)
        if recorded is not None and recorded.source == "pinned":
            del _recorded[model]


def jit_compile_for(model, mode, default=None):
    """The recorded `jit_compile` choice for `model` in `mode` ("train",
    "test" or "predict"), or `default` when none was made (or it left the
    mode undecided). For `Task.make_train_function` and friends, where a
    per-mode choice replaces the single `compile()` value."""
    with _lock:
        report = _recorded.get(model) if isinstance(model, keras.layers.Layer) else None
    value = report.choice(mode) if report is not None else None
    return default if value is None else value


# --- Measuring ------------------------------------------------------------------


def _block(result):
    """Waits for `result` (async GPU execution) by fetching its smallest tensor."""
    flat = [t for t in keras.tree.flatten(result) if hasattr(t, "shape")]
    if flat:
        keras.ops.convert_to_numpy(min(flat, key=lambda t: int(np.prod(t.shape))))


def wall_timer(name, fn):
    """The default timer: seconds `fn()` takes, waiting for its results."""
    start = time.perf_counter()
    _block(fn())
    return time.perf_counter() - start


def _candidate_functions(model, x, modes):
    def scalar(outputs):
        return tf.add_n([tf.reduce_mean(tf.cast(t, "float32")) for t in keras.tree.flatten(outputs)])

    parts = trainer_parts(model)
    # A trainer's step runs all of its models (a distiller's teacher too).
    train_loss = parts["train_loss"] if parts else (lambda inputs: scalar(model(inputs, training=True)))

    x = {name: tf.constant(value) for name, value in x.items()}

    def make(mode, jit_compile):
        if mode == "predict":
            function = tf.function(lambda inputs: model(inputs, training=False), jit_compile=jit_compile)
        else:

            def step(inputs):
                with tf.GradientTape() as tape:
                    loss = tf.cast(train_loss(inputs), "float32")
                # Returned, so no part of the gradient is pruned away.
                return loss, tape.gradient(loss, model.trainable_variables)

            function = tf.function(step, jit_compile=jit_compile)
        return lambda: function(x)

    return {(mode, jit): make(mode, jit) for mode in modes for jit in (False, True)}


def _clearly_decided(candidates, mode, clear_gain=CLEAR_GAIN, min_runs=2):
    """True when `mode` has two candidates timed `min_runs` times or more
    and every run of one beat every run of the other by `clear_gain` (one
    run each would let a single hiccup of a shared machine decide)."""
    timed = [c.runs_s for c in candidates if c.mode == mode and len(c.runs_s) >= min_runs]
    if len(timed) != 2:
        return False
    fast, slow = sorted(timed, key=min)
    return max(fast) < min(slow) * (1 - clear_gain)


class _DeliberateTracing(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning while the
    candidates trace. It counts traces by the Python code traced, across
    `tf.function`s, so the third model a process measured read as excessive
    retracing, though each candidate traces once, on purpose."""

    def filter(self, record):
        return "triggered tf.function retracing" not in record.getMessage()


def _measure(model, shapes, modes, runs, budget_s, timer):
    """`[Candidate]` for `modes`, timed interleaved: one warm-up call each
    (the compile time), then up to `runs` rounds, alternating the order,
    until `budget_s` of timed runs once every candidate has a run, or until
    each mode is clearly decided (`_clearly_decided`)."""
    x = example_inputs(shapes)
    functions = _candidate_functions(model, x, modes)
    candidates = {key: Candidate(mode=key[0], jit_compile=key[1]) for key in functions}
    saved = [(v, keras.ops.convert_to_numpy(v)) for v in model.non_trainable_variables]
    tracing_filter = _DeliberateTracing()
    tf.get_logger().addFilter(tracing_filter)
    try:
        for key, candidate in candidates.items():
            try:
                candidate.compile_s = float(timer(candidate.name, functions[key]))
            except Exception as e:  # A candidate that cannot run is reported, not chosen.
                candidate.error = _error_line(e)
        working = [key for key in candidates if candidates[key].error is None]
        spent = 0.0
        for round_index in range(runs):
            if round_index and spent >= budget_s:
                break
            working = [key for key in working if not _clearly_decided(candidates.values(), key[0])]
            for key in list(working) if round_index % 2 == 0 else list(reversed(working)):
                try:
                    seconds = float(timer(candidates[key].name, functions[key]))
                except Exception as e:  # E.g. out of memory while both paths hold buffers: not chosen.
                    candidates[key].error = _error_line(e)
                    candidates[key].runs_s.clear()
                    working.remove(key)
                    continue
                candidates[key].runs_s.append(seconds)
                spent += seconds
    finally:
        tf.get_logger().removeFilter(tracing_filter)
        for variable, value in saved:
            variable.assign(value)
    for candidate in candidates.values():
        if candidate.runs_s:
            candidate.median_s = statistics.median(candidate.runs_s)
    return list(candidates.values())


def _error_line(error):
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{type(error).__name__}: {first_line}"


def _decide(candidates, mode, min_gain=MIN_GAIN):
    timed = {c.jit_compile: c.median_s for c in candidates if c.mode == mode and c.median_s is not None}
    if not timed:
        return None
    if len(timed) == 1:
        return next(iter(timed))
    return timed[True] < timed[False] * (1 - min_gain)


def _to_entry(report, modes):
    return {
        "modes": {
            mode: {
                "chosen": report.choice(mode),
                "candidates": [dataclasses.asdict(c) for c in report.candidates if c.mode == mode],
            }
            for mode in modes
        },
        "measured_at": report.measured_at,
        "cost_s": report.cost_s,
        "device": report.device,
        "versions": report.versions,
        "inputs": report.inputs,
        "model": report.model,
    }


def _modes_of_entry(entry):
    """`(candidates, predict choice, train choice)` of a cache entry (a mode
    not in it: no candidates, choice None)."""
    modes = entry["modes"]
    candidates = [Candidate(**c) for mode in MODES for c in modes.get(mode, {}).get("candidates", [])]
    return candidates, modes.get("predict", {}).get("chosen"), modes.get("train", {}).get("chosen")


def _from_entry(entry, model_name, key, path):
    candidates, predict, train = _modes_of_entry(entry)
    return FastPathReport(
        model=model_name,
        source="cache",
        predict=predict,
        train=train,
        candidates=candidates,
        cost_s=entry.get("cost_s"),
        measured_at=entry.get("measured_at"),
        key=key,
        cache_file=str(path) if path else None,
        device=entry.get("device"),
        versions=entry.get("versions"),
        inputs=entry.get("inputs"),
    )


def _replicas(strategy):
    """`(num_replicas, is_tpu)` of a `tf.distribute` strategy (or None)."""
    if strategy is None or keras.backend.backend() != "tensorflow":
        return 1, False
    return int(strategy.num_replicas_in_sync), "TPU" in type(strategy).__name__


def jit_compile_supported(strategy=None):
    """Whether Keras `fit`/`predict` steps can be XLA-compiled under `strategy`.

    No for a `tf.distribute` strategy with several replicas (MirroredStrategy,
    MultiWorkerMirroredStrategy): Keras's TensorFlow trainer wraps the whole
    `strategy.run(train_step)` call, i.e. every replica's computation, in one
    `tf.function(jit_compile=True)`, and one XLA computation runs on one
    device. Reading the second replica's variables from it fails with
    "Trying to access resource .../replica_1/... located in device CPU:1 from
    device CPU:0" (tested here on two logical CPUs). The same holds on real
    multi-GPU machines, as reported upstream: keras-team/keras#18145 (8 x
    A100), tensorflow/tensorflow#53140 (P100s) and #45940 (variables not
    shareable across replicas in one XLA computation), #48502 (no
    `NcclAllReduce` kernel for XLA GPU devices), tensorflow/models#10752
    (MultiWorkerMirroredStrategy, 2 x 8 GPUs), and keras-hub#949, after
    which keras-hub stopped compiling with XLA under a strategy. Keras's own
    `jit_compile="auto"` turns XLA off under a strategy for this reason.
    The workaround TensorFlow's maintainers suggest there (#45940) is XLA
    auto-clustering within each replica (`TF_XLA_FLAGS=--tf_xla_auto_jit=2`
    with `jit_compile=False`); not tested here, for want of several GPUs.

    `strategy=None` looks at the strategy in scope (TensorFlow backend).

    Example:
    ```python
    with tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]).scope():
        jit_compile_supported()  # False
    ```
    """
    if strategy is None and keras.backend.backend() == "tensorflow":
        strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    replicas, is_tpu = _replicas(strategy)
    return replicas == 1 or is_tpu


def choose_jit_compile(
    model,
    jit_compile="auto",
    *,
    modes=MODES,
    batch_size=DEFAULT_BATCH_SIZE,
    sequence_length=None,
    runs=DEFAULT_RUNS,
    budget_s=DEFAULT_BUDGET_SECONDS,
    timer=None,
    device=None,
    versions=None,
    cache=True,
    refresh=False,
    record=True,
):
    """Chooses `jit_compile` per mode for `model` on this machine: pinned,
    cached, or measured; returns a `FastPathReport` (also recorded for
    `jit_compile_for` and `explain_fast_path`, and logged at INFO).

    Args:
        model: a built functional Keras model (any bertzoo task or backbone).
        jit_compile: True/False pins; "auto" measures unless
            `$BERTZOO_JIT_COMPILE` pins 0 or 1.
        modes: which of "predict" and "train" to decide.
        batch_size, sequence_length: the input shapes measured (default 8 x
            the preprocessor's sequence length, else min(the backbone's
            `max_sequence_length`, 128)).
        runs: timed rounds (median of these), within `budget_s` seconds of
            timed runs once each candidate has one.
        timer: `timer(candidate_name, fn) -> seconds` (default
            `wall_timer`); tests inject a clock here.
        device, versions: replace `device_description()` /
            `library_versions()` in the cache key (tests).
        cache: read and write the disk cache (`cache_file()`).
        refresh: measure even when a cached choice exists.
        record: record the report as the model's choice (`jit_compile_for`,
            `explain_fast_path`); False answers without changing what the
            model runs or reports (it is still cached and logged).

    Example:
    ```python
    report = choose_jit_compile(model)
    model.compile(jit_compile=report.train)
    ```
    """
    modes = (modes,) if isinstance(modes, str) else modes
    modes = tuple(dict.fromkeys("predict" if m == "test" else m for m in modes))
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"modes must be among {MODES}, got {sorted(unknown)}.")
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):  # Not 1 or 0: `compile()` refuses them.
        raise ValueError(f"jit_compile must be True, False or 'auto', got {jit_compile!r}.")
    batch_size, runs = check_positive_int("batch_size", batch_size), check_positive_int("runs", runs)
    if sequence_length is not None:
        sequence_length = check_positive_int("sequence_length", sequence_length)
        inputs_model = _inputs_model(model)
        backbone = getattr(inputs_model, "backbone", inputs_model)
        longest = getattr(backbone, "max_sequence_length", None)
        if longest and sequence_length > longest:  # Else every candidate fails inside the measurement.
            raise ValueError(
                f"`sequence_length`={sequence_length} is longer than the model's max_sequence_length={longest}: "
                f"measure at most {longest} tokens."
            )
    name = type(model).__name__
    if getattr(model, "run_eagerly", False) is True:  # Keras ignores jit_compile then: nothing to measure.
        return _rule_report(model, False, "compiled with run_eagerly=True: the steps run eagerly", keep=record)
    if jit_compile == "auto":
        pinned = pinned_jit_compile()
        if pinned in (True, False):
            jit_compile, pin_reason = pinned, f"{PIN_ENV}={os.environ.get(PIN_ENV)}"
        elif pinned == "rule":  # Not measured: `compile()` reads its rule (`auto_jit_compile`).
            reason = f"{PIN_ENV}=rule: decided by the rule, nothing measured"
            return _record(model, FastPathReport(model=name, source="rule", reason=reason), record)
    else:
        pin_reason = "jit_compile passed explicitly"
    if jit_compile in (True, False):
        return _rule_report(model, jit_compile, pin_reason, source="pinned", keep=record)
    backend_choice = backend_jit_compile()
    if backend_choice is not None:
        return _rule_report(model, backend_choice, f"the {keras.backend.backend()} backend's rule", keep=record)
    if not jit_compile_supported():  # Timed outside `strategy.run`, the steps would not be the real ones.
        reason = "a multi-replica tf.distribute strategy: XLA off (jit_compile_supported)"
        return _rule_report(model, False, reason, keep=record)
    if not measurable(model):
        reason = "nothing to measure: not a built model with symbolic inputs"
        return _record(model, FastPathReport(model=name, source="rule", reason=reason), record)
    device = device_description() if device is None else device
    if device.get("kind") == "tpu":
        return _rule_report(model, True, "TPU: always XLA (TPUStrategy compiles every step)", keep=record)
    versions = library_versions() if versions is None else versions
    signature = model_signature(model, batch_size, sequence_length)
    key = cache_key(device, versions, signature)
    path = cache_file() if cache else None
    with _lock:
        entry = None if refresh else _memory.get(key)
        if cache and not refresh and not _has_modes(entry, modes):
            # Another process may have measured the modes this one has not since.
            entry = _merged_entry(_read_cache(path).get(key), entry)
        if _has_modes(entry, modes):
            _memory[key] = entry
            return _record(model, _from_entry(entry, name, key, path), record)
        earlier = entry
        start = time.perf_counter()
        candidates = _measure(
            model, input_shapes(model, batch_size, sequence_length), modes, runs, budget_s, timer or wall_timer
        )
        report = FastPathReport(
            model=name,
            source="measured",
            candidates=candidates,
            cost_s=time.perf_counter() - start,
            measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            key=key,
            cache_file=str(path) if path else None,
            device=device,
            versions=versions,
            inputs=signature["inputs"],
        )
        report.predict = _decide(candidates, "predict") if "predict" in modes else None
        report.train = _decide(candidates, "train") if "train" in modes else None
        entry = _to_entry(report, modes)
        if earlier is not None:  # Keep the modes measured before, and report them.
            entry["modes"] = {**earlier["modes"], **entry["modes"]}
            report.candidates, report.predict, report.train = _modes_of_entry(entry)
            report.cost_s += earlier.get("cost_s") or 0.0
            entry["cost_s"] = report.cost_s
        _memory[key] = entry
        if cache and not any(_transient(c.error) for c in candidates):
            _write_cache(path, key, entry)
    return _record(model, report, record)


def _has_modes(entry, modes):
    return entry is not None and all(mode in entry["modes"] for mode in modes)


def _merged_entry(on_disk, in_memory):
    """The disk's entry with this process's modes over it (what this
    process's models already run stays), or whichever of them exists."""
    if on_disk is None or in_memory is None:
        return in_memory if on_disk is None else on_disk
    return {**on_disk, "modes": {**on_disk["modes"], **in_memory["modes"]}}


# Failures that say nothing lasting about a candidate (memory another process
# held, say): such a measurement serves this process only, the next measures again.
_TRANSIENT_ERRORS = ("ResourceExhaustedError", "UnavailableError", "MemoryError", "OutOfMemoryError")


def _transient(error):
    return error is not None and error.split(":", 1)[0] in _TRANSIENT_ERRORS


def auto_jit_compile(model_or_policy, rule, rule_reason="the rule: nothing measured", mode=None):
    """The choice `jit_compile="auto"` makes on the TensorFlow backend
    without a multi-replica strategy (`bertzoo.utils.device` checks the
    backend and strategy first): `$BERTZOO_JIT_COMPILE` pins, else the
    measured (or cached) choice for a model, else `rule` (policies, models
    without symbolic inputs, `BERTZOO_JIT_COMPILE=rule`, a mode no candidate
    of which could run, or a measurement that failed: `compile()` never
    fails for want of one). `mode` ("train", "test" or "predict") measures
    that mode only; None measures both. A mode not measured yet reads
    `rule` meanwhile. Returns a `FastPathReport`, recorded for the model
    with the rule's value in any mode no candidate of which ran (its
    `reason` says so)."""
    pinned = pinned_jit_compile()
    report = None
    if pinned != "rule" and measurable(model_or_policy):
        try:
            report = choose_jit_compile(model_or_policy, modes=MODES if mode is None else (mode,))
        except Exception as e:  # Measuring is an optimization: fall back to the rule.
            logger.warning(
                "Could not measure the fast path of %s (%s: %s); using the rule.",
                _name(model_or_policy),
                type(e).__name__,
                e,
            )
            rule_reason = f"{rule_reason} (measuring failed: {type(e).__name__})"
    if report is not None:
        wanted = MODES if mode is None else ("predict" if mode == "test" else mode,)
        # A mode measured without a candidate that ran stays undecided in the
        # cache, and its step runs the rule: so does the report, whichever
        # step asks, so that `explain_fast_path` tells what runs.
        undecided = [
            name
            for name in MODES
            if report.choice(name) is None and (name in wanted or any(c.mode == name for c in report.candidates))
        ]
        if not undecided:
            return report
        reason = f"the rule for {' and '.join(undecided)}: no candidate ran"
        filled = dataclasses.replace(report, **{name: rule for name in undecided}, reason=reason)
        return _record(model_or_policy, filled)
    if pinned in (True, False):
        return _rule_report(model_or_policy, pinned, f"{PIN_ENV}={os.environ.get(PIN_ENV)}", source="pinned")
    reason = f"{PIN_ENV}=rule: {rule_reason}" if pinned == "rule" else rule_reason
    return _rule_report(model_or_policy, rule, reason)


def explain_fast_path(model, jit_compile=None, **options):
    """What `jit_compile` choice was (or would be) made for `model`, and why:
    a `FastPathReport` (`str()` is a table of the candidates, medians,
    compile times, the choice, its source and the cache key and file).

    With `jit_compile=None` and no options: what the model runs, the
    choice last recorded for it (by `compile()`, the step `fit`, `evaluate`
    or `predict` built, or `choose_jit_compile`), else what "auto" chooses
    now (measuring, or reading the cache; recorded).

    With `jit_compile` or `options` (for `choose_jit_compile`, e.g.
    `refresh=True`, `batch_size=32`): what that choice would be, cached as
    usual but not recorded for the model, which keeps the choice it runs (a
    pinned `compile(jit_compile=True)` stays pinned); where the model's
    choice differs, or is a pin, the report's `reason` names it.

    Example:
    ```python
    print(bertzoo.explain_fast_path(model))
    print(bertzoo.explain_fast_path(model, refresh=True))  # Measures again.
    ```
    """
    with _lock:
        recorded = _recorded.get(model) if isinstance(model, keras.layers.Layer) else None
    if jit_compile is None and not options:
        return recorded if recorded is not None else choose_jit_compile(model)
    options = {"record": False, **options}
    report = choose_jit_compile(model, "auto" if jit_compile is None else jit_compile, **options)
    if recorded is not None and not options["record"]:
        runs = (recorded.predict, recorded.train)
        if runs != (report.predict, report.train):
            note = (
                f"not what the model runs: its {recorded.source} choice, "
                f"predict jit_compile={runs[0]}, train jit_compile={runs[1]}"
            )
        elif recorded.source == "pinned":
            note = "the model runs the same, pinned by compile()"
        else:
            note = None
        if note:
            report = dataclasses.replace(report, reason="; ".join(filter(None, (report.reason, note))))
    return report
