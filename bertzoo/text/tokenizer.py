"""BERT WordPiece tokenization as a Keras layer.

Pre-tokenization follows the reference BERT `BasicTokenizer` and the HF
`tokenizers` `BertNormalizer` + `BertPreTokenizer`, written with TensorFlow
string ops so it runs inside `tf.data` graphs. The WordPiece step itself is
`tensorflow_text.FastWordpieceTokenizer`. Where the two references disagree we
follow HF `tokenizers`, which is what checkpoints are usually served with
(capital sigma always lower-cases to "σ"; private-use characters are deleted),
except for its CJK Extension E range, which starts 256 code points late there;
we use BERT's range.

Why not `keras_hub.tokenizers.WordPieceTokenizer` for the whole pipeline: its
pre-tokenization differs from BERT's on real-world text. It splits words at
zero-width and other format characters (BERT deletes them, so "co\u00adop"
with a soft hyphen stays one word, and so do emoji ZWJ sequences), does not
treat non-ASCII spaces such as U+00A0 as whitespace, lower-cases with NFKC case
folding ("straße" becomes "strasse", "…" becomes "...", Hangul jamo are
re-composed after accent stripping), and caps words at 100 UTF-8 bytes instead
of 100 characters. `tests/text/test_text_tokenizer.py` pins these cases.
"""

import os
import re

import keras

from bertzoo.text.normalization import merge_inner_dims
from bertzoo.text.normalization import normalize
from bertzoo.text.normalization import normalize_characters
from bertzoo.text.normalization import pretokenize
from bertzoo.text.normalization import regex_split
from bertzoo.text.normalization import split_words
from bertzoo.text.normalization import to_string_tensor
from bertzoo.text.normalization import without_nul
from bertzoo.text.token_lookup import TokenLookupMixin
from bertzoo.text.vocabulary import check_vocabulary
from bertzoo.text.vocabulary import load_vocabulary
from bertzoo.utils import private_api
from bertzoo.utils.optional import tf
from bertzoo.utils.optional import tf_text

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
SUFFIX_INDICATOR = "##"


@keras.saving.register_keras_serializable(package="bertzoo")
class BertTokenizer(TokenLookupMixin, keras.layers.Layer):
    """BERT WordPiece tokenizer layer: strings in, int32 token ids out.

    Applies BERT's rules: deletes control characters, optionally lower-cases
    and strips accents, splits on whitespace, punctuation and CJK ideographs,
    maps words longer than `max_chars_per_word` characters to `[UNK]`, then
    splits each word into the longest matching vocabulary pieces (`##`-prefixed
    after the first). A word that cannot be covered by pieces becomes `[UNK]`.

    Runs eagerly and inside `tf.data` / `tf.function` with identical ids. A
    batch of strings gives a `tf.RaggedTensor` of shape `[batch, None]`; a
    single string gives a dense 1-D `tf.Tensor`.

    Args:
        vocabulary: list of token strings, or the path of a `vocab.txt` with one
            token per line. Must contain `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]` and
            `[MASK]`.
        lowercase: lower-case inputs (BERT "uncased" checkpoints).
        strip_accents: remove accents ("café" -> "cafe"). `None` (default)
            follows `lowercase`, matching BERT uncased / HF `tokenizers`.
        max_chars_per_word: words with more characters than this become
            `[UNK]` (BERT's `max_input_chars_per_word`).
        split_on_cjk: make every CJK ideograph its own word (BERT's
            `tokenize_chinese_chars`).
        special_tokens_in_strings: read `[CLS]`, `[SEP]`, `[PAD]`, `[MASK]`
            and `[UNK]` written in the text as those tokens (as Hugging Face
            tokenizers do), e.g. for fill-mask inputs. Default False, as in
            keras-hub: text from users then cannot inject control tokens (a
            review containing "[SEP]" stays three ordinary pieces).

    Example:

    ```python
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
             "the", "fox", "run", "##s", "."]
    tokenizer = BertTokenizer(vocab)
    tokenizer(["The fox runs.", "fox"]).to_list()
    # [[5, 6, 7, 8, 9], [6]]
    tokenizer.detokenize([[5, 6, 7, 8]]).numpy()
    # array([b'the fox runs'], dtype=object)
    ```
    """

    PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN = PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN

    def __init__(
        self,
        vocabulary,
        lowercase=True,
        strip_accents=None,
        max_chars_per_word=100,
        split_on_cjk=True,
        special_tokens_in_strings=False,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        private_api.accept_raw_inputs(self)
        self._check_text_options(
            strip_accents,
            lowercase=lowercase,
            split_on_cjk=split_on_cjk,
            special_tokens_in_strings=special_tokens_in_strings,
        )
        if isinstance(max_chars_per_word, bool) or not isinstance(max_chars_per_word, int) or max_chars_per_word < 1:
            raise ValueError(f"`max_chars_per_word` must be a positive integer, got {max_chars_per_word!r}.")
        if isinstance(vocabulary, (str, os.PathLike)):
            source = f"file '{os.fspath(vocabulary)}'"
            vocabulary = load_vocabulary(vocabulary)
        else:
            source = "vocabulary list"
            if vocabulary is None or isinstance(vocabulary, (bytes, dict)):
                raise ValueError(
                    "`vocabulary` must be a list of token strings or the path of a "
                    f"vocab.txt file, got {type(vocabulary).__name__}."
                )
            vocabulary = list(vocabulary)
            check_vocabulary(vocabulary, source)
        # Immutable containers: the WordPiece model below is built from this
        # list once, so later edits would silently desynchronize them.
        self._store_vocabulary(vocabulary, {t: i for i, t in enumerate(vocabulary)})
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.max_chars_per_word = max_chars_per_word
        self.split_on_cjk = split_on_cjk
        self.special_tokens_in_strings = special_tokens_in_strings
        for token in SPECIAL_TOKENS:
            if token not in self._token_to_id:
                raise ValueError(
                    f"The {source} has no '{token}' token, which BERT models need "
                    f"({', '.join(SPECIAL_TOKENS)}). Add it to the vocabulary (the "
                    "BERT layout puts [PAD] at 0 and [UNK], [CLS], [SEP], [MASK] at "
                    "100-103), or build one with bertzoo.text.build_vocabulary()."
                )
        # Built here, eagerly: tf-text resources cannot be created while tf.data
        # traces a map function.
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=vocabulary,
            suffix_indicator=SUFFIX_INDICATOR,
            unknown_token=UNK_TOKEN,
            no_pretokenization=True,
            support_detokenization=True,
            # Lengths are limited in characters before this runs (as BERT does,
            # with `max_chars_per_word` read on each call, so it can be changed);
            # this byte cap must never trigger first.
            max_bytes_per_word=2**31 - 1,
            token_out_type=tf.int32,
        )
        self.built = True

    def export_resources(self):
        """TensorFlow resources a SavedModel must track to run this tokenizer:
        none (the WordPiece model is a constant in the graph)."""
        return []

    # --- Tokenization -----------------------------------------------------
    def tokenize(self, strings):
        """Token ids for `strings`.

        Args:
            strings: a python string, a list of strings, or a string tensor.

        Returns:
            int32 ids: a dense 1-D tensor for a single string, otherwise a
            `tf.RaggedTensor` with one more (ragged) dimension than the input.
        """
        strings = to_string_tensor(strings, "BertTokenizer.tokenize")
        scalar = strings.shape.rank == 0
        if self.special_tokens_in_strings:
            words = self._words_keeping_special_tokens(strings)
        else:
            words = pretokenize(strings, self.lowercase, self.strip_accents, self.split_on_cjk)
        too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > self._word_length_limit()
        if self.special_tokens_in_strings:  # A special token written in the text is itself, however short the limit.
            special = tf.equal(words.flat_values[:, tf.newaxis], tf.constant(SPECIAL_TOKENS)[tf.newaxis, :])
            too_long &= ~tf.reduce_any(special, axis=1)
        # The literal word "[UNK]" cannot come out of `pretokenize` (brackets are
        # punctuation), so replacing a word with it means exactly one [UNK] id.
        words = words.with_flat_values(tf.where(too_long, UNK_TOKEN, words.flat_values))
        ids = merge_inner_dims(self._wordpiece.tokenize(words))
        if scalar:
            return ids[0]
        return ids

    def tokenize_with_offsets(self, strings):
        """Token ids of a batch of strings and, for each token, the characters
        of the original string it comes from.

        The ids are those of `tokenize` (special tokens written in the text
        are read as text, whatever `special_tokens_in_strings` says). Offsets
        count Unicode characters (Python `str` indices) of each string, with
        invalid UTF-8 bytes counting one character each: `text[start:end]`
        is the token's source, case and accents included (a `##` piece covers
        the characters of its part of the word, an `[UNK]` its whole word).
        Characters that normalization drops (combining accents, format
        characters) belong to the token before them. Runs eagerly and in
        graphs (the exported question answering signature).

        Args:
            strings: a list of strings or a 1-D string tensor.

        Returns:
            `(ids, starts, ends)`: `tf.RaggedTensor`s of shape `[batch, None]`,
            int32 ids and int64 character offsets (`end` exclusive).

        Example:

        ```python
        ids, starts, ends = tokenizer.tokenize_with_offsets(["Café au lait"])
        # starts[0].numpy().tolist() == [0, 5, 8], ends[0].numpy().tolist() == [4, 7, 12]
        ```
        """
        strings = to_string_tensor(strings, "BertTokenizer.tokenize_with_offsets")
        if strings.shape.rank != 1:
            raise ValueError(
                f"BertTokenizer.tokenize_with_offsets expects a 1-D batch of strings, got shape {strings.shape}."
            )
        # Normalization maps characters one by one (see `normalize`), so each
        # byte of the normalized text maps back to the character it came from.
        text, alignment = normalize_characters(strings, lambda t: normalize(t, self.lowercase, self.strip_accents))
        words, word_starts, _ = split_words(text, self.split_on_cjk, with_offsets=True)
        flat_words = words.flat_values
        too_long = tf.strings.length(flat_words, unit="UTF8_CHAR") > self._word_length_limit()
        # As in `tokenize`: a word too long is one [UNK], which covers it all.
        ids, piece_starts, piece_ends = self._wordpiece.tokenize_with_offsets(tf.where(too_long, UNK_TOKEN, flat_words))
        pieces = ids.row_lengths()
        too_long = tf.repeat(too_long, pieces)
        piece_starts = tf.where(too_long, tf.zeros_like(piece_starts.flat_values), piece_starts.flat_values)
        piece_ends = tf.where(
            too_long, tf.repeat(tf.cast(tf.strings.length(flat_words), tf.int64), pieces), piece_ends.flat_values
        )
        word_bytes = tf.repeat(word_starts.flat_values, pieces)
        rows = tf.repeat(words.value_rowids(), pieces)
        starts, ends = alignment.characters(rows, word_bytes + piece_starts, word_bytes + piece_ends)
        tokens = tf.math.unsorted_segment_sum(pieces, words.value_rowids(), words.nrows())
        # validate=False: the lengths add up by construction; each validation is a graph branch that every
        # tf.data iterator instantiates again (a tenth of a second a pipeline on a 2-core CPU).
        return tuple(
            tf.RaggedTensor.from_row_lengths(values, tokens, validate=False)
            for values in (ids.flat_values, starts, ends)
        )

    def _words_keeping_special_tokens(self, strings):
        """`pretokenize`, except that special tokens written in the text
        (exactly, case included) stay whole words, which WordPiece then maps
        to their own ids."""
        if strings.shape.rank == 0:
            strings = strings[tf.newaxis]
        pattern = "|".join(re.escape(token) for token in SPECIAL_TOKENS)

        def split(text):
            return regex_split(text, pattern, pattern)

        pieces = without_nul(split, strings)
        flat = pieces.flat_values
        special = tf.reduce_any(tf.equal(flat[:, tf.newaxis], tf.constant(SPECIAL_TOKENS)[tf.newaxis, :]), axis=1)
        # Each piece is either ordinary text (words from `pretokenize`) or
        # one special token (itself); the other part of its row is empty.
        ordinary = pretokenize(tf.where(special, "", flat), self.lowercase, self.strip_accents, self.split_on_cjk)
        kept = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(flat, special), tf.cast(special, tf.int64), validate=False
        )
        words = tf.concat([ordinary, kept], axis=1)
        return merge_inner_dims(pieces.with_flat_values(words))

    def detokenize(self, ids):
        """Joins token ids back into strings.

        `##` pieces are glued to the previous piece and words are joined with
        single spaces. This is not an exact inverse of `tokenize` (case, accents
        and spacing around punctuation are lost); special tokens are kept.

        Args:
            ids: a 1-D sequence of ids (one string out), or a batch of them as a
                nested list, dense tensor or `tf.RaggedTensor`.
        """
        ids = self._checked_ids(ids)
        if ids.shape.rank == 1:
            return self._wordpiece.detokenize(ids[tf.newaxis])[0]
        return self._wordpiece.detokenize(ids)

    def _word_length_limit(self):
        # Compared with int32 lengths: a larger limit (e.g. sys.maxsize for "none") would wrap negative.
        return min(self.max_chars_per_word, 2**31 - 1)

    @classmethod
    def from_config(cls, config):
        """Inverse of `get_config`, whose `"vocabulary"` is a list of tokens: a
        config never names a file, so building from one reads no file."""
        if not isinstance(config.get("vocabulary"), (list, tuple)):
            raise ValueError(
                "BertTokenizer config needs `vocabulary` as a list of tokens (as get_config() writes it), got "
                f"{type(config.get('vocabulary')).__name__}; build from a vocabulary file with BertTokenizer(path)."
            )
        return cls(**config)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary": list(self._vocabulary),
                "lowercase": self.lowercase,
                "strip_accents": self.strip_accents,
                "max_chars_per_word": self.max_chars_per_word,
                "split_on_cjk": self.split_on_cjk,
                "special_tokens_in_strings": self.special_tokens_in_strings,
            }
        )
        return config
