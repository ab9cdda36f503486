"""Extractive question answering: predict the answer span in a context (SQuAD)."""

import keras
import numpy as np
from keras import ops

from bertzoo.layers.dense import Dense
from bertzoo.models.head_utils import check_two_segments
from bertzoo.models.head_utils import guarded
from bertzoo.models.head_utils import one_weight_per_row
from bertzoo.models.head_utils import unused_pooler_ok
from bertzoo.models.raw_inputs import eager_strings_as_arrays
from bertzoo.models.serving import TextServing
from bertzoo.models.serving import as_int32
from bertzoo.models.serving import same_size
from bertzoo.models.serving import serving_call
from bertzoo.models.serving import string_function
from bertzoo.models.serving import trim_padding
from bertzoo.models.task import Task
from bertzoo.models.task import deterministic_preprocess
from bertzoo.text.normalization import to_string_tensor
from bertzoo.text.normalization import valid_utf8
from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.tokenizer import SUFFIX_INDICATOR
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.utils.checks import check_positive_int
from bertzoo.utils.optional import tf

MASKED_LOGIT = -1e9
# Longest answer span, in tokens, of `predict_spans`, `decode_spans` and the
# exported `serving_default` (BERT's SQuAD setting).
MAX_ANSWER_LENGTH = 30
# The character span of a question its context does not answer (SQuAD 2.0).
NO_ANSWER = (-1, -1)
# Tokens between the starts of consecutive context windows (BERT's SQuAD
# `doc_stride`), when the sequence is long enough: see `window_stride`.
DEFAULT_STRIDE = 128


def context_positions(padding_mask, segment_ids):
    """Where an answer may be: tokens of the second segment except its
    closing `[SEP]` (the last real token). Works on NumPy and backend tensors."""
    real = ops.cast(padding_mask, "bool")
    next_is_real = ops.concatenate([real[:, 1:], ops.zeros_like(real[:, :1])], axis=1)
    return ops.logical_and(ops.equal(ops.cast(segment_ids, "int32"), 1), next_is_real)


def answer_positions(padding_mask, segment_ids, mask_question=True):
    """Where a span may start or end, `(batch, length)` booleans: every real
    token, or with `mask_question` `[CLS]` (position 0, "no answer in this
    window") and the context tokens (`context_positions`)."""
    allowed = ops.cast(padding_mask, "bool")
    if mask_question:
        first = ops.expand_dims(ops.equal(ops.arange(ops.shape(allowed)[1]), 0), 0)
        allowed = ops.logical_or(context_positions(padding_mask, segment_ids), first)
    return allowed


@keras.saving.register_keras_serializable(package="bertzoo")
class SpanLogits(keras.layers.Layer):
    """`(batch, length, 2)` token scores -> `(batch, 2, length)` start/end
    logits, with positions that cannot hold an answer set to -1e9.

    Allowed: every real token; with `mask_question=True` only `[CLS]`
    (position 0, "no answer in this window") and the context tokens (see
    `context_positions`).
    """

    def __init__(self, mask_question=True, **kwargs):
        super().__init__(**kwargs)
        self.mask_question = bool(mask_question)

    def call(self, scores, padding_mask, segment_ids):
        logits = ops.transpose(scores, (0, 2, 1))
        allowed = answer_positions(padding_mask, segment_ids, self.mask_question)
        return ops.where(ops.expand_dims(allowed, 1), logits, ops.cast(MASKED_LOGIT, logits.dtype))

    def compute_output_shape(self, scores_shape, padding_mask_shape, segment_ids_shape):
        return (scores_shape[0], scores_shape[2], scores_shape[1])

    def get_config(self):
        config = super().get_config()
        config["mask_question"] = self.mask_question
        return config


def best_spans(span_logits, allowed, max_answer_length=MAX_ANSWER_LENGTH, allowed_starts=None):
    """Best answer span per example, as TensorFlow tensors: eagerly for
    `predict_spans` / `decode_spans`, in the graph of the exported signature.

    A span has `start <= end`, at most `max_answer_length` tokens and both
    ends at `allowed` positions (bool `(batch, length)`; the start also at
    `allowed_starts` when given), never at position 0 (`[CLS]`, "no
    answer"); the best maximizes `start_logit + end_logit`, as BERT's SQuAD
    code does. Computed in the dtype of `span_logits`.

    Returns:
        `(starts, ends, scores)` of shape `(batch,)` (int32, int32, the
        logits' dtype); an example without any allowed span gets
        `start = end = 0` and score `-inf`.
    """
    logits = tf.convert_to_tensor(span_logits)
    starts, ends = logits[:, 0], logits[:, 1]
    batch, length = tf.shape(starts)[0], tf.shape(starts)[1]
    positions = tf.range(length)
    allowed = tf.cast(allowed, tf.bool) & (positions > 0)[tf.newaxis]
    starts_allowed = allowed if allowed_starts is None else allowed & tf.cast(allowed_starts, tf.bool)
    # Only the band of spans a start may have (`width` ends each), not all
    # `length**2` pairs: 30 of 384 columns at SQuAD's settings, so thousands
    # of windows decode in one call. Row-major ties keep the earliest start,
    # then the shortest span, as over the full square.
    width = tf.minimum(tf.cast(max_answer_length, tf.int32), length)
    end_positions = positions[:, tf.newaxis] + tf.range(width)[tf.newaxis]  # (length, width); past the end: padding.
    padding = tf.fill([batch, width], tf.cast(-np.inf, logits.dtype))
    band_ends = tf.gather(tf.concat([ends, padding], 1), end_positions, axis=1)
    band_allowed = tf.gather(tf.concat([allowed, tf.zeros([batch, width], tf.bool)], 1), end_positions, axis=1)
    valid = starts_allowed[:, :, tf.newaxis] & band_allowed
    scores = tf.where(valid, starts[:, :, tf.newaxis] + band_ends, tf.cast(-np.inf, logits.dtype))
    flat = tf.reshape(scores, [batch, -1])
    best = tf.argmax(flat, axis=1, output_type=tf.int32)
    score = tf.gather(flat, best, batch_dims=1)
    found = tf.math.is_finite(score)
    start = best // width
    return tf.where(found, start, 0), tf.where(found, start + best % width, 0), score


def decode_spans(span_logits, max_answer_length=MAX_ANSWER_LENGTH, allowed=None):
    """Best answer span per example (see `best_spans`), as NumPy arrays.

    `allowed` (bool `(batch, length)`) restricts both ends, by default to the
    unmasked positions. Computed in float64.

    Args:
        span_logits: `(batch, 2, length)`, the output of `BertQuestionAnswerer`.
        max_answer_length: longest span, in tokens.
        allowed: optional bool mask of positions that may start or end a span.

    Returns:
        `(starts, ends, scores)` NumPy arrays of shape `(batch,)`; an example
        without any allowed span gets `start = end = 0` and score `-inf`.

    Example:

    ```python
    starts, ends, scores = decode_spans(model.predict(features), max_answer_length=30)
    ```
    """
    max_answer_length = check_positive_int("max_answer_length", max_answer_length)
    logits = np.asarray(span_logits, dtype="float64")
    if logits.ndim != 3 or logits.shape[1] != 2:
        raise ValueError(f"`span_logits` must have shape (batch, 2, length), got {logits.shape}.")
    if allowed is None:
        allowed = logits[:, 0] > MASKED_LOGIT / 2
    return tuple(np.asarray(t) for t in best_spans(logits, allowed, max_answer_length))


def window_stride(sequence_length, stride=None):
    """The doc stride for windows of `sequence_length` tokens, checked.

    A window is `[CLS] question [SEP] context [SEP]`; `stride` is the number
    of context tokens between the starts of consecutive windows (BERT's
    `doc_stride`, Hugging Face's `doc_stride` too; not the overlap). Every
    window holds at least `stride` context tokens (the question is cut to
    `sequence_length - 3 - stride` tokens), so windows overlap by the rest
    and no context token is skipped. `None`: `DEFAULT_STRIDE` (128), or half
    the room of a shorter sequence, `(sequence_length - 3) // 2`.
    """
    if stride is None:
        stride = min(DEFAULT_STRIDE, (sequence_length - 3) // 2)
        if stride < 1:
            raise ValueError(
                f"sequence_length={sequence_length} is too short for context windows "
                "([CLS] question [SEP] context [SEP]): use a sequence_length of at least 5."
            )
        return stride
    stride = check_positive_int("stride", stride)  # Context tokens between window starts.
    if stride > sequence_length - 4:
        raise ValueError(
            f"stride={stride} leaves no room for the question in windows of sequence_length={sequence_length}: "
            f"a window is [CLS] question [SEP] context [SEP] and holds at least `stride` context tokens. "
            f"Use stride <= {sequence_length - 4} (e.g. stride={window_stride(sequence_length)}), "
            "or a longer sequence_length."
        )
    return stride


def _check_null_score_threshold(null_score_threshold):
    if null_score_threshold is None:
        return None
    if (
        isinstance(null_score_threshold, bool)
        or not isinstance(null_score_threshold, (int, float, np.number))
        or (not np.isfinite(null_score_threshold))
    ):
        raise ValueError(
            '`null_score_threshold` must be a finite number (the BERT paper\'s tau: answer "" when '
            "null_score > best span score + tau; e.g. 0.0, tuned on SQuAD 2.0 dev data) or None "
            f"(SQuAD 1.1: always a span), got {null_score_threshold!r}."
        )
    return float(null_score_threshold)


def question_windows(tokenizer, questions, contexts, sequence_length, stride):
    """Packs `(question, context)` pairs into doc-stride windows (BERT's SQuAD
    recipe), in TensorFlow ops: eagerly for `predict_spans`, in the graph of
    the exported `serving_default`.

    Each example gives `1 + ceil(max(0, context_tokens - room) / stride)`
    windows `[CLS] question [SEP] context[k * stride : k * stride + room]
    [SEP]` (padded to `sequence_length`), where `room = sequence_length - 3 -
    question_tokens` and, where the context needs more than one window, the
    question is cut to `sequence_length - 3 - stride` tokens (see
    `window_stride`). An example whose question and context fit gets one
    window, packed as `BertPreprocessor` packs it.

    Args:
        tokenizer: the `BertTokenizer`.
        questions, contexts: 1-D string tensors of the same size.
        sequence_length: window length, in tokens.
        stride: context tokens between window starts (checked by `window_stride`).

    Returns:
        `(features, windows)`: the model's inputs, one row per window, and a
        dict with `example` (the example of each window), `offset` (context
        token index = position in the window + offset), `char_starts`,
        `char_ends` (ragged `[example, context token]` character offsets in
        the context) and `contexts` (the contexts the offsets count in).
    """
    contexts = valid_utf8(contexts)
    question_ids = tokenizer.tokenize(questions)
    context_ids, char_starts, char_ends = tokenizer.tokenize_with_offsets(contexts)
    context_length = context_ids.row_lengths()
    # The question is cut only where the context needs several windows: an
    # example that fits is packed whole, as training (`BertPreprocessor`) packs it.
    full_length = question_ids.row_lengths()
    fits = full_length + context_length + 3 <= sequence_length
    question_length = tf.where(fits, full_length, tf.minimum(full_length, sequence_length - 3 - stride))
    starts = question_ids.row_starts()
    question_ids = tf.gather(question_ids.flat_values, tf.ragged.range(starts, starts + question_length))
    room = sequence_length - 3 - question_length
    extra = tf.maximum(context_length - room, 0)
    counts = 1 + (extra + stride - 1) // stride
    example = tf.repeat(tf.range(tf.size(counts, out_type=tf.int64)), counts)
    first = tf.ragged.range(counts).flat_values * stride  # First context token of each window.
    length = tf.minimum(tf.gather(room, example), tf.gather(context_length, example) - first)
    begin = tf.gather(context_ids.row_starts(), example) + first
    window_context = tf.gather(context_ids.flat_values, tf.ragged.range(begin, begin + length))
    window_question = tf.gather(question_ids, example)
    windows = tf.size(example)
    cls = tf.fill([windows, 1], tf.constant(tokenizer.cls_token_id, tf.int32))
    sep = tf.fill([windows, 1], tf.constant(tokenizer.sep_token_id, tf.int32))
    tokens = tf.concat([cls, window_question, sep, window_context, sep], axis=1)
    first_segment = tf.concat([cls, window_question, sep], axis=1)
    segments = tf.concat([tf.zeros_like(first_segment), tf.ones_like(window_context), tf.ones_like(sep)], axis=1)
    shape = [None, sequence_length]
    features = {
        "token_ids": tokens.to_tensor(tokenizer.pad_token_id, shape=shape),
        "segment_ids": segments.to_tensor(0, shape=shape),
        "padding_mask": tf.ones_like(tokens, tf.bool).to_tensor(False, shape=shape),
    }
    offset = first - tf.gather(question_length, example) - 2
    return features, {
        "example": example,
        "offset": offset,
        "char_starts": char_starts,
        "char_ends": char_ends,
        "contexts": contexts,
    }


def max_context_positions(allowed, windows):
    """Where a span may start: each context token only in the window where it
    has the most context (BERT's `token_is_max_context`).

    A token seen by several windows counts in the one maximizing
    `min(tokens left of it, tokens right of it) + 0.01 * window context
    length` (the first such window on ties), so a span is not taken from a
    window that sees only one side of it.

    Args:
        allowed: bool `(windows, length)`, the context positions of each
            window (`context_positions`).
        windows: the second output of `question_windows`.

    Returns:
        bool `(windows, length)`.
    """
    allowed = tf.cast(allowed, tf.bool)
    # Each window's context: `count` positions from `first` on.
    count = tf.reduce_sum(tf.cast(allowed, tf.int64), axis=1)
    first = tf.argmax(tf.cast(allowed, tf.int32), axis=1, output_type=tf.int64)
    window_starts = tf.gather(windows["char_starts"].row_starts(), windows["example"])
    where = tf.where(allowed)
    window, position = where[:, 0], where[:, 1]
    # The token's index among all examples' context tokens.
    key = tf.gather(window_starts + windows["offset"], window) + position
    left, right = position - tf.gather(first, window), tf.gather(first + count - 1, window) - position
    # 100 x BERT's score: an integer, so equal scores compare equal.
    score = 100 * tf.minimum(left, right) + tf.gather(count, window)
    tokens = tf.size(windows["char_starts"].flat_values, out_type=tf.int64)
    best = tf.math.unsorted_segment_max(score, key, tokens)
    last = tf.size(first, out_type=tf.int64)
    chosen = tf.math.unsorted_segment_min(tf.where(score == tf.gather(best, key), window, last), key, tokens)
    is_max = window == tf.gather(chosen, key)
    return tf.scatter_nd(where, is_max, tf.shape(allowed, out_type=tf.int64))


def answer_windows(span_logits, features, windows, max_answer_length=MAX_ANSWER_LENGTH, null_score_threshold=None):
    """The answer of each example from the span logits of its windows (see
    `question_windows`), in TensorFlow ops (eagerly and in the exported
    graph).

    In each window the best context span (`best_spans`) starting at a token
    this window gives the most context (`max_context_positions`, as BERT's
    SQuAD code); across an example's windows the best span score (start +
    end logit, comparable across windows) wins, the first window on ties. `null_score` is
    `start_logit[CLS] + end_logit[CLS]`, the minimum over the windows (BERT
    paper, SQuAD 2.0). With `null_score_threshold` (tau) the answer is `""`
    when `null_score > score + tau`; None never answers `""` while a span
    exists (SQuAD 1.1).

    Returns:
        A dict of tensors of shape `(examples,)`: `answer` (the exact
        substring of the context, `""` for no answer), `start` / `end` (its
        character offsets, `end` exclusive; -1 for no answer), `score` (the
        best span's, -inf without any span) and `null_score`.
    """
    logits = tf.cast(span_logits, tf.float32)
    allowed = context_positions(features["padding_mask"], features["segment_ids"])
    starts, ends, scores = best_spans(logits, allowed, max_answer_length, max_context_positions(allowed, windows))
    example = windows["example"]
    num_examples = tf.shape(windows["contexts"], out_type=tf.int64)[0]
    best = tf.math.unsorted_segment_max(scores, example, num_examples)
    # (The segment max of -inf scores is the lowest float, not -inf.)
    found = best > tf.float32.min
    best = tf.where(found, best, tf.constant(-np.inf, tf.float32))
    window_ids = tf.range(tf.size(example, out_type=tf.int64))
    winner = tf.math.unsorted_segment_min(
        tf.where(scores >= tf.gather(best, example), window_ids, tf.size(example, out_type=tf.int64)),
        example,
        num_examples,
    )
    null_score = tf.math.unsorted_segment_min(logits[:, 0, 0] + logits[:, 1, 0], example, num_examples)
    if null_score_threshold is not None:
        found &= ~(null_score > best + null_score_threshold)
    winner = tf.where(found, winner, 0)

    def characters(positions, offsets):
        """Character offset of the winning window's token `positions`; -1 where not found."""
        token = tf.cast(tf.gather(positions, winner), tf.int64) + tf.gather(windows["offset"], winner)
        index = tf.where(found, offsets.row_starts() + token, 0)
        values = tf.concat([offsets.flat_values, [-1]], 0)  # Never read where found.
        return tf.where(found, tf.gather(values, index), -1)

    start = tf.cast(characters(starts, windows["char_starts"]), tf.int32)
    end = tf.cast(characters(ends, windows["char_ends"]), tf.int32)
    answer = tf.strings.substr(windows["contexts"], tf.maximum(start, 0), tf.maximum(end - start, 0), unit="UTF8_CHAR")
    return {
        "answer": tf.where(found, answer, ""),
        "start": start,
        "end": end,
        "score": best,
        "null_score": null_score,
    }


@keras.saving.register_keras_serializable(package="bertzoo")
class BertQuestionAnswerer(Task):
    """Span question answering (BERT paper, section 4.2, SQuAD): a dense layer
    gives every token a start and an end score.

    Training inputs are `(question, context)` pairs, packed `[CLS] question
    [SEP] context [SEP]` with waterfall truncation: the question is kept
    whole and the end of the context is cut (the preprocessor is switched to
    `truncate="waterfall"`; long contexts are not split for training).
    `predict_spans` and the exported `serving_default` read contexts of any
    length in overlapping doc-stride windows and answer with character
    offsets into the original context, SQuAD 2.0 null answers included. Output: logits `(batch, 2, length)`, row 0 for
    the start and row 1 for the end; padding (and, with `mask_question`, the
    question and both `[SEP]`) get -1e9. The default loss, sparse
    cross-entropy over positions, is the mean of the start and end losses.

    Labels for raw text: answer character spans `(start, end)` (end
    exclusive) in each context, e.g. SQuAD's `(answer_start, answer_start +
    len(text))`, or `None` (or `(-1, -1)`) for a question the context does
    not answer (SQuAD 2.0; the BERT paper trains those on `[CLS]`). They
    become token positions in `tf.data`; an unanswered question, and an
    answer cut off by truncation, point at `[CLS]` (position 0). A span that begins or
    ends inside a word piece takes the whole piece. Tokenized inputs take
    token positions `(start, end)` directly.

    Args:
        backbone: a `bertzoo.BertBackbone`.
        preprocessor: a `bertzoo.text.BertPreprocessor`, or None for
            tokenized inputs.
        mask_question: allow answers only in the context (and `[CLS]`).

    Example:

    ```python
    model = bertzoo.BertQuestionAnswerer.from_preset("tiny", sequence_length=256)
    context = "The Eiffel Tower was finished in 1889."
    model.fit((["When was the tower finished?"], [context]), [(33, 37)])
    model.predict_spans(["When was the tower finished?"], [context])[0]["text"]  # '1889' once trained
    model.predict_spans(questions, long_contexts, stride=128, null_score_threshold=0.0)  # SQuAD 2.0
    ```
    """

    weightless_head_arguments = Task.weightless_head_arguments + ("mask_question",)

    def __init__(self, backbone, preprocessor=None, mask_question=True, **kwargs):
        check_two_segments(backbone, "A question and its context")
        if preprocessor is not None and preprocessor.truncate != "waterfall":
            preprocessor = BertPreprocessor(
                preprocessor.tokenizer, sequence_length=preprocessor.sequence_length, truncate="waterfall"
            )
        policy = backbone.dtype_policy
        head_dtype = "float32" if policy.compute_dtype != "float32" else policy
        self.span_dense = Dense(
            2,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=head_dtype,
            name="span_scores",
        )
        self.span_logits = SpanLogits(mask_question, dtype=head_dtype, name="span_logits")
        inputs = backbone.input
        outputs = self.compute_head_outputs(inputs, backbone(inputs))
        super().__init__(inputs=inputs, outputs=outputs, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.mask_question = bool(mask_question)

    def compute_head_outputs(self, inputs, features, training=None):
        scores = self.span_dense(features["sequence_output"])
        return self.span_logits(scores, inputs["padding_mask"], inputs["segment_ids"])

    def get_config(self):
        return {**super().get_config(), "mask_question": self.mask_question}

    def fit(self, *args, **kwargs):
        if kwargs.get("class_weight") is not None:
            raise ValueError(
                "BertQuestionAnswerer.fit does not take `class_weight`: its labels are (start, end) positions, "
                "not classes. Weigh examples with `sample_weight` (one weight per question)."
            )
        with unused_pooler_ok():
            return super().fit(*args, **kwargs)

    def loss_sample_weight(self, sample_weight):
        """The labels are (start, end) pairs, so Keras weighs a `(batch, 2)`
        loss: one weight per example, `(batch, 1)`, goes on both ends."""
        return None if sample_weight is None else one_weight_per_row(sample_weight)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return super().compute_loss(x, y, y_pred, self.loss_sample_weight(sample_weight), training=training)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(x, y, y_pred, self.loss_sample_weight(sample_weight))

    # --- Raw inputs -------------------------------------------------------
    def _raw_to_tensors(self, x, y):
        if not (isinstance(x, tuple) and len(x) == 2):
            raise ValueError(
                "BertQuestionAnswerer takes raw text as a tuple (questions, contexts) of two lists of strings."
            )
        questions, contexts = ([v] if isinstance(v, str) else list(v) for v in x)
        if len(questions) != len(contexts):
            raise ValueError(f"Got {len(questions)} questions but {len(contexts)} contexts.")
        if y is not None:
            if isinstance(y, (list, tuple)) or (isinstance(y, np.ndarray) and y.dtype == object):
                y = [NO_ANSWER if span is None else span for span in y]
            y = np.asarray(y)
            if y.shape != (len(contexts), 2) or y.dtype.kind not in "iu":
                raise ValueError(
                    f"Answer spans must be integer character offsets of shape ({len(contexts)}, 2), one "
                    f"(start, end) per context with `end` exclusive, or None for no answer; got shape {y.shape}, "
                    f"dtype {y.dtype}."
                )
            for i, ((start, end), context) in enumerate(zip(y, contexts)):
                if not (0 <= start < end <= len(context) or (start, end) == NO_ANSWER):
                    raise ValueError(
                        f"Answer span {i} ({start}, {end}) is not inside its context of {len(context)} "
                        f"characters: need 0 <= start < end <= len(context), or None / {NO_ANSWER} for a "
                        "question the context does not answer."
                    )
            y = y.astype("int32")
        return super()._raw_to_tensors((questions, contexts), y)

    def _checked_labels(self, y, features=None):
        # Token positions of tokenized inputs: one past the end would make
        # the loss (and, under XLA, every weight) NaN.
        values = np.asarray(y)
        length = np.shape(features["token_ids"])[-1] if isinstance(features, dict) else None
        if values.dtype.kind in "iu" and length is not None:
            if values.ndim != 2 or values.shape[-1] != 2 or values.min() < 0 or values.max() >= length:
                raise ValueError(
                    f"Answer labels of tokenized inputs are (start, end) token positions in [0, {length}), one "
                    f"pair per example; got shape {values.shape}, values from {values.min()} to {values.max()}."
                )
            if "padding_mask" in features and "segment_ids" in features:
                # A label at a masked position costs about 1e9 and teaches nothing.
                allowed = ops.convert_to_numpy(
                    answer_positions(features["padding_mask"], features["segment_ids"], self.mask_question)
                )
                rows = np.arange(len(values))
                bad = np.flatnonzero(~(allowed[rows, values[:, 0]] & allowed[rows, values[:, 1]]))
                if bad.size:
                    where = (
                        "a context token, or 0 ([CLS]) for no answer (mask_question=True)"
                        if self.mask_question
                        else "a real token (not padding)"
                    )
                    raise ValueError(
                        f"Answer labels of examples {bad[:10].tolist()} (e.g. {values[bad[0]].tolist()}) point at "
                        f"positions the model masks: each of start and end must be {where}. Fix the labels"
                        + (", or build the model with mask_question=False." if self.mask_question else ".")
                    )
        return y

    @deterministic_preprocess
    def preprocess(self, x, y=None, sample_weight=None, preprocessor=None):
        """`(questions, contexts)` (and character spans) -> features (and
        token positions `(batch, 2)`; an answer cut off points at `[CLS]`)."""
        if not (isinstance(x, tuple) and len(x) == 2):
            raise ValueError("BertQuestionAnswerer takes (questions, contexts) pairs.")
        preprocessor = self.preprocessor if preprocessor is None else preprocessor
        features = preprocessor(x)
        if y is None:
            return features
        questions, contexts = x
        if preprocessor.truncate != "waterfall":  # A preprocessor swapped or changed after construction.
            raise ValueError(
                f"BertQuestionAnswerer trains with truncate='waterfall' packing (the question whole, the context "
                f"cut), which its answer positions assume; this preprocessor packs with "
                f"truncate={preprocessor.truncate!r}. Set model.preprocessor.truncate = 'waterfall' (or build it "
                "with BertPreprocessor(..., truncate='waterfall'))."
            )
        span_dtype = tf.as_dtype(y.dtype if hasattr(y, "dtype") else np.asarray(y).dtype)
        if not span_dtype.is_integer:
            raise ValueError(
                f"Answer spans are integer character offsets (start, end); these are {span_dtype.name}. Cast a "
                "dataset's with dataset.map(lambda x, y: (x, tf.cast(y, tf.int32))) if they are whole numbers."
            )
        tokenizer = preprocessor.tokenizer
        budget = preprocessor.sequence_length - 3

        # Token counts of the question, the context, and the context up to the
        # answer's start and end, from one tokenizer call (the features' own
        # tokenization).
        spans = tf.cast(y, tf.int32)
        # `_raw_to_tensors` checks in-memory spans; a dataset's are seen here.
        lengths = tf.strings.length(contexts, unit="UTF8_CHAR")
        unanswered = (spans[:, 0] == NO_ANSWER[0]) & (spans[:, 1] == NO_ANSWER[1])
        inside = (spans[:, 0] >= 0) & (spans[:, 0] < spans[:, 1]) & (spans[:, 1] <= lengths)
        message = (
            "Answer spans are (start, end) character offsets with 0 <= start < end <= len(context), or "
            f"{NO_ANSWER} for no answer; these (start, end) in this tf.data batch are not:"
        )
        spans = guarded(spans, (inside | unanswered, message, spans))
        spans = tf.where(unanswered[:, tf.newaxis], 0, spans)  # No token: kept below is False, [CLS].
        zeros = tf.zeros_like(spans[:, 0])
        texts = tf.concat(
            [
                questions,
                contexts,
                tf.strings.substr(contexts, zeros, spans[:, 0], unit="UTF8_CHAR"),
                tf.strings.substr(contexts, zeros, spans[:, 1], unit="UTF8_CHAR"),
            ],
            axis=0,
        )
        counts = tf.cast(tf.reshape(tokenizer.tokenize(texts).row_lengths(), [4, -1]), tf.int32)
        before, through = counts[2], counts[3]
        # A span that starts or ends inside a word: the tokens holding one of
        # its characters (as Hugging Face's offset mapping), from the offsets,
        # where they tokenize the context as `tokenize` does (not with
        # `special_tokens_in_strings` or ALBERT's quote replacement).
        _, char_starts, char_ends = tokenizer.tokenize_with_offsets(contexts)
        same = tf.cast(char_starts.row_lengths(), tf.int32) == counts[1]
        wide, rows = tf.cast(spans, tf.int64), char_starts.value_rowids()

        def per_context(hits):  # On the flat values: ragged broadcasting adds a validated branch per comparison.
            return tf.math.unsorted_segment_sum(tf.cast(hits, tf.int32), rows, char_starts.nrows())

        before = tf.where(same, per_context(char_ends.flat_values <= tf.gather(wide[:, 0], rows)), before)
        through = tf.where(same, per_context(char_starts.flat_values < tf.gather(wide[:, 1], rows)), through)
        # Waterfall packing: the question takes what it needs, the context the rest.
        question_kept = tf.minimum(counts[0], budget)
        context_kept = tf.minimum(counts[1], budget - question_kept)
        kept = (through > before) & (through <= context_kept)
        offset = question_kept + 2  # [CLS] question [SEP]
        positions = tf.stack([tf.where(kept, offset + before, 0), tf.where(kept, offset + through - 1, 0)], axis=1)
        return keras.utils.pack_x_y_sample_weight(features, positions, sample_weight)

    # --- Decoding ---------------------------------------------------------
    def predict_spans(
        self,
        questions,
        contexts,
        max_answer_length=MAX_ANSWER_LENGTH,
        batch_size=None,
        verbose=0,
        stride=None,
        null_score_threshold=None,
    ):
        """Answers questions about contexts of any length (SQuAD 1.1 and 2.0
        as in the BERT paper).

        A context longer than one window is read in overlapping doc-stride
        windows (`question_windows`: `[CLS] question [SEP] context window
        [SEP]`, window starts `stride` context tokens apart); the best span
        (start + end logit, at most `max_answer_length` tokens, inside the
        context) over all windows wins and is mapped back to characters of
        the original context. SQuAD 2.0: `null_score` is `start_logit[CLS] +
        end_logit[CLS]`, the minimum over the windows; with
        `null_score_threshold` (the paper's tau) the answer is `""` when
        `null_score > score + tau`.

        Args:
            questions, contexts: strings, or lists of strings of equal length.
            max_answer_length: longest answer, in tokens (default
                `MAX_ANSWER_LENGTH`, 30).
            batch_size, verbose: as in `predict` (batches of windows).
            stride: context tokens between window starts (BERT's
                `doc_stride`); None: 128, or `(sequence_length - 3) // 2` for
                shorter sequences (see `window_stride`). At most
                `sequence_length - 4`; the question is cut to
                `sequence_length - 3 - stride` tokens.
            null_score_threshold: None (SQuAD 1.1: always a span when the
                context has one) or a number tau (SQuAD 2.0).

        Returns:
            One dict per question: `text` (the answer, exactly
            `context[start:end]` with its case and accents; `""` for no
            answer), `start` / `end` (character offsets in the context, `end`
            exclusive; -1 for no answer), `score` (the best span's start +
            end logit, -inf without a span) and `null_score`.

        Example:

        ```python
        answer = model.predict_spans(["Who wrote it?"], ["It was written by Ada."])[0]
        sorted(answer)  # ['end', 'null_score', 'score', 'start', 'text']
        model.predict_spans(questions, long_contexts, stride=128, null_score_threshold=0.0)
        ```
        """
        if self.preprocessor is None:
            raise ValueError("predict_spans needs a preprocessor; this model takes tokenized inputs.")
        max_answer_length = check_positive_int("max_answer_length", max_answer_length)
        stride = window_stride(self.preprocessor.sequence_length, stride)
        null_score_threshold = _check_null_score_threshold(null_score_threshold)
        questions, contexts = eager_strings_as_arrays((questions, contexts))
        questions, contexts = ([v] if isinstance(v, str) else list(v) for v in (questions, contexts))
        if len(questions) != len(contexts):
            raise ValueError(f"Got {len(questions)} questions but {len(contexts)} contexts; pass one per question.")
        if not questions:
            return []  # Keras's predict cannot run zero rows.
        questions = to_string_tensor(questions, "predict_spans (questions)")
        contexts = to_string_tensor(contexts, "predict_spans (contexts)")
        features, windows = question_windows(
            self.preprocessor.tokenizer, questions, contexts, self.preprocessor.sequence_length, stride
        )
        logits = self.predict({k: np.asarray(v) for k, v in features.items()}, batch_size=batch_size, verbose=verbose)
        answers = answer_windows(logits, features, windows, max_answer_length, null_score_threshold)
        return [
            {
                "text": text.decode("utf-8"),
                "start": int(start),
                "end": int(end),
                "score": float(score),
                "null_score": float(null_score),
            }
            for text, start, end, score, null_score in zip(
                *(np.asarray(answers[k]) for k in ("answer", "start", "end", "score", "null_score"))
            )
        ]

    def decode_answers(self, span_logits, features, max_answer_length=MAX_ANSWER_LENGTH, tokenizer=None):
        """The best answer span of each packed (single-window) example, as a
        dict of tensors: `start`, `end` (token positions), `score` (see
        `best_spans`, both ends in the context), `null_score` (start + end
        logit of `[CLS]`) and `answer`, the span's tokens joined back (`""`
        when there is none). The exported `serving_tokenized` returns it;
        raw text goes through `predict_spans` / `answer_windows` instead
        (windows, exact character offsets).

        Args:
            span_logits: the model's output for `features`.
            features: the model's inputs (`token_ids`, `segment_ids`,
                `padding_mask`).
            max_answer_length: longest span, in tokens.
            tokenizer: joins the span's tokens back; default: the
                preprocessor's. None without a preprocessor: no `answer`.
        """
        if tokenizer is None and self.preprocessor is not None:
            tokenizer = self.preprocessor.tokenizer
        allowed = context_positions(features["padding_mask"], features["segment_ids"])
        start, end, score = best_spans(span_logits, allowed, max_answer_length)
        logits = tf.convert_to_tensor(span_logits)
        result = {"start": start, "end": end, "score": score, "null_score": logits[:, 0, 0] + logits[:, 1, 0]}
        if tokenizer is not None:
            found = tf.math.is_finite(score)
            positions = tf.ragged.range(start, tf.where(found, end + 1, 0))
            answer = tokenizer.detokenize(tf.gather(features["token_ids"], positions, batch_dims=1))
            if isinstance(tokenizer, BertTokenizer):  # A span from inside a word: its first piece's "##" is markup.
                answer = tf.strings.regex_replace(answer, "^" + SUFFIX_INDICATOR, "")
            result["answer"] = tf.where(found, answer, "")
        return result

    # --- Serving ----------------------------------------------------------
    def serving_signatures(
        self,
        preprocessor=None,
        pairs="auto",
        stride=None,
        max_answer_length=MAX_ANSWER_LENGTH,
        null_score_threshold=None,
    ):
        """`serving_default(question, context)` (with a preprocessor) and
        `serving_tokenized`.

        `serving_default` answers as `predict_spans` does, with the same
        code: contexts of any length in doc-stride windows of the
        preprocessor's `sequence_length`, returning `answer` (exact substring
        of the context, `""` for no answer), `start` / `end` (character
        offsets, -1 for no answer), `score` and `null_score` per question.
        `stride`, `max_answer_length` and `null_score_threshold` are fixed at
        export (`model.export(path, stride=..., null_score_threshold=...)`);
        a client can still apply its own threshold to `score` and
        `null_score`. `serving_tokenized` (one packed window per row) returns
        `start_logits`, `end_logits` and `decode_answers`'s outputs (token
        positions).
        """
        max_answer_length = check_positive_int("max_answer_length", max_answer_length)
        null_score_threshold = _check_null_score_threshold(null_score_threshold)
        tokenizer = preprocessor.tokenizer if preprocessor is not None else None
        if preprocessor is not None:
            stride = window_stride(preprocessor.sequence_length, stride)

        def outputs(span_logits, features):
            logits = tf.cast(span_logits, tf.float32)  # (batch, 2, length)
            result = {"start_logits": logits[:, 0], "end_logits": logits[:, 1]}
            result.update(self.decode_answers(logits, features, max_answer_length, tokenizer=tokenizer))
            return result

        serving = TextServing(self, preprocessor, outputs=outputs)
        functions = serving.tokenized_signatures()
        if preprocessor is None:
            return functions

        def answer(question, context):
            question, context = same_size(question, context, "question", "context")
            features, windows = question_windows(tokenizer, question, context, preprocessor.sequence_length, stride)
            features = trim_padding(as_int32(features))
            logits = serving_call(self, features)
            return serving.finish(answer_windows(logits, features, windows, max_answer_length, null_score_threshold))

        functions["serving_default"] = string_function(answer, question=[None], context=[None])
        return functions
