"""Compression: distillation, pruning and quantization."""

from bertzoo.compression.distiller import Distiller
from bertzoo.compression.losses import AttentionDistillation
from bertzoo.compression.losses import HiddenStateDistillation
from bertzoo.compression.losses import ValueRelationDistillation
from bertzoo.compression.lottery import LotteryTicket
from bertzoo.compression.lottery import lottery_ticket
from bertzoo.compression.pipeline import PRUNING_LEARNING_RATE
from bertzoo.compression.pipeline import compress
from bertzoo.compression.pruner import Pruner
from bertzoo.compression.pruner import PruningState
from bertzoo.compression.quantization import quantization_aware_training
from bertzoo.compression.quantization import quantize
from bertzoo.compression.recipes import RECIPES
from bertzoo.compression.recipes import augment_texts
from bertzoo.compression.recipes import distill
from bertzoo.compression.recipes import transfer_pool
from bertzoo.compression.report import SparsityReport
from bertzoo.compression.report import gzip_size
from bertzoo.compression.report import sparsity_report
from bertzoo.compression.schedules import ConstantSparsity
from bertzoo.compression.schedules import PolynomialDecay
from bertzoo.compression.schedules import PruningSchedule
from bertzoo.compression.schedules import ramp_schedule
from bertzoo.compression.structured import head_and_neuron_importance
from bertzoo.compression.structured import prune_heads_and_neurons
from bertzoo.compression.student_init import init_student_from_teacher
