"""Training that survives interruption (`bertzoo.ResumableTraining`): a fit
interrupted mid-epoch (an exception, or `kill -9` of a subprocess) and
resumed by a freshly built model reaches the weights of an uninterrupted run;
for a task, a `Distiller` and a `Pruner` (masks and schedule included)."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.models.optimizers import bert_optimizer
from bertzoo.models.resumable import CHECKPOINT_NAME
from bertzoo.models.resumable import _dataset_fingerprint
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.utils import private_api

POSITIVE = "good great fine nice superb".split()
NEGATIVE = "bad awful dull poor weak".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POSITIVE + NEGATIVE + "the film was a very".split()
# 20 examples in batches of 8: 3 batches per epoch (the last one short).
EPOCHS, BATCH_SIZE, SEED = 3, 8, 7
REPO = Path(__file__).resolve().parents[1]


def sentiment(n=20, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    texts = [
        " ".join(["the", "film", "was"][: rng.integers(0, 4)] + list(rng.choice(POSITIVE if label else NEGATIVE, 2)))
        for label in labels
    ]
    return texts, labels.astype("int32")


def classifier(seed, num_layers=1, hidden_dim=16, dropout=0.1, dtype=None):
    """A tiny classifier with dropout on, compiled with bertzoo's AdamW and
    warm-up/decay schedule; `seed` decides its initial weights."""
    keras.utils.set_random_seed(seed)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=2,
        intermediate_dim=2 * hidden_dim,
        max_sequence_length=16,
        dropout=dropout,
        dtype=dtype,
    )
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=8)
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=preprocessor, dropout=dropout, dtype=dtype)
    model.compile(optimizer=bert_optimizer(1e-2))
    return model


def distiller(seed):
    teacher = classifier(seed=100, num_layers=2, hidden_dim=32, dropout=0.0)
    student = classifier(seed)
    trainer = bertzoo.Distiller(teacher, student, temperature=2.0, alpha=0.5)
    trainer.compile(optimizer=bert_optimizer(1e-2))
    return trainer


def pruner(seed):
    model = classifier(seed)
    return bertzoo.Pruner(model, bertzoo.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=8, frequency=1))


class Interrupted(Exception):
    pass


class Interrupt(keras.callbacks.Callback):
    """Raises (or kills the process) after batch `batch` of epoch `epoch`."""

    def __init__(self, epoch, batch, kill=False):
        super().__init__()
        self.at, self.kill = (epoch, batch), kill

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise Interrupted(f"after batch {batch} of epoch {self.epoch}")


def train(trainer, backup_dir, interrupt=None, x=None, y=None, **kwargs):
    texts, labels = sentiment()
    callbacks = [bertzoo.ResumableTraining(backup_dir, save_every=1, seed=SEED)]
    if interrupt is not None:
        callbacks.insert(0, interrupt)
    x = texts if x is None else x
    y = labels if y is None and not isinstance(x, tf.data.Dataset) else y
    return trainer.fit(x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, verbose=0, callbacks=callbacks, **kwargs)


def state_of(model):
    """Every variable of the model (weights, pruning state, dropout seeds)
    and of its optimizer."""
    return [keras.ops.convert_to_numpy(v) for v in list(model.variables) + list(model.optimizer.variables)]


def assert_same_state(a, b):
    a, b = state_of(a), state_of(b)
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_allclose(x.astype("float64"), y.astype("float64"), atol=1e-6, rtol=0, err_msg=str(i))


def trained_through(build, backup, **kwargs):
    """`build(0)` trained through every epoch, uninterrupted."""
    reference = build(0)
    history = train(reference, backup, **kwargs)
    assert history.epoch == list(range(EPOCHS))
    assert not backup.exists()  # Removed once the fit completes.
    return reference


def interrupted_at(build, backup, at, **kwargs):
    """Trains `build(0)` until `Interrupt(*at)` stops it: leaves its checkpoint in `backup`."""
    with pytest.raises(Interrupted):
        train(build(0), backup, Interrupt(*at), **kwargs)
    checkpoint = bertzoo.ResumableTraining(backup).read_checkpoint()
    # The interrupting callback ran before the save of batch `at[1]`.
    assert (checkpoint["epoch"], checkpoint["step"]) == (at[0], at[1])


def copy_of(checkpoint_dir, tmp_path):
    """A copy of a module fixture's checkpoint directory, for one test to use up."""
    backup = tmp_path / "backup"
    shutil.copytree(checkpoint_dir, backup)
    return backup


# The runs several tests start from, trained once per module: `classifier`
# on `sentiment()` uninterrupted, and interrupted after batch 1 of epoch 1
# (of epoch 0; on a dataset). Each test resumes (or is refused) from its own copy.
@pytest.fixture(scope="module")
def reference_classifier(tmp_path_factory):
    return trained_through(classifier, tmp_path_factory.mktemp("reference") / "backup")


@pytest.fixture(scope="module")
def interrupted_in_epoch_1(tmp_path_factory):
    backup = tmp_path_factory.mktemp("interrupted_in_epoch_1") / "backup"
    interrupted_at(classifier, backup, (1, 1))
    return backup


@pytest.fixture(scope="module")
def interrupted_in_epoch_0(tmp_path_factory):
    backup = tmp_path_factory.mktemp("interrupted_in_epoch_0") / "backup"
    interrupted_at(classifier, backup, (0, 1))
    return backup


@pytest.fixture(scope="module")
def interrupted_on_a_dataset(tmp_path_factory):
    """`classifier` on `sentiment()` as a batched `tf.data.Dataset` (the same
    batches every pass), interrupted after batch 1 of epoch 1."""
    backup = tmp_path_factory.mktemp("interrupted_on_a_dataset") / "backup"
    interrupted_at(classifier, backup, (1, 1), x=batches_of(*sentiment()))
    return backup


def interrupted_then_resumed(build, tmp_path, at=(1, 1), reference=None, interrupted=None, **kwargs):
    """Trains `build(0)` through (unless `reference` is that run), then
    `build(0)` interrupted at `at` (unless `interrupted` is that run's
    checkpoint directory) and a fresh `build(1)` (other initial weights:
    everything must come from the checkpoint) resumed; returns the two
    finished trainers."""
    if reference is None:
        reference = trained_through(build, tmp_path / "reference", **kwargs)
    if interrupted is None:
        backup = tmp_path / "backup"
        interrupted_at(build, backup, at, **kwargs)
    else:
        backup = copy_of(interrupted, tmp_path)
        checkpoint = bertzoo.ResumableTraining(backup).read_checkpoint()
        assert (checkpoint["epoch"], checkpoint["step"]) == (at[0], at[1])

    resumed = build(1)
    history = train(resumed, backup, **kwargs)
    assert history.epoch == list(range(at[0], EPOCHS))
    assert not backup.exists()
    return reference, resumed


def test_task_resumes_mid_epoch_to_the_same_weights(tmp_path, reference_classifier, interrupted_in_epoch_1):
    reference, resumed = interrupted_then_resumed(
        classifier, tmp_path, reference=reference_classifier, interrupted=interrupted_in_epoch_1
    )
    assert int(resumed.optimizer.iterations) == int(reference.optimizer.iterations) == 9
    assert_same_state(reference, resumed)
    assert private_api.learning_rate_schedule(resumed.optimizer).total_steps == 9


def test_distiller_resumes_mid_epoch_to_the_same_weights(tmp_path):
    reference, resumed = interrupted_then_resumed(distiller, tmp_path, at=(1, 0))
    assert_same_state(reference.student, resumed.student)
    assert_same_state(reference, resumed)


def test_pruner_resumes_with_its_masks_and_schedule(tmp_path):
    reference, resumed = interrupted_then_resumed(pruner, tmp_path, at=(1, 1))
    assert resumed.step == reference.step == 9
    for a, b in zip(reference.state.masks + reference.state.steps, resumed.state.masks + resumed.state.steps):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    assert resumed.sparsity() == reference.sparsity() == pytest.approx(0.75, abs=0.01)
    assert_same_state(reference.model, resumed.model)


def test_a_bfloat16_model_resumes_to_the_same_weights(tmp_path):
    # NumPy writes bfloat16 arrays as raw 2-byte records; the restore failed to assign them.
    def bfloat16_classifier(seed):
        model = classifier(seed, dtype="bfloat16")
        model.compile(optimizer=bert_optimizer(1e-2))
        return model

    reference, resumed = interrupted_then_resumed(bfloat16_classifier, tmp_path)
    assert resumed.backbone.token_embedding.embeddings.dtype == "bfloat16"
    untrained = bfloat16_classifier(0).get_weights()
    moved = [not np.array_equal(w, u) for w, u in zip(reference.get_weights(), untrained)]
    assert sum(moved) > len(moved) // 2, "the steps changed the weights (Keras's Adam steps are zero in bfloat16)"
    assert_same_state(reference, resumed)


def test_tokenized_inputs_resume_too(tmp_path):
    texts, _ = sentiment()
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=8)
    features = {k: keras.ops.convert_to_numpy(v) for k, v in preprocessor(texts).items()}
    reference, resumed = interrupted_then_resumed(classifier, tmp_path, at=(2, 0), x=features)
    assert_same_state(reference, resumed)


def test_datasets_that_repeat_their_batches_resume_too(tmp_path, interrupted_on_a_dataset):
    texts, labels = sentiment()
    dataset = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(BATCH_SIZE)  # Same batches every pass.
    reference, resumed = interrupted_then_resumed(
        classifier, tmp_path, at=(1, 1), interrupted=interrupted_on_a_dataset, x=dataset
    )
    assert_same_state(reference, resumed)


KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
import test_resumable_training as t
t.train(t.classifier(0), {backup!r}, t.Interrupt(1, 1, kill=True))
"""


def test_kill_9_mid_epoch_then_resume_in_a_new_process(tmp_path, reference_classifier):
    backup = tmp_path / "backup"
    script = KILLED_RUN.format(tests=str(REPO / "tests"), backup=str(backup))
    # A generous limit: the new process imports TensorFlow and traces its train step, slow on a loaded machine.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert sorted(os.listdir(backup)) == [CHECKPOINT_NAME]  # Complete, no half-written file.
    assert bertzoo.ResumableTraining(backup).read_checkpoint()["epoch"] == 1

    resumed = classifier(1)
    train(resumed, backup)
    assert_same_state(reference_classifier, resumed)


def test_a_checkpoint_of_another_run_is_refused(tmp_path, interrupted_in_epoch_0):
    backup = copy_of(interrupted_in_epoch_0, tmp_path)
    texts, labels = sentiment(seed=1)  # Other data.
    with pytest.raises(ValueError, match=r"belongs to another run: its data"):
        train(classifier(0), backup, x=texts, y=labels)
    with pytest.raises(ValueError, match=r"ResumableTraining runs whole passes"):
        train(classifier(0), backup, steps_per_epoch=2)
    # Class weights weigh the loss as sample weights do (those are in the data's fingerprint).
    with pytest.raises(ValueError, match=r"its class_weight is None, this fit's is \{'0': 1.0, '1': 9.0\}"):
        train(classifier(0), backup, class_weight={0: 1, 1: 9})
    two = [bertzoo.ResumableTraining(backup), bertzoo.ResumableTraining(tmp_path / "other")]
    with pytest.raises(ValueError, match=r"fit got 2 ResumableTraining callbacks: pass one"):
        classifier(0).fit(*sentiment(), callbacks=two, verbose=0)
    # Other optimizer settings: a new peak learning rate, another weight decay.
    # Refused before the training and validation datasets are built (they trace the preprocessing).
    for optimizer, changed in ((bert_optimizer(0.5), "peak_learning_rate"), (bert_optimizer(1e-2), "weight_decay")):
        if changed == "weight_decay":
            optimizer.weight_decay = 0.5
        other = classifier(0)
        other.compile(optimizer=optimizer)
        other._as_dataset = lambda *args, **kwargs: pytest.fail("built a dataset before refusing")
        with pytest.raises(ValueError, match=rf"other optimizer settings: \S*{changed}=.*Compile with the interrupted"):
            train(other, backup, validation_data=sentiment(n=8, seed=2))
    spe = classifier(0)
    spe.compile(steps_per_execution=2)
    with pytest.raises(ValueError, match=r"needs steps_per_execution=1 \(this model was compiled with 2\)"):
        train(spe, backup)
    # A leftover of a save killed mid-write (its process is gone) is removed.
    assert_leftover_removed(backup, pid=999999999)


def test_raw_validation_data_is_evaluated_after_every_epoch_of_a_resumed_fit(tmp_path, interrupted_in_epoch_1):
    validation = sentiment(n=8, seed=2)
    backup = copy_of(interrupted_in_epoch_1, tmp_path)  # Interrupted after batch 1 of epoch 1.
    resumed = classifier(1)
    history = train(resumed, backup, validation_data=validation)
    assert history.epoch == [1, 2]  # The rest of epoch 1 (its own fit), then epoch 2.
    assert len(history.history["val_loss"]) == 2
    expected = resumed.evaluate(*validation, batch_size=BATCH_SIZE, verbose=0, return_dict=True)
    np.testing.assert_allclose(history.history["val_loss"][-1], expected["loss"], rtol=1e-5)


def test_a_finished_run_kept_on_disk_trains_no_further(tmp_path):
    backup = tmp_path / "backup"
    texts, labels = sentiment()
    model = classifier(0)
    callback = bertzoo.ResumableTraining(backup, seed=SEED, delete_checkpoint=False)
    model.fit(texts, labels, batch_size=BATCH_SIZE, epochs=2, verbose=0, callbacks=[callback])
    assert callback.read_checkpoint()["epoch"] == 2
    again = classifier(1)
    history = again.fit(texts, labels, batch_size=BATCH_SIZE, epochs=2, verbose=0, callbacks=[callback])
    assert history.epoch == []
    assert_same_state(model, again)


class Spy(keras.callbacks.Callback):
    """Records the hooks Keras calls on it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_begin(self, logs=None):
        self.calls.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(f"epoch_begin {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append("batch")

    def on_train_end(self, logs=None):
        self.calls.append("train_end")


def test_other_callbacks_see_one_training_run_when_it_resumes(tmp_path, interrupted_in_epoch_1):
    backup = copy_of(interrupted_in_epoch_1, tmp_path)  # Interrupted after batch 1 of epoch 1.
    spy, model = Spy(), classifier(1)
    history = train(model, backup, spy)
    # The rest of epoch 1 and epoch 2 are two Keras fits: one begin, one end.
    assert spy.calls == ["train_begin", "epoch_begin 1"] + ["batch"] * 2 + ["epoch_begin 2"] + ["batch"] * 3 + [
        "train_end"
    ]
    assert spy.model is model and spy.params["epochs"] == EPOCHS
    assert history.epoch == [1, 2] and not backup.exists()
    assert model.history is history  # Not the last Keras fit's (epoch 2 only).


class AtBatch(keras.callbacks.Callback):
    """Base of callbacks that act at batch `batch` of epoch `epoch` (`reached(batch)`)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def reached(self, batch):
        return (self.epoch, batch) == self.at


class StopAfter(AtBatch):
    """Stops training after batch `batch` of epoch `epoch`, as a time budget would."""

    def on_train_batch_end(self, batch, logs=None):
        if self.reached(batch):
            self.model.stop_training = True


def test_a_run_another_callback_stops_keeps_its_checkpoint(tmp_path):
    backup = tmp_path / "backup"
    history = train(classifier(0), backup, StopAfter(1, 0))
    assert history.epoch == [0, 1]
    checkpoint = bertzoo.ResumableTraining(backup).read_checkpoint()
    assert (checkpoint["epoch"], checkpoint["step"]) == (1, 1)  # Kept: the next run goes on from it.
    history = train(classifier(1), backup)
    assert history.epoch == [1, 2] and not backup.exists()


def test_a_run_early_stopping_ends_is_finished(tmp_path):
    backup = tmp_path / "backup"
    never_better = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    history = train(classifier(0), backup, never_better)
    assert history.epoch == [0, 1] and never_better.stopped_epoch == 1
    assert not backup.exists()  # Training is complete: the checkpoint is removed.


class PoisonWeights(AtBatch):
    """Makes a weight NaN before batch `batch` of epoch `epoch`: that batch's loss is NaN."""

    def on_train_batch_begin(self, batch, logs=None):
        if self.reached(batch):
            kernel = self.model.trainable_variables[0]
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))


def test_no_checkpoint_is_written_after_a_non_finite_loss(tmp_path):
    backup = tmp_path / "backup"
    texts, labels = sentiment()
    callbacks = [
        PoisonWeights(1, 1),
        keras.callbacks.TerminateOnNaN(),
        bertzoo.ResumableTraining(backup, save_every=1, seed=SEED),
    ]
    history = classifier(0).fit(texts, labels, batch_size=BATCH_SIZE, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    assert np.isnan(history.history["loss"][-1])
    # The checkpoint of batch 1 of epoch 1, the last before the NaN, is kept.
    checkpoint = bertzoo.ResumableTraining(backup).read_checkpoint()
    assert (checkpoint["epoch"], checkpoint["step"]) == (1, 1)
    with np.load(backup / CHECKPOINT_NAME) as arrays:
        assert all(
            np.isfinite(arrays[name]).all()
            for name in arrays.files
            if name.startswith("v") and arrays[name].dtype.kind == "f"
        )


def test_a_leftover_of_an_earlier_process_with_this_pid_is_removed(tmp_path):
    # A killed container run (PID 1) leaves a temporary file named with the pid the next run has too.
    backup = tmp_path / "backup"
    backup.mkdir()
    assert_leftover_removed(backup, pid=os.getpid())


def assert_leftover_removed(backup, pid):
    """A temporary checkpoint named with `pid` beside a damaged checkpoint:
    the next `fit` removes it, then refuses the damaged one."""
    leftover = backup / f".{CHECKPOINT_NAME}.tmp-{pid}-x"
    leftover.write_bytes(b"partial")
    (backup / CHECKPOINT_NAME).write_bytes(b"damaged")
    with pytest.raises(ValueError, match=r"Cannot read the training checkpoint"):
        train(classifier(0), backup)
    assert not leftover.exists()


def test_a_changed_weight_decay_exclusion_is_refused_on_resume(tmp_path, interrupted_in_epoch_0):
    backup = copy_of(interrupted_in_epoch_0, tmp_path)
    assert bertzoo.ResumableTraining(backup).read_checkpoint()["optimizer"]["exclude_from_weight_decay_names"] == [
        "beta",
        "bias",
        "gamma",
    ]
    optimizer = bert_optimizer(1e-2)
    optimizer.exclude_from_weight_decay(var_names=["bias"])  # LayerNorm decayed now.
    other = classifier(0)
    other.compile(optimizer=optimizer)
    with pytest.raises(ValueError, match=r"other optimizer settings: exclude_from_weight_decay_names=\['beta', 'bias'"):
        train(other, backup)

    # A checkpoint of an older bertzoo, without the setting (nor the optimizer's class and the batch size),
    # still resumes.
    def older(meta):
        del meta["optimizer"]["exclude_from_weight_decay_names"], meta["optimizer"]["class_name"], meta["batch_size"]

    rewrite_checkpoint(backup, older)
    assert train(classifier(1), backup).epoch == [0, 1, 2]


def rewrite_checkpoint(backup, change):
    """Rewrites the checkpoint's metadata with `change(meta)`."""
    with np.load(backup / CHECKPOINT_NAME) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(str(arrays["__meta__"]))
    change(meta)
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez(backup / CHECKPOINT_NAME, **arrays)


def batches_of(texts, labels, batch_size=BATCH_SIZE):
    return tf.data.Dataset.from_tensor_slices((texts, labels)).batch(batch_size)


def test_a_dataset_of_other_batches_is_refused_on_resume(tmp_path, interrupted_on_a_dataset):
    # Not only their number: the checkpoint had "tf.data.Dataset of 3 batches" as the data's fingerprint.
    backup = copy_of(interrupted_on_a_dataset, tmp_path)
    with pytest.raises(
        ValueError,
        match=r"its data \(fingerprint\) is '\w+', this fit's is '\w+' \(of a tf.data.Dataset: its element spec",
    ):
        train(classifier(1), backup, x=batches_of(*sentiment(seed=5)))


def test_a_dataset_fingerprint_reads_its_first_batches_only():
    texts, labels = sentiment()

    def fingerprint(labels, through_a_filter=False):
        dataset = batches_of(texts, labels, batch_size=2)
        if through_a_filter:  # No random access (a filter): the end could be reached only by reading it all.
            dataset = dataset.filter(lambda *batch: True).apply(tf.data.experimental.assert_cardinality(10))
        return _dataset_fingerprint(dataset, 10)

    first, last = labels.copy(), labels.copy()
    first[0], last[-1] = 1 - labels[0], 1 - labels[-1]
    assert fingerprint(labels) != fingerprint(first)
    assert fingerprint(labels) == fingerprint(last) == fingerprint(labels, through_a_filter=True)
    read = []

    def counted():
        for i in range(40):
            read.append(i)
            yield texts[i % len(texts)]

    generated = tf.data.Dataset.from_generator(counted, output_signature=tf.TensorSpec((), tf.string)).batch(4)
    _dataset_fingerprint(generated.apply(tf.data.experimental.assert_cardinality(10)), 10)
    assert len(read) <= 2 * (3 * 4 + 1)  # Two passes over three batches (and a prefetch), not the whole of it.


def test_a_checkpoint_of_an_older_bertzoo_on_a_dataset_resumes(tmp_path, interrupted_on_a_dataset):
    # Before content fingerprints, a dataset's was its length alone.
    texts, labels = sentiment()
    backup = copy_of(interrupted_on_a_dataset, tmp_path)  # Interrupted after batch 1 of epoch 1.
    rewrite_checkpoint(backup, lambda meta: meta.update(fingerprint="tf.data.Dataset of 3 batches"))
    history = train(classifier(1), backup, x=batches_of(texts, labels))
    assert history.epoch == [1, 2] and not backup.exists()


def test_a_dataset_reshuffled_on_every_pass_is_refused(tmp_path):
    # A seeded shuffle reshuffles each pass (by default), in an order a new process does not repeat.
    texts, labels = sentiment()
    reshuffled = tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(20, seed=1).batch(BATCH_SIZE)
    with pytest.raises(ValueError, match=r"first batches change from one pass to the next.*reshuffle_each_iteration"):
        train(classifier(0), tmp_path / "refused", x=reshuffled)
    # Shuffled once for every pass, it is taken.
    once = tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(20, seed=1, reshuffle_each_iteration=False)
    assert _dataset_fingerprint(once.batch(BATCH_SIZE), 3) == _dataset_fingerprint(once.batch(BATCH_SIZE), 3)


def test_a_refused_restore_leaves_the_weights_alone(tmp_path, interrupted_in_epoch_0):
    backup = copy_of(interrupted_in_epoch_0, tmp_path)
    model = classifier(1)
    model.backbone.token_embedding.trainable = False  # The same variables; fewer optimizer slots.
    model.compile(optimizer=bert_optimizer(1e-2))
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"written by another model or optimizer: it holds \d+ optimizer variables"):
        train(model, backup)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_damaged_or_edited_checkpoint_is_refused_before_any_weight_changes(tmp_path, interrupted_in_epoch_0):
    def refused(match, change=None, arrays_change=None, model=None):
        backup = copy_of(interrupted_in_epoch_0, tmp_path / str(len(list(tmp_path.iterdir()))))
        if change is not None:
            rewrite_checkpoint(backup, change)
        if arrays_change is not None:
            with np.load(backup / CHECKPOINT_NAME) as archive:
                arrays = {name: archive[name] for name in archive.files}
            arrays_change(arrays)
            np.savez(backup / CHECKPOINT_NAME, **arrays)
        model = model or classifier(1)
        before = model.get_weights()
        with pytest.raises(ValueError, match=match):
            train(model, backup)
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)

    # A cut array: 10 variables were assigned before Keras's own shape error.
    cut = r"Cannot read the training checkpoint .*its array v00010 has shape \(1,\), for attention_0/query/bias of shape \(16,\).*Delete it"
    refused(cut, arrays_change=lambda arrays: arrays.update(v00010=arrays["v00010"][:1]))
    refused(r"its array o00003 is missing", arrays_change=lambda arrays: arrays.pop("o00003"))  # A bare KeyError.
    refused(
        r"epoch, step and seed must be integers, found \{'epoch': 0, 'step': \d, 'seed': None\}",
        lambda m: m.pop("seed"),
    )
    refused(r"its position, epoch 0 step -1, is negative", lambda meta: meta.update(step=-1))
    # A position past the run: epoch 7 of 3 trained nothing and deleted the checkpoint as finished; step 5 of 3
    # batches skipped into the next epoch and ended 2 steps short.
    refused(r"its position, epoch 7 step \d, is past a run of 3 epochs of 3 batches", lambda m: m.update(epoch=7))
    refused(r"its position, epoch 0 step 5, is past", lambda meta: meta.update(step=5))
    # A mixed-precision model keeps float32 variables: only the layers' policies tell it from the float32 run.
    refused(
        r"its set of the layers' dtype policies is \['float32', 'int32'\], this fit's is \[.*'mixed_bfloat16'\]\. Resume "
        r"with the model built with the same dtype",
        model=classifier(1, dtype="mixed_bfloat16"),
    )
    # Any integer seeds a run: a negative one resumes.
    backup = copy_of(interrupted_in_epoch_0, tmp_path / "negative_seed")
    rewrite_checkpoint(backup, lambda meta: meta.update(seed=-3))
    assert bertzoo.ResumableTraining(backup).read_checkpoint()["seed"] == -3
    callbacks = [bertzoo.ResumableTraining(backup, save_every=1)]
    resumed = classifier(1).fit(*sentiment(), batch_size=BATCH_SIZE, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    assert resumed.epoch == [0, 1, 2] and not backup.exists()


def test_an_unwritable_backup_dir_is_refused_before_training(tmp_path):
    (tmp_path / "a_file").write_text("")
    model = classifier(0)
    with pytest.raises(
        ValueError, match=r"cannot write its checkpoint in `backup_dir` .*a_file.backup.*Pass a `backup_dir`"
    ):
        train(model, tmp_path / "a_file" / "backup")
    # A writable one is probed, and the folders the probe made are gone again (the first save makes them).
    bertzoo.ResumableTraining(tmp_path / "new" / "nested" / "backup")._check_writable()
    assert not (tmp_path / "new").exists()
    assert int(model.optimizer.iterations) == 0


def test_another_batch_size_is_refused_plainly_on_resume(tmp_path, interrupted_in_epoch_0):
    backup = copy_of(interrupted_in_epoch_0, tmp_path)
    texts, labels = sentiment()
    model = classifier(1)
    model._as_dataset = lambda *args, **kwargs: pytest.fail("built a dataset before refusing")
    callback = bertzoo.ResumableTraining(backup, seed=SEED)
    with pytest.raises(ValueError, match=r"another run: its batch size is 8, this fit's is 7\. Resume with the same"):
        model.fit(texts, labels, batch_size=7, epochs=EPOCHS, verbose=0, callbacks=[callback])


def test_an_optimizer_of_another_class_is_refused_on_resume(tmp_path):
    # Nadam and Adamax have the same config; their variables differ.
    backup = tmp_path / "backup"
    model = classifier(0)
    model.compile(optimizer=keras.optimizers.Nadam(1e-2))
    with pytest.raises(Interrupted):
        train(model, backup, Interrupt(0, 1))
    other = classifier(0)
    other.compile(optimizer=keras.optimizers.Adamax(1e-2))
    other._as_dataset = lambda *args, **kwargs: pytest.fail("built a dataset before refusing")
    with pytest.raises(
        ValueError, match=r"other optimizer settings: class_name='Nadam'; this fit has class_name='Adamax'"
    ):
        train(other, backup)


def test_a_checkpoint_of_a_newer_format_is_refused(tmp_path, interrupted_in_epoch_0):
    backup = copy_of(interrupted_in_epoch_0, tmp_path)
    rewrite_checkpoint(backup, lambda meta: meta.update(format=meta["format"] + 1))
    with pytest.raises(
        ValueError, match=r"written by a newer bertzoo \(checkpoint format 2; this version reads format 1"
    ):
        train(classifier(1), backup)


def test_pytorchs_global_generator_is_checkpointed_on_the_torch_backend(monkeypatch):
    # Keras's torch dropout without a seed draws its masks from PyTorch's global generator: its state is
    # saved with the checkpoint and restored on resume, so the resumed masks continue the interrupted run's.
    torch = pytest.importorskip("torch")
    from bertzoo.models import resumable

    assert resumable._global_random_states() == {}  # TensorFlow: nothing outside Keras's seed generators.
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    torch.manual_seed(3)
    states = resumable._global_random_states()
    assert sorted(states) == ["torch_rng_cpu"] and states["torch_rng_cpu"].dtype == np.uint8
    interrupted = torch.rand(5)
    torch.manual_seed(4)  # A new process, seeded as the script seeds it.
    resumable._set_global_random_states(dict(states, v00000=np.zeros(2)))
    np.testing.assert_array_equal(torch.rand(5).numpy(), interrupted.numpy())
