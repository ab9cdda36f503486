"""Low-level helpers shared by every bertzoo package."""

from bertzoo.utils.layers import quantization_mode
