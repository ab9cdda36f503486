"""Building blocks of BERT-family encoders."""

from bertzoo.layers.activations import SUPPORTED_ACTIVATIONS
from bertzoo.layers.activations import get_activation
from bertzoo.layers.attention import SelfAttentionBlock
from bertzoo.layers.dense import Dense
from bertzoo.layers.dropout import Dropout
from bertzoo.layers.embeddings import BertEmbeddings
from bertzoo.layers.embeddings import PositionEmbedding
from bertzoo.layers.feedforward import FeedForwardBlock
