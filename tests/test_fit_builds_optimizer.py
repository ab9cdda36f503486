"""`fit` and `train_on_batch` create the optimizer's variables before
Keras traces the first training step (`bertzoo.models.raw_inputs.build_optimizer_before_fit`): the
variables Keras would create in the step, for a task, a task with a frozen
backbone and a Distiller (whose teacher gets none). Training under
`MirroredStrategy` goes through the same `fit` (tests/test_distribute_mirrored.py)."""

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.models import raw_inputs

FEATURES = {
    "token_ids": np.random.default_rng(0).integers(5, 60, (8, 8)).astype("int32"),
    "segment_ids": np.zeros((8, 8), "int32"),
    "padding_mask": np.ones((8, 8), "int32"),
}
LABELS = np.arange(8) % 2


def classifier(seed=0, hidden_dim=16):
    keras.utils.set_random_seed(seed)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=64,
        num_layers=1,
        hidden_dim=hidden_dim,
        num_heads=2,
        intermediate_dim=2 * hidden_dim,
        max_sequence_length=8,
        dropout=0.0,
    )
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=None, dropout=0.0)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2))
    return model


class BuiltAtStart(keras.callbacks.Callback):
    """Whether the optimizer had its variables when training began (after
    Keras made its train function, before the first step is traced)."""

    def on_train_begin(self, logs=None):
        self.built = self.model.optimizer.built


def optimizer_state(trainer):
    """The optimizer's variables by path (less the optimizer's own name) and shape."""
    return sorted((v.path.split("/", 1)[-1], tuple(v.shape)) for v in trainer.optimizer.variables)


def fit(trainer, lazily, monkeypatch):
    """One epoch; `lazily`: as Keras alone does it (variables made in the step)."""
    with monkeypatch.context() as patch:
        if lazily:
            patch.setattr(raw_inputs, "build_optimizer_before_fit", lambda model: None)
        start = BuiltAtStart()
        trainer.fit(FEATURES, LABELS, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[start])
    return start.built


@pytest.mark.parametrize("frozen_backbone", [False, True])
def test_a_task_has_keras_optimizer_variables_before_its_first_step(monkeypatch, frozen_backbone):
    eager, lazy = classifier(), classifier()
    for model in (eager, lazy):
        model.backbone.trainable = not frozen_backbone
        model.compile(optimizer=keras.optimizers.AdamW(1e-2))
    assert fit(eager, lazily=False, monkeypatch=monkeypatch) is True
    assert fit(lazy, lazily=True, monkeypatch=monkeypatch) is False  # The check can tell.
    assert optimizer_state(eager) == optimizer_state(lazy)
    # Adam's two moments for each trained weight, and nothing for a frozen backbone's.
    moments = [path for path, _ in optimizer_state(eager) if path.endswith(("_momentum", "_velocity"))]
    assert len(moments) == 2 * len(eager.trainable_variables)
    assert (len(moments) < 2 * len(classifier().trainable_variables)) == frozen_backbone
    for a, b in zip(eager.get_weights(), lazy.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_distiller_builds_for_the_student_only(monkeypatch):
    def distiller():
        trainer = bertzoo.Distiller(classifier(seed=1, hidden_dim=32), classifier(), temperature=2.0, alpha=0.5)
        trainer.compile(optimizer=keras.optimizers.AdamW(1e-2))
        return trainer

    eager, lazy = distiller(), distiller()
    assert fit(eager, lazily=False, monkeypatch=monkeypatch) is True
    assert fit(lazy, lazily=True, monkeypatch=monkeypatch) is False
    assert optimizer_state(eager) == optimizer_state(lazy)
    moments = [path for path, _ in optimizer_state(eager) if path.endswith(("_momentum", "_velocity"))]
    # The student's weights and the projections (widths 16 -> 32); not the teacher's.
    projections = [eager.hidden_projection, eager.embedding_projection]
    trained = len(eager.student.trainable_variables) + sum(len(p.trainable_variables) for p in projections)
    assert len(moments) == 2 * trained
    assert eager.teacher.trainable  # Frozen only while it fits.
    # `train_on_batch` too builds state for the student and projections only.
    batch = distiller()
    batch.train_on_batch(FEATURES, LABELS)
    assert optimizer_state(batch) == optimizer_state(eager)
    assert batch.teacher.trainable
    # It restores what it found: called while the teacher is frozen (from a
    # callback inside `fit`), the teacher stays frozen.
    batch.teacher.trainable = False
    batch.train_on_batch(FEATURES, LABELS)
    assert not batch.teacher.trainable


def test_a_pruner_distilling_from_a_wider_teacher_still_builds_for_the_projections():
    model, teacher = classifier(), classifier(seed=1, hidden_dim=32)
    pruner = bertzoo.Pruner(model, bertzoo.ConstantSparsity(0.5, begin_step=0))
    pruner.fit(
        FEATURES, LABELS, batch_size=4, epochs=1, verbose=0, teacher=teacher, distillation={"hidden_state_weight": 1.0}
    )
    assert pruner.sparsity() == pytest.approx(0.5, abs=1e-3)
    # Once the model has trained alone, its optimizer knows no projection: refused, with the fix.
    other = classifier()
    other.fit(FEATURES, LABELS, batch_size=4, epochs=1, verbose=0)
    other_pruner = bertzoo.Pruner(other, bertzoo.ConstantSparsity(0.5, begin_step=0))
    with pytest.raises(ValueError, match=r"optimizer was not built for .*pruner.compile\(optimizer="):
        other_pruner.fit(FEATURES, LABELS, verbose=0, teacher=teacher, distillation={"hidden_state_weight": 1.0})


def test_train_on_batch_builds_too_and_traces_its_step_once(monkeypatch):
    traces = []
    original = bertzoo.BertClassifier.train_step
    monkeypatch.setattr(
        bertzoo.BertClassifier, "train_step", lambda self, data: traces.append(1) or original(self, data)
    )
    eager, lazy = classifier(), classifier()
    eager.train_on_batch(FEATURES, LABELS)
    assert len(traces) == 1
    with monkeypatch.context() as patch:
        patch.setattr(raw_inputs, "build_optimizer_before_fit", lambda model: None)
        lazy.train_on_batch(FEATURES, LABELS)
    assert len(traces) == 1 + 2  # Keras alone traces again once its step made the variables.
    assert optimizer_state(eager) == optimizer_state(lazy)
    for a, b in zip(eager.get_weights(), lazy.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Refused for its arguments: the optimizer stays as it was.
    refused = classifier()
    with pytest.raises(ValueError, match=r"`sample_weight` and `class_weight`"):
        refused.train_on_batch(FEATURES, LABELS, sample_weight=np.ones(8), class_weight={0: 1.0, 1: 1.0})
    assert not refused.optimizer.built


def test_a_refused_fit_and_a_frozen_model_leave_the_optimizer_unbuilt(tmp_path):
    model = classifier()
    with pytest.raises(ValueError, match=r"`epochs` must be an integer >= 1"):
        model.fit(FEATURES, LABELS, epochs=0, callbacks=[bertzoo.ResumableTraining(tmp_path / "backup")])
    assert not model.optimizer.built
    model.trainable = False  # Nothing to train: Keras's step never builds the optimizer.
    model.fit(FEATURES, LABELS, batch_size=4, epochs=1, verbose=0)
    assert not model.optimizer.built
    model.trainable = True  # Unfrozen, it trains (an optimizer built for nothing could not).
    model.compile(optimizer=model.optimizer)  # Keras reads `trainable` when it compiles.
    before = [keras.ops.convert_to_numpy(v).copy() for v in model.trainable_variables]
    model.fit(FEATURES, LABELS, batch_size=4, epochs=1, verbose=0)
    assert any(not np.allclose(a, keras.ops.convert_to_numpy(v)) for a, v in zip(before, model.trainable_variables))
