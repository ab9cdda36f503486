"""bertzoo: BERT-family encoders for Keras 3, with compression built in."""

from bertzoo import compression
from bertzoo import convert
from bertzoo import export
from bertzoo.compression import ConstantSparsity
from bertzoo.compression import Distiller
from bertzoo.compression import PolynomialDecay
from bertzoo.compression import Pruner
from bertzoo.compression import compress
from bertzoo.compression import distill
from bertzoo.compression import init_student_from_teacher
from bertzoo.compression import lottery_ticket
from bertzoo.compression import prune_heads_and_neurons
from bertzoo.compression import quantization_aware_training
from bertzoo.compression import quantize
from bertzoo.compression import sparsity_report
from bertzoo.convert import convert_checkpoint
from bertzoo.export import export_saved_model
from bertzoo.layers import BertEmbeddings
from bertzoo.layers import FeedForwardBlock
from bertzoo.layers import SelfAttentionBlock
from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.models.bert_classifier import BertClassifier
from bertzoo.models.bert_multiple_choice import BertMultipleChoice
from bertzoo.models.bert_pretrainer import BertPretrainer
from bertzoo.models.bert_question_answerer import BertQuestionAnswerer
from bertzoo.models.bert_token_classifier import BertTokenClassifier
from bertzoo.models.bert_token_classifier import align_word_labels
from bertzoo.models.feature_extractor import FeatureExtractor
from bertzoo.models.listing import list_presets
from bertzoo.models.resumable import ResumableTraining
from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.models.task import Task
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import PresetError
from bertzoo.text.pretraining import BertMaskGenerator
from bertzoo.text.pretraining import sentence_pairs
from bertzoo.utils.fast_path import explain_fast_path
from bertzoo.version import __version__

__all__ = [
    "compression",
    "convert",
    "export",
    "ConstantSparsity",
    "Distiller",
    "PolynomialDecay",
    "Pruner",
    "compress",
    "distill",
    "init_student_from_teacher",
    "lottery_ticket",
    "prune_heads_and_neurons",
    "quantization_aware_training",
    "quantize",
    "sparsity_report",
    "convert_checkpoint",
    "export_saved_model",
    "BertEmbeddings",
    "FeedForwardBlock",
    "SelfAttentionBlock",
    "BertBackbone",
    "BertClassifier",
    "BertMultipleChoice",
    "BertPretrainer",
    "BertQuestionAnswerer",
    "BertTokenClassifier",
    "align_word_labels",
    "FeatureExtractor",
    "list_presets",
    "ResumableTraining",
    "WarmupLinearDecay",
    "Task",
    "Preset",
    "PresetError",
    "BertMaskGenerator",
    "sentence_pairs",
    "explain_fast_path",
    "__version__",
]
