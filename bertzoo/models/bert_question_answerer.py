"""Extractive question answering: predict the answer span in a context (SQuAD)."""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from bertzoo.export.serving import TextServing
from bertzoo.export.serving import same_size
from bertzoo.export.serving import string_function
from bertzoo.layers.dense import Dense
from bertzoo.models.head_utils import unused_pooler_ok
from bertzoo.models.task import Task
from bertzoo.text.preprocessor import BertPreprocessor

MASKED_LOGIT = -1e9
# Longest answer span, in tokens, of `predict_spans`, `decode_spans` and the
# exported `serving_default` (BERT's SQuAD setting).
MAX_ANSWER_LENGTH = 30


def context_positions(padding_mask, segment_ids):
    """Where an answer may be: tokens of the second segment except its
    closing `[SEP]` (the last real token). Works on NumPy and backend tensors."""
    real = ops.cast(padding_mask, "bool")
    next_is_real = ops.concatenate([real[:, 1:], ops.zeros_like(real[:, :1])], axis=1)
    return ops.logical_and(ops.equal(ops.cast(segment_ids, "int32"), 1), next_is_real)


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
        allowed = ops.cast(padding_mask, "bool")
        if self.mask_question:
            first = ops.expand_dims(ops.equal(ops.arange(ops.shape(allowed)[1]), 0), 0)
            allowed = ops.logical_or(context_positions(padding_mask, segment_ids), first)
        return ops.where(ops.expand_dims(allowed, 1), logits, ops.cast(MASKED_LOGIT, logits.dtype))

    def compute_output_shape(self, scores_shape, padding_mask_shape, segment_ids_shape):
        return (scores_shape[0], scores_shape[2], scores_shape[1])

    def get_config(self):
        config = super().get_config()
        config["mask_question"] = self.mask_question
        return config


def best_spans(span_logits, allowed, max_answer_length=MAX_ANSWER_LENGTH):
    """Best answer span per example, as TensorFlow tensors: eagerly for
    `predict_spans` / `decode_spans`, in the graph of the exported signature.

    A span has `start <= end`, at most `max_answer_length` tokens and both
    ends at `allowed` positions (bool `(batch, length)`), never at position
    0 (`[CLS]`, "no answer"); the best maximizes `start_logit + end_logit`,
    as BERT's SQuAD code does. Computed in the dtype of `span_logits`.

    Returns:
        `(starts, ends, scores)` of shape `(batch,)` (int32, int32, the
        logits' dtype); an example without any allowed span gets
        `start = end = 0` and score `-inf`.
    """
    logits = tf.convert_to_tensor(span_logits)
    starts, ends = logits[:, 0], logits[:, 1]
    length = tf.shape(starts)[1]
    positions = tf.range(length)
    allowed = tf.cast(allowed, tf.bool) & (positions > 0)[tf.newaxis]
    i, j = positions[:, tf.newaxis], positions[tf.newaxis]
    band = (j >= i) & (j - i < max_answer_length)
    valid = band[tf.newaxis] & allowed[:, :, tf.newaxis] & allowed[:, tf.newaxis, :]
    scores = tf.where(valid, starts[:, :, tf.newaxis] + ends[:, tf.newaxis, :], tf.cast(-np.inf, logits.dtype))
    flat = tf.reshape(scores, [tf.shape(scores)[0], -1])
    best = tf.argmax(flat, axis=1, output_type=tf.int32)
    score = tf.gather(flat, best, batch_dims=1)
    found = tf.math.is_finite(score)
    return tf.where(found, best // length, 0), tf.where(found, best % length, 0), score


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
    _check_max_answer_length(max_answer_length)
    logits = np.asarray(span_logits, dtype="float64")
    if logits.ndim != 3 or logits.shape[1] != 2:
        raise ValueError(f"`span_logits` must have shape (batch, 2, length), got {logits.shape}.")
    if allowed is None:
        allowed = logits[:, 0] > MASKED_LOGIT / 2
    return tuple(np.asarray(t) for t in best_spans(logits, allowed, max_answer_length))


def _check_max_answer_length(max_answer_length):
    if isinstance(max_answer_length, bool) or not isinstance(max_answer_length, int) or max_answer_length < 1:
        raise ValueError(f"`max_answer_length` must be a positive integer, got {max_answer_length!r}.")


@keras.saving.register_keras_serializable(package="bertzoo")
class BertQuestionAnswerer(Task):
    """Span question answering (BERT paper, section 4.2, SQuAD): a dense layer
    gives every token a start and an end score.

    Inputs are `(question, context)` pairs, packed `[CLS] question [SEP]
    context [SEP]` with waterfall truncation: the question is kept whole and
    the end of the context is cut (the preprocessor is switched to
    `truncate="waterfall"`). Output: logits `(batch, 2, length)`, row 0 for
    the start and row 1 for the end; padding (and, with `mask_question`, the
    question and both `[SEP]`) get -1e9. The default loss, sparse
    cross-entropy over positions, is the mean of the start and end losses.

    Labels for raw text: answer character spans `(start, end)` (end
    exclusive) in each context, e.g. SQuAD's `(answer_start, answer_start +
    len(text))`. They become token positions in `tf.data`; an answer cut
    off by truncation points at `[CLS]` (position 0). Spans should begin and
    end at word boundaries, as SQuAD's do. Tokenized inputs take token
    positions `(start, end)` directly.

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
    ```
    """

    def __init__(self, backbone, preprocessor=None, mask_question=True, **kwargs):
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
        with unused_pooler_ok():
            return super().fit(*args, **kwargs)

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
            y = np.asarray(y)
            if y.shape != (len(contexts), 2) or y.dtype.kind not in "iu":
                raise ValueError(
                    f"Answer spans must be integer character offsets of shape ({len(contexts)}, 2), one "
                    f"(start, end) per context with `end` exclusive; got shape {y.shape}, dtype {y.dtype}."
                )
            for i, ((start, end), context) in enumerate(zip(y, contexts)):
                if not 0 <= start < end <= len(context):
                    raise ValueError(
                        f"Answer span {i} ({start}, {end}) is not inside its context of {len(context)} "
                        "characters: need 0 <= start < end <= len(context)."
                    )
            y = y.astype("int32")
        return super()._raw_to_tensors((questions, contexts), y)

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
        tokenizer = preprocessor.tokenizer
        budget = preprocessor.sequence_length - 3

        # Token counts of the question, the context, and the context up to the
        # answer's start and end, from one tokenizer call.
        spans = tf.cast(y, tf.int32)
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
        # Waterfall packing: the question takes what it needs, the context the rest.
        question_kept = tf.minimum(counts[0], budget)
        context_kept = tf.minimum(counts[1], budget - question_kept)
        before, through = counts[2], counts[3]
        kept = (through > before) & (through <= context_kept)
        offset = question_kept + 2  # [CLS] question [SEP]
        positions = tf.stack(
            [tf.where(kept, offset + before, 0), tf.where(kept, offset + through - 1, 0)], axis=1
        )
        return keras.utils.pack_x_y_sample_weight(features, positions, sample_weight)

    # --- Decoding ---------------------------------------------------------
    def predict_spans(self, questions, contexts, max_answer_length=MAX_ANSWER_LENGTH, batch_size=None, verbose=0):
        """Answers questions: for each `(question, context)`, the best context
        span (see `best_spans`) as a dict with `text` (the span's tokens
        joined back: lower-cased for uncased vocabularies, pieces merged),
        `start` / `end` (token positions in the packed sequence) and `score`
        (start + end logit).

        Example:

        ```python
        answer = model.predict_spans(["Who wrote it?"], ["It was written by Ada."])[0]
        sorted(answer)  # ['end', 'score', 'start', 'text']
        ```
        """
        if self.preprocessor is None:
            raise ValueError("predict_spans needs a preprocessor; this model takes tokenized inputs.")
        _check_max_answer_length(max_answer_length)
        questions, contexts = ([v] if isinstance(v, str) else list(v) for v in (questions, contexts))
        features = self.preprocess((tf.constant(questions), tf.constant(contexts)))
        features = {k: np.asarray(v) for k, v in features.items()}
        logits = np.asarray(self.predict(features, batch_size=batch_size, verbose=verbose), "float64")
        answers = self.decode_answers(logits, features, max_answer_length)
        return [
            {"text": text.decode("utf-8"), "start": int(start), "end": int(end), "score": float(score)}
            for text, start, end, score in zip(
                *(np.asarray(answers[k]) for k in ("answer", "start", "end", "score"))
            )
        ]

    def decode_answers(self, span_logits, features, max_answer_length=MAX_ANSWER_LENGTH, tokenizer=None):
        """The best answer span of each example, as a dict of tensors:
        `start`, `end`, `score` (see `best_spans`, both ends in the context)
        and `answer`, the span's text (`""` when there is none). Runs eagerly
        (`predict_spans`) and in the exported `serving_default`.

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
        result = {"start": start, "end": end, "score": score}
        if tokenizer is not None:
            found = tf.math.is_finite(score)
            positions = tf.ragged.range(start, tf.where(found, end + 1, 0))
            answer = tokenizer.detokenize(tf.gather(features["token_ids"], positions, batch_dims=1))
            result["answer"] = tf.where(found, answer, "")
        return result

    # --- Serving ----------------------------------------------------------
    def serving_signatures(self, preprocessor=None, pairs="auto"):
        """`serving_default(question, context)` (with a preprocessor) and
        `serving_tokenized`, returning `start_logits`, `end_logits` and the
        best span: `start`, `end`, `score` and its text `answer` (as
        `predict_spans` decodes it; `start = end = 0`, `answer = ""` if
        none)."""
        tokenizer = preprocessor.tokenizer if preprocessor is not None else None

        def outputs(span_logits, features):
            logits = tf.cast(span_logits, tf.float32)  # (batch, 2, length)
            result = {"start_logits": logits[:, 0], "end_logits": logits[:, 1]}
            result.update(self.decode_answers(logits, features, tokenizer=tokenizer))
            return result

        serving = TextServing(self, preprocessor, outputs=outputs)
        functions = serving.tokenized_signatures()
        if preprocessor is None:
            return functions

        def answer(question, context):
            question, context = same_size(
                tf.reshape(question, [-1]), tf.reshape(context, [-1]), "question", "context"
            )
            return serving.run(self.preprocess((question, context), preprocessor=preprocessor))

        functions["serving_default"] = string_function(answer, question=[None], context=[None])
        return functions
