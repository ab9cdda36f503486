"""Helpers for the converter tests: random tiny checkpoints in each source
layout, written from one set of arrays, and an independent NumPy forward pass
of BERT / ALBERT computed from those same arrays."""

import io
import json
import math
import types
from pathlib import Path

import numpy as np
import pytest

# --- Random reference weights -------------------------------------------------


def random_model(
    rng,
    vocabulary_size=40,
    positions=16,
    segments=2,
    hidden=16,
    heads=2,
    intermediate=32,
    num_layers=2,
    num_sets=None,
    embedding=None,
):
    """Random weights in a plain layout: `sets` are the distinct layer weight
    sets, `layer_sets[i]` the set layer application `i` uses. Kernels are
    `[in, out]`. `embedding` (E) given: ALBERT-style factorized embeddings."""
    E = embedding or hidden

    def dense(n_in, n_out):
        return rng.normal(0, 0.3, (n_in, n_out)), rng.normal(0, 0.1, (n_out,))

    def norm(n):
        return 1 + rng.normal(0, 0.1, (n,)), rng.normal(0, 0.1, (n,))

    num_sets = num_sets or num_layers
    sets = [
        {
            "query": dense(hidden, hidden),
            "key": dense(hidden, hidden),
            "value": dense(hidden, hidden),
            "output": dense(hidden, hidden),
            "attention_norm": norm(hidden),
            "intermediate": dense(hidden, intermediate),
            "ffn_output": dense(intermediate, hidden),
            "ffn_norm": norm(hidden),
        }
        for _ in range(num_sets)
    ]
    model = {
        "word": rng.normal(0, 0.5, (vocabulary_size, E)),
        "position": rng.normal(0, 0.5, (positions, E)),
        "segment": rng.normal(0, 0.5, (segments, E)),
        "embedding_norm": norm(E),
        "projection": dense(E, hidden) if embedding else None,
        "sets": sets,
        "layer_sets": [i * num_sets // num_layers for i in range(num_layers)],
        "pooler": dense(hidden, hidden),
        "heads": {
            "transform": dense(hidden, E),
            "transform_norm": norm(E),
            "output_bias": rng.normal(0, 0.1, (vocabulary_size,)),
            "nsp": dense(hidden, 2),
        },
        "sizes": dict(V=vocabulary_size, P=positions, T=segments, H=hidden, A=heads, I=intermediate, E=E),
    }
    # Store everything as float32, as real checkpoints do.
    return _to_float32(model)


def _to_float32(x):
    if isinstance(x, dict):
        return {k: _to_float32(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_float32(v) for v in x)
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return x.astype("float32")
    return x


# --- Independent NumPy forward pass --------------------------------------------

_erf = np.vectorize(math.erf)


def activation_fn(name):
    return {
        "gelu_exact": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
        "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        "relu": lambda x: np.maximum(x, 0),
    }[name]


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def forward(model, inputs, activation, eps=1e-12):
    """`(sequence_output, pooled_output)` in float64, from the raw arrays."""
    m = _to_float64(model)
    act = activation_fn(activation)
    ids, seg = inputs["token_ids"], inputs["segment_ids"]
    mask = np.asarray(inputs["padding_mask"]).astype(bool)
    batch, length = ids.shape
    heads = m["sizes"]["A"]
    x = m["word"][ids] + m["position"][:length][None] + m["segment"][seg]
    x = layer_norm(x, *m["embedding_norm"], eps)
    if m["projection"] is not None:
        x = x @ m["projection"][0] + m["projection"][1]
    for index in m["layer_sets"]:
        w = m["sets"][index]
        d = x.shape[-1] // heads

        def split(t, d=d):
            return t.reshape(batch, length, heads, d).transpose(0, 2, 1, 3)

        q, k, v = (split(x @ w[n][0] + w[n][1]) for n in ("query", "key", "value"))
        logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
        logits = np.where(mask[:, None, None, :], logits, -1e9)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, heads * d)
        x = layer_norm(x + context @ w["output"][0] + w["output"][1], *w["attention_norm"], eps)
        h = act(x @ w["intermediate"][0] + w["intermediate"][1])
        x = layer_norm(x + h @ w["ffn_output"][0] + w["ffn_output"][1], *w["ffn_norm"], eps)
    pooled = np.tanh(x[:, 0] @ m["pooler"][0] + m["pooler"][1])
    return x, pooled


def _to_float64(x):
    if isinstance(x, dict):
        return {k: _to_float64(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_float64(v) for v in x)
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return x.astype("float64")
    return x


def max_difference(backbone, model, inputs, activation, eps=1e-12):
    """Largest |bertzoo - NumPy| over sequence and pooled outputs."""
    out = backbone(inputs)
    sequence, pooled = forward(model, inputs, activation, eps)
    return max(
        float(np.abs(np.asarray(out["sequence_output"]) - sequence).max()),
        float(np.abs(np.asarray(out["pooled_output"]) - pooled).max()),
    )


# --- Writers, one per source layout ---------------------------------------------


def sentencepiece_model(size=40):
    """The bytes of a small unigram SentencePiece model of exactly `size`
    pieces, with ALBERT's special pieces (<pad>=0, <unk>=1, [CLS]=2, [SEP]=3,
    [MASK]=4), trained here on generated text."""
    spm = pytest.importorskip("sentencepiece")
    rng = np.random.default_rng(0)
    words = [
        "tok",
        "fox",
        "runs",
        "the",
        "dog",
        "cat",
        "sat",
        "mat",
        "blue",
        "sky",
        "quick",
        "brown",
        "jumps",
        "lazy",
        "over",
        "wing",
        "park",
    ]
    sentences = [" ".join(rng.choice(words, 6)) for _ in range(300)]
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buffer,
        vocab_size=size,
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
        normalization_rule_name="nmt_nfkc",
        minloglevel=2,
    )
    return buffer.getvalue()


def tiny_vocabulary(size):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return tokens + [f"tok{i}" for i in range(size - len(tokens))]


def hf_bert_arrays(model, prefix="", legacy_norm_names=False, heads=True):
    """HF BERT names; `nn.Linear` weights stored `[out, in]`."""
    s = model["sizes"]
    gamma, beta = ("gamma", "beta") if legacy_norm_names else ("weight", "bias")
    out = {
        f"{prefix}embeddings.word_embeddings.weight": model["word"],
        f"{prefix}embeddings.position_embeddings.weight": model["position"],
        f"{prefix}embeddings.token_type_embeddings.weight": model["segment"],
        f"{prefix}embeddings.LayerNorm.{gamma}": model["embedding_norm"][0],
        f"{prefix}embeddings.LayerNorm.{beta}": model["embedding_norm"][1],
        f"{prefix}embeddings.position_ids": np.arange(s["P"], dtype="int64")[None],
        f"{prefix}pooler.dense.weight": model["pooler"][0].T,
        f"{prefix}pooler.dense.bias": model["pooler"][1],
    }
    for i, w in enumerate(model["sets"]):
        p = f"{prefix}encoder.layer.{i}."
        for source, name in (
            ("attention.self.query", "query"),
            ("attention.self.key", "key"),
            ("attention.self.value", "value"),
            ("attention.output.dense", "output"),
            ("intermediate.dense", "intermediate"),
            ("output.dense", "ffn_output"),
        ):
            out[f"{p}{source}.weight"] = w[name][0].T
            out[f"{p}{source}.bias"] = w[name][1]
        for source, name in (("attention.output.LayerNorm", "attention_norm"), ("output.LayerNorm", "ffn_norm")):
            out[f"{p}{source}.{gamma}"] = w[name][0]
            out[f"{p}{source}.{beta}"] = w[name][1]
    if heads:
        h = model["heads"]
        out.update(
            {
                "cls.predictions.transform.dense.weight": h["transform"][0].T,
                "cls.predictions.transform.dense.bias": h["transform"][1],
                f"cls.predictions.transform.LayerNorm.{gamma}": h["transform_norm"][0],
                f"cls.predictions.transform.LayerNorm.{beta}": h["transform_norm"][1],
                "cls.predictions.bias": h["output_bias"],
                "cls.predictions.decoder.weight": model["word"],  # Tied, as HF saves it.
                "cls.predictions.decoder.bias": h["output_bias"],
                "cls.seq_relationship.weight": h["nsp"][0].T,
                "cls.seq_relationship.bias": h["nsp"][1],
            }
        )
    return out


def hf_albert_arrays(model, inner_group_num=1, prefix="albert.", heads=True):
    """HF ALBERT names. Set `g * R + r` of `model["sets"]` is group g, inner layer r."""
    out = {
        f"{prefix}embeddings.word_embeddings.weight": model["word"],
        f"{prefix}embeddings.position_embeddings.weight": model["position"],
        f"{prefix}embeddings.token_type_embeddings.weight": model["segment"],
        f"{prefix}embeddings.LayerNorm.weight": model["embedding_norm"][0],
        f"{prefix}embeddings.LayerNorm.bias": model["embedding_norm"][1],
        f"{prefix}encoder.embedding_hidden_mapping_in.weight": model["projection"][0].T,
        f"{prefix}encoder.embedding_hidden_mapping_in.bias": model["projection"][1],
        f"{prefix}pooler.weight": model["pooler"][0].T,
        f"{prefix}pooler.bias": model["pooler"][1],
    }
    for k, w in enumerate(model["sets"]):
        g, r = divmod(k, inner_group_num)
        p = f"{prefix}encoder.albert_layer_groups.{g}.albert_layers.{r}."
        for source, name in (
            ("attention.query", "query"),
            ("attention.key", "key"),
            ("attention.value", "value"),
            ("attention.dense", "output"),
            ("ffn", "intermediate"),
            ("ffn_output", "ffn_output"),
        ):
            out[f"{p}{source}.weight"] = w[name][0].T
            out[f"{p}{source}.bias"] = w[name][1]
        for source, name in (("attention.LayerNorm", "attention_norm"), ("full_layer_layer_norm", "ffn_norm")):
            out[f"{p}{source}.weight"] = w[name][0]
            out[f"{p}{source}.bias"] = w[name][1]
    if heads:
        h = model["heads"]
        out.update(
            {
                "predictions.dense.weight": h["transform"][0].T,
                "predictions.dense.bias": h["transform"][1],
                "predictions.LayerNorm.weight": h["transform_norm"][0],
                "predictions.LayerNorm.bias": h["transform_norm"][1],
                "predictions.bias": h["output_bias"],
                "sop_classifier.classifier.weight": h["nsp"][0].T,
                "sop_classifier.classifier.bias": h["nsp"][1],
            }
        )
    return out


def hf_config(model, model_type="bert", **overrides):
    s = model["sizes"]
    config = {
        "model_type": model_type,
        "vocab_size": s["V"],
        "hidden_size": s["H"],
        "num_hidden_layers": len(model["layer_sets"]),
        "num_attention_heads": s["A"],
        "intermediate_size": s["I"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": s["P"],
        "type_vocab_size": s["T"],
        "layer_norm_eps": 1e-12,
        "initializer_range": 0.02,
    }
    if model_type == "albert":
        config.update(embedding_size=s["E"], num_hidden_groups=len(model["sets"]), inner_group_num=1)
        config["hidden_act"] = "gelu_new"
    config.update(overrides)
    return config


def write_hf(directory, config, arrays, vocabulary=None, tokenizer_config=None):
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(directory / "model.safetensors"))
    if vocabulary is not None:
        (directory / "vocab.txt").write_text("".join(t + "\n" for t in vocabulary))
    if tokenizer_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory


def tf1_arrays(model, albert=False, heads=True, optimizer_slots=True):
    """Original google-research/bert (or /albert) variable names; kernels [in, out]."""
    out = {
        "bert/embeddings/word_embeddings": model["word"],
        "bert/embeddings/position_embeddings": model["position"],
        "bert/embeddings/token_type_embeddings": model["segment"],
        "bert/embeddings/LayerNorm/gamma": model["embedding_norm"][0],
        "bert/embeddings/LayerNorm/beta": model["embedding_norm"][1],
        "bert/pooler/dense/kernel": model["pooler"][0],
        "bert/pooler/dense/bias": model["pooler"][1],
    }
    if model["projection"] is not None:
        out["bert/encoder/embedding_hidden_mapping_in/kernel"] = model["projection"][0]
        out["bert/encoder/embedding_hidden_mapping_in/bias"] = model["projection"][1]
    for k, w in enumerate(model["sets"]):
        if albert:
            p = f"bert/encoder/transformer/group_{k}/inner_group_0/"
            names = (
                ("attention_1/self/query", "query"),
                ("attention_1/self/key", "key"),
                ("attention_1/self/value", "value"),
                ("attention_1/output/dense", "output"),
                ("ffn_1/intermediate/dense", "intermediate"),
                ("ffn_1/intermediate/output/dense", "ffn_output"),
            )
            norms = (("LayerNorm", "attention_norm"), ("LayerNorm_1", "ffn_norm"))
        else:
            p = f"bert/encoder/layer_{k}/"
            names = (
                ("attention/self/query", "query"),
                ("attention/self/key", "key"),
                ("attention/self/value", "value"),
                ("attention/output/dense", "output"),
                ("intermediate/dense", "intermediate"),
                ("output/dense", "ffn_output"),
            )
            norms = (("attention/output/LayerNorm", "attention_norm"), ("output/LayerNorm", "ffn_norm"))
        for source, name in names:
            out[f"{p}{source}/kernel"] = w[name][0]
            out[f"{p}{source}/bias"] = w[name][1]
        for source, name in norms:
            out[f"{p}{source}/gamma"] = w[name][0]
            out[f"{p}{source}/beta"] = w[name][1]
    if heads:
        h = model["heads"]
        out.update(
            {
                "cls/predictions/transform/dense/kernel": h["transform"][0],
                "cls/predictions/transform/dense/bias": h["transform"][1],
                "cls/predictions/transform/LayerNorm/gamma": h["transform_norm"][0],
                "cls/predictions/transform/LayerNorm/beta": h["transform_norm"][1],
                "cls/predictions/output_bias": h["output_bias"],
                "cls/seq_relationship/output_weights": h["nsp"][0].T,  # Stored [2, H].
                "cls/seq_relationship/output_bias": h["nsp"][1],
            }
        )
    if optimizer_slots:
        for name in list(out):
            out[f"{name}/adam_m"] = np.zeros_like(out[name])
            out[f"{name}/adam_v"] = np.ones_like(out[name])
        out["global_step"] = np.asarray(1000, dtype="int64")
    return out


def tf1_config(model, albert=False, **overrides):
    s = model["sizes"]
    config = {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": s["H"],
        "initializer_range": 0.02,
        "intermediate_size": s["I"],
        "max_position_embeddings": s["P"],
        "num_attention_heads": s["A"],
        "num_hidden_layers": len(model["layer_sets"]),
        "type_vocab_size": s["T"],
        "vocab_size": s["V"],
    }
    if albert:
        config.update(
            embedding_size=s["E"], num_hidden_groups=len(model["sets"]), inner_group_num=1, net_structure_type=0
        )
    config.update(overrides)
    return config


def write_tf1(directory, config, arrays, vocabulary=None, config_name="bert_config.json", prefix="bert_model.ckpt"):
    """Writes a TF checkpoint whose variables carry exactly these names."""
    import tensorflow as tf

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / config_name).write_text(json.dumps(config))
    names = sorted(arrays)
    tf.raw_ops.SaveV2(
        prefix=str(directory / prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(arrays[n]) for n in names],
    )
    if vocabulary is not None:
        (directory / "vocab.txt").write_text("".join(t + "\n" for t in vocabulary))
    return directory


@pytest.fixture
def ref():
    """The helpers above, as a namespace."""
    return types.SimpleNamespace(
        random_model=random_model,
        forward=forward,
        max_difference=max_difference,
        tiny_vocabulary=tiny_vocabulary,
        sentencepiece_model=sentencepiece_model,
        hf_bert_arrays=hf_bert_arrays,
        hf_albert_arrays=hf_albert_arrays,
        hf_config=hf_config,
        write_hf=write_hf,
        tf1_arrays=tf1_arrays,
        tf1_config=tf1_config,
        write_tf1=write_tf1,
    )
