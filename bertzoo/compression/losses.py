"""The distillation losses: soft targets, hidden states, attention maps, value relations.

Each is a `keras.distillation.DistillationLoss`; `bertzoo.Distiller` combines
them, and they can be used on their own in a custom training loop.
"""

import math

import keras
from keras import ops

_EPSILON = 1e-9


def _token_mask(padding_mask, like):
    """Float32 `(batch, length)` mask of real tokens (all ones if None)."""
    if padding_mask is None:
        return ops.ones(ops.shape(like)[:2], "float32")
    return ops.cast(padding_mask, "float32")


class _LayerPairsLoss(keras.distillation.DistillationLoss):
    """A loss over `(student_layer, teacher_layer)` pairs of per-layer outputs."""

    # The outputs list holds layer `i` at index `i - 1 + _INDEX_SHIFT`; they are `_WHAT`.
    _INDEX_SHIFT = 0
    _WHAT = "outputs"

    def __init__(self, layer_pairs):
        self.layer_pairs = [(int(s), int(t)) for s, t in layer_pairs]

    def validate_outputs(self, teacher_outputs, student_outputs):
        need_t = max(t for _, t in self.layer_pairs) + self._INDEX_SHIFT
        need_s = max(s for s, _ in self.layer_pairs) + self._INDEX_SHIFT
        if len(teacher_outputs) < need_t or len(student_outputs) < need_s:
            raise ValueError(
                f"The layer pairs {self.layer_pairs} need {need_t} teacher and {need_s} student "
                f"{self._WHAT}, got {len(teacher_outputs)} and {len(student_outputs)}."
            )

    def get_config(self):
        return {"layer_pairs": [list(p) for p in self.layer_pairs]}


class HiddenStateDistillation(_LayerPairsLoss):
    """Mean squared error between mapped hidden states (TinyBERT).

    `compute_loss(teacher_hidden_states, student_hidden_states, padding_mask)`
    takes the backbones' `hidden_states` lists (index 0 is the embedding
    output, index `i` the output of layer `i`). For each `(s, t)` pair the
    student's state, passed through `projection` when given (TinyBERT's
    learned `W_h`, needed when the widths differ), is compared with the
    teacher's; the squared error is averaged over real (unpadded) tokens and
    the teacher's features, then over pairs.

    Example:
    ```python
    loss = HiddenStateDistillation([(1, 3), (2, 6)])
    loss.compute_loss(teacher_features["hidden_states"], student_features["hidden_states"], padding_mask)
    ```
    """

    _INDEX_SHIFT = 1  # Index 0 is the embedding output.
    _WHAT = "hidden states"

    def __init__(self, layer_pairs, projection=None):
        super().__init__(layer_pairs)
        self.projection = projection

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


class SoftTargetDistillation(keras.distillation.LogitsDistillation):
    """Hinton et al.'s soft-target loss for any head's logits:
    `T^2 * KL(softmax(t / T) || softmax(s / T))` over the last axis (classes,
    choices, or positions of a start/end span), averaged over the other axes.

    `compute_loss(teacher_logits, student_logits, mask=None)`: with a `mask`
    of the logits' leading shape (a tagger's `(batch, length)` padding mask),
    the average runs over the unmasked rows only, so padding tokens do not
    count. The KL is computed from log-softmax, exactly: no probability is
    clipped, so the gradient never vanishes.

    The base class is configured with a `keras.losses.KLDivergence`
    instance, the loss this computes (tests/test_distillation.py checks it
    against NumPy).
    """

    def __init__(self, temperature=2.0):
        super().__init__(temperature=temperature, loss=keras.losses.KLDivergence())

    def compute_loss(self, teacher_outputs, student_outputs, mask=None, **kwargs):
        # From log-softmax, not clipped probabilities (Keras's KLDivergence
        # clips at 1e-7): a student confidently wrong still gets Hinton's
        # gradient (q - p) / T instead of none.
        log_p = ops.log_softmax(ops.cast(teacher_outputs, "float32") / self.temperature, axis=-1)
        log_q = ops.log_softmax(ops.cast(student_outputs, "float32") / self.temperature, axis=-1)
        kl = ops.sum(ops.exp(log_p) * (log_p - log_q), axis=-1)  # One value per row.
        if mask is None:
            return ops.mean(kl) * (self.temperature**2)
        mask = ops.cast(mask, "float32")
        return ops.sum(kl * mask) / ops.maximum(ops.sum(mask), 1.0) * (self.temperature**2)

    def get_config(self):
        return {"temperature": self.temperature}


def soft_target_loss(temperature):
    """The soft-target loss at temperature `T` (a `SoftTargetDistillation`).

    Example:
    ```python
    soft_target_loss(2.0).compute_loss(teacher_logits, student_logits)
    ```
    """
    return SoftTargetDistillation(temperature=temperature)


def _row_kl(teacher, student, mask):
    """`KL(teacher || student)` of each row of `(batch, heads, queries, keys)`
    distributions, averaged over heads and the real queries of the float
    `(batch, queries)` `mask`."""
    # Masked keys have probability 0 on both sides; the clamp keeps
    # 0 * log 0 at 0 and the gradient finite.
    kl = ops.sum(
        teacher * (ops.log(ops.maximum(teacher, _EPSILON)) - ops.log(ops.maximum(student, _EPSILON))),
        axis=-1,
    )
    kl = ops.sum(kl, axis=1) * mask
    return ops.sum(kl) / (ops.maximum(ops.sum(mask), 1.0) * teacher.shape[1])


def _average_heads(probs, groups):
    """Averages `(batch, heads, q, k)` probabilities over `groups` equal groups
    of consecutive heads (a matmul with a constant, so shapes stay static)."""
    heads = probs.shape[1]
    if heads == groups:
        return probs
    size = heads // groups
    averaging = [[1.0 / size if h // size == g else 0.0 for g in range(groups)] for h in range(heads)]
    return ops.einsum("bhqk,hg->bgqk", probs, ops.convert_to_tensor(averaging, "float32"))


class AttentionDistillation(_LayerPairsLoss):
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
    ```python
    loss = AttentionDistillation([(2, 6)])
    loss.compute_loss(teacher_features["attention_scores"], student_features["attention_scores"], padding_mask)
    ```
    """

    _WHAT = "attention maps"

    def compute_loss(self, teacher_outputs, student_outputs, padding_mask=None, **kwargs):
        self.validate_outputs(teacher_outputs, student_outputs)
        total = 0.0
        for s, t in self.layer_pairs:
            teacher = ops.cast(teacher_outputs[t - 1], "float32")
            student = ops.cast(student_outputs[s - 1], "float32")
            groups = math.gcd(teacher.shape[1], student.shape[1])
            teacher = _average_heads(teacher, groups)
            student = _average_heads(student, groups)
            total = total + _row_kl(teacher, student, _token_mask(padding_mask, teacher[:, 0]))
        return total / len(self.layer_pairs)


def _relations(values, heads, mask):
    """Scaled dot-product self-relations of `(batch, length, width)` vectors
    split into `heads` equal parts: `(batch, heads, length, length)` softmax
    rows over the real keys."""
    batch, length = ops.shape(values)[0], ops.shape(values)[1]
    size = values.shape[-1] // heads
    split = ops.reshape(ops.cast(values, "float32"), (batch, length, heads, size))
    logits = ops.einsum("bqhd,bkhd->bhqk", split, split) / math.sqrt(size)
    keys = ops.expand_dims(ops.expand_dims(ops.cast(mask, "bool"), 1), 1)
    return ops.softmax(ops.where(keys, logits, ops.full_like(logits, -1e9)), axis=-1)


class ValueRelationDistillation(_LayerPairsLoss):
    """KL divergence between value-value relations (MiniLM).

    `compute_loss(teacher_values, student_values, padding_mask)` takes the
    backbones' `value_states` lists (`(batch, length, heads * head_dim)`,
    index `i - 1` for layer `i`). For each `(s, t)` pair both sides' values
    are split into `relation_heads` equal parts (MiniLMv2's relation heads,
    so the widths and head counts of teacher and student may differ), the
    relation `softmax(V V^T / sqrt(d))` is taken per part, and
    `KL(teacher || student)` of every query row is averaged over real
    (unpadded) queries, relation heads and pairs. It transfers what the
    values encode without any learned projection.

    Example:
    ```python
    loss = ValueRelationDistillation([(2, 6)], relation_heads=12)
    loss.compute_loss(teacher_features["value_states"], student_features["value_states"], padding_mask)
    ```
    """

    _WHAT = "value states"

    def __init__(self, layer_pairs, relation_heads):
        super().__init__(layer_pairs)
        if isinstance(relation_heads, bool) or not isinstance(relation_heads, int) or relation_heads < 1:
            raise ValueError(f"`relation_heads` must be an int >= 1, got {relation_heads!r}.")
        self.relation_heads = relation_heads

    def compute_loss(self, teacher_outputs, student_outputs, padding_mask=None, **kwargs):
        self.validate_outputs(teacher_outputs, student_outputs)
        total = 0.0
        for s, t in self.layer_pairs:
            teacher, student = teacher_outputs[t - 1], student_outputs[s - 1]
            for side, width in (("teacher", teacher.shape[-1]), ("student", student.shape[-1])):
                if width % self.relation_heads:
                    raise ValueError(
                        f"The {side}'s value width {width} is not divisible by relation_heads="
                        f"{self.relation_heads}: choose a divisor of both widths."
                    )
            mask = _token_mask(padding_mask, teacher)
            teacher = _relations(teacher, self.relation_heads, mask)
            student = _relations(student, self.relation_heads, mask)
            total = total + _row_kl(teacher, student, mask)
        return total / len(self.layer_pairs)

    def get_config(self):
        return {**super().get_config(), "relation_heads": self.relation_heads}
