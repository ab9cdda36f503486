"""Learning-rate schedules for BERT fine-tuning."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bertzoo")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak_learning_rate`, then linear decay to zero.

    BERT's fine-tuning schedule: `floor(warmup_fraction * total_steps)`
    warm-up steps from 0 (none in a run too short for one), then linear
    decay to 0 at `total_steps`. `total_steps` may be left unset: bertzoo task
    models fill it in from the dataset when `fit()` starts (it is a variable,
    so a second `fit()` with another length updates it without re-tracing).
    While unset, the rate is the peak (no warm-up). A length that fit
    filled in is extended by the next `fit()` (from the step it starts at);
    one given here is kept. The config records which it is
    (`total_steps_from_fit`), so a saved and reloaded model's next `fit()`
    extends the schedule too instead of training at rate zero.

    Example:
    ```python
    schedule = WarmupLinearDecay(5e-5, warmup_fraction=0.1, total_steps=1000)
    float(schedule(100))
    # 4.999999873689376e-05 (5e-05 in float32)
    ```
    """

    def __init__(self, peak_learning_rate=5e-5, warmup_fraction=0.1, total_steps=None, total_steps_from_fit=False):
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"`warmup_fraction` must be in [0, 1), got {warmup_fraction}.")
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_fraction = float(warmup_fraction)
        self._total_steps = keras.Variable(
            -1.0 if total_steps is None else float(total_steps),
            trainable=False,
            dtype="float32",
            name="total_steps",
        )
        # Set by `fit()` (`bertzoo.models.raw_inputs.set_schedule_length`)
        # when it fills in `total_steps`.
        self._length_from_fit = bool(total_steps_from_fit) and total_steps is not None

    @property
    def total_steps(self):
        value = float(ops.convert_to_numpy(self._total_steps))
        return None if value < 0 else int(value)

    @total_steps.setter
    def total_steps(self, value):
        self._total_steps.assign(-1.0 if value is None else float(value))

    def __call__(self, step):
        step = ops.cast(step, "float32")
        total = self._total_steps
        known = total > 0
        total = ops.maximum(total, 1.0)
        # Whole warm-up steps, as BERT's `int(num_train_steps * warmup_proportion)`:
        # a run of fewer than 1 / warmup_fraction steps starts at the peak.
        warmup = ops.floor(total * self.warmup_fraction)
        warm = step / ops.maximum(warmup, 1.0)
        decay = ops.clip((total - step) / ops.maximum(total - warmup, 1.0), 0.0, 1.0)
        factor = ops.where(step < warmup, warm, ops.where(known, decay, 1.0))
        return self.peak_learning_rate * factor

    def get_config(self):
        config = {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_fraction": self.warmup_fraction,
            "total_steps": self.total_steps,
        }
        if getattr(self, "_length_from_fit", False) and config["total_steps"] is not None:
            config["total_steps_from_fit"] = True
        return config
