"""SentencePiece tokenization (ALBERT's vocabularies) as a Keras layer.

The SentencePiece step is `tensorflow_text.SentencepieceTokenizer`, the same
C++ library as the `sentencepiece` package and keras-hub's tokenizers, so the
layer runs eagerly, inside `tf.data` and inside exported SavedModels. With its
default options it gives exactly keras-hub's `AlbertTokenizer` ids: the text
goes to SentencePiece as is, normalized only by the rules stored in the model
(`nmt_nfkc`, `nmt_nfkc_cf` with case folding, ...).

ALBERT checkpoints were trained with extra preprocessing in front of
SentencePiece (ALBERT's `tokenization.preprocess_text`, reproduced by Hugging
Face's `AlbertTokenizer`/`AlbertTokenizerFast`). Each step is an option, so a
converter can reproduce a checkpoint's tokenizer settings:

    HF AlbertTokenizer(do_lower_case=L, keep_accents=K)
        == SentencePieceTokenizer(proto, **albert_tokenizer_options(L, K),
                                  special_tokens_in_strings=True)

(`albert_tokenizer_options` gives `lowercase=L, strip_accents=not K,
replace_quotes=True, split_digit_comma=True`.) Where two segmentations have
exactly the same score (the same pieces in another order, "..." "." against
"." "..."), SentencePiece builds and Hugging Face may pick differently: TF
Text's SentencePiece (used here and by keras-hub in `tf.data`) is followed.
With `strip_accents`, Hangul syllables (split into jamo by NFKD) are
re-composed by SentencePiece's NFKC rules as in ALBERT's own pipeline; Hugging
Face's tokenizer leaves them split (mostly `<unk>`).

Model file and config: the constructor takes the serialized model proto as
`bytes` or the path of a `.model` file (`spiece.model`, `30k-clean.model`).
`get_config()` stores the proto base64-encoded under `"proto"` (JSON-safe, no
file references, so `from_config` never reads files); `from_config` decodes it.
A preset keeps the proto as a file next to `config.json` and builds the layer
from that path; `tokenizer.proto` gives the bytes to write.

Loading only parses the protobuf: no pickle, no code execution.
"""

import base64
import binascii
import functools
import os
import re
import struct
import unicodedata
from pathlib import Path

import keras

from bertzoo.text.normalization import merge_inner_dims
from bertzoo.text.normalization import normalize_characters
from bertzoo.text.normalization import regex_split
from bertzoo.text.normalization import to_string_tensor
from bertzoo.text.normalization import valid_utf8
from bertzoo.text.normalization import without_nul
from bertzoo.text.token_lookup import TokenLookupMixin
from bertzoo.utils import private_api
from bertzoo.utils.optional import tf
from bertzoo.utils.optional import tf_text

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
# A Unicode noncharacter (never in interchange text): the second character of
# a rewritten quote pair in `tokenize_with_offsets`.
_QUOTE_PAIR_END = "\ufdd0"
# Score given to pieces ending in a digit and a comma when `split_digit_comma`
# is set: the offset Hugging Face's ALBERT converter subtracts.
DIGIT_COMMA_PENALTY = 100.0

_EXPECTED = (
    "expected a serialized SentencePiece model (a ModelProto, such as ALBERT's "
    "spiece.model or 30k-clean.model, written by sentencepiece.SentencePieceTrainer)"
)


def albert_tokenizer_options(do_lower_case=True, keep_accents=False):
    """`SentencePieceTokenizer` options reproducing ALBERT's own preprocessing
    for a checkpoint with these tokenizer settings (the `do_lower_case` and
    `keep_accents` of its Hugging Face `tokenizer_config.json`; Google's
    ALBERT checkpoints are uncased: the defaults)."""
    for name, value in (("do_lower_case", do_lower_case), ("keep_accents", keep_accents)):
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return {
        "lowercase": do_lower_case,
        "strip_accents": not keep_accents,
        "replace_quotes": True,
        "split_digit_comma": True,
    }


# --- A minimal protobuf reader for ModelProto ------------------------------
# Only what the layer needs: the pieces (field 1: piece=1, score=2, type=3).
# Every other field is copied byte for byte.
@functools.cache
def combining_characters_pattern():
    """An RE2 character class of the characters with a non-zero canonical
    combining class (Python's `unicodedata.combining`): what ALBERT's
    `preprocess_text` drops after NFKD. Not the Mn category, which also holds
    vowel signs of Indic and Thai scripts that ALBERT keeps. Built once (about
    0.2 s), on the first use of `strip_accents`."""
    codes = [c for c in range(0x110000) if unicodedata.combining(chr(c))]
    ranges, start, previous = [], codes[0], codes[0]
    for code in codes[1:] + [None]:
        if code is not None and code == previous + 1:
            previous = code
            continue
        ranges.append(f"\\x{{{start:X}}}" + (f"-\\x{{{previous:X}}}" if previous > start else ""))
        if code is not None:
            start = previous = code
    return "[" + "".join(ranges) + "]"


def _read_varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _write_varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data):
    """Yields `(field_number, wire_type, value, raw_bytes)` of one message."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire_type == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if pos > len(data):
            raise ValueError("truncated field")
        yield number, wire_type, value, data[start:pos]


def _parse_pieces(proto):
    """`[(piece, score, type)]` of a ModelProto; ValueError if it is not one."""
    pieces = []
    for number, wire_type, value, _ in _fields(proto):
        if number != 1:
            continue
        if wire_type != 2:
            raise ValueError("field 1 (pieces) is not a message")
        piece, score, kind = None, 0.0, 1
        for sub_number, sub_type, sub_value, _ in _fields(value):
            if sub_number == 1 and sub_type == 2:
                piece = sub_value.decode("utf-8")
            elif sub_number == 2 and sub_type == 5:
                score = struct.unpack("<f", sub_value)[0]
            elif sub_number == 3 and sub_type == 0:
                kind = sub_value
        if piece is None:
            raise ValueError(f"piece {len(pieces)} has no text")
        pieces.append((piece, score, kind))
    return pieces


def _penalize_digit_comma(proto, pieces):
    """`proto` with the score of every piece ending in digit + "," lowered by
    `DIGIT_COMMA_PENALTY`, as Hugging Face's ALBERT converter does: such
    pieces are then only used when nothing else covers the text, so "1,000"
    splits as "1" "," "000" (ALBERT's `encode_pieces` rule)."""
    if not any(_ends_in_digit_comma(piece) for piece, _, _ in pieces):
        return proto
    out = bytearray()
    index = 0
    for number, wire_type, value, raw in _fields(proto):
        if number != 1 or wire_type != 2:
            out += raw
            continue
        piece, score, _ = pieces[index]
        index += 1
        if not _ends_in_digit_comma(piece):
            out += raw
            continue
        sub = bytearray()
        for sub_number, sub_type, _, sub_raw in _fields(value):
            if not (sub_number == 2 and sub_type == 5):
                sub += sub_raw
        sub += _write_varint((2 << 3) | 5) + struct.pack("<f", score - DIGIT_COMMA_PENALTY)
        out += _write_varint((1 << 3) | 2) + _write_varint(len(sub)) + sub
    return bytes(out)


def _ends_in_digit_comma(piece):
    return len(piece) >= 2 and piece[-1] == "," and piece[-2].isdigit()


def _read_proto(proto):
    """`(bytes, description)` for the `proto` argument."""
    if isinstance(proto, (bytes, bytearray, memoryview)):
        return bytes(proto), "SentencePiece proto bytes"
    if isinstance(proto, (str, os.PathLike)):
        path = Path(proto)
        if not path.exists():
            hint = ""
            if isinstance(proto, str) and len(proto) > 256:
                hint = (
                    " (A base64 string from get_config()? Build the layer with "
                    "SentencePieceTokenizer.from_config(config), which decodes it.)"
                )
            raise FileNotFoundError(f"SentencePiece model file '{path}' does not exist.{hint}")
        if path.is_dir():
            found = sorted(p.name for p in path.glob("*.model"))
            hint = f" It contains {', '.join(found)}: pass that file." if found else ""
            raise FileNotFoundError(f"SentencePiece model path '{path}' is a directory, expected a .model file.{hint}")
        return path.read_bytes(), f"file '{path}'"
    raise ValueError(
        f"`proto` must be the path of a SentencePiece .model file or its serialized bytes, got {type(proto).__name__}."
    )


def _not_a_model(source, data, reason):
    head = data[:64].lstrip(b"\xef\xbb\xbf")
    hint = ""
    if head.startswith((b"[PAD]", b"[UNK]", b"[CLS]", b"<pad>", b"<unk>")) or (
        head and all(32 <= c < 127 or c in (9, 10, 13) for c in head)
    ):
        hint = (
            " It looks like a text file: a WordPiece vocab.txt belongs to "
            "bertzoo.text.BertTokenizer; a SentencePiece .vocab listing cannot be "
            "used without its .model file."
        )
    return ValueError(f"The {source} is not a SentencePiece model: {_EXPECTED}; {reason}.{hint}")


@keras.saving.register_keras_serializable(package="bertzoo")
class SentencePieceTokenizer(TokenLookupMixin, keras.layers.Layer):
    """SentencePiece tokenizer layer (ALBERT): strings in, int32 token ids out.

    The model must contain ALBERT's special tokens `<pad>`, `<unk>`, `[CLS]`,
    `[SEP]` and `[MASK]`; their ids are looked up in its vocabulary. A batch of
    strings gives a `tf.RaggedTensor` of shape `[batch, None]`; a single string
    gives a dense 1-D `tf.Tensor`. Eager, `tf.data` and `tf.function` ids are
    identical.

    Args:
        proto: the path of a SentencePiece `.model` file, or its bytes.
        lowercase: lower-case the text before SentencePiece (ALBERT's
            `do_lower_case`). Default False: only the model's own
            normalization applies, as in keras-hub's `AlbertTokenizer`.
        strip_accents: NFKD-decompose and drop combining characters (a
            non-zero canonical combining class, as ALBERT's `preprocess_text`
            and Hugging Face's slow `AlbertTokenizer` do; its fast tokenizer
            also drops the other marks, e.g. Devanagari vowel signs) before
            SentencePiece (ALBERT's `keep_accents=False`). `None` (default)
            follows `lowercase`.
        replace_quotes: replace "``" and "''" with '"' (ALBERT's preprocessing).
        split_digit_comma: never end a piece with a digit followed by a comma,
            so "1,000" becomes "1" "," "000" as in ALBERT's `encode_pieces`
            (implemented as Hugging Face does, by lowering those pieces'
            scores).
        special_tokens_in_strings: read `[CLS]`, `[SEP]`, `<pad>`, `<unk>`
            and `[MASK]` written in the text (exactly, case included) as those
            tokens, as Hugging Face tokenizers do, e.g. for fill-mask inputs.
            Default False, as in keras-hub: text from users cannot inject
            control tokens. Pieces the model declares "user defined" (ALBERT
            declares `[MASK]` so) are matched by SentencePiece itself either
            way, but only as they reach it: with `lowercase=True` a written
            `[MASK]` arrives as `[mask]` and is not matched (as in ALBERT's own
            pipeline), so pass `special_tokens_in_strings=True` for fill-mask
            text then.

    Example:

    ```python
    tokenizer = SentencePieceTokenizer("30k-clean.model", lowercase=True)
    tokenizer(["The quick brown fox.", "A fox"])  # RaggedTensor of ids
    tokenizer.detokenize(tokenizer("the fox"))  # "the fox"
    preprocessor = BertPreprocessor(tokenizer, sequence_length=128)
    ```
    """

    PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN = PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN

    def __init__(
        self,
        proto,
        lowercase=False,
        strip_accents=None,
        replace_quotes=False,
        split_digit_comma=False,
        special_tokens_in_strings=False,
        **kwargs,
    ):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        private_api.accept_raw_inputs(self)
        self._check_text_options(
            strip_accents,
            lowercase=lowercase,
            replace_quotes=replace_quotes,
            split_digit_comma=split_digit_comma,
            special_tokens_in_strings=special_tokens_in_strings,
        )
        data, source = _read_proto(proto)
        if not data:
            raise _not_a_model(source, data, "it is empty")
        try:
            pieces = _parse_pieces(data)
        except (ValueError, UnicodeDecodeError, struct.error) as e:
            raise _not_a_model(source, data, f"it does not parse ({e})") from None
        if not pieces:
            raise _not_a_model(source, data, "it holds no vocabulary pieces")
        vocabulary = [piece for piece, _, _ in pieces]
        token_to_id = {}
        for i, token in enumerate(vocabulary):
            token_to_id.setdefault(token, i)
        missing = [token for token in SPECIAL_TOKENS if token not in token_to_id]
        if missing:
            raise ValueError(
                f"The SentencePiece model ({source}) has no {', '.join(repr(t) for t in missing)} "
                f"token{'s' if len(missing) > 1 else ''}, which ALBERT models need "
                f"({', '.join(SPECIAL_TOKENS)}). Train it with pad_piece='<pad>', "
                "unk_piece='<unk>', bos_piece='[CLS]', eos_piece='[SEP]' and "
                "user_defined_symbols='[MASK]' (ALBERT's layout: ids 0-4), or use the "
                ".model file that came with the checkpoint."
            )
        self._proto = data
        self._store_vocabulary(vocabulary, token_to_id)
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.replace_quotes = replace_quotes
        self.split_digit_comma = split_digit_comma
        self.special_tokens_in_strings = special_tokens_in_strings
        model = _penalize_digit_comma(data, pieces) if split_digit_comma else data
        # Built here, eagerly: tf-text resources cannot be created while tf.data
        # traces a map function.
        self._sentencepiece_model = model
        try:
            self._sentencepiece = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)
            size = int(self._sentencepiece.vocab_size())
        except tf.errors.OpError as e:
            raise _not_a_model(source, data, f"SentencePiece refused it ({e.message.strip()})") from None
        if size != len(vocabulary):
            raise _not_a_model(source, data, f"SentencePiece reads {size} pieces, the proto lists {len(vocabulary)}")
        self._special_ids = tf.constant([token_to_id[t] for t in SPECIAL_TOKENS], tf.int32)
        self.built = True

    # --- Vocabulary -------------------------------------------------------
    @property
    def proto(self):
        """The serialized SentencePiece model (bytes), as given: write it to
        a `.model` file to save the vocabulary."""
        return self._proto

    def export_resources(self):
        """TensorFlow resources a SavedModel must track to run this tokenizer
        (the SentencePiece model); `bertzoo.export` attaches them."""
        return [self._live_sentencepiece()]

    def _live_sentencepiece(self):
        """tf-text's tokenizer, built again when its resource is gone:
        `tf.random.set_seed` (so `keras.utils.set_random_seed` too) clears
        TensorFlow's eager caches, and the SentencePiece resource with them.
        Checked eagerly, also while a `tf.data` map or `tf.function` traces
        (`init_scope`), where the resource cannot be created."""
        with tf.init_scope():
            if tf.executing_eagerly():
                try:
                    self._sentencepiece.vocab_size()
                except tf.errors.NotFoundError:
                    self._sentencepiece = tf_text.SentencepieceTokenizer(
                        model=self._sentencepiece_model, out_type=tf.int32
                    )
        return self._sentencepiece

    # --- Tokenization -----------------------------------------------------
    def _preprocess(self, text):
        """The optional ALBERT preprocessing in front of SentencePiece, in
        Hugging Face's order: quotes, NFKD + accent stripping, lower-casing."""
        strip_accents = self.lowercase if self.strip_accents is None else self.strip_accents
        if not (self.lowercase or strip_accents or self.replace_quotes):
            return text
        # Invalid UTF-8 becomes U+FFFD, so the Unicode ops below cannot fail.
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        if self.replace_quotes:
            text = tf.strings.regex_replace(text, "``|''", '"')
        if strip_accents:
            text = tf_text.normalize_utf8(text, "NFKD")
            text = tf.strings.regex_replace(text, combining_characters_pattern(), "")
        if self.lowercase:
            # Per character, as Hugging Face's Lowercase normalizer: a final
            # capital sigma becomes "σ", not the "ς" of ICU / str.lower().
            text = tf.strings.regex_replace(text, "\u03a3", "\u03c3")
            text = without_nul(lambda t: tf.strings.lower(t, encoding="utf-8"), text)
        # ALBERT splits its text at Python's whitespace, which counts NEL;
        # SentencePiece does not.
        return tf.strings.regex_replace(text, "\u0085", " ")

    def tokenize(self, strings):
        """Token ids for `strings`.

        Args:
            strings: a python string, a list of strings, or a string tensor.

        Returns:
            int32 ids: a dense 1-D tensor for a single string, otherwise a
            `tf.RaggedTensor` with one more (ragged) dimension than the input.
        """
        strings = to_string_tensor(strings, "SentencePieceTokenizer.tokenize")
        scalar = strings.shape.rank == 0
        if scalar:
            strings = strings[tf.newaxis]
        if self.special_tokens_in_strings:
            ids = self._tokenize_keeping_special_tokens(strings)
        else:
            ids = self._live_sentencepiece().tokenize(self._preprocess(strings))
        if scalar:
            return ids[0]
        return ids

    def tokenize_with_offsets(self, strings):
        """Token ids of a batch of strings and, for each piece, the characters
        of the original string it comes from (as `BertTokenizer`'s, for
        question answering).

        ALBERT's preprocessing is applied one character at a time here; a
        quote pair that `replace_quotes` rewrites (``` `` ``` or `''`) maps
        its `"` to the pair's two characters. The ids are `tokenize`'s (but
        for a U+FDD0 noncharacter in the text, which stands in for a pair's
        second character here and is dropped).
        Special tokens written in the text are read as text. Offsets count
        Unicode characters (Python `str` indices), `end` exclusive.

        Args:
            strings: a list of strings or a 1-D string tensor.

        Returns:
            `(ids, starts, ends)`: `tf.RaggedTensor`s of shape `[batch, None]`.
        """
        strings = to_string_tensor(strings, "SentencePieceTokenizer.tokenize_with_offsets")
        if strings.shape.rank != 1:
            raise ValueError(
                f"SentencePieceTokenizer.tokenize_with_offsets expects a 1-D batch of strings, got shape {strings.shape}."
            )
        preprocess = self._preprocess
        if self.replace_quotes:
            # One character at a time no pair is seen: the pair's first
            # character becomes the `"` and its second a stand-in that
            # normalizes to nothing, so characters and offsets stay in place.
            strings = tf.strings.regex_replace(valid_utf8(strings), "``|''", '"' + _QUOTE_PAIR_END)
            preprocess = lambda chars: self._preprocess(tf.strings.regex_replace(chars, _QUOTE_PAIR_END, ""))  # noqa: E731
        text, alignment = normalize_characters(strings, preprocess)
        ids, byte_starts, byte_ends = self._live_sentencepiece().tokenize_with_offsets(text)
        rows = ids.value_rowids()
        starts, ends = alignment.characters(
            rows, tf.cast(byte_starts.flat_values, tf.int64), tf.cast(byte_ends.flat_values, tf.int64)
        )
        # A piece's "▁" stands for the whitespace before the word: its span
        # starts at the word's first visible character.
        chars = alignment.chars
        # Unicode spaces too (no-break, ideographic, NEL), which `\s` (ASCII in RE2) misses.
        visible = tf.where(~tf.strings.regex_full_match(chars.flat_values, r"[\s\p{Z}\x{85}]"))[:, 0]
        row_chars = tf.gather(chars.row_starts(), rows)
        position = tf.searchsorted(visible, starts + row_chars, side="left")
        next_visible = tf.gather(tf.concat([visible, [tf.size(chars.flat_values, out_type=tf.int64)]], 0), position)
        starts = tf.minimum(next_visible - row_chars, ends)
        return ids, ids.with_flat_values(starts), ids.with_flat_values(ends)

    def _tokenize_keeping_special_tokens(self, strings):
        """Splits the text at special tokens written in it (before any
        preprocessing, so their case counts), tokenizes the text between them
        on its own, as Hugging Face does, and puts each special token's id in
        its place."""
        pattern = "|".join(re.escape(token) for token in SPECIAL_TOKENS)

        def split(text):
            return regex_split(text, pattern, pattern)

        pieces = without_nul(split, strings)
        flat = pieces.flat_values
        matches = tf.equal(flat[:, tf.newaxis], tf.constant(SPECIAL_TOKENS)[tf.newaxis, :])
        special = tf.reduce_any(matches, axis=1)
        # Each piece is either ordinary text or one special token; the other
        # part of its row is empty (SentencePiece gives no ids for "").
        ordinary = self._live_sentencepiece().tokenize(self._preprocess(tf.where(special, "", flat)))
        special_ids = tf.gather(self._special_ids, tf.argmax(tf.cast(matches, tf.int32), axis=1))
        kept = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(special_ids, special), tf.cast(special, tf.int64), validate=False
        )
        ids = tf.concat([ordinary, kept], axis=1)
        return merge_inner_dims(pieces.with_flat_values(ids))

    def detokenize(self, ids):
        """Joins token ids back into strings with SentencePiece's decoder.

        Control tokens (`[CLS]`, `[SEP]`, `<pad>`) decode to nothing, `<unk>`
        to " ⁇ ". Lower-casing and other normalization are not undone.

        Args:
            ids: a 1-D sequence of ids (one string out), or a batch of them as a
                nested list, dense tensor or `tf.RaggedTensor`.
        """
        ids = self._checked_ids(ids)
        if ids.shape.rank == 1:
            return self._live_sentencepiece().detokenize(ids[tf.newaxis])[0]
        return self._live_sentencepiece().detokenize(ids)

    # --- Config -----------------------------------------------------------
    def get_config(self):
        """The layer's config; `"proto"` is the model, base64-encoded."""
        config = super().get_config()
        config.update(
            {
                "proto": base64.b64encode(self._proto).decode("ascii"),
                "lowercase": self.lowercase,
                "strip_accents": self.strip_accents,
                "replace_quotes": self.replace_quotes,
                "split_digit_comma": self.split_digit_comma,
                "special_tokens_in_strings": self.special_tokens_in_strings,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        """Inverse of `get_config`: `"proto"` must be the base64 text it wrote
        (a config never names a file, so loading one reads no other file)."""
        config = dict(config)
        proto = config.get("proto")
        if not isinstance(proto, str):
            raise ValueError(
                "SentencePieceTokenizer config needs `proto`: the SentencePiece model as "
                f"base64 text (as get_config() writes it), got {type(proto).__name__}."
            )
        try:
            config["proto"] = base64.b64decode(proto, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                "SentencePieceTokenizer config `proto` is not base64 text. It must hold the "
                "SentencePiece model as get_config() writes it; to build the layer from a "
                ".model file, pass its path to SentencePieceTokenizer(...)."
            ) from None
        return cls(**config)
