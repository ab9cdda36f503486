"""Compression: distillation, pruning and quantization."""

from bertzoo.compression.pruning import Pruner
from bertzoo.compression.pruning import PruningState
from bertzoo.compression.pruning import SparsityReport
from bertzoo.compression.pruning import gzip_size
from bertzoo.compression.pruning import sparsity_report
from bertzoo.compression.quantization import quantize
from bertzoo.compression.schedules import ConstantSparsity
from bertzoo.compression.schedules import PolynomialDecay
from bertzoo.compression.schedules import PruningSchedule
from bertzoo.compression.structured import head_and_neuron_importance
from bertzoo.compression.structured import prune_heads_and_neurons
from bertzoo.compression.distillation import AttentionDistillation
from bertzoo.compression.distillation import Distiller
from bertzoo.compression.distillation import HiddenStateDistillation
from bertzoo.compression.distillation import init_student_from_teacher
