"""Attributes a functional model's constructor sets before the model exists."""

import keras


class EarlyAttributesMixin:
    """Mix in before `keras.Model` in a functional model that keeps its layers
    as attributes before calling `super().__init__(inputs=..., outputs=...)`.

    On Keras's torch backend every Keras layer is a `torch.nn.Module`, whose
    `__setattr__` refuses a sub-module until `Module.__init__` has run, i.e.
    until the functional constructor. Until then such attributes are stored
    as plain attributes: nothing is lost, because the functional graph itself
    tracks every layer (and so every weight) the model uses. Properties and
    the other backends go through Keras's usual `__setattr__`.

    Example:
    ```python
    class MyBackbone(EarlyAttributesMixin, keras.Model):
        def __init__(self, **kwargs):
            self.dense = keras.layers.Dense(4)  # before the model exists
            inputs = keras.Input((3,))
            super().__init__(inputs=inputs, outputs=self.dense(inputs), **kwargs)
    ```
    """

    def __setattr__(self, name, value):
        if (
            keras.config.backend() == "torch"
            and "_modules" not in self.__dict__  # torch.nn.Module.__init__ has not run.
            and not isinstance(getattr(type(self), name, None), property)
        ):
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)
