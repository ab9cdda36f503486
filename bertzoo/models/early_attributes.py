"""Attributes a functional model's constructor sets before the model exists."""

import keras


class EarlyAttributesMixin:
    """Mix in before `keras.Model` in a functional model that keeps its layers
    as attributes before calling `super().__init__(inputs=..., outputs=...)`.

    On Keras's torch backend every Keras layer is a `torch.nn.Module`, whose
    `__setattr__` refuses a sub-module until `Module.__init__` has run, i.e.
    until the functional constructor. Until then such attributes are stored
    as plain attributes: nothing is lost, because the functional graph itself
    tracks every layer (and so every weight) the model uses; once it has, the
    layers set early are moved to the front of the tracked layers, where the
    other backends put them, so `weights` comes in the same order everywhere.
    Properties and the other backends go through Keras's usual `__setattr__`.

    Example:
    ```python
    class MyBackbone(EarlyAttributesMixin, keras.Model):
        def __init__(self, **kwargs):
            self.dense = keras.layers.Dense(4)  # before the model exists
            inputs = keras.Input((3,))
            super().__init__(inputs=inputs, outputs=self.dense(inputs), **kwargs)
    ```
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        early = self.__dict__.get("_bertzoo_early_layers")
        if early:
            # The order the other backends track layers in (set as attributes
            # first, then the graph's), so that `weights` and `get_weights()`
            # line up across backends.
            object.__setattr__(self, "_bertzoo_early_layers", [])
            tracked = {id(layer) for layer in self._layers}
            first = [layer for layer in dict.fromkeys(early, None) if id(layer) in tracked]
            firsts = {id(layer) for layer in first}
            self._layers[:] = first + [layer for layer in self._layers if id(layer) not in firsts]

    def __setattr__(self, name, value):
        if (
            keras.config.backend() == "torch"
            and "_modules" not in self.__dict__  # torch.nn.Module.__init__ has not run.
            and not isinstance(getattr(type(self), name, None), property)
        ):
            object.__setattr__(self, name, value)
            if "_bertzoo_early_layers" not in self.__dict__:
                object.__setattr__(self, "_bertzoo_early_layers", [])
            self.__dict__["_bertzoo_early_layers"].extend(_layers_in(value))
            return
        super().__setattr__(name, value)


def _layers_in(value):
    """The Keras layers in `value` (a layer, or lists, tuples and dicts of
    them), in the order Keras's attribute tracking meets them."""
    if isinstance(value, keras.layers.Layer):
        return [value]
    if isinstance(value, (list, tuple)):
        return [layer for item in value for layer in _layers_in(item)]
    if isinstance(value, dict):
        return [layer for item in value.values() for layer in _layers_in(item)]
    return []
