"""Pruning schedules: when to prune, and to which sparsity.

The semantics follow tensorflow-model-optimization's schedules (reimplemented
on `keras.ops`, so they run inside a compiled train step on every backend):
a schedule called with a step returns `(should_prune, sparsity)`.
`should_prune` is true on the steps `begin_step, begin_step + frequency, ...`
that are not past `end_step` (`end_step=-1`: no end); between those steps
the masks stay as they are. One difference in when a step's masks apply:
tensorflow-model-optimization computes step s's masks before the forward
pass of batch s, bertzoo's `Pruner` right after that batch's update (so
the update pruned weights received is zeroed at once). The steps that
prune and the sparsity reached are the same; the masks lag by one update.
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from bertzoo.utils.checks import check_positive_int


def check_sparsity(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a sparsity in [0, 1) (the fraction of weights set to zero), got {value!r}.")
    return float(value)


def _check_steps(begin_step, end_step, frequency, allow_no_end):
    for name, value in (("begin_step", begin_step), ("end_step", end_step), ("frequency", frequency)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise ValueError(f"`{name}` must be an integer, got {value!r}.")
    if begin_step < 0:
        raise ValueError(f"`begin_step` must be >= 0, got {begin_step}.")
    if frequency <= 0:
        raise ValueError(f"`frequency` must be a positive number of steps, got {frequency}.")
    if allow_no_end and end_step == -1:
        return
    if end_step < begin_step or (not allow_no_end and end_step == begin_step):
        relation = "before" if end_step < begin_step else "at"
        fix = "-1 for no end, or a step after `begin_step`" if allow_no_end else "a step after `begin_step`"
        raise ValueError(f"`end_step`={end_step} is {relation} `begin_step`={begin_step}: pass {fix}.")


class PruningSchedule:
    """Base class: `schedule(step)` returns `(should_prune, sparsity)` tensors.

    Subclasses implement `sparsity_at(step)` (a float tensor) and
    `get_config()`, and have a `final_sparsity` attribute; `begin_step`,
    `end_step` and `frequency` decide the pruning steps.
    """

    begin_step = 0
    end_step = -1
    frequency = 1

    def should_prune(self, step):
        step = ops.cast(step, "int64")
        in_range = step >= self.begin_step
        if self.end_step != -1:
            in_range = ops.logical_and(in_range, step <= self.end_step)
        on_turn = ops.equal(ops.mod(step - self.begin_step, self.frequency), 0)
        return ops.logical_and(in_range, on_turn)

    def sparsity_at(self, step):
        raise NotImplementedError

    def __call__(self, step):
        return self.should_prune(step), self.sparsity_at(step)

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()


@keras.saving.register_keras_serializable(package="bertzoo")
class PolynomialDecay(PruningSchedule):
    """Sparsity rising from `initial_sparsity` to `final_sparsity` along a
    polynomial curve between `begin_step` and `end_step` (Zhu & Gupta, 2017):

        p = clip((step - begin_step) / (end_step - begin_step), 0, 1)
        sparsity = final_sparsity + (initial_sparsity - final_sparsity) * (1 - p) ** power

    Masks are recomputed at `begin_step + i * frequency` up to `end_step`
    (included when it is on that grid; as TF-MOT, an `end_step` off the grid
    is no pruning step, so the last sparsity reached is the last grid
    step's: `bertzoo.compression.ramp_schedule` always lands on it), and
    kept fixed afterwards.

    Example:
    ```python
    schedule = bertzoo.PolynomialDecay(initial_sparsity=0.0, final_sparsity=0.9,
                                       begin_step=0, end_step=2000, frequency=100)
    should_prune, sparsity = schedule(1000)   # True, 0.7875
    ```
    """

    def __init__(self, initial_sparsity, final_sparsity, begin_step, end_step, power=3, frequency=100):
        self.initial_sparsity = check_sparsity("initial_sparsity", initial_sparsity)
        self.final_sparsity = check_sparsity("final_sparsity", final_sparsity)
        _check_steps(begin_step, end_step, frequency, allow_no_end=False)
        if (
            isinstance(power, (bool, np.bool_))
            or not isinstance(power, numbers.Real)
            or not math.isfinite(power)
            or power <= 0
        ):
            # NaN would keep the sparsity at NaN (nothing pruned); inf would jump to the final sparsity at the end.
            raise ValueError(f"`power` must be a finite positive number (e.g. 3, tfmot's default), got {power!r}.")
        self.begin_step, self.end_step, self.frequency = int(begin_step), int(end_step), int(frequency)
        self.power = power if isinstance(power, int) else float(power)

    def sparsity_at(self, step):
        step = ops.cast(step, "float32")
        progress = (step - self.begin_step) / float(self.end_step - self.begin_step)
        progress = ops.clip(progress, 0.0, 1.0)
        delta = self.initial_sparsity - self.final_sparsity
        return self.final_sparsity + delta * ops.power(1.0 - progress, float(self.power))

    def get_config(self):
        return {
            "initial_sparsity": self.initial_sparsity,
            "final_sparsity": self.final_sparsity,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "power": self.power,
            "frequency": self.frequency,
        }


@keras.saving.register_keras_serializable(package="bertzoo")
class ConstantSparsity(PruningSchedule):
    """Prunes to `target_sparsity` every `frequency` steps from `begin_step`
    (until `end_step`; `-1` means until training stops).

    Example:
    ```python
    schedule = bertzoo.ConstantSparsity(0.8, begin_step=0, frequency=50)
    ```
    """

    def __init__(self, target_sparsity, begin_step, end_step=-1, frequency=100):
        self.target_sparsity = check_sparsity("target_sparsity", target_sparsity)
        _check_steps(begin_step, end_step, frequency, allow_no_end=True)
        self.begin_step, self.end_step, self.frequency = int(begin_step), int(end_step), int(frequency)

    @property
    def final_sparsity(self):
        return self.target_sparsity

    def sparsity_at(self, step):
        return ops.full((), self.target_sparsity, "float32")

    def get_config(self):
        return {
            "target_sparsity": self.target_sparsity,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "frequency": self.frequency,
        }


def ramp_schedule(steps, final_sparsity, prunings=10):
    """A schedule for a training run of `steps` steps: sparsity rising along
    Zhu and Gupta's cubic curve over the first 2/3 of the steps, pruning
    every `ramp // prunings` of them (so at least `prunings` times), then
    training on at `final_sparsity` (the recovery third). The ramp ends on a
    pruning step, so the target is reached; with fewer than 2 steps it
    prunes once, at step 0.

    Example:
    ```python
    schedule = bertzoo.compression.ramp_schedule(steps=1128, final_sparsity=0.9)
    schedule.end_step, schedule.frequency   # (750, 75): 90% from step 750 on
    ```
    """
    final_sparsity = check_sparsity("final_sparsity", final_sparsity)
    steps = check_positive_int("steps", steps)
    prunings = check_positive_int("prunings", prunings)
    ramp = (2 * steps) // 3
    if ramp < 1:
        return ConstantSparsity(final_sparsity, begin_step=0)
    frequency = max(1, ramp // prunings)
    return PolynomialDecay(
        0.0, final_sparsity, begin_step=0, end_step=frequency * (ramp // frequency), frequency=frequency
    )


def check_schedule(schedule):
    """Returns `schedule` if it is a `PruningSchedule`, else raises a ValueError."""
    if isinstance(schedule, PruningSchedule):
        return schedule
    raise ValueError(
        f"`schedule` must be a pruning schedule such as bertzoo.PolynomialDecay(...) or "
        f"bertzoo.ConstantSparsity(...), got {schedule!r}."
    )
