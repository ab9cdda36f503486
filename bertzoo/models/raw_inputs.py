"""`fit` / `evaluate` on raw text, shared by task models and trainers."""


class RawInputsMixin:
    """Runs `fit` and `evaluate` inputs through `self._as_dataset` first.

    `_as_dataset(x, y, sample_weight, batch_size, shuffle)` returns a batched,
    tokenized `tf.data.Dataset`, or None when `x` needs no preprocessing. The
    default learning-rate schedule's length is filled in from the data.
    Mix it in before the Keras model class.
    """

    def fit(self, x=None, y=None, batch_size=None, epochs=1, sample_weight=None,
            validation_data=None, shuffle=True, steps_per_epoch=None, **kwargs):
        from bertzoo.models.task import set_schedule_length

        dataset = self._as_dataset(x, y, sample_weight, batch_size, shuffle=shuffle)
        if dataset is not None:  # Already shuffled, batched and tokenized.
            x, y, sample_weight, batch_size, shuffle = dataset, None, None, None, False
        if validation_data is not None:
            parts = validation_data if isinstance(validation_data, tuple) else (validation_data,)
            validation_data = self._as_dataset(*parts) or validation_data
        if self.optimizer is not None:
            set_schedule_length(self.optimizer, x, batch_size, epochs, steps_per_epoch)
        return super().fit(
            x=x, y=y, batch_size=batch_size, epochs=epochs, sample_weight=sample_weight,
            validation_data=validation_data, shuffle=shuffle, steps_per_epoch=steps_per_epoch, **kwargs,
        )

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        dataset = self._as_dataset(x, y, sample_weight, batch_size)
        if dataset is not None:
            x, y, sample_weight, batch_size = dataset, None, None, None
        return super().evaluate(x=x, y=y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)
