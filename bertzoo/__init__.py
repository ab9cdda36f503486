"""bertzoo: BERT-family encoders for Keras 3, with compression built in."""

from bertzoo.version import __version__
from bertzoo.layers import BertEmbeddings
from bertzoo.layers import FeedForwardBlock
from bertzoo.layers import SelfAttentionBlock
from bertzoo.models.bert_backbone import BertBackbone
from bertzoo.models.bert_classifier import BertClassifier
from bertzoo.models.schedules import WarmupLinearDecay
from bertzoo.models.task import Task
from bertzoo.saving.listing import list_presets
from bertzoo.saving.preset import Preset
from bertzoo import convert
from bertzoo.convert import convert_checkpoint
