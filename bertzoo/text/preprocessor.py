"""Turns raw text (one segment or a pair) into BERT model inputs."""

import numbers
import weakref

import keras

from bertzoo.text.normalization import to_string_tensor
from bertzoo.text.sentencepiece_tokenizer import SentencePieceTokenizer
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.utils import private_api
from bertzoo.utils.checks import public_settings
from bertzoo.utils.optional import tf

TRUNCATE_MODES = ("round_robin", "waterfall")

# preprocessor -> (its settings, its traced tokenize-and-pack function); see
# `_graph_features`. Kept off the layer: a `tf.function` attribute would be
# saved into exports.
_GRAPH_FEATURES = weakref.WeakKeyDictionary()


def _check_sequence_length(sequence_length):
    """`sequence_length` as a plain `int` (NumPy integers accepted), or a clear error."""
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, numbers.Integral) or sequence_length < 3:
        raise ValueError(
            f"`sequence_length` must be an integer >= 3 (room for [CLS], [SEP], [SEP]), "
            f"got {sequence_length!r}. Pass e.g. sequence_length=128."
        )
    return int(sequence_length)


def _check_tokenizer(tokenizer):
    if not isinstance(tokenizer, (BertTokenizer, SentencePieceTokenizer)):
        raise ValueError(
            "`tokenizer` must be a bertzoo BertTokenizer or SentencePieceTokenizer, got "
            f"{type(tokenizer).__name__}. Build one with BertTokenizer(vocabulary) "
            "(WordPiece) or SentencePieceTokenizer(proto) (ALBERT)."
        )


def _packer(tokenizer, sequence_length, truncate):
    """keras-hub's packer adding `tokenizer`'s [CLS], [SEP] and [PAD] ids."""
    # Imported here: keras-hub imports TensorFlow when it is installed,
    # which `import bertzoo` on the JAX or torch backend should not.
    from keras_hub.layers import MultiSegmentPacker

    return MultiSegmentPacker(
        sequence_length=sequence_length,
        start_value=tokenizer.cls_token_id,
        end_value=tokenizer.sep_token_id,
        pad_value=tokenizer.pad_token_id,
        truncate=truncate,
    )


def _check_truncate(truncate):
    if truncate not in TRUNCATE_MODES:
        raise ValueError(
            f"Unknown `truncate` mode {truncate!r}. Use 'round_robin' (split the "
            "budget evenly between segments) or 'waterfall' (first segment first)."
        )


@keras.saving.register_keras_serializable(package="bertzoo")
class BertPreprocessor(keras.layers.Layer):
    """Tokenizes and packs text into `token_ids`, `segment_ids`, `padding_mask`.

    One segment becomes `[CLS] A [SEP]`; a pair `(a, b)` becomes
    `[CLS] A [SEP] B [SEP]` with segment ids 0 for the first part (including
    `[CLS]` and the first `[SEP]`) and 1 for the second. Sequences are padded
    with the `[PAD]` id to `sequence_length`; `padding_mask` is True on real
    tokens. Inputs too long are truncated (specials are always kept):

    - `"round_robin"`: the segments take one token each in turn until the
      budget is used, so a long segment cannot crowd out a short one.
    - `"waterfall"`: the first segment takes what it needs, the second gets
      what is left (possibly nothing).

    `call(x, y=None, sample_weight=None)` returns
    `keras.utils.pack_x_y_sample_weight(features, y, sample_weight)`, so the
    layer maps directly over a `tf.data.Dataset` of `text` or `(text, label)`
    elements. A dataset of unlabelled pairs must be mapped with
    `lambda a, b: preprocessor((a, b))`, since tf.data would pass `b` as `y`.

    This is a `tf.data` layer: run it in the input pipeline (or eagerly), not
    inside a jit-compiled (XLA) model. Eager and `tf.data` outputs are identical.

    Args:
        tokenizer: a `BertTokenizer` (WordPiece) or a `SentencePieceTokenizer`
            (ALBERT); `[CLS]`, `[SEP]` and padding ids come from it.
        sequence_length: output length, an integer >= 3.
        truncate: `"round_robin"` (default) or `"waterfall"`.

    Example:

    ```python
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "fox", "ran"]
    preprocessor = BertPreprocessor(BertTokenizer(vocab), sequence_length=8)
    out = preprocessor(("the fox", "ran"))
    out["token_ids"].numpy().tolist()
    # [2, 5, 6, 3, 7, 3, 0, 0]
    out["segment_ids"].numpy().tolist()
    # [0, 0, 0, 0, 1, 1, 0, 0]
    ds = tf.data.Dataset.from_tensor_slices((["the fox"], [1])).batch(1)
    features, label = next(iter(ds.map(preprocessor)))
    ```
    """

    def __init__(self, tokenizer, sequence_length=128, truncate="round_robin", **kwargs):
        super().__init__(**kwargs)
        private_api.accept_raw_inputs(self)
        _check_tokenizer(tokenizer)
        sequence_length = _check_sequence_length(sequence_length)
        _check_truncate(truncate)
        self._tokenizer = tokenizer
        self.packer = _packer(tokenizer, sequence_length, truncate)
        self.built = True

    @property
    def tokenizer(self):
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer):
        # A new packer too: it holds the [CLS], [SEP] and [PAD] ids, which the new vocabulary may place elsewhere.
        _check_tokenizer(tokenizer)
        packer = _packer(tokenizer, self.sequence_length, self.truncate)
        self._tokenizer = tokenizer
        self.packer = packer

    # The packer reads both on every call: set there, so a change after construction packs as it says.
    @property
    def sequence_length(self):
        return self.packer.sequence_length

    @sequence_length.setter
    def sequence_length(self, value):
        self.packer.sequence_length = _check_sequence_length(value)

    @property
    def truncate(self):
        return self.packer.truncate

    @truncate.setter
    def truncate(self, value):
        _check_truncate(value)
        self.packer.truncate = value

    def _segments(self, x):
        """Canonicalizes `x` to a tuple of 1 or 2 string tensors of equal rank."""
        segments = x if isinstance(x, tuple) else (x,)
        if not 1 <= len(segments) <= 2:
            raise ValueError(
                f"BertPreprocessor takes one segment or a pair (a, b), got {len(segments)} "
                "segments. Join the extra segments into one string, or pass a tuple of two."
            )
        tensors = []
        for i, segment in enumerate(segments):
            segment = to_string_tensor(segment, f"BertPreprocessor (segment {i})")
            if segment.shape.rank not in (0, 1):
                raise ValueError(
                    f"Segment {i} has shape {segment.shape}; pass a single string or a 1-D "
                    "batch of strings. For pairs, pass a tuple (first_texts, second_texts)."
                )
            tensors.append(segment)
        if len(tensors) == 2:
            a, b = tensors
            if a.shape.rank != b.shape.rank or not a.shape.is_compatible_with(b.shape):
                raise ValueError(f"The two segments must have the same shape, got {a.shape} and {b.shape}.")
        return tuple(tensors)

    def call(self, x, y=None, sample_weight=None):
        segments = self._segments(x)
        features = self._graph_features()(*segments) if tf.inside_function() else self._features(segments)
        return keras.utils.pack_x_y_sample_weight(features, y, sample_weight)

    def graph_settings(self):
        """What a function traced from this preprocessor read from it: the
        tokenizer and packer objects, their settings and the tokenizer's
        resources. A traced function whose settings differ from these now
        must be traced again (`_graph_features`, and the tasks' traced
        preprocessing, `Task._graph_preprocess`)."""
        # The objects themselves, not their ids (an id can be reused once one is gone).
        settings = (self.tokenizer, self.packer, self.sequence_length, self.truncate, public_settings(self))
        settings += (public_settings(self.tokenizer),)
        # A resource the tokenizer rebuilt since (SentencePiece's, after `tf.random.set_seed`) retraces:
        # the traced function holds the old one's handle.
        return settings + tuple(self.tokenizer.export_resources())

    def _graph_features(self):
        """`_features` as one `tf.function` per preprocessor, traced once per
        input shape. Every new `tf.data` pipeline (each `fit`, `evaluate` or
        resumed run on raw text) traces its map function again, and
        tokenizing and packing is most of that trace. `python -m
        benchmarks.text_pipeline --repeats 3` (2-core Xeon, `tiny` preset,
        three runs): a process's later pipelines built and gave their first
        batch in 0.46-0.56 s against 0.98-1.14 s traced inline each time;
        its first one in 1.31-1.43 s against 1.22-1.37 s.

        Traced again when a setting of the preprocessor or its tokenizer
        (`lowercase`, ...) or either object changed since, as eager calls
        would follow it."""
        settings = self.graph_settings()
        cached = _GRAPH_FEATURES.get(self)
        if cached is None or cached[0] != settings:
            # A weak reference: the function must not keep its own key alive.
            preprocessor = weakref.ref(self)
            function = tf.function(lambda *segments: preprocessor()._features(segments), autograph=False)
            cached = _GRAPH_FEATURES[self] = (settings, function)
        return cached[1]

    def _features(self, segments):
        token_segments = tuple(self.tokenizer.tokenize(segment) for segment in segments)
        token_ids, segment_ids = self.packer(token_segments)
        # Outside tf.data the packer runs in python and returns arrays; make
        # both paths give int32 tensors with a static last dimension (also for
        # an empty batch, where the python path loses it).
        shape = [self.sequence_length] if segments[0].shape.rank == 0 else [-1, self.sequence_length]
        token_ids = tf.reshape(tf.cast(token_ids, tf.int32), shape)
        segment_ids = tf.reshape(tf.cast(segment_ids, tf.int32), shape)
        # Real tokens run up to the closing [SEP]; only what follows it is
        # padding (a literal "[PAD]" read from the text, with
        # `special_tokens_in_strings`, is a real token).
        is_pad = tf.equal(token_ids, self.tokenizer.pad_token_id)
        features = {
            "token_ids": token_ids,
            "segment_ids": segment_ids,
            "padding_mask": tf.math.cumsum(tf.cast(~is_pad, tf.int32), axis=-1, reverse=True) > 0,
        }
        return features

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
                "sequence_length": self.sequence_length,
                "truncate": self.truncate,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("tokenizer"), dict):
            config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        return cls(**config)
