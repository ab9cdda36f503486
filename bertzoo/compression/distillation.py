"""Knowledge distillation of BERT classifiers into smaller ones.

`Distiller` trains a student `BertClassifier` to imitate a fine-tuned teacher:
Hinton et al.'s soft targets at temperature `T` mixed with the hard labels,
plus TinyBERT-style intermediate losses (hidden states through a learned
projection when widths differ, attention distributions, the embedding
layer) between mapped layers. `init_student_from_teacher` builds a shallower
student from every k-th teacher layer (DistilBERT).

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
  classifier's backbone is one nested layer, its per-layer hidden states are
  no layer's output, and attention probabilities are not computed by the
  default graph at all; so features come from
  `BertBackbone.compute_features(..., return_attention_scores=True)`.
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

import math
import warnings

import keras
from keras import ops

from bertzoo.layers.dense import Dense
from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.models.bert_classifier import BertClassifier
from bertzoo.models.task import bert_optimizer
from bertzoo.models.raw_inputs import RawInputsMixin
from bertzoo.saving.preset import Preset
from bertzoo.utils.device import resolve_jit_compile

LAYER_MAPS = ("uniform", "last")
_EPSILON = 1e-9


# --- Layer maps -------------------------------------------------------------
def _check_layer_index(name, value, num_layers, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}`: {what} layer {value!r} is not an integer.")
    if not 1 <= value <= num_layers:
        raise ValueError(
            f"`{name}`: {what} layer {value} is out of range: the {what} has layers "
            f"1..{num_layers} (layer 0, the embedding output, is distilled by `embedding_weight`)."
        )
    return value


def layer_map_pairs(layer_map, student_layers, teacher_layers):
    """The `(student_layer, teacher_layer)` pairs a layer map stands for.

    Layers are numbered from 1 (the first transformer layer) to `L`; layer 0,
    the embedding output, is handled by the embedding loss.

    - `"uniform"`: student layer `i` learns from teacher layer
      `ceil(i * L_teacher / L_student)` (TinyBERT's `g(m) = m * N / M`; the last
      layers are always paired).
    - `"last"`: only the last layers (MiniLM).
    - an explicit list of `(student_layer, teacher_layer)` pairs.

    Example:
    >>> layer_map_pairs("uniform", student_layers=2, teacher_layers=6)
    [(1, 3), (2, 6)]
    """
    if isinstance(layer_map, str):
        if layer_map == "uniform":
            return [(i, -(-i * teacher_layers // student_layers)) for i in range(1, student_layers + 1)]
        if layer_map == "last":
            return [(student_layers, teacher_layers)]
        raise ValueError(
            f"Unknown `layer_map` {layer_map!r}. Use 'uniform', 'last', or a list of "
            "(student_layer, teacher_layer) pairs such as [(1, 2), (2, 4)]."
        )
    try:
        pairs = [tuple(pair) for pair in layer_map]
    except TypeError:
        raise ValueError(
            f"`layer_map` must be 'uniform', 'last' or a list of (student_layer, "
            f"teacher_layer) pairs, got {layer_map!r}."
        ) from None
    if not pairs:
        raise ValueError(
            "`layer_map` is empty. Give at least one (student_layer, teacher_layer) pair, "
            "or set hidden_state_weight=0 and attention_weight=0 to distill outputs only."
        )
    checked = []
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"`layer_map` entry {pair!r} is not a (student_layer, teacher_layer) pair.")
        checked.append(
            (
                _check_layer_index("layer_map", pair[0], student_layers, "student"),
                _check_layer_index("layer_map", pair[1], teacher_layers, "teacher"),
            )
        )
    return checked


# --- Losses -----------------------------------------------------------------
def _token_mask(padding_mask, like):
    """Float32 `(batch, length)` mask of real tokens (all ones if None)."""
    if padding_mask is None:
        return ops.ones(ops.shape(like)[:2], "float32")
    return ops.cast(padding_mask, "float32")


class HiddenStateDistillation(keras.distillation.DistillationLoss):
    """Mean squared error between mapped hidden states (TinyBERT).

    `compute_loss(teacher_hidden_states, student_hidden_states, padding_mask)`
    takes the backbones' `hidden_states` lists (index 0 is the embedding
    output, index `i` the output of layer `i`). For each `(s, t)` pair the
    student's state, passed through `projection` when given (TinyBERT's
    learned `W_h`, needed when the widths differ), is compared with the
    teacher's; the squared error is averaged over real (unpadded) tokens and
    the teacher's features, then over pairs.

    Example:
    >>> loss = HiddenStateDistillation([(1, 3), (2, 6)])
    >>> loss.compute_loss(teacher_features["hidden_states"],
    ...                   student_features["hidden_states"], padding_mask)
    """

    def __init__(self, layer_pairs, projection=None):
        self.layer_pairs = [(int(s), int(t)) for s, t in layer_pairs]
        self.projection = projection

    def validate_outputs(self, teacher_outputs, student_outputs):
        need_t = max(t for _, t in self.layer_pairs) + 1
        need_s = max(s for s, _ in self.layer_pairs) + 1
        if len(teacher_outputs) < need_t or len(student_outputs) < need_s:
            raise ValueError(
                f"The layer pairs {self.layer_pairs} need {need_t} teacher and {need_s} student "
                f"hidden states, got {len(teacher_outputs)} and {len(student_outputs)}."
            )

    def compute_loss(self, teacher_outputs, student_outputs, padding_mask=None, **kwargs):
        self.validate_outputs(teacher_outputs, student_outputs)
        total = 0.0
        for s, t in self.layer_pairs:
            student = student_outputs[s]
            if self.projection is not None:
                student = self.projection(student)
            teacher = ops.cast(teacher_outputs[t], "float32")
            student = ops.cast(student, "float32")
            if student.shape[-1] != teacher.shape[-1]:
                raise ValueError(
                    f"Student layer {s} has width {student.shape[-1]} but teacher layer {t} has "
                    f"{teacher.shape[-1]}: pass a projection to HiddenStateDistillation."
                )
            mask = _token_mask(padding_mask, teacher)
            squared = ops.sum(ops.square(student - teacher), axis=-1) * mask
            total = total + ops.sum(squared) / (ops.maximum(ops.sum(mask), 1.0) * teacher.shape[-1])
        return total / len(self.layer_pairs)

    def get_config(self):
        return {"layer_pairs": [list(p) for p in self.layer_pairs]}


def soft_target_loss(temperature):
    """Hinton et al.'s soft-target loss: `T^2 * KL(softmax(t / T) || softmax(s / T))`,
    averaged over the batch, as a `keras.distillation.LogitsDistillation`.

    The loss must be given as a `keras.losses.KLDivergence` *instance*: with
    the default `loss="kl_divergence"` (Keras 3.15) the string resolves to the
    plain function, `LogitsDistillation` does not recognise it as KL, and it
    then applies KL to the raw temperature-scaled logits with no softmax and no
    `T^2` (a meaningless value; tests/test_distillation.py checks ours against
    NumPy).

    Example:
    >>> soft_target_loss(2.0).compute_loss(teacher_logits, student_logits)
    """
    return keras.distillation.LogitsDistillation(temperature=temperature, loss=keras.losses.KLDivergence())


def _average_heads(probs, groups):
    """Averages `(batch, heads, q, k)` probabilities over `groups` equal groups
    of consecutive heads (a matmul with a constant, so shapes stay static)."""
    heads = probs.shape[1]
    if heads == groups:
        return probs
    size = heads // groups
    averaging = [[1.0 / size if h // size == g else 0.0 for g in range(groups)] for h in range(heads)]
    return ops.einsum("bhqk,hg->bgqk", probs, ops.convert_to_tensor(averaging, "float32"))


class AttentionDistillation(keras.distillation.DistillationLoss):
    """KL divergence between mapped attention distributions (MiniLM).

    `compute_loss(teacher_attention, student_attention, padding_mask)` takes
    the backbones' `attention_scores` lists (softmax probabilities of shape
    `(batch, heads, length, length)`, index `i - 1` for layer `i`). For each
    `(s, t)` pair it computes `KL(teacher || student)` of every query row,
    averaged over real (unpadded) query positions, heads and pairs.

    Heads: equal counts are matched head to head. Otherwise both sides are
    averaged over consecutive heads down to `gcd(teacher_heads,
    student_heads)` groups (12 teacher heads and 4 student heads: each
    student head learns the mean of 3 teacher heads; coprime counts compare
    the all-head means). An average of distributions is a distribution, so
    the KL stays well defined.

    Example:
    >>> loss = AttentionDistillation([(2, 6)])
    >>> loss.compute_loss(teacher_features["attention_scores"],
    ...                   student_features["attention_scores"], padding_mask)
    """

    def __init__(self, layer_pairs):
        self.layer_pairs = [(int(s), int(t)) for s, t in layer_pairs]

    def validate_outputs(self, teacher_outputs, student_outputs):
        need_t = max(t for _, t in self.layer_pairs)
        need_s = max(s for s, _ in self.layer_pairs)
        if len(teacher_outputs) < need_t or len(student_outputs) < need_s:
            raise ValueError(
                f"The layer pairs {self.layer_pairs} need {need_t} teacher and {need_s} student "
                f"attention maps, got {len(teacher_outputs)} and {len(student_outputs)}."
            )

    def compute_loss(self, teacher_outputs, student_outputs, padding_mask=None, **kwargs):
        self.validate_outputs(teacher_outputs, student_outputs)
        total = 0.0
        for s, t in self.layer_pairs:
            teacher = ops.cast(teacher_outputs[t - 1], "float32")
            student = ops.cast(student_outputs[s - 1], "float32")
            groups = math.gcd(teacher.shape[1], student.shape[1])
            teacher = _average_heads(teacher, groups)
            student = _average_heads(student, groups)
            # Masked keys have probability 0 on both sides; the clamp keeps
            # 0 * log 0 at 0 and the gradient finite.
            kl = ops.sum(
                teacher * (ops.log(ops.maximum(teacher, _EPSILON)) - ops.log(ops.maximum(student, _EPSILON))),
                axis=-1,
            )  # (batch, groups, queries)
            mask = _token_mask(padding_mask, teacher[:, 0])  # (batch, queries)
            kl = ops.sum(kl, axis=1) * mask
            total = total + ops.sum(kl) / (ops.maximum(ops.sum(mask), 1.0) * groups)
        return total / len(self.layer_pairs)

    def get_config(self):
        return {"layer_pairs": [list(p) for p in self.layer_pairs]}


# --- Models -----------------------------------------------------------------
def _check_classifier(role, model):
    if not isinstance(model, BertClassifier):
        raise ValueError(
            f"The {role} must be a bertzoo BertClassifier, got {type(model).__name__}. "
            f"Build one with bertzoo.BertClassifier.from_preset(...)."
        )


def _tokenizer_difference(a, b):
    """Why two `BertTokenizer`s give different ids for the same text, or None."""
    va, vb = a.get_vocabulary(), b.get_vocabulary()
    if va != vb:
        if len(va) != len(vb):
            return f"the vocabularies have {len(va)} and {len(vb)} tokens"
        i = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y)
        return f"the vocabularies differ (id {i} is {va[i]!r} for the teacher, {vb[i]!r} for the student)"
    for setting in ("lowercase", "strip_accents", "max_chars_per_word", "split_on_cjk"):
        if getattr(a, setting) != getattr(b, setting):
            return f"`{setting}` is {getattr(a, setting)!r} for the teacher, {getattr(b, setting)!r} for the student"
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
            f"Teacher and student vocabularies differ: the teacher has vocabulary_size={tv}, "
            f"the student {sv}. {fix}"
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


def _classifier_features(model, inputs, training, attention):
    """One forward pass of a `BertClassifier`: its logits and backbone features."""
    features = model.backbone.compute_features(inputs, training=training, return_attention_scores=attention)
    pooled = model.output_dropout(features["pooled_output"], training=training)
    features["logits"] = model.output_dense(pooled)
    return features


@keras.saving.register_keras_serializable(package="bertzoo")
class Distiller(RawInputsMixin, keras.distillation.Distiller):
    """Trains a student `BertClassifier` to imitate a teacher `BertClassifier`.

    The loss of a labelled batch is

        alpha * CE(y, student) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))
        + hidden_state_weight * mean over pairs of MSE(W_h h_student[s], h_teacher[t])
        + attention_weight * mean over pairs of KL(A_teacher[t] || A_student[s])
        + embedding_weight * MSE(W_e e_student, e_teacher)

    and of an unlabelled batch (no `y`: raw text alone) the same with
    `alpha = 0`: the teacher's soft targets replace the labels. `W_h` and
    `W_e` are learned `Dense` projections, present only when the hidden sizes
    differ. The pairs `(s, t)` come from `layer_map`; a weight of 0 turns its
    loss off (and attention probabilities are then not computed at all).

    The teacher is frozen (`teacher.trainable` is set to False), runs in
    inference mode (no dropout) and its outputs pass through
    `stop_gradient`. Teacher and student must read the same token ids: with
    raw-text inputs the student's preprocessor (else the teacher's) tokenizes
    once for both, and differing vocabularies are an error. `fit`,
    `evaluate` and `predict` accept what task models accept: raw strings,
    string pairs, `tf.data` datasets of them, or tokenized dicts.

    Metrics: `accuracy` is the student's (on labelled data), `agreement` is
    the fraction of examples where student and teacher predict the same
    class, `student_loss` the hard-label loss and `distillation_loss` the
    weighted sum of the other terms. After `fit`, `distiller.student` is an
    ordinary `BertClassifier` (save it with `save_to_preset`).

    Args:
        teacher: a trained `bertzoo.BertClassifier`.
        student: the `bertzoo.BertClassifier` to train (same `num_classes`).
        temperature: softmax temperature `T > 0` of the soft targets.
        alpha: weight in [0, 1] of the hard-label loss against the soft one.
        hidden_state_weight: weight of the hidden-state loss.
        attention_weight: weight of the attention-distribution loss.
        embedding_weight: weight of the embedding-output loss.
        layer_map: "uniform", "last", or `[(student_layer, teacher_layer), ...]`
            (layers numbered from 1); see `layer_map_pairs`.

    Example:
    >>> teacher = bertzoo.BertClassifier.from_preset("runs/teacher")  # fine-tuned
    >>> # A random student may take the teacher's tokenizer (one vocabulary for both):
    >>> student = bertzoo.BertClassifier.from_preset(
    ...     "tiny", num_classes=2, preprocessor=teacher.preprocessor, load_weights=False)
    >>> # ...or start from every k-th teacher layer (same width):
    >>> # student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 2})
    >>> distiller = bertzoo.Distiller(teacher, student, temperature=2.0, alpha=0.5)
    >>> distiller.compile()
    >>> distiller.fit(train_texts, train_labels, validation_data=(val_texts, val_labels), epochs=3)
    >>> student.save_to_preset("runs/student")
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
        layer_map="uniform",
        name="distiller",
        **kwargs,
    ):
        _check_classifier("teacher", teacher)
        _check_classifier("student", student)
        if teacher is student:
            raise ValueError("The teacher and the student are the same model: pass two models.")
        if teacher.num_classes != student.num_classes:
            raise ValueError(
                f"The teacher predicts {teacher.num_classes} classes but the student "
                f"{student.num_classes}: build the student with num_classes={teacher.num_classes}."
            )
        _check_same_tokens(teacher, student)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"`temperature` must be a number > 0, got {temperature!r} (1 = plain softmax).")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
            raise ValueError(
                f"`alpha` must be in [0, 1] (the weight of the hard-label loss; 0 = soft targets "
                f"only), got {alpha!r}."
            )
        weights = {
            "hidden": _check_weight("hidden_state_weight", hidden_state_weight),
            "attention": _check_weight("attention_weight", attention_weight),
            "embedding": _check_weight("embedding_weight", embedding_weight),
        }
        layer_pairs = layer_map_pairs(layer_map, student.backbone.num_layers, teacher.backbone.num_layers)

        s_width, t_width = student.backbone.hidden_dim, teacher.backbone.hidden_dim

        def projection(name):
            if s_width == t_width:
                return None
            layer = Dense(t_width, dtype=student.backbone.dtype_policy, name=name)
            layer.build((None, None, s_width))
            return layer

        hidden_projection = projection("hidden_projection") if weights["hidden"] else None
        embedding_projection = projection("embedding_projection") if weights["embedding"] else None
        terms = {"soft": soft_target_loss(float(temperature))}
        if weights["hidden"]:
            terms["hidden"] = HiddenStateDistillation(layer_pairs, hidden_projection)
        if weights["attention"]:
            terms["attention"] = AttentionDistillation(layer_pairs)
        if weights["embedding"]:
            terms["embedding"] = HiddenStateDistillation([(0, 0)], embedding_projection)
        super().__init__(
            teacher=teacher,
            student=student,
            distillation_losses=list(terms.values()),
            distillation_loss_weights=[1.0] + [weights[k] for k in terms if k != "soft"],
            student_loss_weight=float(alpha),
            name=name,
            **kwargs,
        )
        self._terms = terms
        self.hidden_projection = hidden_projection
        self.embedding_projection = embedding_projection
        self.temperature = float(temperature)
        self.hidden_state_weight = weights["hidden"]
        self.attention_weight = weights["attention"]
        self.embedding_weight = weights["embedding"]
        self.layer_map = layer_map if isinstance(layer_map, str) else [list(p) for p in layer_pairs]
        self.layer_pairs = layer_pairs
        self._term_weights = weights
        self._needs_attention = bool(weights["attention"])
        self.agreement_tracker = keras.metrics.Mean(name="agreement")
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
        compiled = getattr(self, "_compile_metrics", None)
        return [
            m for m in super().metrics
            if m is not self.total_loss_tracker and not (m is compiled and not m.built)
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
            optimizer = bert_optimizer()
        if loss == "auto":
            loss = self.student.default_loss()
        if metrics == "auto":
            metrics = self.student.default_metrics()
        # The student decides: its dtype and whether it is quantized. A
        # multi-replica strategy turns XLA off (or rejects jit_compile=True).
        jit_compile = resolve_jit_compile(jit_compile, self.student, getattr(self, "distribute_strategy", None))
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=jit_compile, **kwargs)

    # --- Forward and loss -------------------------------------------------
    def call(self, inputs, training=None):
        """The student's logits (its features are kept for `compute_loss`)."""
        features = _classifier_features(self.student, inputs, training, self._needs_attention)
        object.__setattr__(self, "_student_pass", (features["logits"], features))
        return features["logits"]

    def _teacher_features(self, x):
        features = _classifier_features(self.teacher, x, training=False, attention=self._needs_attention)
        return keras.tree.map_structure(ops.stop_gradient, features)

    def _loss_terms(self, x, y, student, teacher, sample_weight=None):
        """Unweighted loss terms (scalars) and the teacher-student agreement."""
        mask = x.get("padding_mask")
        terms = {}
        if y is not None:
            hard = self._student_loss(y, student["logits"], sample_weight)
            terms["hard"] = ops.mean(hard)
        for key, loss in self._terms.items():
            if key == "soft":
                terms[key] = loss.compute_loss(teacher["logits"], student["logits"])
            elif key == "attention":
                terms[key] = loss.compute_loss(teacher["attention_scores"], student["attention_scores"], mask)
            else:
                terms[key] = loss.compute_loss(teacher["hidden_states"], student["hidden_states"], mask)
        same = ops.equal(ops.argmax(student["logits"], axis=-1), ops.argmax(teacher["logits"], axis=-1))
        return terms, ops.mean(ops.cast(same, "float32"))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        student = None
        if y_pred is not None and self._student_pass is not None and self._student_pass[0] is y_pred:
            student = self._student_pass[1]
        object.__setattr__(self, "_student_pass", None)
        if student is None:  # `y_pred` did not come from this model's `call`.
            student = _classifier_features(self.student, x, training, self._needs_attention)
        teacher = self._teacher_features(x)
        terms, agreement = self._loss_terms(x, y, student, teacher, sample_weight)

        soft_weight = 1.0 - self.student_loss_weight if y is not None else 1.0
        distillation = soft_weight * terms["soft"]
        for key, weight in self._term_weights.items():
            if key in terms:
                distillation = distillation + weight * terms[key]
        total = distillation
        if y is not None:
            total = total + self.student_loss_weight * terms["hard"]
            self.student_loss_tracker.update_state(terms["hard"])
        self.distillation_loss_tracker.update_state(distillation)
        self.total_loss_tracker.update_state(total)
        self.agreement_tracker.update_state(agreement)
        return total

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if y is not None:
            return super().compute_metrics(x, y, y_pred, sample_weight)
        # Unlabelled data: the label metrics (compiled ones, the hard loss)
        # have nothing to compare.
        skip = (getattr(self, "_compile_metrics", None), self.student_loss_tracker)
        return {m.name: m.result() for m in self.metrics if all(m is not s for s in skip)}

    def loss_terms(self, x, y=None):
        """The unweighted loss terms on one batch, both models in inference mode.

        Returns a dict of floats: `soft` (T^2-scaled KL), `hidden`,
        `attention`, `embedding` (the enabled ones), `hard` when `y` is given,
        and `agreement`.

        Example:
        >>> distiller.loss_terms(["a fine film", "a dull film"], [1, 0])
        {'hard': 0.69, 'soft': 0.01, 'hidden': 1.8, ...}
        """
        import numpy as np

        if not (isinstance(x, dict) and "token_ids" in x):
            if self.preprocessor is None:
                raise ValueError("Raw text needs a preprocessor: pass a tokenized dict, or attach one.")
            x = self.preprocessor(x)
        student = _classifier_features(self.student, x, False, self._needs_attention)
        teacher = self._teacher_features(x)
        y = None if y is None else ops.convert_to_tensor(np.asarray(y))
        terms, agreement = self._loss_terms(x, y, student, teacher)
        terms["agreement"] = agreement
        return {k: float(ops.convert_to_numpy(v)) for k, v in terms.items()}

    # --- Raw inputs (the task models' preprocessing) ------------------------
    def _as_dataset(self, x, y=None, sample_weight=None, batch_size=None, shuffle=False):
        return self._text_model()._as_dataset(x, y, sample_weight, batch_size, shuffle=shuffle)

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
            "layer_map": self.layer_map,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for role in ("teacher", "student"):
            if isinstance(config[role], dict):
                config[role] = keras.saving.deserialize_keras_object(config[role])
        return cls(**config)


# --- Student initialisation -------------------------------------------------
_SHAPE_KEYS = ("vocabulary_size", "hidden_dim", "embedding_dim", "head_dim", "max_sequence_length", "num_segments")


def _per_layer(value, num_layers):
    return list(value) if isinstance(value, (list, tuple)) else [value] * num_layers


def _student_config(teacher_config, student, teacher_layers_of):
    """The student backbone config: a preset's, or the teacher's with overrides."""
    if isinstance(student, dict):
        overrides = dict(student)
        num_layers = overrides.get("num_layers", teacher_config["num_layers"])
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be a positive integer, got {num_layers!r}.")
        selected = teacher_layers_of(num_layers)
        config = dict(teacher_config)
        config.pop("name", None)
        # Per-layer sizes (pruned teachers) follow the copied layers.
        for key in ("num_heads", "intermediate_dim"):
            if key not in overrides and isinstance(config[key], (list, tuple)):
                sizes = config[key]
                config[key] = [sizes[t - 1] for t in selected]
        if "num_groups" not in overrides:
            config["num_groups"] = None
        config.update(overrides)
        return config, selected
    if isinstance(student, (str, Preset)) or hasattr(student, "__fspath__"):
        config = Preset.resolve(student).backbone_config
        return config, teacher_layers_of(config["num_layers"])
    raise ValueError(
        "`student` must be a dict of backbone settings (e.g. {'num_layers': 2}, applied to the "
        f"teacher's config) or a preset name/directory, got {type(student).__name__}."
    )


def init_student_from_teacher(teacher, student, layers="every_k"):
    """A shallower copy of `teacher`, initialised from its layers (DistilBERT).

    The student takes the teacher's embeddings, pooler and classifier head,
    and for its layer `i` (from 1) the weights of teacher layer `layers[i-1]`.
    `layers="every_k"` takes every k-th layer, `k = L_teacher / L_student`
    (layers k, 2k, ..., L_teacher: the same pairs as the distiller's
    "uniform" layer map); pass a list of teacher layers (from 1) to choose.
    Weights can only be copied between equal shapes, so hidden size, head
    size and count, feed-forward size, vocabulary and position table must
    match; a `ValueError` names the first that does not.

    Args:
        teacher: a `bertzoo.BertClassifier` (a `BertClassifier` is returned)
            or a `bertzoo.BertBackbone` (a `BertBackbone` is returned).
        student: a dict of backbone settings applied to the teacher's config
            (usually `{"num_layers": n}`), or a preset name/directory whose
            backbone config (not weights) is used.
        layers: "every_k" or a list of teacher layer numbers, one per
            student layer.

    Example:
    >>> teacher = bertzoo.BertClassifier.from_preset("runs/minilm_sentiment")  # 6 layers
    >>> student = bertzoo.init_student_from_teacher(teacher, {"num_layers": 3})  # layers 2, 4, 6
    """
    if isinstance(teacher, BertClassifier):
        backbone = teacher.backbone
    elif isinstance(teacher, BertBackbone):
        backbone = teacher
    else:
        raise ValueError(
            f"`teacher` must be a bertzoo BertClassifier or BertBackbone, got {type(teacher).__name__}."
        )
    t_layers = backbone.num_layers

    def teacher_layers_of(num_layers):
        if isinstance(layers, str):
            if layers != "every_k":
                raise ValueError(f"Unknown `layers` {layers!r}: use 'every_k' or a list of teacher layers.")
            if t_layers % num_layers:
                raise ValueError(
                    f"layers='every_k' needs the teacher's depth ({t_layers}) to be a multiple of the "
                    f"student's ({num_layers}). Pass the teacher layers to copy, e.g. "
                    f"layers={[-(-i * t_layers // num_layers) for i in range(1, num_layers + 1)]}."
                )
            k = t_layers // num_layers
            return [k * i for i in range(1, num_layers + 1)]
        chosen = list(layers)
        if len(chosen) != num_layers:
            raise ValueError(
                f"`layers` lists {len(chosen)} teacher layers but the student has {num_layers}: "
                "give one teacher layer per student layer."
            )
        return [_check_layer_index("layers", t, t_layers, "teacher") for t in chosen]

    config, selected = _student_config(backbone.get_config(), student, teacher_layers_of)
    t_config = backbone.get_config()
    for key in _SHAPE_KEYS:
        if config.get(key) != t_config.get(key):
            raise ValueError(
                f"Cannot copy teacher weights: the student's `{key}` is {config.get(key)!r} but the "
                f"teacher's is {t_config.get(key)!r}. Student initialisation from the teacher needs "
                "equal widths; for a narrower student, distill a freshly initialized one (the "
                "Distiller learns a projection for hidden states of another width)."
            )
    student_backbone = BertBackbone(**config)
    s_heads = _per_layer(student_backbone.num_heads, student_backbone.num_layers)
    s_inter = _per_layer(student_backbone.intermediate_dim, student_backbone.num_layers)
    t_heads = _per_layer(backbone.num_heads, t_layers)
    t_inter = _per_layer(backbone.intermediate_dim, t_layers)
    for i, t in enumerate(selected):
        for key, s_sizes, t_sizes in (("num_heads", s_heads, t_heads), ("intermediate_dim", s_inter, t_inter)):
            if s_sizes[i] != t_sizes[t - 1]:
                raise ValueError(
                    f"Cannot copy teacher layer {t} into student layer {i + 1}: `{key}` is "
                    f"{s_sizes[i]} for the student and {t_sizes[t - 1]} for that teacher layer."
                )
    if config.get("activation") != t_config.get("activation"):
        warnings.warn(
            f"The student uses activation {config.get('activation')!r}, the teacher "
            f"{t_config.get('activation')!r}: copied layers will compute a different function.",
            stacklevel=2,
        )

    copies = [(student_backbone.embeddings, backbone.embeddings), (student_backbone.pooler, backbone.pooler)]
    assigned = {}
    for i, t in enumerate(selected):
        for s_block, t_block in zip(student_backbone.layer_blocks(i), backbone.layer_blocks(t - 1)):
            if id(s_block) in assigned and assigned[id(s_block)] is not t_block:
                raise ValueError(
                    f"Student layer {i + 1} shares its weights with an earlier layer (num_groups="
                    f"{student_backbone.num_groups}) but would copy a different teacher layer ({t}). "
                    "Use a student without cross-layer sharing (num_groups=None)."
                )
            if id(s_block) not in assigned:
                assigned[id(s_block)] = t_block
                copies.append((s_block, t_block))
    for s_layer, t_layer in copies:
        for s_var, t_var in zip(s_layer.weights, t_layer.weights):
            if tuple(s_var.shape) != tuple(t_var.shape):  # Guarded above; a last line of defence.
                raise ValueError(f"Shape mismatch copying {t_var.path} {t_var.shape} into {s_var.path} {s_var.shape}.")
            s_var.assign(ops.cast(t_var.value, s_var.dtype))

    if isinstance(teacher, BertBackbone):
        return student_backbone
    preprocessor = None
    if teacher.preprocessor is not None:
        preprocessor = keras.layers.deserialize(keras.layers.serialize(teacher.preprocessor))
    model = BertClassifier(
        student_backbone,
        num_classes=teacher.num_classes,
        preprocessor=preprocessor,
        dropout=teacher.dropout,
        activation=teacher.activation,
        class_names=teacher.class_names,
    )
    for s_var, t_var in zip(model.output_dense.weights, teacher.output_dense.weights):
        s_var.assign(ops.cast(t_var.value, s_var.dtype))
    return model
