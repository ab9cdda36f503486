"""Dict inputs with exactly the keys a functional model declares."""


class DeclaredInputsMixin:
    """Mix in before `keras.Model` in a functional model with dict inputs:
    a call whose dict has keys the model does not take raises a ValueError
    naming them.

    Keras matches such a dict to the inputs by position, with only a warning,
    so an extra entry (`labels`, a Hugging Face `attention_mask`, the
    `mask_positions` of pre-training features) would silently be read as
    another input and change the outputs.

    Example:
    ```python
    features, _ = pretrainer.preprocess((first, second), labels)  # features hold "mask_positions" too
    backbone({k: features[k] for k in backbone.input})  # not backbone(features)
    ```
    """

    # The signature is Functional.call's: Keras passes `training` only to a
    # `call` that names it.
    def call(self, inputs, training=None, mask=None, **kwargs):
        declared = self.input
        if isinstance(inputs, dict) and isinstance(declared, dict):
            extra = sorted(set(inputs) - set(declared))
            if extra:  # (Keras itself names missing keys.)
                raise ValueError(
                    f"{type(self).__name__} '{self.name}' got inputs it does not take: {extra}. It takes "
                    f"{sorted(declared)}: pass {{k: x[k] for k in model.input}} to drop the others."
                )
        return super().call(inputs, training=training, mask=mask, **kwargs)
