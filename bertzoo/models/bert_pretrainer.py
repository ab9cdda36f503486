"""BERT / ALBERT pre-training: masked LM plus next-sentence or sentence-order prediction."""

import collections.abc
import logging
import weakref

import keras
import numpy as np

from bertzoo.layers.dense import Dense
from bertzoo.layers.masked_lm_head import MaskedLMHead
from bertzoo.models.head_utils import MaskedAccuracy
from bertzoo.models.head_utils import check_class_ids
from bertzoo.models.head_utils import check_two_segments
from bertzoo.models.head_utils import class_ids_checked_in_graph
from bertzoo.models.head_utils import masked_loss
from bertzoo.models.head_utils import one_weight_per_row
from bertzoo.models.head_utils import unused_pooler_ok
from bertzoo.models.serving import TextServing
from bertzoo.models.task import Task
from bertzoo.models.task import check_preprocessor_fits
from bertzoo.text.pretraining import SENTENCE_OBJECTIVES
from bertzoo.text.pretraining import BertMaskGenerator
from bertzoo.text.pretraining import check_masking
from bertzoo.text.pretraining import default_max_selections
from bertzoo.utils.checks import constructor_arguments
from bertzoo.utils.optional import tf

logger = logging.getLogger("bertzoo")
# What the pair labels name, for the label checks' messages.
SENTENCE_CLASSES = "sentence-pair classes (0 = in order, 1 = swapped or random)"

_MLM_ARRAYS = (
    "mlm/transform/kernel",
    "mlm/transform/bias",
    "mlm/layer_norm/gamma",
    "mlm/layer_norm/beta",
    "mlm/output_bias",
)
_SENTENCE_ARRAYS = ("nsp/kernel", "nsp/bias")
# Preprocessor -> its copy that reads special tokens in text (`predict_masked`).
_FILL_MASK_PREPROCESSORS = weakref.WeakKeyDictionary()


_MLM_ONLY_LABELS = (
    "A masked-LM-only BertPretrainer (sentence_objective=None) makes its own labels: pass texts without `y`."
)
# The constructor arguments `check_head_arguments` checks.
_HEAD_ARGUMENTS = (
    "sentence_objective",
    "masking_rate",
    "mask_token_rate",
    "random_token_rate",
    "max_predictions",
    "tie_weights",
)


def pretraining_head_shapes(config):
    """Shapes of the canonical pre-training head arrays (see
    `BertPretrainer.load_pretraining_heads`) for a backbone config."""
    H = config["hidden_dim"]
    E = config.get("embedding_dim") or H
    V = config["vocabulary_size"]
    return {
        "mlm/transform/kernel": (H, E),
        "mlm/transform/bias": (E,),
        "mlm/layer_norm/gamma": (E,),
        "mlm/layer_norm/beta": (E,),
        "mlm/output_bias": (V,),
        "mlm/decoder/kernel": (E, V),
        "nsp/kernel": (H, 2),
        "nsp/bias": (2,),
    }


def _quantized(dtype):
    """Whether a saved dtype policy (a name, or a policy or policy map's config) quantizes any layer."""
    if dtype is None:
        return False
    policy = keras.dtype_policies.get(dtype)
    policies = [policy] + ([policy[name] for name in policy] if isinstance(policy, collections.abc.Mapping) else [])
    return any(p.quantization_mode is not None for p in policies)


@keras.saving.register_keras_serializable(package="bertzoo")
class BertPretrainer(Task):
    """Pre-trains a backbone with BERT's objectives (BERT paper, section 3.1).

    Masked LM: the preprocessor's output is masked by `BertMaskGenerator`
    (`masking_rate` of the tokens, 80% `[MASK]` / 10% random / 10% kept) and
    `MaskedLMHead` predicts the original tokens at the masked positions, its
    decoder tied to the token embedding. Sentence objective over the pooled
    `[CLS]` output, a 2-way dense layer: `"nsp"` (BERT: is B the next
    sentence?), `"sop"` (ALBERT: are A and B in order?) or None (masked LM
    only, as RoBERTa). Label 0 means "next / in order"; build pairs with
    `bertzoo.sentence_pairs`.

    Inputs (tokenized): `token_ids`, `segment_ids`, `padding_mask` and
    `mask_positions` (int, `(batch, slots)`). Outputs: a dict with `"mlm"`
    logits `(batch, slots, vocabulary_size)` and, with a sentence objective,
    `"sentence"` logits `(batch, 2)`. Labels: `{"mlm": original ids at the
    slots (-100 in unused slots), "sentence": 0/1}`. The loss is the masked-LM
    cross-entropy averaged over real slots plus the sentence cross-entropy,
    as in BERT.

    Raw text: `fit(texts)` (masked LM only) or `fit((first, second), labels)`
    (with a sentence objective). `fit` draws fresh masks for every batch of
    every epoch (dynamic masking); `evaluate`, `predict` and `fit`'s
    validation data mask the same way on every pass (fixed seeds, one per
    batch; `predict` on a short list masks it in one call), so their
    losses compare across epochs and checkpoints.
    `sample_weight` is one weight per example (per sentence pair), on every
    prediction slot of its sequence and on its sentence loss.

    `from_preset` on a converted checkpoint (one with
    `pretraining_heads.safetensors`) loads its masked-LM and sentence heads.

    Args:
        backbone: a `bertzoo.BertBackbone`.
        preprocessor: a `bertzoo.text.BertPreprocessor`, or None for tokenized
            (already masked) inputs.
        sentence_objective: `"nsp"`, `"sop"` or None.
        masking_rate: fraction of the tokens to predict (at least one per
            sequence, also at 0).
        mask_token_rate: fraction of those replaced by `[MASK]`.
        random_token_rate: fraction of those replaced by a random token.
        max_predictions: prediction slots per sequence; None means
            `ceil(masking_rate * sequence_length)`.
        tie_weights: tie the masked-LM decoder to the token embedding (BERT);
            False gives it a kernel of its own.

    Example:

    ```python
    model = bertzoo.BertPretrainer.from_preset("tiny", sentence_objective="nsp")
    first, second, labels = bertzoo.sentence_pairs(documents, "nsp", seed=0)
    model.compile()
    model.fit((first, second), labels, epochs=1)
    ```
    """

    fit_needs_labels = False  # Masked-LM labels come from the masking.
    # The masking arguments shape no weight: a saved pretrainer keeps its heads
    # when they change (BERT's second phase: longer sequences, more predictions).
    weightless_head_arguments = Task.weightless_head_arguments + (
        "masking_rate",
        "mask_token_rate",
        "random_token_rate",
        "max_predictions",
    )

    def __init__(
        self,
        backbone,
        preprocessor=None,
        sentence_objective="nsp",
        masking_rate=0.15,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        max_predictions=None,
        tie_weights=True,
        **kwargs,
    ):
        self.check_head_arguments(
            sentence_objective=sentence_objective,
            masking_rate=masking_rate,
            mask_token_rate=mask_token_rate,
            random_token_rate=random_token_rate,
            max_predictions=max_predictions,
            tie_weights=tie_weights,
        )
        if sentence_objective is not None:
            check_two_segments(backbone, f"The sentence pairs of sentence_objective={sentence_objective!r}")
        self.masker = None
        if preprocessor is not None:
            check_preprocessor_fits(backbone, preprocessor)  # Before the masker draws ids from the tokenizer.
            tokenizer = preprocessor.tokenizer
            self.masker = BertMaskGenerator(
                # Random replacements are real tokens, not a padded table's spare rows.
                vocabulary_size=tokenizer.vocabulary_size(),
                mask_token_id=tokenizer.mask_token_id,
                unselectable_token_ids=[
                    tokenizer.pad_token_id,
                    tokenizer.cls_token_id,
                    tokenizer.sep_token_id,
                    tokenizer.mask_token_id,
                ],
                selection_rate=masking_rate,
                mask_token_rate=mask_token_rate,
                random_token_rate=random_token_rate,
                max_selections=self._slots(max_predictions, masking_rate, preprocessor.sequence_length),
                name="masker",
            )
        policy = backbone.dtype_policy
        head_dtype = "float32" if policy.compute_dtype != "float32" else policy
        embedding = backbone.embeddings.token_embedding
        self.mlm_head = MaskedLMHead(
            token_embedding=embedding if tie_weights else None,
            vocabulary_size=embedding.input_dim,
            embedding_dim=embedding.output_dim,
            activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            initializer_range=backbone.initializer_range,
            dtype=head_dtype,
            name="mlm_head",
        )
        self.sentence_head = None
        if sentence_objective is not None:
            self.sentence_head = Dense(
                2,
                kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
                dtype=head_dtype,
                name="sentence_head",
            )
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        features = backbone({k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")})
        outputs = {"mlm": self.mlm_head(features["sequence_output"], inputs["mask_positions"])}
        if self.sentence_head is not None:
            outputs["sentence"] = self.sentence_head(features["pooled_output"])
        super().__init__(inputs=inputs, outputs=outputs, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.sentence_objective = sentence_objective
        self.masking_rate = float(masking_rate)
        self.mask_token_rate = float(mask_token_rate)
        self.random_token_rate = float(random_token_rate)
        self.max_predictions = max_predictions
        self.tie_weights = bool(tie_weights)

    @classmethod
    def check_head_arguments(cls, **arguments):
        """Checks the head's constructor arguments (absent ones take the constructor's defaults)."""
        defaults = {name: p.default for name, p in constructor_arguments(cls).items() if name in _HEAD_ARGUMENTS}
        arguments = {**defaults, **arguments}
        sentence_objective, tie_weights = arguments["sentence_objective"], arguments["tie_weights"]
        if sentence_objective is not None and sentence_objective not in SENTENCE_OBJECTIVES:
            raise ValueError(
                f"Unknown `sentence_objective` {sentence_objective!r}: use 'nsp' (BERT), 'sop' (ALBERT) "
                "or None (masked LM only)."
            )
        check_masking(
            arguments["masking_rate"],
            arguments["mask_token_rate"],
            arguments["random_token_rate"],
            arguments["max_predictions"],
            names={"selection_rate": "masking_rate", "max_selections": "max_predictions"},
        )
        if not isinstance(tie_weights, bool):
            raise ValueError(f"`tie_weights` must be True or False, got {tie_weights!r}.")

    @staticmethod
    def _slots(max_predictions, masking_rate, sequence_length):
        if max_predictions is None:
            return default_max_selections(sequence_length, masking_rate)
        return max_predictions

    def measurement_lengths(self, sequence_length):
        """`{input name: length}` of the inputs whose second dimension is not
        the sequence (`bertzoo.utils.fast_path` measures with these): the
        prediction slots the preprocessing gives at `sequence_length`."""
        return {"mask_positions": int(self._slots(self.max_predictions, self.masking_rate, sequence_length))}

    def get_config(self):
        return {
            **super().get_config(),
            "sentence_objective": self.sentence_objective,
            "masking_rate": self.masking_rate,
            "mask_token_rate": self.mask_token_rate,
            "random_token_rate": self.random_token_rate,
            "max_predictions": self.max_predictions,
            "tie_weights": self.tie_weights,
        }

    # --- Training defaults ------------------------------------------------
    def default_loss(self):
        losses = {"mlm": masked_loss()}
        if self.sentence_objective is not None:
            losses["sentence"] = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return losses

    def default_metrics(self):
        metrics = {"mlm": [MaskedAccuracy(name="accuracy")]}
        if self.sentence_objective is not None:
            metrics["sentence"] = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        return metrics

    # --- Raw inputs -------------------------------------------------------
    def fit(self, x=None, y=None, **kwargs):
        if self.sentence_objective is not None and isinstance(x, tuple) and y is None:
            raise ValueError(
                f"sentence_objective={self.sentence_objective!r} needs the pair labels: "
                "fit((first, second), labels), e.g. from bertzoo.sentence_pairs(documents)."
            )
        with unused_pooler_ok():  # Masked LM alone does not use the pooler.
            return super().fit(x=x, y=y, **kwargs)

    def _raw_to_tensors(self, x, y):
        if self.sentence_objective is None and y is not None:
            raise ValueError(_MLM_ONLY_LABELS)  # fit and evaluate: before the pipeline, not from its trace.
        return super()._raw_to_tensors(x, self._checked_labels(y) if y is not None else None)

    def _checked_labels(self, y, features=None):
        if self.sentence_objective is not None and not isinstance(y, dict):
            values = np.asarray(y)
            if values.dtype.kind not in "iufb":
                raise ValueError(
                    f"Sentence-pair labels must be integer ids ({SENTENCE_CLASSES}), got {values.dtype} values "
                    f"such as {values.ravel()[:3].tolist()}: convert them, e.g. np.asarray(labels, 'int32')."
                )
            check_class_ids(y, 2, what=SENTENCE_CLASSES)
        return y

    def _raw_sample_weight(self, sample_weight, x):
        if sample_weight is not None and self.sentence_objective is None:
            raise ValueError(
                "A masked-LM-only BertPretrainer (sentence_objective=None) takes no `sample_weight` with raw "
                "text: its labels come from the masking, and Keras pairs weights with labels. Repeat the texts "
                "to weigh them, or pass tokenized, masked inputs with labels {'mlm': ...} and weights."
            )
        return sample_weight

    def loss_sample_weight(self, sample_weight):
        """One weight per example, shaped for each output's loss: `(batch, 1)`
        on the masked-LM slots (each slot of a sequence weighs as the
        sequence), `(batch,)` on the sentence loss. Weights per output (a
        dict, as Keras passes them for dict labels) are shaped the same way;
        masked-LM weights per slot, `(batch, slots)`, are used as given."""
        if sample_weight is None:
            return None
        if isinstance(sample_weight, dict):
            return {name: one_weight_per_row(w) if name == "mlm" else w for name, w in sample_weight.items()}
        weights = {"mlm": one_weight_per_row(sample_weight)}
        if self.sentence_objective is not None:
            weights["sentence"] = sample_weight
        return weights

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return super().compute_loss(x, y, y_pred, self.loss_sample_weight(sample_weight), training=training)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return super().compute_metrics(x, y, y_pred, self.loss_sample_weight(sample_weight))

    def _labels_checked_in_graph(self, labels):
        if self.sentence_objective is None or isinstance(labels, dict):
            return labels
        return class_ids_checked_in_graph(labels, 2, what=SENTENCE_CLASSES)

    def preprocess(self, x, y=None, sample_weight=None, preprocessor=None, seed=None):
        """Texts (or sentence pairs and their labels) -> masked features
        (with `mask_positions`) and labels `{"mlm": ..., "sentence": ...}`;
        masks are drawn afresh on every call (from `seed`, a shape-(2,) int
        tensor, when given; `fit` draws one per batch in order)."""
        paired = isinstance(x, tuple) and len(x) == 2
        if self.sentence_objective is not None:
            if not paired:
                raise ValueError(
                    f"With sentence_objective={self.sentence_objective!r}, pass sentence pairs and their "
                    "labels: fit((first, second), labels) with labels 0 = in order / next, 1 = swapped / "
                    "random. Build them with bertzoo.sentence_pairs(documents), or use "
                    "sentence_objective=None for masked LM only."
                )
        elif y is not None:
            raise ValueError(_MLM_ONLY_LABELS)
        preprocessor = self.preprocessor if preprocessor is None else preprocessor
        features = preprocessor(x)
        # The slots follow the length packed now (`sequence_length` can be changed after construction).
        slots = self._slots(self.max_predictions, self.masking_rate, preprocessor.sequence_length)
        masked = self.masker(features["token_ids"], seed=seed, max_selections=slots)
        features = dict(features, token_ids=masked["token_ids"], mask_positions=masked["mask_positions"])
        labels = {"mlm": masked["mask_labels"]}
        if y is not None:
            labels["sentence"] = y
        return keras.utils.pack_x_y_sample_weight(features, labels, sample_weight)

    def _batch_seed_drawer(self, training):
        if not training:
            # The same masks on every pass: the batch's index in the pass, under a fixed seed.
            fixed = tf.constant(0 if self.masker.seed is None else self.masker.seed, tf.int64)
            return lambda index: tf.stack([fixed, tf.cast(index, tf.int64)])
        # A stream per dataset, seeded from the masker's here, in the calling
        # thread: datasets iterated at once (training and validation) then
        # never take each other's seeds.
        generator = tf.random.Generator.from_seed(int(self.masker.draw_seed()[0]))
        return lambda index: generator.make_seeds(1)[:, 0]

    def serving_signatures(self, preprocessor=None, pairs="auto"):
        """Tokenized (already masked) inputs only, `serving_default` and
        `serving_tokenized`: raw text would be masked at random. Outputs:
        the `mlm` (and `sentence`) logits."""
        return TextServing(self).tokenized_signatures()

    # --- Converted heads --------------------------------------------------
    @classmethod
    def _kept_head_part(cls, changed, saved_head_config):
        # Another sentence objective (or decoder tying) leaves the masked-LM head's weights meaningful:
        # the README's fill-mask recipe drops the sentence head of a pre-trained model. Not a quantized
        # head: its integer kernels are no float weights to copy.
        if not set(changed) <= {"sentence_objective", "tie_weights"} or _quantized(saved_head_config.get("dtype")):
            return None
        saved_objective = saved_head_config.get("sentence_objective")
        objective = changed.get("sentence_objective", saved_objective)
        if objective is None:
            kept = "the saved masked-LM head is kept (this model has no sentence head)"
        elif objective == saved_objective:
            kept = "the saved masked-LM and sentence heads are kept"
        else:
            kept = f"the saved masked-LM head is kept; the {objective!r} sentence head is new, randomly initialized"
        if changed.get("tie_weights") is False:
            kept += "; the untied decoder starts as a copy of the token embedding"
        return kept

    def _load_preset_extras(self, preset, kept_part=None):
        if kept_part is not None:
            self._load_saved_heads(preset)
        elif preset.has_arrays():
            self.load_pretraining_heads(preset.load_arrays())
        elif preset.directory is not None and preset.config.get("task") is None:  # A backbone preset.
            heads = "masked-LM head starts" if self.sentence_head is None else "masked-LM and sentence heads start"
            logger.warning(
                "BertPretrainer.from_preset(%r): the preset has no pre-training heads (a backbone, or a "
                "checkpoint converted without them), so its %s randomly initialized: `predict_masked` "
                "gives meaningless tokens until they are trained.",
                preset.name,
                heads,
            )

    def _load_saved_heads(self, preset):
        """The masked-LM head (and the sentence head of the same objective)
        of a saved pretrainer whose sentence objective or decoder tying differ
        from this one's (`_kept_head_part`). Loads the saved model whole
        first, so for a moment it holds two backbones."""
        saved = type(self).from_preset(preset.directory, preprocessor=None, verify_checksums=preset.verify_checksums)
        head = saved.mlm_head
        arrays = {
            "mlm/transform/kernel": head.transform.kernel,
            "mlm/transform/bias": head.transform.bias,
            "mlm/layer_norm/gamma": head.layer_norm.gamma,
            "mlm/layer_norm/beta": head.layer_norm.beta,
            "mlm/output_bias": head.output_bias,
        }
        if not saved.tie_weights:
            if self.tie_weights:
                logger.warning(
                    "%s.from_preset(%r, tie_weights=True): the saved masked-LM decoder has a kernel of its own; "
                    "the tied decoder reads the token embedding instead, and that kernel is not used.",
                    type(self).__name__,
                    preset.name,
                )
            else:
                arrays["mlm/decoder/kernel"] = head.decoder_kernel
        if saved.sentence_objective is not None and saved.sentence_objective == self.sentence_objective:
            arrays.update({"nsp/kernel": saved.sentence_head.kernel, "nsp/bias": saved.sentence_head.bias})
        self.load_pretraining_heads({name: keras.ops.convert_to_numpy(v) for name, v in arrays.items()})

    def load_pretraining_heads(self, arrays):
        """Sets the heads from canonical arrays (see `bertzoo.convert.common`):
        `mlm/transform/{kernel,bias}`, `mlm/layer_norm/{gamma,beta}`,
        `mlm/output_bias`, optionally `mlm/decoder/kernel` (an untied decoder)
        and `nsp/{kernel,bias}` (BERT's NSP or ALBERT's SOP head). Arrays
        of the sentence head alone load it and leave the masked-LM head as
        it is, with a warning. `from_preset` calls it for converted checkpoints.

        Example:

        ```python
        model.load_pretraining_heads(Preset.resolve("converted/bert").load_arrays())
        ```
        """
        backbone = self.backbone
        expected = pretraining_head_shapes(
            {
                "hidden_dim": backbone.hidden_dim,
                "embedding_dim": backbone.embedding_dim,
                "vocabulary_size": backbone.vocabulary_size,
            }
        )
        # A checkpoint may hold the sentence head alone (e.g. Hugging Face's
        # `BertForNextSentencePrediction`): the masked-LM head then stays as it is.
        has_mlm = any(name in arrays for name in _MLM_ARRAYS + ("mlm/decoder/kernel",))
        sentence_only = not has_mlm and any(name in arrays for name in _SENTENCE_ARRAYS)
        problems = [] if sentence_only else [f"{name}: missing" for name in _MLM_ARRAYS if name not in arrays]
        if self.sentence_head is not None:
            present = [name for name in _SENTENCE_ARRAYS if name in arrays]
            if len(present) == 1:
                problems.append(f"{_SENTENCE_ARRAYS[1 - _SENTENCE_ARRAYS.index(present[0])]}: missing")
        for name, array in arrays.items():
            if name in expected and tuple(array.shape) != expected[name]:
                problems.append(f"{name}: shape {tuple(array.shape)}, the model needs {expected[name]}")
        untied = "mlm/decoder/kernel" in arrays
        if untied and self.tie_weights:
            problems.append(
                "mlm/decoder/kernel: the checkpoint's decoder is not tied to the token embedding; build the "
                "model with tie_weights=False to load it"
            )
        if problems:
            raise ValueError("Cannot load the pre-training heads:\n  " + "\n  ".join(problems))
        if self.sentence_head is not None and "nsp/kernel" in arrays:
            self.sentence_head.kernel.assign(arrays["nsp/kernel"])
            self.sentence_head.bias.assign(arrays["nsp/bias"])
        if sentence_only:
            logger.warning(
                "The pre-training heads hold a sentence head only, no masked-LM head: %s; the masked-LM "
                "head starts randomly initialized, so `predict_masked` gives meaningless tokens until it "
                "is trained.",
                "the sentence head is loaded"
                if self.sentence_head is not None
                else "this model has no sentence head (sentence_objective=None), so nothing is loaded",
            )
            return
        head = self.mlm_head
        head.transform.kernel.assign(arrays["mlm/transform/kernel"])
        head.transform.bias.assign(arrays["mlm/transform/bias"])
        head.layer_norm.gamma.assign(arrays["mlm/layer_norm/gamma"])
        head.layer_norm.beta.assign(arrays["mlm/layer_norm/beta"])
        head.output_bias.assign(arrays["mlm/output_bias"])
        if not self.tie_weights:
            # A tied checkpoint decodes with the token embedding: copy it.
            decoder = (
                arrays["mlm/decoder/kernel"]
                if untied
                else np.transpose(keras.ops.convert_to_numpy(backbone.embeddings.token_embedding.embeddings))
            )
            head.decoder_kernel.assign(decoder)

    # --- Fill-mask ----------------------------------------------------------
    def predict_masked(self, texts, top_k=5):
        """The `top_k` most likely tokens at each `[MASK]` written in `texts`.

        `[MASK]` (and the other special tokens, spelled exactly) are read as
        tokens here whatever the preprocessor's `special_tokens_in_strings`
        says. Probabilities are the masked-LM head's softmax over the whole
        vocabulary. Meaningful with pretrained heads (a converted checkpoint
        keeps them, see `load_pretraining_heads`).

        Args:
            texts: a string or a list of strings, each with at least one
                `[MASK]` left after truncation to the preprocessor's
                `sequence_length`.
            top_k: how many candidates per mask, a positive integer.

        Returns:
            One list per text, with one list per `[MASK]` (left to right) of
            `top_k` `(token, probability)` pairs, most likely first.

        Example:
        ```python
        model = bertzoo.BertPretrainer.from_preset("converted/bert_base", sentence_objective=None)
        model.predict_masked(["The capital of France is [MASK]."], top_k=5)
        # [[[("paris", 0.41), ("lyon", 0.05), ...]]]
        ```
        """
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k <= 0:
            raise ValueError(f"`top_k` must be a positive integer, got {top_k!r}.")
        if self.preprocessor is None:
            raise ValueError(
                "predict_masked needs the model's preprocessor to tokenize text; this model was built with "
                "preprocessor=None. Build it with from_preset(..., preprocessor='auto')."
            )
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("predict_masked takes a string or a non-empty list of strings.")
        features = self._fill_mask_preprocessor()(texts)
        token_ids = np.asarray(features["token_ids"])
        mask_id = self.preprocessor.tokenizer.mask_token_id
        masked = [np.flatnonzero(row == mask_id) for row in token_ids]
        for i, positions in enumerate(masked):
            if positions.size == 0:
                raise ValueError(
                    f"Text {i} ({texts[i][:60]!r}) has no [MASK] token"
                    + (" left after truncation" if "[MASK]" in texts[i] else "")
                    + ": write [MASK] (upper case, in brackets) where a token should be predicted"
                    + (
                        f", within the first {self.preprocessor.sequence_length} tokens."
                        if "[MASK]" in texts[i]
                        else "."
                    )
                )
        slots = max(p.size for p in masked)
        mask_positions = np.zeros((len(texts), slots), "int32")
        for i, positions in enumerate(masked):
            mask_positions[i, : positions.size] = positions
        inputs = {
            name: np.asarray(features[name]).astype("int32") for name in ("token_ids", "segment_ids", "padding_mask")
        }
        inputs["mask_positions"] = mask_positions
        vocabulary = self.preprocessor.tokenizer.get_vocabulary()
        logits = keras.ops.convert_to_numpy(self(inputs, training=False)["mlm"]).astype("float64")
        logits = logits[..., : len(vocabulary)]  # A padded table's spare rows are no tokens.
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        top_k = min(int(top_k), probabilities.shape[-1])
        results = []
        for i, positions in enumerate(masked):
            per_mask = []
            for slot in range(positions.size):
                best = np.argsort(-probabilities[i, slot], kind="stable")[:top_k]
                per_mask.append([(vocabulary[j], float(probabilities[i, slot, j])) for j in best])
            results.append(per_mask)
        return results

    def _fill_mask_preprocessor(self):
        """The model's preprocessor, reading special tokens written in text."""
        preprocessor = self.preprocessor
        if preprocessor.tokenizer.special_tokens_in_strings:
            return preprocessor
        # Kept outside the model (a Keras model would track it as a sublayer),
        # and built again when the preprocessor's settings change (its
        # `sequence_length` may, after construction).
        config = preprocessor.get_config()
        cached = _FILL_MASK_PREPROCESSORS.get(preprocessor)
        if cached is None or cached[0] != config:
            tokenizer_config = dict(preprocessor.tokenizer.get_config(), special_tokens_in_strings=True)
            copy = dict(config, tokenizer=type(preprocessor.tokenizer).from_config(tokenizer_config))
            cached = _FILL_MASK_PREPROCESSORS[preprocessor] = (config, type(preprocessor).from_config(copy))
        return cached[1]
