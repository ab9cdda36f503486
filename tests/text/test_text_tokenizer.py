"""BertTokenizer: id parity with keras-hub and HF `tokenizers`, graph mode, config."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertzoo.text import BertTokenizer
from bertzoo.text import save_vocabulary

VOCAB_PATH = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "all-MiniLM-L6-v2" / "vocab.txt"
).resolve()

TINY_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "the", "fox", "run", "##s", ".", "cafe", "café", "Café", "a", "##a", "!", "Cafe",
]  # fmt: skip

# Hard English-ish inputs on which both references agree with BERT's rules.
HARD_STRINGS = [
    "",
    "   ",
    "Café au lait, naïve coöperation, Éclair, façade, résumé, piñata, Zoë",
    "Wait!!! What?!?... (yes) -- [no] {maybe} ;-) <<>> ##hash## @@ ~~ ^_^ `code`",
    "1,234,567.89 and 3.14159 or -0.5e10, $1,000.00 / 50% off #1",
    "I ❤️ NY 😀👍🏽 🇺🇸 🎉🎉🎉 :-)",
    "中文字符和日本語のテキスト、漢字。",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,  # 135 chars: one [UNK]
    "a" * 100 + " " + "b" * 101,  # the 100-character limit, both sides of it
    "&amp; &lt;b&gt;bold&lt;/b&gt; &quot;quoted&quot; &#39;apos&#39; &nbsp;",
    "MiXeD CaSe: iPhone McDonald's NASA eBay HTTPServer",
    "tab\tseparated\tvalues\nnew line\r\nwindows line  double  space\n\n",
    "don't won't it's O'Neil rock'n'roll",
    "e-mail: user.name+tag@example.co.uk, https://example.com/a?b=1&c=2#frag",
    "“Smart quotes” ‘single’ — em dash – en dash «guillemets» ¿Qué? ¡Sí!",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "C++ C# F# .NET node.js 3D 4K 1080p 2nd 21st",
]

# Inputs where keras-hub's WordPieceTokenizer pre-tokenization differs from
# BERT's (investigated in keras-hub 0.32): ids are checked against HF only.
KERAS_HUB_DIFFERS = {
    # NFKC case folding instead of BERT's lower(): "ß" -> "ss", ligatures,
    # fractions, superscripts, "™", "…" and fullwidth forms are rewritten.
    "nfkc_casefold": "Straße ﬁnance ½ x² ™ wait… ＦＵＬＬＷＩＤＴＨ １２３ 𝐁𝐨𝐥𝐝",
    # NFKC after NFD re-composes Hangul jamo into syllables (-> [UNK]).
    "hangul": "한국어 텍스트",
    # Casefold turns an existing final sigma into "σ"; HF keeps "ς".
    "final_sigma": "ΟΔΟΣ Σίσυφος",
    # BERT deletes format characters (soft hyphen, zero-width space, BOM);
    # keras-hub splits words at them. Emoji ZWJ sequences are the common case.
    "format_chars": "co\u00adoperate zero\u200bwidth \ufeffbom 🤷\u200d♀️ 👨\u200d👩\u200d👧",
    # Non-ASCII spaces are whitespace for BERT; keras-hub's RE2 `\s` is ASCII.
    "unicode_spaces": "non\u00a0breaking ideographic\u3000space line\u2028separator",
    # BERT deletes control characters and U+FFFD rather than splitting there.
    "control_chars": "vertical\x0btab null\x00byte next\x85line bad\ufffdchar",
    # keras-hub caps words at 100 UTF-8 bytes, BERT at 100 characters.
    "long_non_ascii_word": "ж" * 60,
    # HF deletes private-use characters; keras-hub keeps them (-> [UNK]).
    "private_use": "pr\ue000ivate",
}

# HF `tokenizers` only treats U+2B920.. of CJK Extension E as CJK, where BERT's
# `_is_chinese_char` (and keras-hub) start at U+2B820, so these are checked
# against keras-hub only. (HF also lags in its Unicode tables: characters
# assigned in recent Unicode versions can get different categories. Not tested.)
HF_DIFFERS = {"cjk_extension_e": "a\U0002b820b \U0002b900x"}


def _real_vocab():
    if not VOCAB_PATH.is_file():
        pytest.skip(f"reference vocabulary not found at {VOCAB_PATH} (shared models not present)")
    return str(VOCAB_PATH)


@pytest.fixture(scope="module")
def real_tokenizer():
    return BertTokenizer(_real_vocab())


@pytest.fixture(scope="module")
def hf_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.BertWordPieceTokenizer(_real_vocab(), lowercase=True)


@pytest.fixture(scope="module")
def keras_hub_tokenizer():
    keras_hub = pytest.importorskip("keras_hub")
    # keras-hub's BertTokenizer does not strip accents unless asked; BERT
    # uncased (and HF, and bertzoo) strip them whenever lower-casing.
    return keras_hub.models.BertTokenizer(vocabulary=_real_vocab(), lowercase=True, strip_accents=True)


def _ours(tokenizer, strings):
    return tokenizer(strings).to_list()


def _hf(hf_tokenizer, strings):
    return [e.ids for e in hf_tokenizer.encode_batch(strings, add_special_tokens=False)]


def _keras_hub(keras_hub_tokenizer, strings):
    return [np.asarray(keras_hub_tokenizer.tokenize(s)).astype(int).tolist() for s in strings]


def test_parity_with_hf_tokenizers(real_tokenizer, hf_tokenizer):
    ours = _ours(real_tokenizer, HARD_STRINGS)
    assert ours == _hf(hf_tokenizer, HARD_STRINGS)
    # Sanity: the cases are not trivially empty and exercise [UNK] and ##.
    assert ours[0] == [] and ours[1] == []
    flat = [i for row in ours for i in row]
    assert real_tokenizer.unk_token_id in flat
    assert any(real_tokenizer.id_to_token(i).startswith("##") for i in flat)


def test_parity_with_keras_hub(real_tokenizer, keras_hub_tokenizer):
    assert _ours(real_tokenizer, HARD_STRINGS) == _keras_hub(keras_hub_tokenizer, HARD_STRINGS)


def test_accents_and_case_spelled_out(real_tokenizer):
    tokens = [real_tokenizer.id_to_token(i) for i in real_tokenizer("Café NAÏVE Éclair").numpy()]
    assert tokens[:2] == ["cafe", "naive"]
    assert "".join(t.removeprefix("##") for t in tokens[2:]) == "eclair"


def test_max_chars_per_word(real_tokenizer):
    unk = real_tokenizer.unk_token_id
    assert real_tokenizer("a" * 101).numpy().tolist() == [unk]
    assert len(real_tokenizer("a" * 100).numpy()) > 1
    # Characters, not bytes: 100 two-byte letters still get word pieces.
    assert unk not in real_tokenizer("ж" * 100).numpy().tolist()
    # A limit past int32 (sys.maxsize for "none") is no limit, not a negative one making every word [UNK].
    unlimited = BertTokenizer(_real_vocab(), max_chars_per_word=2**63 - 1)
    long_word = unlimited("a" * 101).numpy().tolist()
    assert unk not in long_word and len(long_word) > 1
    assert unlimited("a" * 101 + " the").numpy().tolist() == long_word + [1996]
    ids, _, _ = unlimited.tokenize_with_offsets(["a" * 101])
    assert ids.to_list() == [long_word]
    short = BertTokenizer(_real_vocab(), max_chars_per_word=5)
    assert short("hello worlds").numpy().tolist() == [7592, unk]
    # A special token written in the text stays itself (as Hugging Face's), however short the limit.
    special = BertTokenizer(_real_vocab(), max_chars_per_word=5, special_tokens_in_strings=True)
    assert special("the [MASK] sat worlds").numpy().tolist() == [1996, special.mask_token_id, 2938, unk]


@pytest.mark.parametrize("case", sorted(KERAS_HUB_DIFFERS))
def test_bert_rules_where_keras_hub_differs(case, real_tokenizer, hf_tokenizer):
    text = KERAS_HUB_DIFFERS[case]
    assert _ours(real_tokenizer, [text]) == _hf(hf_tokenizer, [text])


@pytest.mark.parametrize("case", sorted(HF_DIFFERS))
def test_bert_rules_where_hf_differs(case, real_tokenizer, keras_hub_tokenizer):
    text = HF_DIFFERS[case]
    assert _ours(real_tokenizer, [text]) == _keras_hub(keras_hub_tokenizer, [text])


def test_cased_parity_with_hf(hf_tokenizer):
    tokenizers = pytest.importorskip("tokenizers")
    cased_hf = tokenizers.BertWordPieceTokenizer(_real_vocab(), lowercase=False)
    cased = BertTokenizer(_real_vocab(), lowercase=False)
    strings = HARD_STRINGS + list(KERAS_HUB_DIFFERS.values())
    assert _ours(cased, strings) == _hf(cased_hf, strings)


def test_eager_and_graph_ids_are_identical(real_tokenizer):
    strings = HARD_STRINGS + list(KERAS_HUB_DIFFERS.values()) + list(HF_DIFFERS.values())
    eager = _ours(real_tokenizer, strings)
    dataset = tf.data.Dataset.from_tensor_slices(strings).batch(5).map(real_tokenizer)
    graph = [row for batch in dataset for row in batch.to_list()]
    assert graph == eager
    one_by_one = tf.data.Dataset.from_tensor_slices(strings).map(real_tokenizer.tokenize)
    assert [ids.numpy().tolist() for ids in one_by_one] == eager
    traced = tf.function(real_tokenizer.tokenize)(tf.constant(strings))
    assert traced.to_list() == eager


def test_output_shapes_and_types():
    tokenizer = BertTokenizer(TINY_VOCAB)
    single = tokenizer("The fox runs.")
    assert isinstance(single, tf.Tensor) and single.dtype == tf.int32
    assert single.numpy().tolist() == [5, 6, 7, 8, 9]
    batch = tokenizer(["the fox", "", "runs"])
    assert isinstance(batch, tf.RaggedTensor) and batch.dtype == tf.int32
    assert batch.to_list() == [[5, 6], [], [7, 8]]
    assert tokenizer(np.array(["fox", "the"])).to_list() == [[6], [5]]
    assert tokenizer([]).to_list() == []
    # Unknown words become a single [UNK], whatever their length.
    assert tokenizer("the zebra fox").numpy().tolist() == [5, 1, 6]


def test_lowercase_and_strip_accents_options():
    uncased = BertTokenizer(TINY_VOCAB)
    assert uncased("Café").numpy().tolist() == [10]
    cased = BertTokenizer(TINY_VOCAB, lowercase=False)  # strip_accents follows: False
    assert cased("Café").numpy().tolist() == [12]
    lower_keep_accents = BertTokenizer(TINY_VOCAB, strip_accents=False)
    assert lower_keep_accents("Café").numpy().tolist() == [11]
    cased_no_accents = BertTokenizer(TINY_VOCAB, lowercase=False, strip_accents=True)
    assert cased_no_accents("Café CAFÉ").numpy().tolist() == [16, 1]


def test_invalid_utf8_does_not_crash():
    tokenizer = BertTokenizer(TINY_VOCAB)
    ids = tokenizer(tf.constant([b"the\xff fox\xc3", b"\x80"]))
    assert ids.to_list() == [[5, 6], []]


def test_a_nul_byte_is_dropped_like_other_control_characters_not_the_rest_of_the_text():
    # tf.strings ops and tf-text's regex_split stop at a NUL byte.
    for special_tokens_in_strings in (False, True):
        tokenizer = BertTokenizer(TINY_VOCAB, special_tokens_in_strings=special_tokens_in_strings)
        with_nul = tokenizer(["the\x00 fox [MASK] runs"]).to_list()
        assert with_nul == tokenizer(["the fox [MASK] runs"]).to_list()
        assert len(with_nul[0]) >= 4


def test_detokenize():
    tokenizer = BertTokenizer(TINY_VOCAB)
    assert tokenizer.detokenize([5, 6, 7, 8, 9]).numpy() == b"the fox runs ."
    out = tokenizer.detokenize(tf.ragged.constant([[2, 6, 7, 8, 3], [13, 14]]))
    assert out.numpy().tolist() == [b"[CLS] fox runs [SEP]", b"aa"]
    dense = tokenizer.detokenize(np.array([[6, 0], [5, 6]]))
    assert dense.numpy().tolist() == [b"fox [PAD]", b"the fox"]
    assert tokenizer.detokenize([[6], [5, 6]]).numpy().tolist() == [b"fox", b"the fox"]
    with pytest.raises(ValueError, match="must be in"):
        tokenizer.detokenize([5, 99])
    # Ids past int32 are refused, not wrapped into the vocabulary (2**32 + 5 would read as 5).
    with pytest.raises(ValueError, match=r"must be in \[0, \d+\], got values in \[6, 4294967301\]"):
        tokenizer.detokenize(np.array([2**32 + 5, 6], np.int64))
    with pytest.raises(ValueError, match="must be in"):
        tokenizer.detokenize([[5], [2**32 + 5]])
    assert tokenizer.detokenize([]).numpy() == b""  # As tokenize("") gives [].


@pytest.mark.parametrize("ids", [[[5, 17]], [[5, -1]], [[5, 2**32 + 5]]], ids=["past", "negative", "wrapping"])
def test_detokenize_in_a_graph_refuses_ids_outside_the_vocabulary(ids):
    # tf-text's detokenizer reads past its table there (a segmentation fault, or a wrapped id read as another).
    tokenizer = BertTokenizer(TINY_VOCAB)
    graph = tf.function(tokenizer.detokenize)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Token ids must be in \[0, 16\]"):
        graph(tf.constant(ids, tf.int64))
    dataset = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(ids, tf.int64)).map(tokenizer.detokenize)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Token ids must be in"):
        list(dataset)
    assert graph(tf.constant([[5, 6]], tf.int64)).numpy().tolist() == [b"the fox"]


def test_vocabulary_accessors(real_tokenizer):
    t = real_tokenizer
    assert (t.pad_token_id, t.unk_token_id, t.cls_token_id, t.sep_token_id, t.mask_token_id) == (
        0, 100, 101, 102, 103,
    )  # fmt: skip
    assert t.vocabulary_size() == 30522
    vocab = t.get_vocabulary()
    assert len(vocab) == 30522 and vocab[101] == "[CLS]"
    vocab.append("mutating the copy")
    assert t.vocabulary_size() == 30522
    assert t.token_to_id("hello") == 7592
    assert t.id_to_token(7592) == "hello"
    assert t.id_to_token(np.int64(101)) == "[CLS]"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        t.token_to_id("definitely-not-a-token")
    with pytest.raises(ValueError, match="30521"):
        t.id_to_token(30522)
    with pytest.raises(ValueError, match="integer"):
        t.id_to_token("5")


def test_missing_special_token_names_token_and_file(tmp_path):
    path = save_vocabulary([t for t in TINY_VOCAB if t != "[MASK]"], tmp_path / "vocab.txt")
    with pytest.raises(ValueError, match=r"'\[MASK\]'") as info:
        BertTokenizer(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match=r"no '\[SEP\]' token"):
        BertTokenizer([t for t in TINY_VOCAB if t != "[SEP]"])


def test_constructor_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        BertTokenizer(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="duplicate token 'fox'"):
        BertTokenizer(TINY_VOCAB + ["fox"])
    with pytest.raises(ValueError, match="strip_accents"):
        BertTokenizer(TINY_VOCAB, strip_accents="yes")
    with pytest.raises(ValueError, match="lowercase"):
        BertTokenizer(TINY_VOCAB, lowercase=1)
    with pytest.raises(ValueError, match="max_chars_per_word"):
        BertTokenizer(TINY_VOCAB, max_chars_per_word=0)
    with pytest.raises(ValueError, match="list of token strings"):
        BertTokenizer(None)
    tokenizer = BertTokenizer(TINY_VOCAB)
    with pytest.raises(ValueError, match="expects strings"):
        tokenizer.tokenize([1, 2, 3])
    ragged = tf.ragged.constant([["the"], ["fox", "runs"]])
    with pytest.raises(ValueError, match=r"BertTokenizer.tokenize expects a dense .*RaggedTensor.*flat_values"):
        tokenizer.tokenize(ragged)
    with pytest.raises(ValueError, match=r"tokenize_with_offsets expects a dense .*RaggedTensor"):
        tokenizer.tokenize_with_offsets(ragged)


def test_vocabulary_path_and_list_agree(tmp_path):
    path = save_vocabulary(TINY_VOCAB, tmp_path / "vocab.txt")
    from_file = BertTokenizer(path)  # a pathlib.Path works too
    from_list = BertTokenizer(TINY_VOCAB)
    assert from_file.get_vocabulary() == TINY_VOCAB
    assert from_file("the fox").numpy().tolist() == from_list("the fox").numpy().tolist()


def test_config_round_trip():
    tokenizer = BertTokenizer(TINY_VOCAB, lowercase=False, max_chars_per_word=7, name="tok")
    config = tokenizer.get_config()
    assert config["vocabulary"] == TINY_VOCAB
    assert config["strip_accents"] is None and config["lowercase"] is False
    json.dumps(config)
    restored = BertTokenizer.from_config(config)
    assert restored.get_config() == config
    texts = ["Café the fox runs!", "aaaaaaaa"]
    assert restored(texts).to_list() == tokenizer(texts).to_list()

    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(tokenizer)))
    assert serialized["registered_name"] == "bertzoo>BertTokenizer"
    revived = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(revived, BertTokenizer)
    assert revived(texts).to_list() == tokenizer(texts).to_list()


SPECIAL_TOKEN_STRINGS = [
    "The capital of France is [MASK].",
    "[CLS] first [SEP] second [SEP]",
    "[MASK][MASK]joined[SEP]no spaces",
    "lower case [mask] and [Sep] are plain text",
    "unknown [UNK] and padding [PAD] tokens",
    "nested [[MASK]] brackets and [ MASK ] spaced",
    "",
]


def test_special_tokens_in_strings_parity_with_hf_and_keras_hub(hf_tokenizer):
    keras_hub = pytest.importorskip("keras_hub")
    ours = BertTokenizer(_real_vocab(), special_tokens_in_strings=True)
    theirs = keras_hub.models.BertTokenizer(
        vocabulary=_real_vocab(), lowercase=True, strip_accents=True, special_tokens_in_strings=True
    )
    expected = _hf(hf_tokenizer, SPECIAL_TOKEN_STRINGS)
    assert _ours(ours, SPECIAL_TOKEN_STRINGS) == expected
    # keras-hub's BertTokenizer does not count "[UNK]" among its special
    # tokens (it reads it as "[", "un", "##k", "]"); HF and bertzoo do.
    agree = [i for i, text in enumerate(SPECIAL_TOKEN_STRINGS) if "[UNK]" not in text]
    keras_hub_ids = _keras_hub(theirs, SPECIAL_TOKEN_STRINGS)
    assert [keras_hub_ids[i] for i in agree] == [expected[i] for i in agree]
    assert ours.mask_token_id in expected[0] and expected[0].count(ours.mask_token_id) == 1
    graph = tf.function(lambda t: ours(t))(tf.constant(SPECIAL_TOKEN_STRINGS)).to_list()
    assert graph == expected


def test_special_tokens_in_strings_is_off_by_default():
    tokenizer = BertTokenizer(TINY_VOCAB)
    assert tokenizer.special_tokens_in_strings is False
    ids = tokenizer("the [MASK] fox").numpy().tolist()
    assert tokenizer.mask_token_id not in ids and ids[0] == 5 and ids[-1] == 6
    on = BertTokenizer(TINY_VOCAB, special_tokens_in_strings=True)
    assert on("the [MASK] fox").numpy().tolist() == [5, on.mask_token_id, 6]
    assert on(["[SEP]", "fox[CLS]"]).to_list() == [[on.sep_token_id], [6, on.cls_token_id]]
    restored = BertTokenizer.from_config(on.get_config())
    assert restored.special_tokens_in_strings is True
    with pytest.raises(ValueError, match="special_tokens_in_strings"):
        BertTokenizer(TINY_VOCAB, special_tokens_in_strings="yes")


def test_a_changed_max_chars_per_word_applies_as_a_rebuilt_tokenizer_would():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##a"]
    tokenizer = BertTokenizer(vocabulary)
    word = "a" * 450
    assert tokenizer.tokenize(word).numpy().tolist() == [1]  # Over the default 100 characters.
    tokenizer.max_chars_per_word = 1000
    rebuilt = BertTokenizer.from_config(tokenizer.get_config())
    expected = [5] + [6] * 449
    assert tokenizer.tokenize(word).numpy().tolist() == rebuilt.tokenize(word).numpy().tolist() == expected
    ids, starts, ends = tokenizer.tokenize_with_offsets([word])
    assert ids.to_list() == [expected] and ends.to_list()[0][-1] == 450


def test_regex_split_and_merge_give_tf_text_and_tensorflow_results_without_graph_checks():
    import tensorflow_text as tf_text

    from bertzoo.text.normalization import merge_inner_dims
    from bertzoo.text.normalization import regex_split

    strings = tf.constant(HARD_STRINGS + list(KERAS_HUB_DIFFERS.values()))
    for delim, keep in ((r"\s", ""), (r" |[,.!?]", r"[,.!?]"), (r"\[SEP\]", r"\[SEP\]")):
        ours = regex_split(strings, delim, keep, with_offsets=True)
        reference = tf_text.regex_split_with_offsets(strings, delim, keep)
        for a, b in zip(ours, reference):
            assert a.to_list() == b.to_list()
        assert regex_split(strings, delim, keep).to_list() == reference[0].to_list()
    words = regex_split(strings, r"\s")
    pieces = tf.RaggedTensor.from_row_lengths(words.flat_values, tf.ones_like(words.flat_values, tf.int64))
    nested = words.with_flat_values(pieces)  # [texts, words, (pieces)]
    assert merge_inner_dims(nested).to_list() == nested.merge_dims(-2, -1).to_list()
    deeper = tf.RaggedTensor.from_row_lengths(nested, [2, len(HARD_STRINGS) + len(KERAS_HUB_DIFFERS) - 2])
    assert merge_inner_dims(deeper).to_list() == deeper.merge_dims(-2, -1).to_list()

    # Tokenization traced (a tf.data map, a SavedModel): no validation branches, which every new tf.data
    # iterator instantiated again (tf-text's regex_split and RaggedTensor.merge_dims add three each).
    tokenizer = BertTokenizer(TINY_VOCAB)
    for tokenize in (tokenizer.tokenize, lambda s: tokenizer.tokenize_with_offsets(s)[0]):
        graph = tf.function(tokenize).get_concrete_function(tf.TensorSpec([None], tf.string)).graph.as_graph_def()
        ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
        assert "Assert" not in ops
