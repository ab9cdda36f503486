"""SentencePieceTokenizer (ALBERT): id parity with the `sentencepiece` package,
keras-hub's AlbertTokenizer and Hugging Face `tokenizers` / transformers'
AlbertTokenizerFast; graph modes, SavedModel, config, errors, and a tiny ALBERT
classifier fitted on raw strings.

No real ALBERT vocabulary is available offline: a small SentencePiece model is
trained here (well under a second) with ALBERT's special-token layout.
"""

import base64
import io
import json
import random
import unicodedata
from pathlib import Path

import keras
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

import bertzoo
from bertzoo.text import BertPreprocessor
from bertzoo.text import SentencePieceTokenizer
from bertzoo.text import albert_tokenizer_options

SHARED_SENTIMENT = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "sentiment").resolve()

WORDS = (
    "the a an of to and in is was for on with as by at from that this it be are were has have had not but or "
    "The A This It I We You They He She Good Bad "
    "quick brown fox jumps over lazy dog cat runs running ran walk walked walking house houses mouse mice "
    "movie movies good bad great terrible awful wonderful love hate like liked likes film book books story "
    "stories time people city country world water fire earth music song songs play played playing player "
    "game games review reviews product price cheap expensive quality service customer order ordered "
    "delivery fast slow broken works working naive resume cafe "
    "café naïve résumé coöperation façade piñata zoë éclair über straße señor niño Ελλάδα ΟΔΟΣ "
    "中文 字符 日本語 テキスト 漢字 한국어 😀 👍 🎉 ❤️ "
    "1 2 3 10 42 100 1,000 2,500 10,000 1,234,567 3.14 0.5 50% $5 #1 1, 2, 3, 10, 1,000, 2,500, 1, 2, 3, "
    "! ? . , ; : ( ) [ ] - -- ... ' \" `` '' & @ / *"
).split()

# Inputs on which all references are compared.
HARD_STRINGS = [
    "",
    "   ",
    "\t\n \r\n",
    "The quick brown fox jumps over the lazy dog.",
    "Café au lait, naïve coöperation, Éclair, façade, résumé, piñata, Zoë",
    "Wait!!! What?!?... (yes) -- [no] {maybe} ;-) <<>> ##hash## @@ ~~ ^_^",
    "1,234,567.89 and 3.14159 or -0.5e10, $1,000.00 / 50% off #1, 2,500, 10,000,",
    "I ❤️ NY 😀👍🏽 🇺🇸 🎉🎉🎉 :-)",
    "中文字符和日本語のテキスト、漢字。",
    "한국어 텍스트",
    "MiXeD CaSe: iPhone McDonald's NASA eBay HTTPServer",
    "tab\tseparated\tvalues\nnew line  double  space  ",
    "``LaTeX quotes'' and \"plain\" and 'single' “smart” ‘quotes’",
    "Straße ﬁnance ½ x² ™ wait… ＦＵＬＬＷＩＤＴＨ １２３",
    "ΟΔΟΣ Σίσυφος",
    "non\u00a0breaking\u3000ideographic space",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
]
# Where Hugging Face differs from ALBERT's own pipeline (Python preprocessing,
# then the `sentencepiece` package), checked against the latter instead.
HF_DIFFERS_WHEN_STRIPPING_ACCENTS = {
    # NFKD splits Hangul syllables into jamo; SentencePiece's NFKC rules
    # re-compose them, HF's Precompiled normalizer does not (it maps graphemes
    # longer than 6 bytes one character at a time).
    "hangul": "한국어 텍스트",
    # ALBERT drops characters of a non-zero combining class; HF's fast
    # StripAccents drops every mark, also the emoji variation selector
    # U+FE0F (combining class 0), which ALBERT keeps.
    "variation_selector": "I \u2764\ufe0f NY \U0001f600\U0001f44d\U0001f3fd \U0001f1fa\U0001f1f8 \U0001f389\U0001f389\U0001f389 :-)",
}
SPECIAL_STRINGS = [
    "The capital of France is [MASK].",
    "[CLS] first [SEP] second [SEP]",
    "x[MASK]y <pad> <unk> [mask] [Sep]",
]


def make_corpus(n=3000, seed=0):
    rng = random.Random(seed)
    corpus = []
    for i in range(n):
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
        corpus.append(sentence.capitalize() if i % 3 == 0 else sentence)
    return corpus


def train_sentencepiece(sentences, vocab_size=300, **options):
    """A unigram model with ALBERT's special pieces: <pad>=0, <unk>=1,
    [CLS]=2 and [SEP]=3 (control), [MASK]=4 (user defined)."""
    settings = dict(
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece="<pad>",
        unk_piece="<unk>",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        user_defined_symbols="[MASK]",
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",  # ALBERT's
        minloglevel=2,
    )
    settings.update(options)
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=buffer, **settings)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def proto():
    return train_sentencepiece(make_corpus())


@pytest.fixture(scope="module")
def model_file(proto, tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "spiece.model"
    path.write_bytes(proto)
    return path


def as_lists(ids):
    return ids.to_list() if isinstance(ids, tf.RaggedTensor) else ids.numpy().tolist()


# --- References --------------------------------------------------------------
def albert_preprocess(text, lowercase, keep_accents):
    """ALBERT's preprocessing (quotes, NFKD and dropping characters of a
    non-zero combining class, lower-casing), written independently in Python."""
    text = text.replace("``", '"').replace("''", '"')
    if not keep_accents:
        text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    if lowercase:
        text = "".join(c.lower() for c in text)
    return text


def model_proto(proto):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    return model


def hf_albert_tokenizer(proto, lowercase, keep_accents):
    """Hugging Face `tokenizers` pipeline for ALBERT, assembled from the
    .model as transformers' AlbertConverter does (without transformers)."""
    from tokenizers import AddedToken
    from tokenizers import Regex
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import normalizers
    from tokenizers import pre_tokenizers

    model = model_proto(proto)

    def score(piece):
        digit_comma = len(piece.piece) >= 2 and piece.piece[-1] == "," and piece.piece[-2].isdigit()
        return piece.score - 100 if digit_comma else piece.score

    vocab = [(piece.piece, score(piece)) for piece in model.pieces]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=model.trainer_spec.unk_id, byte_fallback=False))
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not keep_accents:
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    steps.append(normalizers.Precompiled(model.normalizer_spec.precompiled_charsmap))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False, lstrip=token == "[MASK]")
            for token in ("[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]")
        ]
    )
    return tokenizer


def albert_options(lowercase, keep_accents):
    """Our options equivalent to HF AlbertTokenizer(do_lower_case, keep_accents)."""
    return {**albert_tokenizer_options(lowercase, keep_accents), "special_tokens_in_strings": True}


# --- Parity ------------------------------------------------------------------
def test_default_matches_sentencepiece_and_keras_hub(proto):
    import keras_hub

    tokenizer = SentencePieceTokenizer(proto)
    reference = spm.SentencePieceProcessor(model_proto=proto)
    keras_hub_tokenizer = keras_hub.tokenizers.AlbertTokenizer(proto=proto)
    strings = HARD_STRINGS + SPECIAL_STRINGS
    ours = as_lists(tokenizer(strings))
    assert ours == reference.encode(strings)
    assert ours == [list(map(int, ids)) for ids in keras_hub_tokenizer(strings)]
    assert ours[0] == [] and ours[1] == [] and ours[2] == []
    # The model really normalizes with NFKC and keeps case (ALBERT's nmt_nfkc).
    assert (
        ours[HARD_STRINGS.index("MiXeD CaSe: iPhone McDonald's NASA eBay HTTPServer")]
        != as_lists(tokenizer(["mixed case: iphone mcdonald's nasa ebay httpserver"]))[0]
    )


@pytest.mark.parametrize("lowercase,keep_accents", [(True, False), (False, True), (True, True), (False, False)])
def test_albert_options_match_hf_tokenizers(proto, lowercase, keep_accents):
    tokenizer = SentencePieceTokenizer(proto, **albert_options(lowercase, keep_accents))
    hf = hf_albert_tokenizer(proto, lowercase, keep_accents)
    strings = hf_comparable(HARD_STRINGS + SPECIAL_STRINGS, keep_accents)
    expected = [encoding.ids for encoding in hf.encode_batch(strings, add_special_tokens=False)]
    assert as_lists(tokenizer(strings)) == expected


@pytest.mark.parametrize("lowercase,keep_accents", [(True, False), (False, True)])
def test_albert_options_match_transformers(model_file, lowercase, keep_accents):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AlbertTokenizerFast.from_pretrained(
        str(model_file.parent), do_lower_case=lowercase, keep_accents=keep_accents
    )
    # ALBERT's digit-comma rule lives in the Unigram scores: transformers 4's
    # AlbertConverter (which wrote the tokenizer.json files on the Hub) lowers
    # them, transformers 5 building from a bare spiece.model does not.
    vocab = json.loads(hf.backend_tokenizer.to_str())["model"]["vocab"]
    proto_scores = {piece.piece: piece.score for piece in model_proto(model_file.read_bytes()).pieces}
    penalized = any(score < proto_scores[piece] - 50 for piece, score in vocab)
    options = {**albert_options(lowercase, keep_accents), "split_digit_comma": penalized}
    tokenizer = SentencePieceTokenizer(model_file, **options)
    strings = hf_comparable(HARD_STRINGS + SPECIAL_STRINGS, keep_accents)
    expected = [hf(text, add_special_tokens=False)["input_ids"] for text in strings]
    assert as_lists(tokenizer(strings)) == expected
    # Packing as HF does it: [CLS] A [SEP] B [SEP].
    packed = BertPreprocessor(tokenizer, sequence_length=64)(("Café, 1,000 😀!", "[MASK] is here"))
    pair = hf("Café, 1,000 😀!", "[MASK] is here", return_token_type_ids=True)
    length = len(pair["input_ids"])
    assert packed["token_ids"].numpy().tolist()[:length] == pair["input_ids"]
    assert packed["segment_ids"].numpy().tolist()[:length] == pair["token_type_ids"]


def hf_comparable(strings, keep_accents):
    if keep_accents:
        return strings
    return [text for text in strings if text not in HF_DIFFERS_WHEN_STRIPPING_ACCENTS.values()]


@pytest.mark.parametrize("name", sorted(HF_DIFFERS_WHEN_STRIPPING_ACCENTS))
def test_where_hf_differs_we_follow_albert_and_sentencepiece(proto, name):
    text = HF_DIFFERS_WHEN_STRIPPING_ACCENTS[name]
    reference = spm.SentencePieceProcessor(model_proto=proto)
    tokenizer = SentencePieceTokenizer(proto, **albert_options(True, False))
    ours = as_lists(tokenizer(text))
    assert ours == reference.encode(albert_preprocess(text, lowercase=True, keep_accents=False))
    assert ours != hf_albert_tokenizer(proto, True, False).encode(text, add_special_tokens=False).ids


def test_preprocessing_matches_python_reference_on_sentencepiece(proto):
    """Lower-casing, accent stripping and quotes against an independent Python
    version fed to the `sentencepiece` package (no digit-comma pieces involved)."""
    reference = spm.SentencePieceProcessor(model_proto=proto)
    tokenizer = SentencePieceTokenizer(proto, lowercase=True, strip_accents=True, replace_quotes=True)
    strings = [s for s in HARD_STRINGS if "," not in s]
    expected = [reference.encode(albert_preprocess(s, lowercase=True, keep_accents=False)) for s in strings]
    assert as_lists(tokenizer(strings)) == expected


def test_split_digit_comma(proto):
    tokenizer = SentencePieceTokenizer(proto, split_digit_comma=True)
    plain = SentencePieceTokenizer(proto)
    vocabulary = tokenizer.get_vocabulary()
    digit_comma = {
        i for i, piece in enumerate(vocabulary) if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()
    }
    assert digit_comma, "the test vocabulary should hold pieces such as '▁1,' for this test to mean anything"
    text = "1,000 and 2,500, 10,000, 1,234,567"
    assert set(as_lists(plain(text))) & digit_comma
    ids = as_lists(tokenizer(text))
    assert not set(ids) & digit_comma
    assert tokenizer.detokenize(ids).numpy().decode() == text


def test_special_tokens_in_strings(proto):
    default = SentencePieceTokenizer(proto)
    special = SentencePieceTokenizer(proto, special_tokens_in_strings=True)
    text = "[CLS] a [SEP] b <pad> [MASK]"
    control = {default.cls_token_id, default.sep_token_id, default.pad_token_id}
    # By default typed control tokens stay text; [MASK] is a user-defined
    # piece of the model, which SentencePiece itself always matches.
    assert not set(as_lists(default(text))) & control
    assert default.mask_token_id in as_lists(default(text))
    ids = as_lists(special(text))
    assert [i for i in ids if i in control | {special.mask_token_id}] == [
        special.cls_token_id,
        special.sep_token_id,
        special.pad_token_id,
        special.mask_token_id,
    ]
    # Case counts: "[mask]" is text.
    assert special.mask_token_id not in as_lists(special("[mask]"))


# --- Graph modes, SavedModel ---------------------------------------------------
def test_eager_tf_data_tf_function_identical(proto):
    for options in ({}, albert_options(True, False)):
        tokenizer = SentencePieceTokenizer(proto, **options)
        strings = HARD_STRINGS + SPECIAL_STRINGS
        eager = as_lists(tokenizer(strings))
        dataset = tf.data.Dataset.from_tensor_slices(strings).batch(4).map(tokenizer)
        from_data = [row for batch in dataset for row in batch.to_list()]
        graph = tf.function(tokenizer.tokenize)(tf.constant(strings)).to_list()
        single = [as_lists(tokenizer(text)) for text in strings]
        single_graph = [tf.function(tokenizer.tokenize)(tf.constant(text)).numpy().tolist() for text in strings[:3]]
        assert eager == from_data == graph == single
        assert single_graph == eager[:3]
        assert tokenizer(["a b"]).dtype == tf.int32 and tokenizer("a b").shape.rank == 1


def test_seeding_tensorflow_after_building_leaves_the_tokenizer_working(proto):
    # `tf.random.set_seed` (and so `keras.utils.set_random_seed`) clears
    # TensorFlow's eager caches, and with them SentencePiece's resource.
    tokenizer = SentencePieceTokenizer(proto)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=16)
    before = as_lists(tokenizer(HARD_STRINGS))
    keras.utils.set_random_seed(7)
    assert as_lists(tokenizer(HARD_STRINGS)) == before
    tf.random.set_seed(8)
    dataset = tf.data.Dataset.from_tensor_slices(HARD_STRINGS).batch(4).map(tokenizer)
    assert [row for batch in dataset for row in batch.to_list()] == before
    tf.random.set_seed(9)
    assert preprocessor(HARD_STRINGS[:2])["token_ids"].shape == (2, 16)
    # The preprocessor's traced function (one per preprocessor, reused by every pipeline) too: each
    # `fit` on raw text after `keras.utils.set_random_seed` builds a new pipeline through it.
    texts = tf.data.Dataset.from_tensor_slices(HARD_STRINGS).batch(4)
    packed = next(iter(texts.map(preprocessor)))["token_ids"].numpy().tolist()
    keras.utils.set_random_seed(10)
    assert next(iter(texts.map(preprocessor)))["token_ids"].numpy().tolist() == packed


def test_nul_and_next_line_characters_as_albert_reads_them(proto):
    # A NUL is one unknown piece (lower-casing and the special-token split
    # used to stop there); NEL is whitespace to ALBERT's str.split().
    tokenizer = SentencePieceTokenizer(proto, **albert_options(True, False))
    ids = as_lists(tokenizer("the\x00fox jumps [MASK]"))
    assert tokenizer.token_to_id("<unk>") in ids and ids[-1] == tokenizer.token_to_id("[MASK]")
    assert as_lists(tokenizer.tokenize_with_offsets(["the\x00fox jumps"])[0])[0] == ids[:-1]
    assert as_lists(tokenizer("the\x85fox")) == as_lists(tokenizer("the fox"))


def test_runs_inside_exported_saved_model(proto, tmp_path):
    tokenizer = SentencePieceTokenizer(proto, **albert_options(True, False))
    preprocessor = BertPreprocessor(tokenizer, sequence_length=16)

    class Serving(tf.Module):
        def __init__(self):
            super().__init__()
            self.preprocessor = preprocessor

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def __call__(self, text):
            return self.preprocessor(text)["token_ids"]

    strings = ["Café, 1,000 😀!", "The capital is [MASK].", ""]
    tf.saved_model.save(Serving(), str(tmp_path / "served"))
    loaded = tf.saved_model.load(str(tmp_path / "served"))
    assert loaded(tf.constant(strings)).numpy().tolist() == preprocessor(strings)["token_ids"].numpy().tolist()


# --- Vocabulary API, detokenize ---------------------------------------------------
def test_vocabulary_api(proto, model_file):
    tokenizer = SentencePieceTokenizer(model_file)
    reference = spm.SentencePieceProcessor(model_proto=proto)
    assert tokenizer.vocabulary_size() == reference.get_piece_size() == 300
    assert tokenizer.get_vocabulary() == [reference.id_to_piece(i) for i in range(300)]
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id) == (0, 1, 2)
    assert (tokenizer.sep_token_id, tokenizer.mask_token_id) == (3, 4)
    assert tokenizer.token_to_id("[MASK]") == 4 and tokenizer.id_to_token(4) == "[MASK]"
    assert tokenizer.proto == proto
    vocabulary = tokenizer.get_vocabulary()
    vocabulary[0] = "changed"
    assert tokenizer.id_to_token(0) == "<pad>"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizer.token_to_id("no such piece")
    with pytest.raises(ValueError, match=r"must be in \[0, 299\]"):
        tokenizer.id_to_token(300)
    with pytest.raises(ValueError, match="must be an integer"):
        tokenizer.id_to_token("4")


def test_detokenize(proto):
    tokenizer = SentencePieceTokenizer(proto)
    reference = spm.SentencePieceProcessor(model_proto=proto)
    strings = ["The quick brown fox.", "Café, 1,000 😀!", ""]
    ids = tokenizer(strings)
    assert [s.decode() for s in tokenizer.detokenize(ids).numpy()] == reference.decode(ids.to_list())
    assert tokenizer.detokenize(ids.to_list()[0]).numpy().decode() == "The quick brown fox."
    # Control tokens decode to nothing.
    assert tokenizer.detokenize([2] + ids.to_list()[0] + [3, 0]).numpy().decode() == "The quick brown fox."
    with pytest.raises(ValueError, match=r"must be in \[0, 299\]"):
        tokenizer.detokenize([[5, 300]])
    with pytest.raises(ValueError, match="integer token ids"):
        tokenizer.detokenize([1.5, 2.0])


# --- Config --------------------------------------------------------------------------
def test_config_round_trip(proto):
    tokenizer = SentencePieceTokenizer(proto, lowercase=True, replace_quotes=True, split_digit_comma=True)
    config = tokenizer.get_config()
    config = json.loads(json.dumps(config))  # JSON-safe
    assert base64.b64decode(config["proto"]) == proto
    assert config["lowercase"] is True and config["strip_accents"] is None
    restored = SentencePieceTokenizer.from_config(config)
    strings = HARD_STRINGS + SPECIAL_STRINGS
    assert as_lists(restored(strings)) == as_lists(tokenizer(strings))
    assert restored.get_config() == config
    # Through Keras serialization, alone and inside the preprocessor.
    again = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(tokenizer)))
    )
    assert isinstance(again, SentencePieceTokenizer)
    assert as_lists(again(strings)) == as_lists(tokenizer(strings))
    preprocessor = BertPreprocessor(tokenizer, sequence_length=12)
    rebuilt = BertPreprocessor.from_config(json.loads(json.dumps(preprocessor.get_config())))
    assert isinstance(rebuilt.tokenizer, SentencePieceTokenizer)
    assert rebuilt(strings)["token_ids"].numpy().tolist() == preprocessor(strings)["token_ids"].numpy().tolist()


# --- Errors --------------------------------------------------------------------------
def test_not_a_sentencepiece_model(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    with pytest.raises(
        ValueError, match=r"vocab\.txt' is not a SentencePiece model.*expected a serialized.*BertTokenizer"
    ):
        SentencePieceTokenizer(vocab)
    garbage = tmp_path / "random.model"
    garbage.write_bytes(np.random.default_rng(0).bytes(512))
    with pytest.raises(ValueError, match=r"random\.model' is not a SentencePiece model"):
        SentencePieceTokenizer(str(garbage))
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is not a SentencePiece model.*it is empty"):
        SentencePieceTokenizer(empty)
    with pytest.raises(ValueError, match="proto bytes is not a SentencePiece model"):
        SentencePieceTokenizer(b"\x0a\x03abc")  # parses as a protobuf, but is not a model
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SentencePieceTokenizer(tmp_path / "missing.model")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "spiece.model").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is a directory.*spiece.model"):
        SentencePieceTokenizer(tmp_path / "dir")


def test_missing_special_token():
    proto = train_sentencepiece(make_corpus(500), vocab_size=150, user_defined_symbols="")
    with pytest.raises(ValueError, match=r"has no '\[MASK\]' token.*user_defined_symbols='\[MASK\]'"):
        SentencePieceTokenizer(proto)
    plain = train_sentencepiece(make_corpus(500), vocab_size=150, pad_id=-1, bos_piece="<s>", eos_piece="</s>")
    with pytest.raises(ValueError, match=r"has no '<pad>', '\[CLS\]', '\[SEP\]' tokens"):
        SentencePieceTokenizer(plain)


def test_bad_options(proto):
    for name in ("lowercase", "replace_quotes", "split_digit_comma", "special_tokens_in_strings"):
        with pytest.raises(ValueError, match=f"`{name}` must be True or False"):
            SentencePieceTokenizer(proto, **{name: "yes"})
    with pytest.raises(ValueError, match="`strip_accents` must be True, False or None"):
        SentencePieceTokenizer(proto, strip_accents=1)
    with pytest.raises(ValueError, match="`keep_accents` must be True or False"):
        albert_tokenizer_options(True, "no")
    with pytest.raises(
        ValueError, match="`proto` must be the path of a SentencePiece .model file or its serialized bytes"
    ):
        SentencePieceTokenizer(["<pad>"])
    with pytest.raises(ValueError, match="not base64"):
        SentencePieceTokenizer.from_config({"proto": "/etc/passwd"})
    with pytest.raises(ValueError, match="needs `proto`"):
        SentencePieceTokenizer.from_config({"proto": None})
    tokenizer = SentencePieceTokenizer(proto)
    with pytest.raises(ValueError, match="expects strings, got a int32 tensor"):
        tokenizer(tf.constant([1, 2]))
    with pytest.raises(ValueError, match="got a RaggedTensor"):
        tokenizer(tf.ragged.constant([["a"], ["b", "c"]]))


# --- With the preprocessor and a tiny ALBERT ----------------------------------------------
def test_preprocessor_packs_with_sentencepiece(proto):
    tokenizer = SentencePieceTokenizer(proto)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=10)
    a, b = "The fox.", "A dog ran"
    out = preprocessor((a, b))
    ids_a, ids_b = as_lists(tokenizer(a)), as_lists(tokenizer(b))
    expected = [2] + ids_a + [3] + ids_b + [3]
    assert len(expected) <= 10
    assert out["token_ids"].numpy().tolist() == expected + [0] * (10 - len(expected))
    assert out["segment_ids"].numpy().tolist() == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1) + [0] * (
        10 - len(expected)
    )
    assert out["padding_mask"].numpy().tolist() == [True] * len(expected) + [False] * (10 - len(expected))
    batch = preprocessor(["the quick brown fox jumps over the lazy dog " * 3, ""])
    assert batch["token_ids"].shape == (2, 10)
    assert batch["token_ids"].numpy()[0, -1] == 3 and batch["token_ids"].numpy()[1].tolist()[:3] == [2, 3, 0]


def test_a_backbone_saved_with_a_sentencepiece_tokenizer_loads_with_it(proto, tmp_path):
    tokenizer = SentencePieceTokenizer(proto, lowercase=False)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16
    )
    backbone.save_to_preset(tmp_path / "p", tokenizer=tokenizer, preprocessor_config={"sequence_length": 12})
    assert (tmp_path / "p" / "sentencepiece.model").is_file() and not (tmp_path / "p" / "vocabulary.txt").exists()
    preprocessor = bertzoo.Preset.resolve(tmp_path / "p").build_preprocessor()
    assert isinstance(preprocessor.tokenizer, SentencePieceTokenizer) and not preprocessor.tokenizer.lowercase
    assert preprocessor.sequence_length == 12
    text = "The Fox ran."
    assert as_lists(preprocessor.tokenizer(text)) == as_lists(tokenizer(text))
    with pytest.raises(ValueError, match=r"sets \['lowercase'\], which a SentencePieceTokenizer takes itself"):
        backbone.save_to_preset(tmp_path / "q", tokenizer=tokenizer, preprocessor_config={"lowercase": True})
    assert not (tmp_path / "q").exists()


def test_tiny_albert_classifier_fits_raw_strings(proto):
    keras.utils.set_random_seed(0)
    tokenizer = SentencePieceTokenizer(proto, lowercase=True)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        embedding_dim=8,
        num_groups=1,
    )
    model = bertzoo.BertClassifier(backbone, 2, preprocessor=BertPreprocessor(tokenizer, sequence_length=16))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    texts = [
        "A wonderful film, I love it!",
        "Terrible quality, broken on delivery.",
        "Great song 😀 great price",
        "Awful service; I hate slow orders…",
        "Café au lait was good.",
        "Bad, bad, BAD product. 1,000 complaints",
    ]
    labels = np.array([1, 0, 1, 0, 1, 0])
    history = model.fit(x=texts, y=labels, batch_size=3, epochs=2, verbose=0)
    assert all(np.isfinite(loss) for loss in history.history["loss"])
    logits = model.predict(["I love this movie", "broken and slow", ""], verbose=0)
    assert logits.shape == (3, 2) and np.all(np.isfinite(logits))


# --- A model trained on real text, when ../shared provides it -------------------------------
def assert_same_up_to_ties(ours, expected, what):
    """Equal ids, except where SentencePiece builds disagree on two
    segmentations of equal score: the same pieces in another order ("..." "."
    against "." "...", "oo" "o" against "o" "oo"), which float rounding in
    each library's Viterbi search decides. Such ties are rare."""
    ties = 0
    for a, b in zip(ours, expected, strict=True):
        if a != b:
            assert sorted(a) == sorted(b), f"{what}: {a} != {b}"
            ties += 1
    assert ties <= len(ours) // 200, f"{what}: {ties} of {len(ours)} sentences differ"


def test_parity_on_shared_sentiment_text():
    files = sorted(SHARED_SENTIMENT.glob("*.tsv")) if SHARED_SENTIMENT.is_dir() else []
    if not files:
        pytest.skip(f"no sentiment data under {SHARED_SENTIMENT}")
    import keras_hub

    sentences = []
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()[1:]
        sentences += [line.split("\t", 2)[2] for line in lines if line.count("\t") >= 2]
    proto = train_sentencepiece(sentences[::3], vocab_size=500)  # about a second
    sample = sentences + HARD_STRINGS
    tokenizer = SentencePieceTokenizer(proto)
    ours = as_lists(tokenizer(sample))
    # keras-hub's graph path runs the same SentencePiece build (TF Text): exact.
    keras_hub_tokenizer = keras_hub.tokenizers.AlbertTokenizer(proto=proto)
    dataset = tf.data.Dataset.from_tensor_slices(sample).batch(1024).map(keras_hub_tokenizer)
    assert ours == [row for batch in dataset for row in batch.to_list()]
    # Its eager path and the sentencepiece package (0.2): up to ties.
    assert_same_up_to_ties(ours, spm.SentencePieceProcessor(model_proto=proto).encode(sample), "sentencepiece")
    assert_same_up_to_ties(ours, [list(map(int, ids)) for ids in keras_hub_tokenizer(sample)], "keras-hub eager")
    albert = SentencePieceTokenizer(proto, **albert_options(True, False))
    hf = hf_albert_tokenizer(proto, True, False)
    expected = [e.ids for e in hf.encode_batch(hf_comparable(sample, False), add_special_tokens=False)]
    assert_same_up_to_ties(as_lists(albert(hf_comparable(sample, False))), expected, "HF tokenizers")


def test_tokenize_with_offsets_maps_pieces_to_the_original_characters(proto):
    tokenizer = SentencePieceTokenizer(proto, **albert_tokenizer_options())
    texts = ["Café au LAIT, naïve résumé 1,234 dogs!", "", "  spaced   words  ", "He said ''good'' and ``fine'' ''."]
    ids, starts, ends = tokenizer.tokenize_with_offsets(texts)
    # The same ids as `tokenize`, quote pairs included (the question answerer trains on one, answers with the other).
    assert ids.to_list() == tokenizer.tokenize(texts).to_list()
    spans = [[text[a:b] for a, b in zip(s, e)] for text, s, e in zip(texts, starts.to_list(), ends.to_list())]
    assert spans[0][0] == "Café" and "naïve" in spans[0] and "résumé" in spans[0]  # Case and accents kept.
    assert spans[1] == [] and all(not span.isspace() for row in spans for span in row)
    assert "".join(spans[3]) == texts[3].replace(" ", "")  # A pair's `"` spans both of its characters.
    graph = tf.function(tokenizer.tokenize_with_offsets)(tf.constant(texts))
    assert [t.to_list() for t in graph] == [ids.to_list(), starts.to_list(), ends.to_list()]


def test_question_answering_reads_sentencepiece_text(proto):
    keras.utils.set_random_seed(0)
    tokenizer = SentencePieceTokenizer(proto, **albert_tokenizer_options())
    backbone = bertzoo.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        embedding_dim=8,
        num_groups=1,
    )
    qa = bertzoo.BertQuestionAnswerer(backbone, preprocessor=BertPreprocessor(tokenizer, sequence_length=24))
    context = "The quick brown fox jumps over the lazy dog near the old river bank, Café résumé. " * 3
    answers = qa.predict_spans(["Who jumps?"], [context], stride=8)
    assert answers[0]["text"] == context[answers[0]["start"] : answers[0]["end"]] and answers[0]["text"]


def test_accent_stripping_drops_what_albert_drops(proto):
    # Combining class, not the Mn category: Devanagari and Thai vowel signs
    # (Mn or Mc, combining class 0) stay, the accents of "Café" and the
    # virama of "नमस्ते" go.
    texts = ["कुछ हिंदी नमः नमस्ते", "กัน ที่", "Café naïve Ångström", "I \u2764\ufe0f NY"]
    tokenizer = SentencePieceTokenizer(proto, lowercase=False, strip_accents=True)
    ours = [t.decode("utf-8") for t in tokenizer._preprocess(tf.constant(texts)).numpy().tolist()]
    assert ours == [albert_preprocess(t, lowercase=False, keep_accents=False) for t in texts]
    assert "\u0941" in ours[0] and "\u094d" not in ours[0] and ours[2] == "Cafe naive Angstrom"


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\u2003", " "])
def test_offsets_start_after_any_unicode_space(proto, space):
    text = f"the{space}fox"
    tokenizer = SentencePieceTokenizer(proto)
    ids, starts, ends = tokenizer.tokenize_with_offsets([text])
    spans = [text[s:e] for s, e in zip(starts.to_list()[0], ends.to_list()[0])]
    assert "".join(spans) == "thefox" and all(span and not span[0].isspace() for span in spans), spans
