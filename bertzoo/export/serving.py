"""What each bertzoo model serves: its raw-text signatures and its outputs.

`serving_functions(model, backbone, preprocessor, pairs)` returns the
signature functions of an export. Every model gets `serving_tokenized`, the
model's own inputs (names, ranks and dtypes as the model declares them). With
a preprocessor, the raw-text signatures depend on the task:

    BertClassifier, BertBackbone,     serving_default(text), serving_pairs(text, text_pair)
    other Task subclasses
    BertQuestionAnswerer              serving_default(question, context)
    BertMultipleChoice                serving_default(context, choices[batch, num_choices])
    BertTokenClassifier               serving_default(text): words split on whitespace
                                      serving_words(words[batch, words]): "" pads
    BertPretrainer                    none (its inputs are masked at random)

Outputs (floating ones are float32):

    classifier, multiple choice       logits, probabilities, label_ids (+ label_names)
    token classifier, per word        words, logits, probabilities, label_ids (-1: padding or
                                      cut off), label_names ("" there), with class_names
    question answerer                 start_logits, end_logits, start, end, score, answer
                                      (the best span as BERT's SQuAD decoding picks it,
                                      at most 30 tokens; start = end = 0, answer "" if none)
    others                            the model's outputs by name, or a task's own
                                      `serving_outputs(self, outputs) -> dict` hook
"""

TOKENIZED_KEYS = ("token_ids", "segment_ids", "padding_mask")
MAX_ANSWER_LENGTH = 30


def classification_outputs(outputs, class_names=None, activation=None):
    """Serving outputs of a classification head, as a dict of tensors.

    `logits` and `probabilities` (float32, softmax over the last axis),
    `label_ids` (int32 argmax) and, with `class_names`, `label_names` (the
    name of each predicted class). `activation` is the head's output
    activation: None (the outputs are logits) or `"softmax"` (they are
    probabilities; `logits` are then their logarithm, which has the same
    softmax).

    Example, a task's serving hook:
    >>> def serving_outputs(self, outputs):
    ...     return classification_outputs(outputs, self.class_names)
    """
    import tensorflow as tf

    scores = tf.cast(outputs, tf.float32)
    if activation in (None, "linear"):
        logits, probabilities = scores, tf.nn.softmax(scores, axis=-1)
    elif activation == "softmax":
        probabilities, logits = scores, tf.math.log(scores)
    else:
        raise ValueError(
            f"classification_outputs supports heads with no activation (logits) or 'softmax', "
            f"got activation={activation!r}."
        )
    label_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
    result = {"logits": logits, "probabilities": probabilities, "label_ids": label_ids}
    if class_names is not None:
        result["label_names"] = tf.gather(tf.constant([str(n) for n in class_names]), label_ids)
    return result


def serving_functions(model, backbone, preprocessor, pairs):
    """`{signature name: tf.function with an input signature}` for `model`."""
    kind = _task_kind(model)
    serving = {
        "question_answerer": _QuestionAnswering,
        "multiple_choice": _MultipleChoice,
        "token_classifier": _TokenClassification,
    }.get(kind, _Serving)(model, backbone, preprocessor)
    functions = {}
    if preprocessor is not None and kind != "pretrainer":
        functions.update(serving.text_functions(pairs))
    functions["serving_tokenized"] = serving.tokenized_function()
    if "serving_default" not in functions:  # TensorFlow Serving needs a `serving_default`.
        functions["serving_default"] = serving.tokenized_function()
    return functions


def pairs_supported(model, backbone, preprocessor):
    """Whether `serving_pairs` makes sense: a text task with a two-segment backbone."""
    return preprocessor is not None and _task_kind(model) == "text" and backbone.num_segments >= 2


def _task_kind(model):
    # By class name, so that exporting never imports task modules it does not need.
    names = {cls.__name__ for cls in type(model).__mro__}
    for name, kind in (
        ("BertQuestionAnswerer", "question_answerer"),
        ("BertMultipleChoice", "multiple_choice"),
        ("BertTokenClassifier", "token_classifier"),
        ("BertPretrainer", "pretrainer"),
    ):
        if name in names:
            return kind
    return "text"


def _as_int32(features):
    import tensorflow as tf

    return {k: tf.cast(features[k], tf.int32) for k in TOKENIZED_KEYS}


def _trim(features, *others):
    """Drops the trailing padding columns no row uses (last axis).

    Position embeddings are absolute and padding is masked, so predictions do
    not change; the compute shrinks to the longest text in the batch. The `1`
    keeps `[CLS]` when the batch is empty.
    """
    import tensorflow as tf

    lengths = tf.reshape(tf.reduce_sum(features["padding_mask"], axis=-1), [-1])
    longest = tf.reduce_max(tf.concat([lengths, [1]], axis=0))
    trimmed = {k: v[..., :longest] for k, v in features.items()}
    return (trimmed,) + tuple(o[..., :longest] for o in others) if others else trimmed


class _Serving:
    """Text or text pairs in; the model's outputs, post-processed, out."""

    def __init__(self, model, backbone, preprocessor):
        self.model = model
        self.backbone = backbone
        self.preprocessor = preprocessor

    # --- Signatures -------------------------------------------------------
    def text_functions(self, pairs):
        functions = {"serving_default": _function(self.text, text=[None])}
        if pairs:
            functions["serving_pairs"] = _function(self.pairs, text=[None], text_pair=[None])
        return functions

    def tokenized_function(self):
        import tensorflow as tf

        names = sorted(self.model.input)
        specs = [
            tf.TensorSpec(tuple(self.model.input[n].shape), tf.as_dtype(self.model.input[n].dtype), name=n)
            for n in names
        ]
        return _named_function("tokenized", lambda *values: self.tokenized(dict(zip(names, values))), specs)

    # --- Bodies -----------------------------------------------------------
    # The signatures declare 1-D string inputs, but a loaded signature does
    # not check ranks at run time, so the rank is made explicit: a scalar
    # string is a batch of one, higher ranks are flattened (row-major).
    def text(self, text):
        import tensorflow as tf

        return self.from_text(tf.reshape(text, [-1]))

    def pairs(self, text, text_pair):
        import tensorflow as tf

        text, text_pair = _same_size(tf.reshape(text, [-1]), tf.reshape(text_pair, [-1]), "text", "text_pair")
        return self.from_text((text, text_pair))

    def from_text(self, segments):
        features = _trim(_as_int32(self.preprocessor(segments)))
        return self.outputs(self.model(features, training=False), features)

    def tokenized(self, inputs):
        import tensorflow as tf

        with tf.control_dependencies(self._checks(inputs)):
            features = {k: tf.identity(v) for k, v in inputs.items()}
        if "padding_mask" in features:
            features["padding_mask"] = tf.cast(tf.not_equal(features["padding_mask"], 0), tf.int32)
        return self.outputs(self.model(features, training=False), features)

    def outputs(self, outputs, features):
        import tensorflow as tf

        model = self.model
        hook = getattr(model, "serving_outputs", None)
        activation = getattr(model, "activation", None)
        if callable(hook):
            result = hook(outputs)
        elif type(model).__name__ == "BertClassifier" and activation in (None, "linear", "softmax"):
            result = classification_outputs(outputs, model.class_names, activation)
        elif type(model).__name__ == "BertClassifier":
            result = {"scores": outputs}  # e.g. sigmoid (multi-label) heads: no single label.
        elif isinstance(outputs, dict):
            result = dict(outputs)
        elif isinstance(outputs, (list, tuple)):
            result = {f"output_{i}": o for i, o in enumerate(outputs)}
        else:
            result = {"outputs": outputs}
        if not isinstance(result, dict) or not result:
            raise ValueError(
                f"{type(model).__name__}.serving_outputs must return a non-empty dict of tensors, got {result!r}."
            )
        return {k: tf.cast(v, tf.float32) if v.dtype.is_floating else v for k, v in result.items()}

    def _checks(self, inputs):
        """Run-time checks of tokenized inputs: clear errors instead of wrong results."""
        import tensorflow as tf

        backbone = self.backbone
        token_ids = inputs["token_ids"]
        shape = tf.shape(token_ids)
        length = shape[-1]
        checks = [
            tf.debugging.assert_less_equal(
                length, backbone.max_sequence_length,
                message=f"sequences are longer than the model's max_sequence_length="
                f"{backbone.max_sequence_length}; truncate them (keeping the final [SEP])",
            ),
            tf.debugging.Assert(
                tf.logical_or(tf.equal(tf.reduce_prod(shape[:-1]), 0), tf.greater(length, 0)),
                ["sequences need at least one token ([CLS]); got length 0"],
            ),
            tf.debugging.assert_non_negative(token_ids, message="`token_ids` must be >= 0"),
            tf.debugging.assert_less(
                token_ids, backbone.vocabulary_size,
                message=f"`token_ids` must be < vocabulary_size={backbone.vocabulary_size}",
            ),
        ]
        for name in ("segment_ids", "padding_mask"):
            if name in inputs:
                checks.append(tf.debugging.assert_equal(
                    tf.shape(inputs[name]), shape, message=f"`{name}` must have the shape of `token_ids`"
                ))
        if "segment_ids" in inputs:
            checks += [
                tf.debugging.assert_non_negative(inputs["segment_ids"], message="`segment_ids` must be >= 0"),
                tf.debugging.assert_less(
                    inputs["segment_ids"], backbone.num_segments,
                    message=f"`segment_ids` must be < num_segments={backbone.num_segments}",
                ),
            ]
        return checks


class _QuestionAnswering(_Serving):
    """(question, context) in; the best answer span out."""

    def text_functions(self, pairs):
        return {"serving_default": _function(self.answer, question=[None], context=[None])}

    def answer(self, question, context):
        import tensorflow as tf

        question, context = _same_size(tf.reshape(question, [-1]), tf.reshape(context, [-1]), "question", "context")
        return self.from_text((question, context))

    def outputs(self, outputs, features):
        import tensorflow as tf

        from bertzoo.models.bert_question_answerer import MASKED_LOGIT
        from bertzoo.models.bert_question_answerer import context_positions

        logits = tf.cast(outputs, tf.float32)  # (batch, 2, length)
        starts, ends = logits[:, 0], logits[:, 1]
        length = tf.shape(starts)[1]
        # The decoding of `decode_spans` / `predict_spans`: start <= end, at
        # most MAX_ANSWER_LENGTH tokens, both ends in the context, best
        # start + end logit.
        allowed = tf.cast(context_positions(features["padding_mask"], features["segment_ids"]), tf.bool)
        allowed &= starts > MASKED_LOGIT / 2
        allowed &= (tf.range(length) > 0)[tf.newaxis]
        i, j = tf.range(length)[:, tf.newaxis], tf.range(length)[tf.newaxis]
        band = (j >= i) & (j - i < MAX_ANSWER_LENGTH)
        valid = band[tf.newaxis] & allowed[:, :, tf.newaxis] & allowed[:, tf.newaxis, :]
        scores = tf.where(valid, starts[:, :, tf.newaxis] + ends[:, tf.newaxis, :], -float("inf"))
        flat = tf.reshape(scores, [tf.shape(scores)[0], -1])
        best = tf.argmax(flat, axis=1, output_type=tf.int32)
        score = tf.gather(flat, best, batch_dims=1)
        found = tf.math.is_finite(score)
        start = tf.where(found, best // length, 0)
        end = tf.where(found, best % length, 0)
        positions = tf.ragged.range(start, tf.where(found, end + 1, 0))
        span_ids = tf.gather(features["token_ids"], positions, batch_dims=1)
        answer = self.preprocessor.tokenizer.detokenize(span_ids)
        return {
            "start_logits": starts, "end_logits": ends, "start": start, "end": end, "score": score,
            "answer": tf.where(found, answer, ""),
        }


class _MultipleChoice(_Serving):
    """(context, its choices) in; the chosen index out."""

    def text_functions(self, pairs):
        return {
            "serving_default": _function(self.choose, context=[None], choices=[None, self.model.num_choices])
        }

    def choose(self, context, choices):
        import tensorflow as tf

        context = tf.reshape(context, [-1])
        context, choices = _same_size(context, choices, "context", "choices", rows=True)
        features = self.model._preprocess((context, choices))  # The task's own inference packing.
        features = _trim(_as_int32(features))
        return self.outputs(self.model(features, training=False), features)

    def outputs(self, outputs, features):
        return classification_outputs(outputs)


class _TokenClassification(_Serving):
    """Sentences (split on whitespace) or pre-split words in; one label per word out."""

    def text_functions(self, pairs):
        return {
            "serving_default": _function(self.sentences, text=[None]),
            "serving_words": _function(self.words, words=[None, None]),
        }

    def sentences(self, text):
        import tensorflow as tf

        return self.words(tf.strings.split(tf.reshape(text, [-1])).to_tensor(""))

    def words(self, words):
        import tensorflow as tf

        from bertzoo.models.bert_token_classifier import align_word_tensors

        width = tf.shape(words)[1]
        index = tf.where(words != "", tf.range(width)[tf.newaxis], -1)
        features, word_at = align_word_tensors(
            self.preprocessor.tokenizer, words, index, self.preprocessor.sequence_length
        )
        features, word_at = _trim(_as_int32(features), word_at)
        per_token = classification_outputs(self.model(features, training=False), self.model.class_names)
        # Each word takes the prediction of its first sub-token (as
        # `predict_words` does); words cut off by the sequence length, and
        # padding, get label -1.
        positions = tf.where(word_at >= 0)
        targets = tf.stack([positions[:, 0], tf.cast(tf.gather_nd(word_at, positions), tf.int64)], axis=1)
        batch = tf.shape(words)[0]
        result = {"words": words}
        for name, value in per_token.items():
            if name == "label_names":
                continue
            fill = -1 if name == "label_ids" else 0.0
            empty = tf.fill(tf.concat([[batch, width], tf.shape(value)[2:]], axis=0), tf.cast(fill, value.dtype))
            result[name] = tf.tensor_scatter_nd_update(empty, targets, tf.gather_nd(value, positions))
        if self.model.class_names is not None:
            names = tf.constant([""] + [str(n) for n in self.model.class_names])
            result["label_names"] = tf.gather(names, result["label_ids"] + 1)
        return result

    def outputs(self, outputs, features):  # Token ids in: one prediction per token.
        return classification_outputs(outputs, self.model.class_names)


def _function(body, **inputs):
    """`tf.function(body)` over string inputs of the given names and shapes."""
    import tensorflow as tf

    specs = [tf.TensorSpec(shape, tf.string, name=name) for name, shape in inputs.items()]
    return _named_function(body.__name__, body, specs)


def _named_function(name, body, specs):
    """A `tf.function` of positional inputs; the signature's inputs are named
    after `specs`, and errors name the function `name`."""
    import tensorflow as tf

    def function(*values):
        return body(*values)

    function.__name__ = name
    return tf.function(function, input_signature=specs, autograph=False)


def _same_size(first, second, first_name, second_name, rows=False):
    """`first`, `second` after checking they hold one row each per example."""
    import tensorflow as tf

    size = tf.shape(second)[0] if rows else tf.size(second)
    check = tf.debugging.assert_equal(
        tf.size(first), size,
        message=f"`{first_name}` and `{second_name}` must have the same number of rows (one per example)",
    )
    with tf.control_dependencies([check]):
        return tf.identity(first), tf.identity(second)
