"""Named distillation recipes: the published schedules, one call each.

A recipe is a list of stages; each stage is one `Distiller` fit with its own
loss settings and its own data:

- `"tinybert"` (Jiao et al. 2020): first the intermediate layers alone
  (hidden states, attention maps, embeddings; no prediction loss), then the
  predictions alone (soft targets), both on the transfer set.
- `"minilm"` (Wang et al. 2020): first the last layer's self-attention
  distributions and value relations, then the predictions.
- `"hinton"` (Hinton et al. 2015): soft targets only, one stage.

The transfer set is the training texts plus any unlabelled `transfer`
texts: the teacher labels all of them, which is what lets a small student
learn from far more examples than were labelled (TinyBERT's augmented data,
MiniLM's and DistilBERT's unlabelled corpora). With no transfer texts the
prediction stage also uses the labels (`alpha=0.5`).
"""

import numpy as np

from bertzoo.compression.distiller import Distiller
from bertzoo.models.optimizers import bert_optimizer

_OFF = {"hidden_state_weight": 0.0, "attention_weight": 0.0, "embedding_weight": 0.0, "value_relation_weight": 0.0}
_PREDICTIONS = ("predictions", {**_OFF, "soft_target_weight": 1.0})

RECIPES = {
    "tinybert": (
        ("intermediate", {"alpha": 0.0, "soft_target_weight": 0.0, "layer_map": "uniform"}),
        _PREDICTIONS,
    ),
    "minilm": (
        (
            "relations",
            {
                **_OFF,
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


def _as_texts(x, what):
    if isinstance(x, str) or not hasattr(x, "__len__"):
        raise ValueError(
            f"`{what}` must be a list of strings (raw text; the recipes tokenize it with the student's "
            f"preprocessor), got {type(x).__name__}."
        )
    texts = list(x)
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"`{what}` must hold strings only: the recipes read raw text.")
    return texts


def _stage_epochs(epochs, stages):
    if isinstance(epochs, int) and not isinstance(epochs, bool):
        epochs = (epochs,) * len(stages)
    epochs = tuple(epochs)
    if len(epochs) != len(stages) or not all(isinstance(e, int) and e >= 0 for e in epochs):
        names = ", ".join(name for name, _ in stages)
        raise ValueError(f"`epochs` must be an int >= 0 or one per stage ({names}), got {epochs!r}.")
    return epochs


def distill(
    teacher,
    student,
    x,
    y=None,
    recipe="tinybert",
    transfer=None,
    epochs=2,
    batch_size=32,
    learning_rate=2e-4,
    temperature=2.0,
    validation_data=None,
    seed=0,
    verbose="auto",
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
        y: their labels, or None (the teacher labels everything).
        recipe: `"tinybert"`, `"minilm"` or `"hinton"` (see the module).
        transfer: extra unlabelled texts for the transfer set, or None.
        epochs: epochs per stage: an int for every stage, or one per stage.
        batch_size: examples per step.
        learning_rate: each stage's peak learning rate.
        temperature: soft-target temperature.
        validation_data: `(texts, labels)` evaluated after every epoch.
        seed: the seed of the transfer set's order.
        verbose: Keras's `fit` verbosity (progress bars by default).

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
    texts = _as_texts(x, "x")
    extra = [] if transfer is None else _as_texts(transfer, "transfer")
    if y is not None and len(y) != len(texts):
        raise ValueError(f"`x` has {len(texts)} texts but `y` {len(y)} labels.")
    if not texts and not extra:
        raise ValueError("No texts to distill on: `x` and `transfer` are empty.")
    # Soft targets everywhere when there are unlabelled texts (or no labels).
    pool = texts + extra
    order = np.random.default_rng(seed).permutation(len(pool))
    unlabelled = [pool[i] for i in order]
    labelled = (texts, np.asarray(y)) if y is not None and not extra else None

    histories = {}
    for (name, options), stage_epochs in zip(stages, epochs):
        if not stage_epochs:
            continue
        options = {"temperature": temperature, **options}
        data = (unlabelled,)
        if name == "predictions" and labelled is not None:
            options["alpha"], data = 0.5, labelled
        distiller = Distiller(teacher, student, **options)
        distiller.compile(optimizer=bert_optimizer(learning_rate))
        histories[name] = distiller.fit(
            *data, epochs=stage_epochs, batch_size=batch_size, validation_data=validation_data, verbose=verbose
        ).history
    return histories
