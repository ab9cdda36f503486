"""Training that survives interruption: `ResumableTraining`.

A `fit` killed mid-epoch (an exception, `kill -9`, a lost machine) and run
again with a `ResumableTraining` callback continues from its last checkpoint
and ends with the weights an uninterrupted run would have reached, to the
last bit on the same machine. `keras.callbacks.BackupAndRestore` does not
give that, for four reasons this module fixes:

- It restarts the interrupted epoch from its first batch (its metadata
  records the batch, but restoring ignores it), so the batches done before
  the interruption are trained on twice.
- Its checkpoint (`model.save_weights`) leaves out the `SeedGenerator`
  states, so dropout draws other masks after a restart.
- Shuffling is not reproducible in a new process: `tf.data`'s
  `reshuffle_each_iteration` order of epoch `e` depends on how many
  iterators the process created before.
- It writes its weights file in place: a process killed while writing
  leaves a truncated checkpoint.

Here the checkpoint is one `.npz` file (written beside its target, then
`os.replace`d: always the complete old or the complete new one) holding
every variable of the model (weights, pruning masks and step counters,
`SeedGenerator` states) and of its optimizer (slots, iteration count), the
position (epoch, batches done in it), the learning-rate schedule's length,
the batch size and a fingerprint of the data: for in-memory data (texts,
arrays), a SHA-256 of every example and the batch size; for a
`tf.data.Dataset`, of its element spec, its number of batches and the
contents of its first 3 batches (read twice, the rest not at all; a
checkpoint of an older bertzoo, which recorded the number of batches
alone, is checked against that). The data order is a pure function of
`(seed, epoch)`: epoch `e` visits the examples in the order
`tf.random.experimental.stateless_shuffle(range(n), seed=(seed, e))`, so a
new process can rebuild it, skip the batches already done, and go on.

Contract: resume with the same model (built the same way), the same
compile settings, the same data, and the same `fit` arguments (`epochs`,
`batch_size`, `shuffle`, `class_weight`) and callback `seed`; the data's
fingerprint, batch size, epochs, seed, shuffling, class weights, the
layers' dtype policies and the optimizer's class and config are checked
before training, the model's and optimizer's variables (number, shapes,
dtypes, as recorded and as stored) before any is restored; a position past
the run, or arrays that do not fit their variables, are refused as damage.
Preprocessing must be deterministic (masked-LM pre-training draws its masks
at random in `tf.data`, so `BertPretrainer` resumes on schedule but not bit
for bit). A `tf.data.Dataset` given to `fit` must yield the same batches in
the same order on every pass and in every process: a `shuffle` in it needs a
`seed` and `reshuffle_each_iteration=False`. One whose first batches change from
one pass to the next is refused when `fit` starts; one whose order changes
from process to process changes the fingerprint, and its resume is refused.
Pass raw texts or arrays instead to let bertzoo shuffle reproducibly, in
another order every epoch.
"""

import hashlib
import json
import os
import random
import re
import tempfile
from pathlib import Path

import keras
import numpy as np

from bertzoo.models.raw_inputs import DEFAULT_BATCH_SIZE
from bertzoo.models.raw_inputs import check_dataset_carries_targets
from bertzoo.models.raw_inputs import is_stream
from bertzoo.models.raw_inputs import set_schedule_length
from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.saving.atomic import current_umask
from bertzoo.saving.atomic import make_parent_directories
from bertzoo.saving.atomic import process_alive
from bertzoo.saving.atomic import remove_empty_directories
from bertzoo.saving.atomic import sync_directory
from bertzoo.utils import private_api
from bertzoo.utils.optional import is_tf_dataset
from bertzoo.utils.optional import tf

CHECKPOINT_NAME = "training_state.npz"
_FORMAT = 1
_META = "__meta__"
_TORCH_RNG = "torch_rng_"  # + "cpu", "cuda000", ...: PyTorch's global generators' states.


def _global_random_states():
    """States of the random-number generators outside Keras's seed
    generators that training draws from, as arrays to checkpoint: on the
    torch backend PyTorch's global generators (Keras's torch dropout draws
    its masks there unless the layer has a seed). None elsewhere."""
    if keras.backend.backend() != "torch":
        return {}
    import torch

    states = {f"{_TORCH_RNG}cpu": torch.random.get_rng_state().numpy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"{_TORCH_RNG}cuda{i:03d}"] = state.numpy()
    return states


def _set_global_random_states(arrays):
    """Restores what `_global_random_states` saved (GPU states where the
    process has as many GPUs)."""
    if keras.backend.backend() != "torch":
        return
    import torch

    if f"{_TORCH_RNG}cpu" in arrays:
        torch.random.set_rng_state(torch.from_numpy(np.array(arrays[f"{_TORCH_RNG}cpu"])))
    cuda = sorted(key for key in arrays if key.startswith(f"{_TORCH_RNG}cuda"))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([torch.from_numpy(np.array(arrays[key])) for key in cuda])


def _class_weight_setting(class_weight):
    """`fit`'s `class_weight` as the checkpoint records it (JSON: string
    keys, in order), or None: it weighs the loss as `sample_weight` does,
    which the data fingerprint covers."""
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict):
        return repr(class_weight)  # Keras refuses it.

    def number(value):
        try:
            return float(value)
        except (TypeError, ValueError):
            return repr(value)  # Keras refuses it; recorded as given meanwhile.

    return {str(k): number(v) for k, v in sorted(class_weight.items(), key=lambda item: str(item[0]))}


class EpochOrder:
    """Which batches `fit` visits, epoch by epoch: examples in a seeded order
    for each epoch (`shuffle`) or in their given order, batched within each
    epoch, for epochs `first` to `last - 1`, the first `skip` batches left
    out. Passed to `Task._as_dataset` as its `shuffle` argument.

    `fingerprint`: the data's, when another `EpochOrder` of the same `fit`
    has read it already (the data is then not read again).
    """

    def __init__(self, seed, shuffle, first, last, skip=0, fingerprint=None):
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.first, self.last, self.skip = int(first), int(last), int(skip)
        self.fingerprint = fingerprint
        # Filled in when the data is seen.
        self.num_examples = None
        self.steps_per_epoch = None

    def _stream(self, batches_of_epoch, steps_per_epoch):
        self.steps_per_epoch = int(steps_per_epoch)
        total = max(0, (self.last - self.first) * self.steps_per_epoch - self.skip)
        stream = tf.data.Dataset.range(self.first, self.last).flat_map(batches_of_epoch).skip(self.skip)
        return stream, total

    def batches(self, examples, batch_size, prepare=None):
        """Unbatched `examples` (a dataset of known length, e.g. from
        `from_tensor_slices`) -> the batches of every epoch, one after the
        other. `prepare`: a function of all the examples at once (e.g. the
        tokenized features), run after they are fingerprinted as given."""

        n = int(examples.cardinality())
        if n <= 0:
            raise ValueError("ResumableTraining needs in-memory training data with at least one example.")
        whole = examples.batch(n).get_single_element()
        self.num_examples = n
        if self.fingerprint is None:
            self.fingerprint = _fingerprint(whole, batch_size)
        if prepare is not None:
            whole = prepare(whole)
        seed = tf.constant(self.seed, tf.int64)

        def batches_of_epoch(epoch):
            indices = tf.range(n, dtype=tf.int64)
            if self.shuffle:
                indices = tf.random.experimental.stateless_shuffle(indices, seed=tf.stack([seed, epoch]))
            return tf.data.Dataset.from_tensor_slices(indices).batch(batch_size)

        stream, total = self._stream(batches_of_epoch, -(-n // batch_size))
        stream = stream.map(lambda i: tf.nest.map_structure(lambda t: tf.gather(t, i), whole))
        return stream.apply(tf.data.experimental.assert_cardinality(total))

    def repeat(self, dataset):
        """A batched `dataset` (the same batches on every iteration) -> its
        batches once per epoch, one epoch after the other."""

        steps = int(dataset.cardinality())
        if steps <= 0:
            raise ValueError(
                "ResumableTraining needs a tf.data.Dataset of known, finite length (its cardinality is "
                f"{steps}): drop `filter`/`repeat`, or pass the data in memory."
            )
        self.num_examples = None
        if self.fingerprint is None:
            self.fingerprint = _dataset_fingerprint(dataset, steps)
        stream, total = self._stream(lambda epoch: dataset, steps)
        return stream.apply(tf.data.experimental.assert_cardinality(total))


def _fingerprint(whole, batch_size):
    """A digest of the training examples (all of them) and the batch size."""

    digest = hashlib.sha256(f"batch_size={batch_size}".encode())
    _digest_tensors(digest, whole)
    return digest.hexdigest()


# Batches of a `tf.data.Dataset` that its fingerprint reads, at its start: a
# bounded cost however long the dataset is (its end could only be reached by
# reading it all where its ops have no random access).
_SAMPLED_BATCHES = 3


def _dataset_fingerprint(dataset, steps):
    """A digest of a batched `dataset` of `steps` batches: its element spec,
    its length and the contents of its first `_SAMPLED_BATCHES` batches.
    Raises unless those are the same on a second pass (a `shuffle` that
    reshuffles every pass, or a random op without a seed)."""

    head = min(_SAMPLED_BATCHES, steps)
    first_pass = _digest_tensors(hashlib.sha256(), list(dataset.take(head)))
    if _digest_tensors(hashlib.sha256(), list(dataset.take(head))).digest() != first_pass.digest():
        raise ValueError(
            "ResumableTraining needs a tf.data.Dataset that yields the same batches, in the same order, on "
            "every pass: this one's first batches change from one pass to the next (a `shuffle` reshuffles "
            "on every pass unless given `reshuffle_each_iteration=False`; so does a random op without a seed). "
            "Pass `reshuffle_each_iteration=False` and a `seed` to its `shuffle` (and seed its random ops), or "
            "pass the data in memory (texts or arrays) for ResumableTraining to shuffle reproducibly, in "
            "another order every epoch."
        )
    digest = hashlib.sha256(f"{dataset.element_spec!r} of {steps} batches".encode())
    digest.update(first_pass.digest())
    return digest.hexdigest()


def _legacy_dataset_fingerprint(steps):
    """What checkpoints of bertzoo before content fingerprints recorded for
    a `tf.data.Dataset`: its length alone."""
    return f"tf.data.Dataset of {steps} batches"


def _digest_tensors(digest, structure):
    """Adds every tensor of `structure` (ragged and sparse ones by their
    components), its shape, dtype and contents, to `digest`; returns it."""
    for leaf in tf.nest.flatten(structure, expand_composites=True):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype.kind}{array.shape}".encode())
        if array.dtype.kind == "O":
            for item in array.reshape(-1):
                digest.update(len(item).to_bytes(8, "little") + bytes(item))
        else:
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest


# Config keys that are training state, not settings (`_optimizer_settings`).
_STATE_KEYS = ("name", "total_steps", "total_steps_from_fit")
# Settings that checkpoints of older bertzoo versions do not record: not
# compared when a checkpoint lacks them.
_ADDED_SETTINGS = ("exclude_from_weight_decay_names", "class_name")


def _optimizer_settings(optimizer):
    """The optimizer's settings, flattened to `{"dotted.key": value}`: its
    config and its learning-rate schedule's, less what is state rather than
    a setting (a float learning rate, a variable that callbacks change and
    the checkpoint restores; the schedule's `total_steps` and whether fit
    filled it in, which fit sets), and its class (`class_name`: optimizers
    of other classes can have the same config). bertzoo's `AdamW` lists its
    weight-decay exclusions (`exclude_from_weight_decay_names`) in its
    config, so a changed exclusion is a changed setting."""
    flat = {"class_name": type(optimizer).__name__}

    def walk(value, prefix):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in _STATE_KEYS or (key == "learning_rate" and not isinstance(item, dict)):
                    continue
                walk(item, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = json.loads(json.dumps(value, default=str))

    walk(optimizer.get_config(), "")
    return flat


def _state_variables(model):
    """The variables a checkpoint holds: every variable of `model` (weights,
    pruning state, `SeedGenerator` states), except a frozen distillation
    teacher's, which training never changes."""
    skip = set()
    teacher = getattr(model, "teacher", None)
    if isinstance(teacher, keras.Model) and not teacher.trainable:
        skip = {id(v) for v in teacher.variables}
    return [v for v in model.variables if id(v) not in skip]


def _dtype_policies(model):
    """The names of the dtype policies `model`'s layers compute in: a
    mixed-precision model keeps float32 variables, so the variables' dtypes
    alone would not tell it from the float32 one."""
    return sorted({layer.dtype_policy.name for layer in private_api.flatten_layers(model)})


def _describe(variables):
    return [[v.path, list(v.shape), str(v.dtype)] for v in variables]


class ResumableTraining(keras.callbacks.Callback):
    """Checkpoints the whole training state during `fit` and resumes from it
    exactly: the data order, dropout, optimizer, schedule and pruning state
    continue where the interrupted run stopped.

    Pass it to `fit` of a bertzoo task, a `bertzoo.Distiller` or a
    `bertzoo.Pruner`. The first run trains from the start; a run after an
    interruption (same script, same arguments) loads `backup_dir`'s
    checkpoint, skips the epochs and batches already done and reaches the
    weights the uninterrupted run would have (on the same hardware, to the
    last bit; within float tolerance elsewhere).

    With this callback `fit` orders the examples of epoch `e` by
    `(seed, e)` (`shuffle=True`) instead of an unseeded shuffle. Checkpoints
    are written atomically after every `save_every` batches and at the end
    of every epoch; the checkpoint is removed when `fit` completes (unless
    `delete_checkpoint=False`). See `bertzoo.models.resumable` for what is
    saved and the contract (same model, data, arguments and seed).

    A resumed run trains the rest of the interrupted epoch and the remaining
    epochs as two Keras `fit` calls; the other callbacks still see one
    training run: `on_train_begin` at its start, `on_train_end` at its end
    (an `EarlyStopping`'s patience, a `ModelCheckpoint(save_best_only=True)`'s
    best value carry over from the one to the other). Callbacks' own state
    is not in the checkpoint: after an interruption they start afresh (an
    `EarlyStopping` forgets its best value, a `CSVLogger` needs
    `append=True` to keep the interrupted run's rows).

    The checkpoint is kept when training stops early for another reason
    than the user's stopping rule: a callback setting `stop_training`
    (a time budget, `TerminateOnNaN`) leaves it on disk and the next run
    resumes from it. It is deleted (with `delete_checkpoint=True`) once
    every epoch has run, or when a `keras.callbacks.EarlyStopping` stopped
    training (training is finished), unless a loss was not finite. After a
    non-finite loss no checkpoint is written any more: the last one, from
    before it, stays.

    Args:
        backup_dir: directory of the checkpoint (`training_state.npz`),
            used by this one training run; `fit` checks that it can write
            there before it trains.
        save_every: also checkpoint every this many batches (None: at the
            end of each epoch only).
        seed: the data order's seed. None: drawn with Python's `random`
            (seeded by `keras.utils.set_random_seed`) and kept in the
            checkpoint, so a resumed run uses the interrupted run's.
        delete_checkpoint: remove the checkpoint once `fit` completes.

    Example:
    ```python
    keras.utils.set_random_seed(0)
    model = bertzoo.BertClassifier.from_preset("tiny", num_classes=2)
    model.fit(texts, labels, epochs=3,
              callbacks=[bertzoo.ResumableTraining("runs/sentiment-backup", save_every=100)])
    ```
    """

    def __init__(self, backup_dir, save_every=None, seed=None, delete_checkpoint=True):
        super().__init__()
        if not backup_dir:
            raise ValueError("ResumableTraining needs a `backup_dir`.")
        if save_every is not None and (
            isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1
        ):
            raise ValueError(f"`save_every` must be a number of batches >= 1 or None, got {save_every!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise ValueError(f"`seed` must be an integer or None, got {seed!r}.")
        self.backup_dir = os.path.expanduser(os.fspath(backup_dir))
        self.save_every = save_every
        self.seed = None if seed is None else int(seed)
        self.delete_checkpoint = bool(delete_checkpoint)
        self._run = None
        # The global generators' states at the last batch's end (or the checkpoint's), set again at the
        # next batch's start: Keras makes data iterators in between (at an epoch's end, at a fit's start,
        # for validation), and on torch each draws from the global generator, as many times in a resumed
        # run as its phases make iterators; so the masks follow from the steps alone.
        self._random_states = None

    @property
    def checkpoint_path(self):
        """Where the checkpoint is (or will be) written."""
        return os.path.join(self.backup_dir, CHECKPOINT_NAME)

    def get_config(self):
        return {
            "backup_dir": self.backup_dir,
            "save_every": self.save_every,
            "seed": self.seed,
            "delete_checkpoint": self.delete_checkpoint,
        }

    # --- The checkpoint ---------------------------------------------------
    def read_checkpoint(self):
        """The checkpoint's metadata (epoch, step, ...) or None without one."""
        arrays = self._load()
        return None if arrays is None else self._meta(arrays)

    def _damaged(self, problem):
        return ValueError(
            f"Cannot read the training checkpoint {self.checkpoint_path!r} ({problem}). Delete it to train "
            "from the start."
        )

    def _meta(self, arrays):
        """The checkpoint's metadata, refused (`_damaged`) unless it holds
        what every checkpoint does: the position as counts, the seed, and
        the variables' descriptions."""
        try:
            meta = json.loads(str(arrays[_META]))
        except (KeyError, ValueError) as e:
            raise self._damaged(f"no readable metadata: {type(e).__name__}: {e}") from None
        keys = ("epoch", "step", "seed")
        if not isinstance(meta, dict) or any(
            isinstance(meta.get(k), bool) or not isinstance(meta.get(k), int) for k in keys
        ):
            found = {k: meta.get(k) for k in keys} if isinstance(meta, dict) else meta
            raise self._damaged(f"its epoch, step and seed must be integers, found {found}")
        if meta["epoch"] < 0 or meta["step"] < 0:  # (Any integer seeds a run.)
            raise self._damaged(f"its position, epoch {meta['epoch']} step {meta['step']}, is negative")
        for key in ("variables", "optimizer_variables"):
            if not isinstance(meta.get(key), list) or not all(isinstance(v, list) and len(v) == 3 for v in meta[key]):
                raise self._damaged(f"its metadata does not describe the {key.replace('_', ' ')}")
        return meta

    def _load(self):
        path = self.checkpoint_path
        if not os.path.exists(path):
            return None
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except Exception as e:  # Written atomically: damage means a disk or a copy went wrong.
            raise ValueError(
                f"Cannot read the training checkpoint {path!r} ({type(e).__name__}: {e}). Delete it to "
                "train from the start."
            ) from e

    def _remove_leftovers(self):
        """Temporary files of saves interrupted in processes that are gone.
        Called when `fit` starts, when no save of this process is under way:
        a temporary file named with this process's id is a leftover too, of
        an earlier process that had the same id (PID 1 of every run of a
        container)."""
        if not os.path.isdir(self.backup_dir):
            return
        pattern = re.compile(rf"^\.{re.escape(CHECKPOINT_NAME)}\.tmp-(\d+)-")
        for name in os.listdir(self.backup_dir):
            match = pattern.match(name)
            if match and (int(match.group(1)) == os.getpid() or not process_alive(int(match.group(1)))):
                try:
                    os.remove(os.path.join(self.backup_dir, name))
                except OSError:
                    pass

    def _save(self, epoch, step):
        model, run = self.model, self._run
        optimizer = model.optimizer
        schedule = private_api.learning_rate_schedule(optimizer)
        variables, slots = _state_variables(model), list(optimizer.variables)
        meta = {
            "format": _FORMAT,
            "epoch": int(epoch),
            "step": int(step),
            "epochs": run["epochs"],
            "batch_size": run["batch_size"],
            "steps_per_epoch": run["steps_per_epoch"],
            "seed": run["seed"],
            "shuffle": run["shuffle"],
            "class_weight": run["class_weight"],
            "num_examples": run["num_examples"],
            "fingerprint": run["fingerprint"],
            "optimizer": run["optimizer"],
            "dtype_policies": run["dtype_policies"],
            "schedule_total_steps": getattr(schedule, "total_steps", None),
            "variables": _describe(variables),
            "optimizer_variables": _describe(slots),
        }
        arrays = {f"v{i:05d}": keras.ops.convert_to_numpy(v) for i, v in enumerate(variables)}
        arrays.update({f"o{i:05d}": keras.ops.convert_to_numpy(v) for i, v in enumerate(slots)})
        arrays.update(self._random_states if self._random_states is not None else _global_random_states())
        arrays[_META] = np.array(json.dumps(meta))
        os.makedirs(self.backup_dir, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{CHECKPOINT_NAME}.tmp-{os.getpid()}-", dir=self.backup_dir)
        if hasattr(os, "fchmod"):  # Not mkstemp's 0600: another user sharing the runs directory resumes too.
            os.fchmod(handle, 0o666 & ~current_umask())
        try:
            with os.fdopen(handle, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.checkpoint_path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        sync_directory(self.backup_dir)
        run["saved_at"] = run["done"]

    def _restore(self, arrays):
        model = self.model
        meta = self._meta(arrays)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        restored = []  # (variable, saved value): every one checked before any is assigned.
        for key, prefix, variables in (
            ("variables", "v", _state_variables(model)),
            ("optimizer_variables", "o", list(model.optimizer.variables)),
        ):
            saved = meta[key]
            shapes = [[list(v.shape), str(v.dtype)] for v in variables]
            if [[s[1], s[2]] for s in saved] != shapes:
                raise ValueError(
                    f"The training checkpoint {self.checkpoint_path!r} was written by another model or "
                    f"optimizer: it holds {len(saved)} {key.replace('_', ' ')}, this one has "
                    f"{len(variables)}{_first_difference(saved, variables)}. Build the model (and compile "
                    "it, attach a Pruner) exactly as the interrupted run did, or delete the checkpoint."
                )
            for i, variable in enumerate(variables):
                name = f"{prefix}{i:05d}"
                value = arrays.get(name)
                if value is not None and value.dtype.kind == "V":  # NumPy stores bfloat16 as raw bytes, intact.
                    value = value.view(np.dtype(keras.backend.standardize_dtype(variable.dtype)))
                if value is None or value.shape != tuple(variable.shape):
                    found = "is missing" if value is None else f"has shape {value.shape}"
                    raise self._damaged(
                        f"its array {name} {found}, for {variable.path} of shape {tuple(variable.shape)}"
                    )
                restored.append((variable, value))
        for variable, value in restored:
            variable.assign(value)
        self._random_states = {key: arrays[key] for key in arrays if key.startswith(_TORCH_RNG)} or None
        schedule = private_api.learning_rate_schedule(model.optimizer)
        if isinstance(schedule, WarmupLinearDecay) and meta.get("schedule_total_steps") is not None:
            schedule.total_steps = int(meta["schedule_total_steps"])

    # --- fit --------------------------------------------------------------
    _WHAT = {
        "epochs": "epochs",
        "batch_size": "batch size",
        "seed": "seed",
        "shuffle": "shuffle",
        "class_weight": "class_weight",
        "steps_per_epoch": "batches per epoch",
        "num_examples": "examples",
        "fingerprint": "data (fingerprint)",
        "dtype_policies": "set of the layers' dtype policies",
    }

    def _check_optimizer(self, saved, settings):
        """Raises unless the checkpoint's optimizer settings are this fit's."""
        unrecorded = {k for k in settings if k.rsplit(".", 1)[-1] in _ADDED_SETTINGS and k not in saved}
        changed = sorted(k for k in (set(saved) | set(settings)) - unrecorded if saved.get(k) != settings.get(k))
        if changed:
            was = ", ".join(f"{k}={saved.get(k)!r}" for k in changed)
            now = ", ".join(f"{k}={settings.get(k)!r}" for k in changed)
            raise ValueError(
                f"The training checkpoint {self.checkpoint_path!r} was written with other optimizer "
                f"settings: {was}; this fit has {now}. Compile with the interrupted run's settings to "
                "resume, or delete the checkpoint to start over."
            )

    def _check_format(self, meta):
        """Raises unless this version of bertzoo reads the checkpoint's format."""
        if meta.get("format", _FORMAT) > _FORMAT:
            raise ValueError(
                f"The training checkpoint {self.checkpoint_path!r} was written by a newer bertzoo (checkpoint "
                f"format {meta['format']}; this version reads format {_FORMAT} and older). Resume with the "
                "bertzoo version that wrote it, or delete the checkpoint to start over."
            )

    def _check_same_run(self, meta, run, keys):
        """Raises unless the checkpoint's run (`meta`) had this fit's `keys`
        (those that checkpoints of older versions record)."""
        for key in keys:
            if key in meta and meta[key] != run[key]:
                dataset = key == "fingerprint" and run["num_examples"] is None
                if dataset and meta[key] == _legacy_dataset_fingerprint(run["steps_per_epoch"]):
                    continue  # An older bertzoo's checkpoint: its fingerprint is the length, and that matches.
                hint = ""
                if dataset:
                    hint = (
                        " (of a tf.data.Dataset: its element spec and first batches, which must be the same in "
                        "every process: give a `shuffle` in it a `seed`)"
                    )
                same = "same data, fit arguments and seed"
                if key == "dtype_policies":
                    same = "model built with the same dtype"
                raise ValueError(
                    f"The training checkpoint {self.checkpoint_path!r} belongs to another run: its "
                    f"{self._WHAT[key]} is {meta[key]!r}, this fit's is {run[key]!r}{hint}. Resume with the "
                    f"{same}, or delete the checkpoint to start over."
                )

    def _check_writable(self):
        """Raises unless a checkpoint can be written in `backup_dir`: found
        before training rather than at the first save."""
        created = []
        try:
            created = make_parent_directories(Path(self.backup_dir) / CHECKPOINT_NAME)
            handle, probe = tempfile.mkstemp(prefix=f".{CHECKPOINT_NAME}.tmp-{os.getpid()}-", dir=self.backup_dir)
            os.close(handle)
            os.remove(probe)
        except OSError as e:
            remove_empty_directories(created)
            raise ValueError(
                f"ResumableTraining cannot write its checkpoint in `backup_dir` {self.backup_dir!r} "
                f"({type(e).__name__}: {e}). Pass a `backup_dir` where this process can create files."
            ) from e
        # The first save creates them again: none is left behind by a fit that fails before.
        remove_empty_directories(created)

    def run_fit(
        self,
        model,
        keras_fit,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        sample_weight=None,
        shuffle=True,
        steps_per_epoch=None,
        initial_epoch=0,
        callbacks=None,
        **kwargs,
    ):
        """Runs `keras_fit` (Keras's `fit` of a bertzoo model) resumably:
        called by `fit` of bertzoo tasks, `Distiller` and `Pruner` when this
        callback is among its `callbacks`."""
        if is_stream(x):
            raise ValueError(
                "ResumableTraining counts, orders and skips batches, which a Python generator or PyDataset "
                "cannot replay: pass the data in memory or as a tf.data.Dataset (e.g. "
                "tf.data.Dataset.from_generator(make_batches, output_signature=...))."
            )
        if steps_per_epoch is not None:
            raise ValueError(
                "ResumableTraining runs whole passes over the data: leave `steps_per_epoch` unset (it "
                "counts the batches itself)."
            )
        if getattr(model, "steps_per_execution", 1) != 1:
            # Keras runs whole executions, past an epoch's last batch and over
            # a resume point, so batches would be trained twice or skipped.
            raise ValueError(
                f"ResumableTraining needs steps_per_execution=1 (this model was compiled with "
                f"{model.steps_per_execution}): it checkpoints between batches. Compile without it."
            )
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"`epochs` must be an integer >= 1, got {epochs!r}.")
        if model.optimizer is None:
            raise ValueError(f"{type(model).__name__} '{model.name}' is not compiled: compile it before fit().")
        self._check_writable()
        self._remove_leftovers()
        batch_size = batch_size or DEFAULT_BATCH_SIZE
        arrays = self._load()
        meta = None if arrays is None else self._meta(arrays)
        if meta is not None:
            self._check_format(meta)
        seed = self.seed
        if meta is not None and seed is None:
            seed = meta["seed"]
        elif seed is None:
            seed = random.randrange(2**31)
        first, skip = (meta["epoch"], meta["step"]) if meta is not None else (int(initial_epoch), 0)
        first = min(first, epochs)

        run = {
            "epochs": epochs,
            "batch_size": batch_size,
            "seed": seed,
            "shuffle": bool(shuffle),
            "class_weight": _class_weight_setting(kwargs.get("class_weight")),
            "optimizer": _optimizer_settings(model.optimizer),
            "dtype_policies": _dtype_policies(model),
        }
        if meta is not None:
            # Before the training datasets are built (each traces the
            # preprocessing), so a refused resume fails fast.
            if "optimizer" in meta:
                self._check_optimizer(meta["optimizer"], run["optimizer"])
            keys = ("batch_size", "epochs", "seed", "shuffle", "class_weight", "dtype_policies")
            self._check_same_run(meta, run, keys)

        def dataset(order):
            data = model._as_dataset(x, y, sample_weight, batch_size, shuffle=order, training=True)
            if data is not None:
                return data

            if is_tf_dataset(x):
                check_dataset_carries_targets(y, sample_weight)
                return order.repeat(x)
            labels = model._checked_labels(y, x) if y is not None else None
            examples = (x,) + tuple(v for v in (labels, sample_weight) if v is not None)
            return order.batches(tf.data.Dataset.from_tensor_slices(examples), batch_size)

        phases = []  # (dataset, first epoch, batches already done in it)
        fingerprint = None  # The data is read (fingerprinted) once.
        if skip:
            order = EpochOrder(seed, shuffle, first, first + 1, skip)
            phases.append((dataset(order), first, skip))
            fingerprint = order.fingerprint
        order = EpochOrder(seed, shuffle, first + bool(skip), epochs, fingerprint=fingerprint)
        phases.append((dataset(order), first + bool(skip), 0))
        run.update(
            steps_per_epoch=order.steps_per_epoch, num_examples=order.num_examples, fingerprint=order.fingerprint
        )
        if meta is not None:
            self._check_same_run(meta, run, ("steps_per_epoch", "num_examples", "fingerprint"))
            # Saved mid-epoch before its last batch, or at an epoch's end as (next epoch, 0).
            if meta["epoch"] > epochs or meta["step"] >= order.steps_per_epoch or (meta["epoch"] == epochs and skip):
                raise self._damaged(
                    f"its position, epoch {meta['epoch']} step {meta['step']}, is past a run of {epochs} epochs "
                    f"of {order.steps_per_epoch} batches"
                )
        if "validation_data" in kwargs:  # Raw from the model's `fit`: built once the checks pass.
            kwargs["validation_data"] = model._as_validation_data(kwargs["validation_data"], batch_size, kwargs)
        set_schedule_length(model.optimizer, None, None, epochs, order.steps_per_epoch)
        done = first * order.steps_per_epoch + skip  # Batches trained on so far, all epochs.
        run.update(done=done, saved_at=done, arrays=arrays)

        callbacks = list(
            callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) else callbacks or []
        )
        callbacks = [c for c in callbacks if c is not self]
        run["early_stopping"] = [c for c in callbacks if isinstance(c, keras.callbacks.EarlyStopping)]
        # One `on_train_begin` / `on_train_end` over the phases (a progress
        # bar is one per `fit` call); this callback last, so that it sees
        # every other callback's `stop_training`.
        callbacks = [
            c if isinstance(c, keras.callbacks.ProgbarLogger) else _OneTrainingRun(c, run) for c in callbacks
        ] + [self]
        history = None
        self._run = run
        try:
            for index, (data, start, done) in enumerate(phases):
                run.update(
                    offset=done, partial=bool(done), first=index == 0, final=index == len(phases) - 1, user_stop=False
                )
                # The resumed epoch's remaining batches run as one `fit` of
                # their own (Keras counts the same number of steps in every
                # epoch of one call), stopped after that epoch.
                result = keras_fit(
                    x=data,
                    epochs=epochs,
                    initial_epoch=start,
                    shuffle=False,
                    callbacks=callbacks,
                    steps_per_epoch=None if done else order.steps_per_epoch,
                    **kwargs,
                )
                history = _merge_histories(history, result)
                if run["user_stop"]:
                    break
        finally:
            self._run = None
        if history is not None:  # Keras set the last `fit`'s.
            model.history = history
        return history

    # --- Callback hooks -----------------------------------------------------
    def on_train_begin(self, logs=None):
        run = self._run
        if run is None:
            raise ValueError(
                "ResumableTraining works through fit() of bertzoo models (tasks, bertzoo.Distiller, "
                f"bertzoo.Pruner); {type(self.model).__name__}.fit does not support it. Use "
                "keras.callbacks.BackupAndRestore for other models."
            )
        if run["first"]:  # Not at a later phase's start: its first batch continues the phase before.
            self._random_states = None
        if run.get("arrays") is not None:
            self._restore(run.pop("arrays"))
        run.pop("arrays", None)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._run["step"] = self._run["offset"]

    def on_train_batch_begin(self, batch, logs=None):
        if self._random_states is not None:
            _set_global_random_states(self._random_states)

    def on_train_batch_end(self, batch, logs=None):
        self._random_states = _global_random_states() or None
        run = self._run
        run["step"] = step = run["offset"] + batch + 1  # Batches done in this epoch.
        run["done"] = self._epoch * run["steps_per_epoch"] + step
        due = self.save_every and run["done"] // self.save_every > run["saved_at"] // self.save_every
        if due and step < run["steps_per_epoch"] and not self._diverged(logs):  # The epoch's end saves the last one.
            self._save(self._epoch, step)

    def _diverged(self, logs):
        """Whether a loss has not been finite in this run (checked only where
        a save is due: reading the loss waits for the step). The logged loss
        is the epoch's running mean, so one non-finite batch keeps it so; the
        weights may be NaN then, and the last checkpoint stays the last."""
        loss = (logs or {}).get("loss")
        if loss is not None and not np.all(np.isfinite(keras.ops.convert_to_numpy(loss))):
            self._run["diverged"] = True
        return self._run.get("diverged", False)

    def on_epoch_end(self, epoch, logs=None):
        run = self._run
        run["user_stop"] = bool(self.model.stop_training)  # Every other callback has run.
        if not self._diverged(logs):
            if run["step"] < run["steps_per_epoch"]:  # A callback stopped training mid-epoch.
                self._save(epoch, run["step"])
            else:
                self._save(epoch + 1, 0)
        if run["user_stop"] and any(c.stopped_epoch == epoch > 0 for c in run["early_stopping"]):
            run["early_stopped"] = True  # The user's rule ended training: it is complete.
        run["offset"] = 0
        if run["partial"]:  # The resumed epoch is done: the next `fit` runs the rest.
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        run = self._run
        if run is None or not (run["final"] or run["user_stop"]):
            return
        # Kept for the next run unless training is over: every epoch ran, or
        # EarlyStopping ended it. Another callback's stop (a time budget, a
        # non-finite loss) leaves it to resume from.
        finished = run["done"] >= run["epochs"] * run["steps_per_epoch"] or run.get("early_stopped", False)
        if not finished or run.get("diverged"):
            return
        if self.delete_checkpoint and os.path.exists(self.checkpoint_path):
            os.remove(self.checkpoint_path)
            try:
                os.rmdir(self.backup_dir)  # Only if nothing else is in it.
            except OSError:
                pass


class _OneTrainingRun(keras.callbacks.Callback):
    """Forwards every hook to `callback` but `on_train_begin` and
    `on_train_end`, which it forwards only in the first, respectively the
    last, of the Keras `fit` calls of one resumed run (`run["first"]`,
    `run["final"]` or `run["user_stop"]`)."""

    _HOOKS = tuple(
        name
        for name in dir(keras.callbacks.Callback)
        if name.startswith("on_") and name not in ("on_train_begin", "on_train_end")
    )

    def __init__(self, callback, run):
        super().__init__()
        self.callback, self._run = callback, run
        # Bound methods of the wrapped callback: Keras still sees which hooks
        # are its defaults (asynchronous dispatch of batch hooks).
        for name in self._HOOKS:
            setattr(self, name, getattr(callback, name))

    def __getattr__(self, name):  # `async_safe` and whatever else a caller reads.
        if name in ("callback", "_run"):
            raise AttributeError(name)
        return getattr(self.callback, name)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def on_train_begin(self, logs=None):
        if self._run["first"]:
            self.callback.on_train_begin(logs)

    def on_train_end(self, logs=None):
        if self._run["final"] or self._run["user_stop"]:
            self.callback.on_train_end(logs)


def _merge_histories(first, second):
    if first is None:
        return second
    for key, values in second.history.items():
        first.history.setdefault(key, []).extend(values)
    first.epoch.extend(second.epoch)
    return first


def _first_difference(saved, variables):
    for i, (s, v) in enumerate(zip(saved, variables)):
        if [s[1], s[2]] != [list(v.shape), str(v.dtype)]:
            return f"; #{i} is {s[0]} {tuple(s[1])} {s[2]} there, {v.path} {tuple(v.shape)} {v.dtype} here"
    return ""
