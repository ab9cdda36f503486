"""Knowledge distillation of BERT task models into smaller ones.

`Distiller` trains a student task model (a classifier, tagger, question
answerer or multiple-choice model) to imitate a fine-tuned teacher:
Hinton et al.'s soft targets at temperature `T` mixed with the hard labels,
plus TinyBERT-style intermediate losses (hidden states through a learned
projection when widths differ, attention distributions, the embedding
layer) between mapped layers. The losses are in `bertzoo.compression.losses`;
`init_student_from_teacher` (in `student_init`) builds a shallower student
from every k-th teacher layer (DistilBERT).

How this relates to `keras.distillation`: `Distiller` subclasses
`keras.distillation.Distiller` (teacher freezing, model checks, the
`student_loss_weight` mix, loss trackers, `compile`'s student loss) and its
losses are `keras.distillation.DistillationLoss` subclasses; the soft-target
loss *is* `keras.distillation.LogitsDistillation` (KL at `T`, scaled by `T^2`),
configured with a `KLDivergence` instance because its default loss string
silently skips the softmax and the `T^2` (see `soft_target_loss`).
What it replaces, and why:

- Feature extraction. Keras reads intermediate features from
  `model.get_layer(name).output` through a second functional model. A BERT
  task's backbone is one nested layer, its per-layer hidden states are no
  layer's output, and attention probabilities are not computed by the
  default graph at all; so features come from the task's own
  `compute_features(..., return_attention_scores=True)` (the backbone's
  features and the head's logits, in one pass).
- One student forward pass. With feature losses Keras runs the student twice
  per step (once for `y_pred`, once through the feature extractor, with
  different dropout masks). Here `call()` runs it once and keeps its features
  for `compute_loss` (matched by the identity of `y_pred`).
- Loss mix. Keras scales every distillation loss by `1 - student_loss_weight`.
  Here `alpha` mixes only the hard-label loss with the soft-target loss, as in
  Hinton et al.; the intermediate losses have their own weights. On unlabeled
  batches (no `y`) the soft-target loss gets the full weight.
- Learned projections. `FeatureDistillation` holds no weights; the TinyBERT
  projections are `Dense` layers of the distiller, trained with the student.
- The teacher's outputs also pass through `stop_gradient` (Keras relies on
  `teacher.trainable = False` alone), so no gradient reaches the teacher even
  if its variables are made trainable again or shared with the student.
"""

import contextlib
import inspect
import math
import types

import keras
import numpy as np
from keras import ops

from bertzoo.compression.layer_maps import layer_map_pairs
from bertzoo.compression.losses import AttentionDistillation
from bertzoo.compression.losses import HiddenStateDistillation
from bertzoo.compression.losses import ValueRelationDistillation
from bertzoo.compression.losses import soft_target_loss
from bertzoo.layers.dense import Dense
from bertzoo.models.compile_defaults import DefaultCompileMixin
from bertzoo.models.head_utils import unused_pooler_ok
from bertzoo.models.raw_inputs import RawInputsMixin
from bertzoo.models.task import Task
from bertzoo.models.task import bert_optimizer
from bertzoo.models.task import loss_scaled
from bertzoo.utils import private_api
from bertzoo.utils import quantization_mode
from bertzoo.utils.checks import check_bool
from bertzoo.utils.device import strategy_scope_of

# `loss_terms` tokenizes raw inputs as one batch of at most this many examples.
_ONE_BATCH = 1 << 30
# `normalize_losses`: the training steps whose mean loss values set the scales.
NORMALIZATION_STEPS = 10
# `Distiller` options that turn every intermediate-layer term off, so only the
# predictions are distilled (Hinton et al., 2015).
PREDICTIONS_ONLY = types.MappingProxyType(
    {"hidden_state_weight": 0.0, "attention_weight": 0.0, "embedding_weight": 0.0, "value_relation_weight": 0.0}
)
_INTERMEDIATE = ("hidden", "attention", "embedding", "value_relation")
_TINY = 1e-12
# `normalize_losses` scales a term up at most this much (one near 0 at the start would get its round-off scaled up).
MAX_TERM_BOOST = 1e6


# --- Models -----------------------------------------------------------------
def _check_task(role, model):
    if not isinstance(model, Task) or type(model).compute_head_outputs is Task.compute_head_outputs:
        raise ValueError(
            f"The {role} must be a bertzoo BertClassifier or another task with a head (BertTokenClassifier, "
            f"BertQuestionAnswerer, BertMultipleChoice), got {type(model).__name__}. "
            f"Build one with e.g. bertzoo.BertClassifier.from_preset(...)."
        )


def _heads_in(backbone, layer):
    """Attention heads of `backbone`'s layer `layer` (from 1; per-layer
    counts after structured pruning)."""
    heads = backbone.num_heads
    return int(heads) if isinstance(heads, int) else int(heads[max(layer, 1) - 1])


def _check_logits(teacher, student):
    """The soft-target loss is softmax(outputs / T) matched between the
    models: Hinton's loss on logits (log-probabilities do too: the shift
    cancels). Other outputs are refused while that loss is on."""
    for role, model in (("teacher", teacher), ("student", student)):
        activation = model._activation_name() if hasattr(model, "_activation_name") else "linear"
        if getattr(model, "num_classes", 2) == 1 or activation not in ("linear", "log_softmax"):
            what = "one value per example" if model.num_classes == 1 else f"{activation or 'activated'} outputs"
            raise ValueError(
                f"The {role}'s head gives {what}, and the soft-target loss matches softmax(logits / T) between the "
                f"models: distill heads that output logits of two or more classes (for {type(model).__name__}: "
                f"{'activation=None, the default, and ' if hasattr(model, '_activation_name') else ''}"
                "num_classes >= 2), or turn the soft-target loss off (soft_target_weight=0)."
            )


def _check_same_head(teacher, student):
    """Teacher and student must give logits of the same kind and shape."""
    if type(teacher) is not type(student):
        raise ValueError(
            f"The teacher is a {type(teacher).__name__} but the student a {type(student).__name__}: "
            "distill into a student of the teacher's class."
        )
    if getattr(teacher, "num_classes", None) != getattr(student, "num_classes", None):
        raise ValueError(
            f"The teacher predicts {teacher.num_classes} classes but the student "
            f"{student.num_classes}: build the student with num_classes={teacher.num_classes}."
        )
    if tuple(teacher.output.shape) != tuple(student.output.shape):
        raise ValueError(
            f"The teacher's outputs have shape {tuple(teacher.output.shape)} but the student's "
            f"{tuple(student.output.shape)}: build the student with the teacher's head settings."
        )
    names = getattr(teacher, "class_names", None), getattr(student, "class_names", None)
    if None not in names and list(names[0]) != list(names[1]):
        # Soft targets are matched by index: the student's class i learns the teacher's class i.
        raise ValueError(
            f"The teacher's class_names are {list(names[0])} but the student's {list(names[1])}: the student "
            f"learns the teacher's outputs in the teacher's order. Build the student with "
            f"class_names={list(names[0])}."
        )


def _tokenizer_difference(a, b):
    """Why two tokenizers give different ids for the same text, or None."""
    if type(a) is not type(b):
        return f"the teacher uses a {type(a).__name__}, the student a {type(b).__name__}"
    va, vb = a.get_vocabulary(), b.get_vocabulary()
    if va != vb:
        if len(va) != len(vb):
            return f"the vocabularies have {len(va)} and {len(vb)} tokens"
        i = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y)
        return f"the vocabularies differ (id {i} is {va[i]!r} for the teacher, {vb[i]!r} for the student)"
    ca, cb = a.get_config(), b.get_config()
    for setting in sorted(set(ca) | set(cb)):
        if setting in ("name", "trainable", "dtype", "vocabulary", "proto"):
            continue
        if ca.get(setting) != cb.get(setting):
            return f"`{setting}` is {ca.get(setting)!r} for the teacher, {cb.get(setting)!r} for the student"
    if ca.get("proto") != cb.get("proto"):
        return "the SentencePiece models differ (same pieces, other scores)"
    return None


def _check_same_tokens(teacher, student):
    """Teacher and student must read the same token ids (one tokenization)."""
    tv, sv = teacher.backbone.vocabulary_size, student.backbone.vocabulary_size
    fix = (
        "Distillation feeds both models the same token ids, so they need one vocabulary. "
        "Give a randomly initialized student the teacher's tokenizer, e.g. "
        "BertClassifier.from_preset('tiny', num_classes=..., preprocessor=teacher.preprocessor, "
        f"load_weights=False) (its backbone needs vocabulary_size={tv}), or build the student "
        "from the teacher with bertzoo.init_student_from_teacher(teacher, {'num_layers': ...})."
    )
    if tv != sv:
        raise ValueError(
            f"Teacher and student vocabularies differ: the teacher has vocabulary_size={tv}, the student {sv}. {fix}"
        )
    if teacher.preprocessor is not None and student.preprocessor is not None:
        why = _tokenizer_difference(teacher.preprocessor.tokenizer, student.preprocessor.tokenizer)
        if why:
            raise ValueError(f"Teacher and student tokenize text differently: {why}. {fix}")
    text_model = student if student.preprocessor is not None else teacher
    if text_model.preprocessor is not None:
        length = text_model.preprocessor.sequence_length
        for role, model in (("teacher", teacher), ("student", student)):
            if model.backbone.max_sequence_length < length:
                raise ValueError(
                    f"The shared preprocessor makes sequences of {length} tokens but the {role} "
                    f"has max_sequence_length={model.backbone.max_sequence_length}. Build the "
                    "models with a shorter `sequence_length`."
                )


def _check_weight(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ValueError(f"`{name}` must be a finite number >= 0 (0 turns the loss off), got {value!r}.")
    return float(value)


# The `Distiller` arguments `check_loss_settings` checks; their defaults are the Distiller's.
LOSS_SETTINGS = (
    "temperature",
    "alpha",
    "hidden_state_weight",
    "attention_weight",
    "embedding_weight",
    "value_relation_weight",
    "soft_target_weight",
)


def check_loss_settings(**settings):
    """Raises a ValueError naming the first bad loss setting of a
    `Distiller` (its constructor's checks), before any model is built or
    trained; returns the loss weights by term ("hidden", "attention",
    "embedding", "value_relation", "soft_target") as floats.

    Takes the Distiller's loss arguments (`LOSS_SETTINGS`) by name; one
    left out takes the Distiller's default, read from its signature so the
    two cannot drift apart.

    Example:
    ```python
    check_loss_settings(temperature=args.temperature, alpha=args.alpha)  # Before fine-tuning a teacher.
    ```
    """
    unknown = sorted(set(settings) - set(LOSS_SETTINGS))
    if unknown:
        raise TypeError(
            f"check_loss_settings() takes the Distiller's loss settings {list(LOSS_SETTINGS)}, got {unknown}."
        )
    parameters = inspect.signature(Distiller.__init__).parameters
    settings = {name: settings.get(name, parameters[name].default) for name in LOSS_SETTINGS}
    temperature, alpha = settings["temperature"], settings["alpha"]
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not temperature > 0
        or math.isinf(temperature)
    ):
        raise ValueError(f"`temperature` must be a finite number > 0, got {temperature!r} (1 = plain softmax).")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"`alpha` must be in [0, 1] (the weight of the hard-label loss; 0 = soft targets only), got {alpha!r}."
        )
    weights = {
        "hidden": _check_weight("hidden_state_weight", settings["hidden_state_weight"]),
        "attention": _check_weight("attention_weight", settings["attention_weight"]),
        "embedding": _check_weight("embedding_weight", settings["embedding_weight"]),
        "value_relation": _check_weight("value_relation_weight", settings["value_relation_weight"]),
        "soft_target": _check_weight("soft_target_weight", settings["soft_target_weight"]),
    }
    if not alpha and not any(weights.values()):
        raise ValueError(
            "Every loss of this Distiller has weight 0 (alpha=0, soft_target_weight=0, no intermediate-layer "
            "weight): it would train nothing while the optimizer's weight decay shrank the student. Set "
            "soft_target_weight > 0 (the teacher's predictions), alpha > 0 (the labels) or an intermediate "
            "weight (hidden_state_weight, attention_weight, ...)."
        )
    return weights


@keras.saving.register_keras_serializable(package="bertzoo")
class Distiller(DefaultCompileMixin, RawInputsMixin, keras.distillation.Distiller):
    """Trains a student task model to imitate a teacher of the same class.

    Any bertzoo head works: `BertClassifier` (soft targets over the classes),
    `BertTokenClassifier` (over each token's classes, padding tokens left
    out), `BertQuestionAnswerer` (over the positions of the start and of the
    end logits) and `BertMultipleChoice` (over the choices; the intermediate
    losses then compare every encoded choice).

    The loss of a labelled batch is

        prediction = alpha * CE(y, student)
                     + (1 - alpha) * soft_target_weight * T^2 * KL(softmax(teacher / T) || softmax(student / T))
        loss = prediction
               + c_h * hidden_state_weight * mean over pairs of MSE(W_h h_student[s], h_teacher[t])
               + c_a * attention_weight * mean over pairs of KL(A_teacher[t] || A_student[s])
               + c_e * embedding_weight * MSE(W_e e_student, e_teacher)
               + c_v * value_relation_weight * KL(VR_teacher[t] || VR_student[s]) (the last pair)

    and of an unlabelled batch (no `y`: raw text alone) the same with
    `alpha = 0`: the teacher's soft targets replace the labels. `W_h` and
    `W_e` are learned `Dense` projections, present only when the hidden sizes
    differ. The pairs `(s, t)` come from `layer_map`; a weight of 0 turns its
    loss off (and attention probabilities are then not computed at all).

    Balance (`normalize_losses=True`, the default): the intermediate terms
    are in other units than the prediction loss (squared activations, nats
    per attention row) and at weight 1 would swamp it. Each scale `c` is
    fixed from the mean values over the first `NORMALIZATION_STEPS` (10)
    training steps: `c_i = P / (n * L_i)`, where `L_i` is the term's mean,
    `P` the prediction loss's (1 when the prediction loss is off) and `n`
    the number of enabled intermediate terms. So at the start the
    intermediate terms together weigh as much as the prediction loss (each
    times its weight), whatever the models' sizes; afterwards every term
    falls at its own pace. A term that starts near 0 (a student copied from
    the teacher's layers) is scaled up at most `MAX_TERM_BOOST` (1e6)
    times. Only the intermediate terms are scaled: the soft-target and
    hard-label losses keep their own weights. The scales are distiller
    weights (saved and restored with it). `normalize_losses=False` uses the
    raw sums.

    Sample weights (and `class_weight`) weight the hard-label loss; the
    distillation terms average over all examples. The metrics
    (`student_loss`, `distillation_loss`, `agreement`) weight each batch by
    its number of examples, as Keras's `loss` does (a tagger's per-token
    values are averaged within each batch first).

    Recipes: `bertzoo.compression.distill(..., recipe="tinybert")` runs
    TinyBERT's two-stage schedule (intermediate layers first, then the
    predictions, on a transfer set) with these losses; its attention term
    is this KL between attention distributions (MiniLM's form), not the
    paper's MSE on unnormalized scores, which the backbone does not expose.

    The teacher is frozen while the distiller trains (`teacher.trainable`
    is False during `fit` and `train_on_batch` and restored afterwards, so a copy of the teacher
    made later trains as usual), runs in inference mode (no dropout) and its
    outputs pass through `stop_gradient`. Teacher and student must read the same token ids: with
    raw-text inputs the student's preprocessor (else the teacher's) tokenizes
    once for both, and differing vocabularies are an error. `fit`,
    `evaluate` and `predict` accept what task models accept: raw strings,
    string pairs, `tf.data` datasets of them, or tokenized dicts.

    Metrics: `accuracy` is the student's (on labelled data), `agreement` is
    the fraction of predictions (examples; real tokens for a tagger; start
    and end for spans) where student and teacher pick the same class (none
    for a head of one output, e.g. a regression: there is no class to pick),
    `student_loss` the hard-label loss and `distillation_loss` the weighted
    sum of the other terms. After `fit`, `distiller.student` is an ordinary
    task model (save it with `save_to_preset`).

    Args:
        teacher: a trained bertzoo task model (e.g. `bertzoo.BertClassifier`).
        student: the task model to train: same class and head settings
            (e.g. `num_classes`) as the teacher.
        temperature: softmax temperature `T > 0` of the soft targets.
        alpha: weight in [0, 1] of the hard-label loss against the soft one.
        hidden_state_weight: weight of the hidden-state loss.
        attention_weight: weight of the attention-distribution loss.
        embedding_weight: weight of the embedding-output loss.
        value_relation_weight: weight of MiniLM's value-relation loss on the
            last layer pair (0: off, and value states are not computed).
        soft_target_weight: weight of the soft-target loss (0 with `alpha=0`
            trains the intermediate layers alone, TinyBERT's first stage).
        layer_map: "uniform", "last", or `[(student_layer, teacher_layer), ...]`
            (layers numbered from 1); see `layer_map_pairs`.
        relation_heads: relation heads of the value-relation loss (default:
            the teacher's attention heads); must divide both models' widths.
        normalize_losses: balance the intermediate terms against the
            prediction loss (above).

    Example:
    ```python
    teacher = bertzoo.BertClassifier.from_preset("runs/teacher")  # fine-tuned
    # A random student may take the teacher's tokenizer (one vocabulary for both; "tiny" has
    # BERT's 30522-token table, so this fits a teacher with that vocabulary, e.g. BERT-uncased, MiniLM):
    student = bertzoo.BertClassifier.from_preset(
        "tiny", num_classes=2, preprocessor=teacher.preprocessor, load_weights=False)
    # ...or start from every k-th teacher layer (same width):
    # student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 2})
    distiller = bertzoo.Distiller(teacher, student, temperature=2.0, alpha=0.5)  # Compiled with defaults.
    distiller.fit(train_texts, train_labels, validation_data=(val_texts, val_labels), epochs=3)
    student.save_to_preset("runs/student")
    ```
    """

    def __init__(
        self,
        teacher,
        student,
        temperature=2.0,
        alpha=0.5,
        hidden_state_weight=1.0,
        attention_weight=1.0,
        embedding_weight=1.0,
        value_relation_weight=0.0,
        soft_target_weight=1.0,
        layer_map="uniform",
        relation_heads=None,
        normalize_losses=True,
        name="distiller",
        **kwargs,
    ):
        # Built in the student's tf.distribute strategy (its variables mirrored like the student's) even
        # when made outside that scope, as a Keras model records the strategy it was made under.
        with strategy_scope_of(student):
            _check_task("teacher", teacher)
            _check_task("student", student)
            if teacher is student:
                raise ValueError("The teacher and the student are the same model: pass two models.")
            if quantization_mode(student):
                raise ValueError(
                    f"The student is quantized ({quantization_mode(student)}): its integer kernels cannot train. "
                    "Distill into a float student, then quantize it (bertzoo.quantize or "
                    "bertzoo.quantization_aware_training)."
                )
            _check_same_head(teacher, student)
            _check_same_tokens(teacher, student)
            weights = check_loss_settings(
                temperature=temperature,
                alpha=alpha,
                hidden_state_weight=hidden_state_weight,
                attention_weight=attention_weight,
                embedding_weight=embedding_weight,
                value_relation_weight=value_relation_weight,
                soft_target_weight=soft_target_weight,
            )
            soft_target_weight = weights.pop("soft_target")
            if soft_target_weight:
                _check_logits(teacher, student)
            layer_pairs = layer_map_pairs(layer_map, student.backbone.num_layers, teacher.backbone.num_layers)

            # Keras freezes the teacher for good; here it is frozen while this
            # distiller trains and left as it was otherwise (see `_training`).
            teacher_trainable = teacher.trainable
            s_width, t_width = student.backbone.hidden_dim, teacher.backbone.hidden_dim

            def projection(name):
                if s_width == t_width:
                    return None
                layer = Dense(t_width, dtype=student.backbone.dtype_policy, name=name)
                layer.build((None, None, s_width))
                return layer

            hidden_projection = projection("hidden_projection") if weights["hidden"] else None
            embedding_projection = projection("embedding_projection") if weights["embedding"] else None
            (student_layer, teacher_layer), *_ = layer_pairs[-1:] or [(0, 0)]
            if relation_heads is None:  # The teacher's heads in the related layer (pruned models: per layer).
                relation_heads = _heads_in(teacher.backbone, teacher_layer)
            terms = {"soft": soft_target_loss(float(temperature))}
            if weights["hidden"]:
                terms["hidden"] = HiddenStateDistillation(layer_pairs, hidden_projection)
            if weights["attention"]:
                terms["attention"] = AttentionDistillation(layer_pairs)
            if weights["embedding"]:
                terms["embedding"] = HiddenStateDistillation([(0, 0)], embedding_projection)
            if weights["value_relation"]:
                terms["value_relation"] = ValueRelationDistillation(layer_pairs[-1:], relation_heads)
                for role, model, layer in (("teacher", teacher, teacher_layer), ("student", student, student_layer)):
                    width = _heads_in(model.backbone, layer) * model.backbone.head_dim  # The values' width there.
                    if width % relation_heads:
                        raise ValueError(
                            f"relation_heads={relation_heads} does not divide the width {width} of the {role}'s values "
                            f"in layer {layer}: pass relation_heads= a divisor of both models' value widths."
                        )
            super().__init__(
                teacher=teacher,
                student=student,
                distillation_losses=list(terms.values()),
                distillation_loss_weights=[soft_target_weight] + [weights[k] for k in terms if k != "soft"],
                student_loss_weight=float(alpha),
                name=name,
                **kwargs,
            )
            self._terms = terms
            teacher.trainable = teacher_trainable
            self.hidden_projection = hidden_projection
            self.embedding_projection = embedding_projection
            self.temperature = float(temperature)
            self.hidden_state_weight = weights["hidden"]
            self.attention_weight = weights["attention"]
            self.embedding_weight = weights["embedding"]
            self.value_relation_weight = weights["value_relation"]
            self.soft_target_weight = soft_target_weight
            self.relation_heads = int(relation_heads)
            self.normalize_losses = check_bool("normalize_losses", normalize_losses)
            # Per intermediate term: its mean over the first training steps
            # (`loss_means`), the prediction loss's (`prediction_mean`), and how
            # many steps were averaged.
            enabled = [k for k in _INTERMEDIATE if weights[k]]
            self._normalized_terms = enabled if self.normalize_losses else []
            self.loss_means = {
                key: self.add_weight(shape=(), initializer="zeros", trainable=False, name=f"{key}_loss_mean")
                for key in self._normalized_terms
            }
            if self._normalized_terms:
                self.prediction_mean = self.add_weight(
                    shape=(), initializer="zeros", trainable=False, name="prediction_loss_mean"
                )
                self.normalization_steps = self.add_weight(
                    shape=(), initializer="zeros", trainable=False, name="normalization_steps"
                )
            self.layer_map = layer_map if isinstance(layer_map, str) else [list(p) for p in layer_pairs]
            self.layer_pairs = layer_pairs
            self._term_weights = weights
            self._needs_attention = bool(weights["attention"])
            self._needs_values = bool(weights["value_relation"])
            self.agreement_tracker = keras.metrics.Mean(name="agreement")
            # One output (a regression or one sigmoid): its argmax is always 0, so agreement would read 1.0.
            self._has_agreement = getattr(student, "num_classes", None) != 1
            # The hard-label loss until `compile()` sets the chosen one.
            self._student_loss = student.default_loss()
            # Features of the latest student forward pass, keyed by its logits;
            # not tracked by Keras (they are tensors of one trace, not state).
            object.__setattr__(self, "_student_pass", None)

    @property
    def alpha(self):
        """Weight of the hard-label loss (Keras's `student_loss_weight`)."""
        return self.student_loss_weight

    @property
    def preprocessor(self):
        """The preprocessor that tokenizes raw text for both models, or None."""
        return self._text_model().preprocessor

    def _text_model(self):
        return self.student if self.student.preprocessor is not None else self.teacher

    @property
    def metrics(self):
        # Keras's `total_loss` tracker would repeat `loss`; the compiled
        # metrics stay unbuilt while only unlabelled data has been seen.
        compiled = private_api.compiled_metrics_container(self)
        return [
            m
            for m in super().metrics
            if m is not self.total_loss_tracker
            and not (m is compiled and not m.built)
            and not (m is self.agreement_tracker and not self._has_agreement)
        ]

    # --- Training defaults ------------------------------------------------
    def compile(self, optimizer="auto", loss="auto", metrics="auto", jit_compile="auto", **kwargs):
        """Compiles with the student's fine-tuning defaults.

        `optimizer="auto"`: `bertzoo.models.task.bert_optimizer()` (AdamW, peak
        learning rate 5e-5, warm-up then linear decay over the `fit()` run);
        pass `bert_optimizer(1e-3)` for a randomly initialized student.
        `loss="auto"`: the student's hard-label loss (logits cross-entropy).
        `metrics="auto"`: the student's accuracy. `jit_compile="auto"`: XLA
        where it is faster (`bertzoo.utils.device.default_jit_compile`).
        """
        if optimizer == "auto":
            with strategy_scope_of(self):  # Its slots are made in the strategy this distiller was built under.
                optimizer = bert_optimizer()
        optimizer = loss_scaled(optimizer, self.student)  # As the student's own compile() would.
        if loss == "auto":
            loss = self.student.default_loss()
        if metrics == "auto":
            metrics = self.student.default_metrics()
        # "auto" times this distiller's own step, teacher included
        # (`fast_path_parts`). A multi-replica strategy turns XLA off (or
        # rejects jit_compile=True).
        jit_compile = self._provisional_jit_compile(jit_compile, self)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=jit_compile, **kwargs)

    def get_compile_config(self):
        # Keras's Distiller compiles its base with loss=None and keeps the
        # student's loss aside: put it back, so a reloaded `.keras` distiller
        # compiles as this one did (optimizer state included).
        config = super().get_compile_config()
        loss = getattr(self, "_student_loss_for_serialization", None)
        if config is not None and config.get("loss") is None and loss is not None:
            config = dict(config, loss=keras.saving.serialize_keras_object(loss))
        return config

    def compile_from_config(self, config):
        # The optimizer is built on what training updates: the teacher frozen.
        with self._training():
            super().compile_from_config(config)

    def fast_path_parts(self):
        """What `jit_compile="auto"` measures this distiller's step with
        (`bertzoo.utils.fast_path.trainer_parts`): the student's inputs, the
        distillation loss on unlabelled inputs as the training proxy (the
        teacher's forward pass, the student's forward and backward passes
        and the intermediate losses), and both models' signatures and the
        loss settings as its cache key."""
        settings = {
            "terms": sorted(k for k, w in self._term_weights.items() if w),
            "soft_target_weight": self.soft_target_weight,
            "layer_pairs": [list(p) for p in self.layer_pairs],
            "relation_heads": self.relation_heads,
            "normalize_losses": self.normalize_losses,
        }
        return {
            "inputs": self.student,
            "models": {"teacher": self.teacher, "student": self.student},
            "settings": settings,
            # The timing proxy runs unlabelled whatever the loss weights say.
            "train_loss": lambda x: self._distillation_loss(x=x, training=True, refuse_zero_loss=False),
        }

    # --- Forward and loss -------------------------------------------------
    def call(self, inputs, training=None):
        """The student's logits (its features are kept for `compute_loss`)."""
        features = self._features(self.student, inputs, training)
        object.__setattr__(self, "_student_pass", (features["logits"], features))
        return features["logits"]

    def _features(self, model, inputs, training):
        """One forward pass of `model`: its logits and backbone features."""
        return model.compute_features(
            inputs,
            training=training,
            return_attention_scores=self._needs_attention,
            return_value_states=self._needs_values,
        )

    def _teacher_features(self, x):
        # Not recorded: no gradient reaches the teacher, and unrecorded it
        # runs the inference kernels (e.g. matmul and GELU fused by oneDNN).
        with private_api.gradient_recording_paused():
            features = self._features(self.teacher, x, training=False)
        return keras.tree.map_structure(ops.stop_gradient, features)

    def _loss_terms(self, x, y, student, teacher, sample_weight=None):
        """Unweighted loss terms (scalars) and the teacher-student agreement."""
        mask = student["padding_mask"]  # Of the encoded sequences (one per choice for multiple choice).
        logits_mask = student.get("logits_mask")  # Per-token heads: padding rows carry no target.
        terms = {}
        if y is not None:
            hard = self._student_loss(y, student["logits"], self.student.loss_sample_weight(sample_weight))
            terms["hard"] = ops.mean(hard)
        for key, loss in self._terms.items():
            if key == "soft":
                terms[key] = loss.compute_loss(teacher["logits"], student["logits"], mask=logits_mask)
            elif key == "attention":
                terms[key] = loss.compute_loss(teacher["attention_scores"], student["attention_scores"], mask)
            elif key == "value_relation":
                terms[key] = loss.compute_loss(teacher["value_states"], student["value_states"], mask)
            else:
                terms[key] = loss.compute_loss(teacher["hidden_states"], student["hidden_states"], mask)
        same = ops.cast(
            ops.equal(ops.argmax(student["logits"], axis=-1), ops.argmax(teacher["logits"], axis=-1)), "float32"
        )
        if logits_mask is None:
            return terms, ops.mean(same)
        logits_mask = ops.cast(logits_mask, "float32")
        return terms, ops.sum(same * logits_mask) / ops.maximum(ops.sum(logits_mask), 1.0)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self._distillation_loss(x, y, y_pred, sample_weight, training)

    def _distillation_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True, refuse_zero_loss=True):
        student = None
        if y_pred is not None and self._student_pass is not None and self._student_pass[0] is y_pred:
            student = self._student_pass[1]
        object.__setattr__(self, "_student_pass", None)
        if (
            refuse_zero_loss
            and y is None
            and training
            and not self.soft_target_weight
            and not any(self._term_weights.values())
        ):
            # Known when the step is traced: unlabelled batches leave no loss with a weight.
            raise ValueError(
                "This Distiller trains on unlabelled batches, but its only loss with a weight is the hard-label "
                "loss (soft_target_weight=0, no intermediate-layer weight): the loss would be 0 while the "
                "optimizer's weight decay shrank the student. Pass labels, or set soft_target_weight > 0 (the "
                "teacher's predictions) or an intermediate weight (hidden_state_weight, attention_weight, ...)."
            )
        if student is None:  # `y_pred` did not come from this model's `call`.
            student = self._features(self.student, x, training)
        teacher = self._teacher_features(x)
        terms, agreement = self._loss_terms(x, y, student, teacher, sample_weight)

        soft_weight = (1.0 - self.student_loss_weight if y is not None else 1.0) * self.soft_target_weight
        prediction = soft_weight * terms["soft"]
        # The trackers average over examples, as Keras's `loss` does, not over batches.
        examples = ops.cast(ops.shape(student["logits"])[0], "float32")
        if y is not None:
            prediction = prediction + self.student_loss_weight * terms["hard"]
            self.student_loss_tracker.update_state(terms["hard"], sample_weight=examples)
        scales = self._term_scales(terms, prediction, training)
        distillation = soft_weight * terms["soft"]
        for key, weight in self._term_weights.items():
            if key in terms:
                distillation = distillation + weight * scales.get(key, 1.0) * terms[key]
        total = distillation
        if y is not None:
            total = total + self.student_loss_weight * terms["hard"]
        self.distillation_loss_tracker.update_state(distillation, sample_weight=examples)
        self.total_loss_tracker.update_state(total, sample_weight=examples)
        if self._has_agreement:
            self.agreement_tracker.update_state(agreement, sample_weight=examples)
        return total

    def _term_scales(self, terms, prediction, training):
        """The `normalize_losses` scale of each intermediate term; in the
        first training steps the running means are updated first."""
        if not self._normalized_terms:
            return {}
        count = ops.convert_to_tensor(self.normalization_steps)
        if training:
            update = ops.cast(count < NORMALIZATION_STEPS, "float32")

            def running_mean(variable, value):
                mean = ops.convert_to_tensor(variable)
                value = ops.stop_gradient(ops.cast(value, "float32"))
                variable.assign(mean + update * (value - mean) / (count + 1.0))

            running_mean(self.prediction_mean, prediction)
            for key in self._normalized_terms:
                running_mean(self.loss_means[key], terms[key])
            count = count + update
            self.normalization_steps.assign(count)
        # Before any training step: this batch's values.
        seen = count > 0
        reference = ops.where(seen, ops.convert_to_tensor(self.prediction_mean), ops.stop_gradient(prediction))
        reference = ops.where(reference > _TINY, reference, 1.0)
        scales = {}
        for key in self._normalized_terms:
            mean = ops.where(seen, ops.convert_to_tensor(self.loss_means[key]), ops.stop_gradient(terms[key]))
            # A term that starts near 0 (a student copied from the teacher) is
            # boosted at most MAX_TERM_BOOST times, not up to its round-off.
            floor = ops.maximum(reference / MAX_TERM_BOOST, _TINY)
            scales[key] = reference / (len(self._normalized_terms) * ops.maximum(mean, floor))
        return scales

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if y is not None:
            return super().compute_metrics(x, y, y_pred, sample_weight)
        # Unlabelled data: the label metrics (compiled ones, the hard loss)
        # have nothing to compare.
        skip = (private_api.compiled_metrics_container(self), self.student_loss_tracker)
        return {m.name: m.result() for m in self.metrics if all(m is not s for s in skip)}

    def loss_terms(self, x, y=None):
        """The unweighted loss terms on one batch, both models in inference mode.

        Returns a dict of floats: `soft` (T^2-scaled KL), `hidden`,
        `attention`, `embedding`, `value_relation` (the enabled ones), `hard`
        when `y` is given, and `agreement` (not for a head of one output).

        Example:
        ```python
        distiller.loss_terms(["a fine film", "a dull film"], [1, 0])
        # {'hard': 0.69, 'soft': 0.01, 'hidden': 1.8, ...}
        ```
        """
        if not (isinstance(x, dict) and "token_ids" in x):
            if self.preprocessor is None:
                raise ValueError("Raw text needs a preprocessor: pass a tokenized dict, or attach one.")
            # The task's own preprocessing (labels too: word labels, answer spans), as one batch.
            batch = next(iter(self._as_dataset(x, y, batch_size=_ONE_BATCH)))
            x, y = batch if isinstance(batch, tuple) else (batch, None)
        student = self._features(self.student, x, False)
        teacher = self._teacher_features(x)
        y = None if y is None else ops.convert_to_tensor(np.asarray(y))
        terms, agreement = self._loss_terms(x, y, student, teacher)
        if self._has_agreement:
            terms["agreement"] = agreement
        return {k: float(ops.convert_to_numpy(v)) for k, v in terms.items()}

    # --- Raw inputs (the task models' preprocessing) ------------------------
    def _as_dataset(self, x, y=None, sample_weight=None, batch_size=None, shuffle=False, training=False):
        return self._text_model()._as_dataset(x, y, sample_weight, batch_size, shuffle=shuffle, training=training)

    def _variables_complete(self):
        # Keras calls a distiller built once it has run, but every variable
        # it trains (the student's, the projections) exists from __init__.
        return self.student.built and self.teacher.built

    @contextlib.contextmanager
    def _training(self):
        """The teacher frozen (no optimizer state, no gradient), and the
        pooler of tagger and span students allowed to go without gradients.
        Restores what it found: a `train_on_batch` inside `fit` (from a
        callback) leaves the teacher frozen for the rest of the fit."""
        was = self.teacher.trainable
        self.teacher.trainable = False
        try:
            with unused_pooler_ok():
                yield
        finally:
            self.teacher.trainable = was

    def fit(self, *args, **kwargs):
        """Keras's `fit` (raw text too), with the teacher frozen meanwhile."""
        with self._training():
            return super().fit(*args, **kwargs)

    def _feature_names(self):
        return sorted(self.student.input)

    def train_on_batch(self, *args, **kwargs):
        """Keras's `train_on_batch`, with the teacher frozen meanwhile."""
        with self._training():
            return super().train_on_batch(*args, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        """The student's logits (the teacher does not run)."""
        dataset = self._as_dataset(x, batch_size=batch_size)
        if dataset is not None:
            x, batch_size = dataset, None
        return self.student.predict(x, batch_size=batch_size, **kwargs)

    # --- Config -----------------------------------------------------------
    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "teacher": keras.saving.serialize_keras_object(self.teacher),
            "student": keras.saving.serialize_keras_object(self.student),
            "temperature": self.temperature,
            "alpha": self.alpha,
            "hidden_state_weight": self.hidden_state_weight,
            "attention_weight": self.attention_weight,
            "embedding_weight": self.embedding_weight,
            "value_relation_weight": self.value_relation_weight,
            "soft_target_weight": self.soft_target_weight,
            "layer_map": self.layer_map,
            "relation_heads": self.relation_heads,
            "normalize_losses": self.normalize_losses,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for role in ("teacher", "student"):
            if isinstance(config[role], dict):
                config[role] = keras.saving.deserialize_keras_object(config[role])
        return cls(**config)
