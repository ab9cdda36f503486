"""Token classification (tagging): one label per word, e.g. named entities."""

import keras
import numpy as np

from bertzoo.layers.dense import Dense
from bertzoo.layers.dropout import Dropout
from bertzoo.models.head_utils import IGNORE_LABEL
from bertzoo.models.head_utils import MaskedAccuracy
from bertzoo.models.head_utils import check_class_ids
from bertzoo.models.head_utils import check_classes
from bertzoo.models.head_utils import class_ids_checked_in_graph
from bertzoo.models.head_utils import class_ids_of_names
from bertzoo.models.head_utils import class_ids_of_names_in_graph
from bertzoo.models.head_utils import guarded
from bertzoo.models.head_utils import masked_loss
from bertzoo.models.head_utils import unused_pooler_ok
from bertzoo.models.raw_inputs import eager_strings_as_arrays
from bertzoo.models.serving import TextServing
from bertzoo.models.serving import as_int32
from bertzoo.models.serving import classification_outputs
from bertzoo.models.serving import serving_call
from bertzoo.models.serving import string_function
from bertzoo.models.serving import trim_padding
from bertzoo.models.task import Task
from bertzoo.models.task import deterministic_preprocess
from bertzoo.text.normalization import regex_split
from bertzoo.utils.checks import check_rate
from bertzoo.utils.optional import tf

# RE2: exactly the characters Python's `str.split()` splits on (`predict_words`),
# so an exported model splits raw text into the same words (`\p{Z}` covers
# U+00A0, U+3000 and the other Unicode spaces; `tf.strings.split` only ASCII).
_WHITESPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f\x{85}\p{Z}]+"


def _split_sentences(words):
    """Canonical list of word lists; a sentence given as one string is split on whitespace."""
    words = eager_strings_as_arrays(words)
    if isinstance(words, (str, bytes)):
        words = [words]
    if isinstance(words, np.ndarray) and words.ndim == 2:
        words = words.tolist()
    rows = []
    for i, sentence in enumerate(words):
        try:
            if isinstance(sentence, bytes):
                sentence = sentence.decode("utf-8")
            if isinstance(sentence, str):
                sentence = sentence.split()
            sentence = [w.decode("utf-8") if isinstance(w, bytes) else w for w in sentence]
        except UnicodeDecodeError as error:
            raise ValueError(
                f"Sentence {i} holds bytes that are not UTF-8 ({error}). Decode the text with its own encoding "
                "first (e.g. raw.decode('latin-1')), then pass strings."
            ) from error
        if not all(isinstance(w, str) for w in sentence):
            raise ValueError(
                f"Sentence {i} holds a non-string word; pass each sentence as a list of word strings "
                "(or one string, split on whitespace)."
            )
        rows.append(sentence)
    return rows


def _pad_words(words, labels=None):
    """Lists of words (and per-word labels) -> `(N, W)` arrays padded with
    `""` (a word with no tokens) and `IGNORE_LABEL`."""
    rows = _split_sentences(words)
    width = max([len(r) for r in rows] + [1])
    padded_words = np.array([r + [""] * (width - len(r)) for r in rows], dtype=str).reshape(len(rows), width)
    if labels is None:
        return padded_words, None
    if len(labels) != len(rows):
        raise ValueError(f"Got {len(rows)} sentences but {len(labels)} label lists.")
    padded_labels = np.full((len(rows), width), IGNORE_LABEL, dtype="int32")
    for i, (sentence, row) in enumerate(zip(rows, labels)):
        values = np.asarray(row).reshape(-1)
        if len(values) != len(sentence):
            raise ValueError(
                f"Sentence {i} has {len(sentence)} words but {len(values)} labels: give one label per word."
            )
        whole = values.dtype.kind in "iub" or (values.dtype.kind == "f" and np.all(values == np.round(values)))
        if values.size and not whole:
            raise ValueError(
                f"Sentence {i}'s labels must be whole-number class ids, got {values.tolist()[:5]}. Label names "
                "are mapped by a model built with `class_names=[...]` (its fit and evaluate take them)."
            )
        padded_labels[i, : len(values)] = values
    return padded_words, padded_labels


def align_word_tensors(tokenizer, words, labels, sequence_length, weights=None):
    """TensorFlow core of `align_word_labels` (runs in `tf.data`).

    `words`: string tensor `(batch, W)`, `""` for padding; `labels`: int
    `(batch, W)`. Returns `(features, token_labels)` of length
    `sequence_length`; with per-word `weights` `(batch, W)`, also the token
    weights: each word's on its first sub-token, 0 elsewhere.
    """
    words = tf.convert_to_tensor(words)
    labels = tf.cast(labels, tf.int32)
    batch = tf.shape(words)[0]
    pieces = tokenizer.tokenize(tf.reshape(words, [-1]))  # (batch * W, pieces of that word)
    counts = pieces.row_lengths()
    first = tf.ragged.range(counts).flat_values == 0
    per_sentence = tf.reduce_sum(tf.reshape(counts, tf.shape(words, out_type=counts.dtype)), axis=1)
    budget = sequence_length - 2
    ids = tf.RaggedTensor.from_row_lengths(pieces.flat_values, per_sentence, validate=False)[:, :budget]

    def pack(values, start, end, pad):
        column = tf.RaggedTensor.from_tensor(tf.ones([batch, 1], values.dtype))
        values = tf.concat([column * start, values, column * end], axis=1)
        return values.to_tensor(default_value=pad, shape=[None, sequence_length])

    def on_first_pieces(values, elsewhere):
        """Per-word `values` on each word's first sub-token, `elsewhere` on the others."""
        flat = tf.where(first, tf.repeat(tf.reshape(values, [-1]), counts), elsewhere)
        sentences = tf.RaggedTensor.from_row_lengths(flat, per_sentence, validate=False)
        return pack(sentences[:, :budget], elsewhere, elsewhere, elsewhere)

    token_ids = pack(ids, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    token_labels = on_first_pieces(labels, IGNORE_LABEL)
    lengths = tf.minimum(per_sentence, budget) + 2
    padding_mask = tf.sequence_mask(lengths, sequence_length)
    features = {
        "token_ids": token_ids,
        "segment_ids": tf.zeros_like(token_ids),
        "padding_mask": padding_mask,
    }
    if weights is None:
        return features, token_labels
    return features, token_labels, on_first_pieces(tf.cast(weights, tf.float32), 0.0)


def align_word_labels(tokenizer, words, labels=None, sequence_length=128):
    """Tokenizes pre-split words and moves word labels onto WordPiece tokens.

    Each word is tokenized on its own; its first sub-token gets the word's
    label and its other sub-tokens, `[CLS]`, `[SEP]` and padding get -100
    (ignored by the loss and the accuracy). Sequences longer than
    `sequence_length - 2` tokens are cut at the end (their last words lose
    their labels).

    Args:
        tokenizer: a `bertzoo.text.BertTokenizer` (e.g. `model.preprocessor.tokenizer`).
        words: a list of sentences, each a list of words (a string is split
            on whitespace).
        labels: a list of per-word integer label lists, or None.
        sequence_length: length of the packed sequences.

    Returns:
        `(features, token_labels)`: a dict of int32 arrays `token_ids`,
        `segment_ids`, `padding_mask` of shape `(N, sequence_length)`, and the
        int32 token labels of the same shape (None without `labels`).

    Example:

    ```python
    features, token_labels = align_word_labels(
        model.preprocessor.tokenizer, [["John", "lives", "in", "Reykjavik"]], [[1, 0, 0, 2]])
    model.fit(features, token_labels)
    ```
    """
    padded_words, padded_labels = _pad_words(words, labels)
    given = padded_labels is not None
    if not given:
        padded_labels = np.full(padded_words.shape, IGNORE_LABEL, dtype="int32")
    features, token_labels = align_word_tensors(tokenizer, padded_words, padded_labels, sequence_length)
    features = {k: np.asarray(v).astype("int32") for k, v in features.items()}
    return features, (np.asarray(token_labels) if given else None)


def _check_per_word_specs(words, labels, weights=None):
    """Raises a ValueError when a tagger's dataset gives labels (or
    weights) that cannot be one per word: their rank is not the words'."""
    if not isinstance(labels, tf.TensorSpec) or labels.shape.rank is None:
        return
    if labels.shape.rank != words.shape.rank:
        hint = (
            "Split sentences into words first (e.g. dataset.map(lambda text, labels: (tf.strings.split(text), "
            "labels)))."
            if labels.shape.rank > words.shape.rank
            else "A label per sentence is a classifier's (bertzoo.BertClassifier), not a tagger's."
        )
        raise ValueError(
            "A tagger's tf.data.Dataset gives one label per word: labels of the words' shape, got words of shape "
            f"{words.shape} and labels of shape {labels.shape}. {hint}"
        )
    rank = None if not isinstance(weights, tf.TensorSpec) else weights.shape.rank
    if rank is not None and rank not in (words.shape.rank, words.shape.rank - 1):
        raise ValueError(
            "A tagger's sample weights are one per word (the words' shape) or one per sentence; got words of shape "
            f"{words.shape} and weights of shape {weights.shape}."
        )


def _one_label_per_word(words, labels, *weights):
    """A dataset element (a sentence, or a padded batch) behind an in-graph
    check that its labels (and per-word weights) have the words' shape, as
    `_pad_words` checks in-memory ones: otherwise padding would silently
    drop labels or leave words without one."""
    checks = [(labels, "labels")] + [(w, "weights") for w in weights if w.shape.rank == words.shape.rank]
    for values, name in checks:
        shapes = tf.stack([tf.shape(words, out_type=tf.int64), tf.shape(values, out_type=tf.int64)])
        same = tf.fill(tf.shape(shapes), tf.reduce_all(tf.equal(shapes[0], shapes[1])))
        message = (
            f"Each word of a tagger's sentence needs one of the {name} (in memory: 'Sentence i has n words but m "
            f"{name}'); an element of this tf.data.Dataset has words of one shape and {name} of another (words' "
            "first):"
        )
        words = guarded(words, (same, message, shapes))
    return (words, labels, *weights)


def _check_tagger_loss(loss):
    """Refuses a sparse cross-entropy that would read the -100 of unlabelled
    positions as a class id: an opaque error without XLA, NaN losses with it."""
    names = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")
    plain = (isinstance(loss, str) and loss in names) or getattr(loss, "__name__", None) in names
    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        plain = getattr(loss, "ignore_class", None) != IGNORE_LABEL
    if plain:
        raise ValueError(
            f"A tagger's labels hold {IGNORE_LABEL} where a position has no label ([CLS], [SEP], padding, a word's "
            "later pieces), which this sparse cross-entropy would read as a class id. Pass "
            f"keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class={IGNORE_LABEL}), or leave "
            "loss='auto' (that loss, averaged over labelled positions)."
        )


def _dense_batches(dataset):
    """A dataset of ragged batches (`ragged_batch`, or `tf.strings.split` of
    batched texts) padded as `padded_batch` pads: words with "", labels with
    -100 ("" for names), weights with 0."""
    if not any(isinstance(s, tf.RaggedTensorSpec) for s in tf.nest.flatten(dataset.element_spec)):
        return dataset

    def dense(value):
        return value.to_tensor(_padding_value(value.dtype)) if isinstance(value, tf.RaggedTensor) else value

    def padded(*element):
        if len(element) == 1:
            return dense(element[0])
        words, *per_word = element
        # Each sentence's labels (and weights) as many as its words, checked before padding hides it.
        if isinstance(words, tf.RaggedTensor):
            lengths = words.row_lengths()
            for values, name in zip(per_word, ("labels", "weights")):
                if isinstance(values, tf.RaggedTensor) and values.ragged_rank == 1:
                    same = tf.equal(values.row_lengths(), lengths)
                    message = (
                        f"Each word of a tagger's sentence needs one of the {name} (in memory: 'Sentence i has n words "
                        f"but m {name}'); in this ragged tf.data batch, these (words, {name}) counts differ:"
                    )
                    words = guarded(words, (same, message, tf.stack([lengths, values.row_lengths()], axis=1)))
        return tuple(dense(part) for part in (words, *per_word))

    return dataset.map(padded)


def _padding_value(dtype):
    if dtype == tf.string:
        return tf.constant("", tf.string)
    return tf.constant(IGNORE_LABEL if dtype.is_integer else 0, dtype)


def _word_index(words):
    """Each word's index in its sentence, IGNORE_LABEL for padding (`""`)."""
    words = tf.convert_to_tensor(words)
    return tf.where(words != "", tf.range(tf.shape(words)[1])[tf.newaxis], IGNORE_LABEL)


@keras.saving.register_keras_serializable(package="bertzoo")
class BertTokenClassifier(Task):
    """A token classifier: a dense layer over every token's final hidden
    state, giving logits `(batch, length, num_classes)` (BERT paper, Fig. 4d,
    as used for CoNLL-2003 NER).

    Raw inputs are pre-split words with one label per word:
    `fit(words, labels)` with `words` a list of word lists and `labels` a list
    of label lists; or a `tf.data.Dataset` of `(words, labels)`, each element
    one sentence (padded into batches here) or a batch padded with `""`. The
    first sub-token of each word carries its label, the
    other positions are ignored (see `align_word_labels`). Tokenized inputs
    take token labels with -100 where there is no target. `predict_words`
    gives one prediction per word.

    Args:
        backbone: a `bertzoo.BertBackbone`.
        num_classes: number of labels.
        preprocessor: a `bertzoo.text.BertPreprocessor` (its tokenizer and
            `sequence_length` are used), or None for tokenized inputs.
        dropout: dropout on the hidden states.
        class_names: optional label names, returned by `predict_words`.

    Example:

    ```python
    model = bertzoo.BertTokenClassifier.from_preset(
        "tiny", num_classes=3, class_names=["O", "PER", "LOC"])
    model.fit([["John", "lives", "in", "Reykjavik"]], [[1, 0, 0, 2]])
    model.predict_words([["Anna", "visits", "Oslo"]])  # [['PER', 'O', 'LOC']] once trained
    ```
    """

    weightless_head_arguments = Task.weightless_head_arguments + ("class_names",)

    def __init__(self, backbone, num_classes, preprocessor=None, dropout=0.1, class_names=None, **kwargs):
        self.check_head_arguments(num_classes, dropout=dropout, class_names=class_names)
        policy = backbone.dtype_policy
        head_dtype = "float32" if policy.compute_dtype != "float32" else policy
        self.output_dropout = Dropout(dropout, dtype=policy, name="output_dropout")
        self.output_dense = Dense(
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=head_dtype,
            name="logits",
        )
        inputs = backbone.input
        outputs = self.compute_head_outputs(inputs, backbone(inputs))
        super().__init__(inputs=inputs, outputs=outputs, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_classes = num_classes
        self.dropout = float(dropout)
        self.class_names = list(class_names) if class_names is not None else None

    per_token_outputs = True

    def compute_head_outputs(self, inputs, features, training=None):
        sequence = self.output_dropout(features["sequence_output"], training=training)
        return self.output_dense(sequence)

    @classmethod
    def check_head_arguments(cls, num_classes, dropout=0.1, class_names=None):
        check_classes(num_classes, class_names)
        check_rate("dropout", dropout)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "dropout": self.dropout,
            "class_names": self.class_names,
        }

    def default_loss(self):
        return masked_loss()

    def compile(self, optimizer="auto", loss="auto", *args, **kwargs):
        _check_tagger_loss(loss)
        super().compile(optimizer, loss, *args, **kwargs)

    def default_metrics(self):
        return [MaskedAccuracy(name="accuracy")]

    def fit(self, *args, **kwargs):
        if kwargs.get("class_weight") is not None:
            raise ValueError(
                "BertTokenClassifier.fit does not take `class_weight`: Keras reads it as one class per example "
                "and would weigh token positions instead. Weigh the classes per word with `sample_weight`, e.g. "
                "sample_weight=[[class_weight[label] for label in sentence] for sentence in labels]."
            )
        with unused_pooler_ok():
            return super().fit(*args, **kwargs)

    # --- Raw inputs -------------------------------------------------------
    def _raw_to_tensors(self, x, y):
        rows = _split_sentences(x)
        words, labels = _pad_words(rows, None if y is None else [self._word_label_ids(row) for row in y])
        # Padding and an empty word are both "": the real sentence lengths
        # check per-word weights (`_raw_sample_weight` gets these words next).
        object.__setattr__(self, "_sentence_lengths", (words, [len(r) for r in rows]))
        return words, labels

    def _raw_sample_weight(self, sample_weight, x):
        # Per-word weights (a list per sentence) padded with 0 to the padded words' width.
        known = getattr(self, "_sentence_lengths", None)
        object.__setattr__(self, "_sentence_lengths", None)  # Read once: no reference to the words kept.
        if sample_weight is None or not any(np.ndim(w) for w in sample_weight):  # None, or one per sentence.
            return sample_weight
        rows = [np.asarray(w, "float32").reshape(-1) for w in sample_weight]
        words = np.asarray(x)
        if len(rows) != len(words):
            raise ValueError(f"Got {len(words)} sentences but {len(rows)} weight lists.")
        padded = np.zeros(words.shape, "float32")
        lengths = known[1] if known is not None and known[0] is x else [int(np.sum(row != "")) for row in words]
        for i, row in enumerate(rows):
            if len(row) != lengths[i]:
                raise ValueError(
                    f"Sentence {i} has {lengths[i]} words but {len(row)} weights: give one weight per word, or "
                    "one per sentence."
                )
            padded[i, : len(row)] = row
        return padded

    def _checked_labels(self, y, features=None):
        # Token labels of tokenized inputs: one per token, and class ids
        # where the loss takes them (not soft targets under a loss of your own).
        token_ids = features.get("token_ids") if isinstance(features, dict) else None
        labels_shape, tokens_shape = np.shape(y)[:2], np.shape(token_ids)[:2]
        if token_ids is not None and hasattr(y, "__len__") and labels_shape != tokens_shape:
            raise ValueError(
                f"Token labels of shape {labels_shape} do not match the tokenized inputs' {tokens_shape}: tokenized "
                "inputs take one label per token (-100 where there is none). Per-word labels go with raw words "
                "(fit(words, labels)), or through bertzoo.align_word_labels(tokenizer, words, labels, sequence_length)."
            )
        if isinstance(getattr(self, "loss", None), keras.losses.SparseCategoricalCrossentropy):
            check_class_ids(y, self.num_classes, ignore=IGNORE_LABEL)
        return y

    def _word_label_ids(self, labels):
        """One sentence's per-word labels as class ids: names (with
        `class_names`) map to their index, ids pass through."""
        labels = [v.decode("utf-8") if isinstance(v, bytes) else v for v in np.asarray(labels).reshape(-1).tolist()]
        if not any(isinstance(v, str) for v in labels):
            check_class_ids(labels, self.num_classes, ignore=IGNORE_LABEL)  # Before int32 padding rounds 1.5.
            return labels
        # "" is no label (as padding in a dataset's batches), as -100 is among ids.
        named = [str(v) for v in labels if v != ""]
        ids = iter(class_ids_of_names(named, self.class_names, "tagger", kind="word labels") if named else [])
        return [IGNORE_LABEL if v == "" else next(ids) for v in labels]

    def _batched(self, dataset, batch_size):
        # One example is a sentence: a vector of words (and of labels).
        # Sentences of different lengths are padded as `_pad_words` pads:
        # words with "", labels with -100 ("" for names), weights with 0.
        words = tf.nest.flatten(dataset.element_spec)[0]
        if words.dtype != tf.string or words.shape.rank not in (1, 2):
            raise ValueError(
                "A tagger's tf.data.Dataset gives words: each element one sentence's words (a vector of "
                'strings, with a vector of per-word labels) or a batch of them (batch, words), padded with ""; '
                f"got {words.dtype.name} elements of shape {words.shape}. Split sentences into words first "
                "(e.g. dataset.map(lambda text, labels: (tf.strings.split(text), labels)))."
            )
        dataset = _dense_batches(dataset)
        spec = dataset.element_spec
        if isinstance(spec, tuple) and len(spec) > 1:  # (words, labels[, weights])
            _check_per_word_specs(*spec)
            dataset = dataset.map(tf.autograph.experimental.do_not_convert(_one_label_per_word))
        if words.shape.rank == 2:
            return dataset

        padded = tf.nest.map_structure(lambda spec: _padding_value(spec.dtype), dataset.element_spec)
        return dataset.padded_batch(batch_size, padding_values=padded)

    def _labels_checked_in_graph(self, labels):
        # A dataset's word labels, batch by batch, as `_word_label_ids`
        # checks in-memory ones: names (with `class_names`) become ids, ""
        # (padding) becomes -100; ids must be classes or -100.
        if not hasattr(labels, "dtype"):
            return labels
        if labels.dtype == tf.string:
            padding = tf.equal(labels, "")
            named = tf.where(padding, tf.constant(str((self.class_names or [""])[0])), labels)
            ids = class_ids_of_names_in_graph(named, self.class_names, "tagger", kind="word labels")
            return tf.where(padding, IGNORE_LABEL, ids)
        return class_ids_checked_in_graph(labels, self.num_classes, ignore=IGNORE_LABEL)

    @deterministic_preprocess
    def preprocess(self, x, y=None, sample_weight=None, preprocessor=None):
        """Words `(batch, W)` (`""` pads) and per-word labels -> features and
        token labels (see `align_word_tensors`); `sample_weight` is one
        weight per sentence `(batch,)` or per word `(batch, W)`. `predict_words` and the
        exported signatures pass word indices as labels: the token labels
        then say which word each token starts."""
        preprocessor = self.preprocessor if preprocessor is None else preprocessor
        labels = tf.fill(tf.shape(x), IGNORE_LABEL) if y is None else y
        if sample_weight is None:
            features, token_labels = align_word_tensors(preprocessor.tokenizer, x, labels, preprocessor.sequence_length)
        else:
            sample_weight = tf.cast(sample_weight, tf.float32)
            if sample_weight.shape.rank == 1:  # One weight per sentence: on each of its words.
                sample_weight = sample_weight[:, tf.newaxis] * tf.ones(tf.shape(x), tf.float32)
            # Each word's weight on its first sub-token, as its label is (the only token the loss counts).
            features, token_labels, sample_weight = align_word_tensors(
                preprocessor.tokenizer, x, labels, preprocessor.sequence_length, weights=sample_weight
            )
        return keras.utils.pack_x_y_sample_weight(features, None if y is None else token_labels, sample_weight)

    def predict_words(self, words, batch_size=None, verbose=0):
        """One prediction per word: the class (name, with `class_names`) of
        its first sub-token; None for words cut off by the sequence length
        or without any token.

        Example:

        ```python
        model.predict_words([["Anna", "visits", "Oslo"], "Olaf left"])  # [['PER', 'O', 'LOC'], ['PER', 'O']]
        ```
        """
        if self.preprocessor is None:
            raise ValueError("predict_words needs a preprocessor; this model takes tokenized inputs.")
        rows = _split_sentences(words)
        if not rows:
            return []  # Keras's predict cannot run zero rows.
        padded, _ = _pad_words(rows)
        features, word_at = self.preprocess(padded, _word_index(padded))
        features = {k: np.asarray(v) for k, v in features.items()}
        predicted = np.argmax(self.predict(features, batch_size=batch_size, verbose=verbose), axis=-1)
        word_at = np.asarray(word_at)
        results = []
        for row, sentence in enumerate(rows):
            labels = [None] * len(sentence)
            for position in np.flatnonzero(word_at[row] >= 0):
                label = int(predicted[row, position])
                labels[word_at[row, position]] = self.class_names[label] if self.class_names else label
            results.append(labels)
        return results

    # --- Serving ----------------------------------------------------------
    def serving_signatures(self, preprocessor=None, pairs="auto"):
        """With a preprocessor: `serving_default(text)` (words split on
        whitespace) and `serving_words(words[batch, words])` (`""` pads),
        returning per word, as `predict_words` predicts: `words`, `logits`,
        `probabilities`, `label_ids` (-1 for padding and words cut off) and,
        with `class_names`, `label_names` (`""` there). `serving_tokenized`:
        one prediction per token."""
        serving = TextServing(
            self, preprocessor, outputs=lambda outputs, features: classification_outputs(outputs, self.class_names)
        )
        functions = serving.tokenized_signatures()
        if preprocessor is None:
            return functions

        def words(words):
            features, word_at = self.preprocess(words, _word_index(words), preprocessor=preprocessor)
            features, word_at = trim_padding(as_int32(features), word_at)
            per_token = classification_outputs(serving_call(self, features), self.class_names)
            # Each word takes the prediction of its first sub-token (as
            # `predict_words` does); words cut off by the sequence length, and
            # padding, get label -1.
            positions = tf.where(word_at >= 0)
            targets = tf.stack([positions[:, 0], tf.cast(tf.gather_nd(word_at, positions), tf.int64)], axis=1)
            batch, width = tf.shape(words)[0], tf.shape(words)[1]
            result = {"words": words}
            for name, value in per_token.items():
                if name == "label_names":
                    continue
                fill = -1 if name == "label_ids" else 0.0
                empty = tf.fill(tf.concat([[batch, width], tf.shape(value)[2:]], axis=0), tf.cast(fill, value.dtype))
                result[name] = tf.tensor_scatter_nd_update(empty, targets, tf.gather_nd(value, positions))
            if self.class_names is not None:
                names = tf.constant([""] + [str(n) for n in self.class_names])
                result["label_names"] = tf.gather(names, result["label_ids"] + 1)
            return serving.finish(result)

        def sentences(text):
            return words(regex_split(text, _WHITESPACE).to_tensor(""))

        functions["serving_default"] = string_function(sentences, text=[None])
        functions["serving_words"] = string_function(words, words=[None, None])
        return functions
