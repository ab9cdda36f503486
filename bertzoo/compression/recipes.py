"""Named distillation recipes: the published stage schedules, one call each
(with `Distiller`'s losses: see its docstring for where they differ from a
paper's).

A recipe is a list of stages; each stage is one `Distiller` fit with its own
loss settings and its own data:

- `"tinybert"` (Jiao et al. 2020): first the intermediate layers alone
  (hidden states, attention maps, embeddings; no prediction loss), then the
  predictions alone (soft targets), both on the transfer set. The attention
  term is a KL between attention distributions, where the paper takes the
  MSE of unnormalized scores; the predictions use KL at T=2 (times T^2),
  where the paper uses soft cross-entropy at T=1.
- `"minilm"` (Wang et al. 2020): first the last layer's self-attention
  distributions and value relations, then the predictions.
- `"hinton"` (Hinton et al. 2015): soft targets only, one stage.

The transfer set is the training texts plus any unlabelled `transfer`
texts and `augment` perturbed copies of the training texts
(`augment_texts`): the teacher labels all of them, which is what lets a small student
learn from far more examples than were labelled (TinyBERT's augmented data,
MiniLM's and DistilBERT's unlabelled corpora). With no transfer texts the
prediction stage also uses the labels (`alpha=0.5`).
"""

import keras
import numpy as np

from bertzoo.compression.distiller import PREDICTIONS_ONLY
from bertzoo.compression.distiller import Distiller
from bertzoo.models.optimizers import bert_optimizer
from bertzoo.models.resumable import ResumableTraining
from bertzoo.utils.checks import check_keyword_arguments
from bertzoo.utils.checks import check_non_negative_int
from bertzoo.utils.checks import check_non_negative_number
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.checks import check_rate
from bertzoo.utils.device import strategy_scope_of

_PREDICTIONS = ("predictions", {**PREDICTIONS_ONLY, "soft_target_weight": 1.0})

RECIPES = {
    "tinybert": (
        ("intermediate", {"alpha": 0.0, "soft_target_weight": 0.0, "layer_map": "uniform"}),
        _PREDICTIONS,
    ),
    "minilm": (
        (
            "relations",
            {
                **PREDICTIONS_ONLY,
                "alpha": 0.0,
                "soft_target_weight": 0.0,
                "attention_weight": 1.0,
                "value_relation_weight": 1.0,
                "layer_map": "last",
            },
        ),
        _PREDICTIONS,
    ),
    "hinton": (_PREDICTIONS,),
}


def augment_texts(texts, copies=1, seed=0, rate=0.1):
    """Perturbed copies of `texts` for a transfer set (EDA-style, Wei and
    Zou 2019; TinyBERT augments with word replacements too).

    Each copy of a text changes about `rate` of its words each way: deleted,
    replaced by a word drawn from all the texts' words, and swapped with the
    next word. The teacher labels the copies, so they need not keep the
    original's label. Returns `copies * len(texts)` strings, copy by copy;
    the same `seed` gives the same copies.

    Example:
    ```python
    augment_texts(["a fine and moving film"], copies=2, seed=0)
    # ['a fine film', 'a and film']
    ```
    """
    copies = check_non_negative_int("copies", copies)
    rate = check_rate("rate", rate)
    if seed is not None:  # None: a fresh random order and copies.
        seed = check_non_negative_int("seed", seed)
    texts = as_texts(texts, "texts")
    split = [t.split() for t in texts]
    pool = [w for words in split for w in words]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(copies):
        for words in split:
            words = [w for w in words if rng.random() >= rate] or words[:1]
            words = [pool[rng.integers(len(pool))] if rng.random() < rate else w for w in words]
            for i in range(len(words) - 1):
                if rng.random() < rate:
                    words[i], words[i + 1] = words[i + 1], words[i]
            out.append(" ".join(words))
    return out


def as_texts(x, what):
    """`x` as a list of strings, or a ValueError naming the argument `what`."""
    if isinstance(x, str) or not hasattr(x, "__len__"):
        raise ValueError(
            f"`{what}` must be a list of strings (raw text; the recipes tokenize it with the student's "
            f"preprocessor), got {type(x).__name__}."
        )
    texts = list(x)
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(
            f"`{what}` must hold strings only: the recipes read single raw texts (a classifier's, a tagger's "
            "sentences). For text pairs, multiple choice or question answering, fit a bertzoo.Distiller on the "
            "task's own inputs, e.g. Distiller(teacher, student).fit((contexts, choices), labels)."
        )
    return texts


def _stage_epochs(epochs, stages):
    def whole(e):
        return isinstance(e, (int, np.integer)) and not isinstance(e, bool) and e >= 0

    if isinstance(epochs, np.ndarray) and epochs.ndim == 0:
        epochs = epochs.item()
    if whole(epochs):
        epochs = (epochs,) * len(stages)
    epochs = tuple(epochs) if isinstance(epochs, (list, tuple, np.ndarray)) else (epochs,)
    if len(epochs) != len(stages) or not all(whole(e) for e in epochs):
        names = ", ".join(name for name, _ in stages)
        raise ValueError(f"`epochs` must be an int >= 0 or one per stage ({names}), got {epochs!r}.")
    return tuple(int(e) for e in epochs)


def transfer_pool(texts, transfer=None, augment=0, seed=0):
    """The transfer set, shuffled: every text once, in one order drawn from
    `seed`. A teacher labels all of them (soft targets).

    Args:
        texts: the training texts (raw strings).
        transfer: unlabelled texts, or None.
        augment: perturbed copies of each training text to add
            (`augment_texts`, seeded by `seed`).
        seed: the seed of the order and of the augmentation.

    Example:
    ```python
    pool = transfer_pool(train_texts, unlabelled_texts, seed=0)
    distiller.fit(pool, epochs=2)  # no labels: soft targets only
    ```
    """
    augment = check_non_negative_int("augment", augment)
    texts = as_texts(texts, "texts")
    extra = [] if transfer is None else as_texts(transfer, "transfer")
    extra += augment_texts(texts, augment, seed=seed) if texts else []
    pool = texts + extra
    return [pool[i] for i in np.random.default_rng(seed).permutation(len(pool))]


def distill(
    teacher,
    student,
    x,
    y=None,
    recipe="tinybert",
    transfer=None,
    augment=0,
    epochs=2,
    batch_size=32,
    learning_rate=2e-4,
    temperature=2.0,
    validation_data=None,
    seed=0,
    verbose="auto",
    pruner=None,
    callbacks=None,
    **distiller_options,
):
    """Distills `teacher` into `student` with a named recipe; returns the histories.

    The student trains in place (an ordinary task model afterwards: save it
    with `save_to_preset`). Each stage compiles a fresh `bert_optimizer`
    (warm-up, then linear decay over that stage) at `learning_rate`; 2e-4
    suits a student copied from teacher layers (`init_student_from_teacher`),
    a randomly initialized one wants about 1e-3.

    Args:
        teacher: a fine-tuned task model (e.g. a `BertClassifier`).
        student: a task model of the same class and head.
        x: the training texts (raw strings).
        y: their labels, or None (the teacher labels everything). Used only
            without `transfer` and `augment` (then the predictions stage
            mixes them in, `alpha=0.5`); with either, every stage trains on
            the teacher's soft targets over the whole transfer set.
        recipe: `"tinybert"`, `"minilm"` or `"hinton"` (see the module).
        transfer: extra unlabelled texts for the transfer set, or None.
        augment: perturbed copies of each training text added to the
            transfer set (`augment_texts`, seeded by `seed`).
        epochs: epochs per stage: an int for every stage, or one per stage.
        batch_size: examples per step.
        learning_rate: each stage's peak learning rate.
        temperature: soft-target temperature.
        validation_data: `(texts, labels)` evaluated after every epoch.
        seed: the seed of the transfer set's order and augmentation.
        verbose: Keras's `fit` verbosity (progress bars by default).
        pruner: a `bertzoo.Pruner` attached to `student` (e.g.
            `Pruner.holding_zeros(student)`, to keep a pruned student's
            zeros): every stage's trainer carries it (`prepare_trainer`).
        callbacks: Keras callbacks for every stage's `fit` (e.g.
            `keras.callbacks.EarlyStopping(monitor="val_loss")` with
            `validation_data`): each stage is a `fit` of its own `Distiller`,
            which a callback sees as its model. Those that reset when a
            `fit` begins (`EarlyStopping`, `ReduceLROnPlateau`) start afresh
            with each stage; `ModelCheckpoint(save_best_only=True)` keeps
            its best across stages, whose losses differ. Not
            `ResumableTraining` or `BackupAndRestore`, which checkpoint one
            `fit`: resume a long distillation stage by stage, with
            `Distiller(teacher, student, ...).fit(...)`.
        **distiller_options: `Distiller` settings for every stage, over the
            recipe's own (e.g. `relation_heads=2` for `"minilm"`, or
            `soft_target_weight=0` for a regression head, whose outputs
            have no soft targets).

    Every stage's `Distiller` is built, and so checked, before the first
    stage trains: a setting a later stage refuses fails before the student
    changes.

    Example:
    ```python
    student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 2})
    bertzoo.distill(teacher, student, train_texts, train_labels, recipe="tinybert",
                    transfer=unlabelled_texts, epochs=(1, 3))
    student.save_to_preset("runs/student")
    ```
    """
    if recipe not in RECIPES:
        raise ValueError(f"Unknown recipe {recipe!r}. Choose one of {sorted(RECIPES)}.")
    stages = RECIPES[recipe]
    epochs = _stage_epochs(epochs, stages)
    check_positive_int("batch_size", batch_size)
    check_non_negative_number("learning_rate", learning_rate)
    check_non_negative_int("seed", seed)
    if pruner is not None and not callable(getattr(pruner, "prepare_trainer", None)):
        raise ValueError(
            f"`pruner` must be a bertzoo.Pruner of the student (e.g. Pruner.holding_zeros(student)) or None, got "
            f"{pruner!r}."
        )
    callbacks = _checked_callbacks(callbacks)
    texts = as_texts(x, "x")
    if y is not None and len(y) != len(texts):
        raise ValueError(f"`x` has {len(texts)} texts but `y` {len(y)} labels.")
    unlabelled = transfer_pool(texts, transfer, augment, seed)
    if not unlabelled:
        raise ValueError("No texts to distill on: `x` and `transfer` are empty.")
    # Soft targets everywhere when there are unlabelled texts (or no labels).
    labelled = (texts, np.asarray(y)) if y is not None and len(unlabelled) == len(texts) else None

    # A misspelled distill() argument would reach Distiller as a setting, and Keras's layer arguments
    # (trainable=False) would be taken silently.
    check_keyword_arguments(
        Distiller, distiller_options, base=(), skip=("teacher", "student", "name"), caller="distill()"
    )
    runs = []
    for (name, options), stage_epochs in zip(stages, epochs):
        if not stage_epochs:
            continue
        options = {"temperature": temperature, **options}
        data = (unlabelled,)
        if name == "predictions" and labelled is not None:
            options["alpha"], data = 0.5, labelled
        options.update(distiller_options)
        try:
            runs.append((name, Distiller(teacher, student, **options), data, stage_epochs))
        except ValueError as e:
            raise ValueError(
                f"The {recipe!r} recipe's {name} stage cannot run, so nothing was trained: {e} (Through "
                "distill(), pass Distiller settings as its keyword arguments, applied to every stage, or skip "
                "this stage with one epoch count per stage, 0 for it.)"
            ) from e
    histories = {}
    for name, distiller, data, stage_epochs in runs:
        with strategy_scope_of(distiller):  # The student's tf.distribute strategy, if any.
            distiller.compile(optimizer=bert_optimizer(learning_rate))
        if pruner is not None:
            pruner.prepare_trainer(distiller)
        histories[name] = distiller.fit(
            *data,
            epochs=stage_epochs,
            batch_size=batch_size,
            validation_data=validation_data,
            verbose=verbose,
            callbacks=callbacks,
        ).history
    return histories


def _checked_callbacks(callbacks):
    """`distill`'s `callbacks` as a list, refusing what cannot span its stages."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise ValueError(f"`callbacks` must be a list of keras.callbacks.Callback, got {callbacks!r}.")
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise ValueError(f"`callbacks` must be a list of keras.callbacks.Callback, got {callback!r}.")
        if isinstance(callback, (ResumableTraining, keras.callbacks.BackupAndRestore)):
            raise ValueError(
                f"distill() runs one fit per stage, and {type(callback).__name__} checkpoints one fit (a rerun would "
                "find a later stage's checkpoint in an earlier stage). Resume stage by stage instead: "
                "Distiller(teacher, student, **stage_settings).fit(texts, epochs=..., "
                "callbacks=[bertzoo.ResumableTraining(directory)]), one directory per stage."
            )
    return callbacks
