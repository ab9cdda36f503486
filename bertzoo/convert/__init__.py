"""Checkpoint converters: Hugging Face, original TF1 BERT/ALBERT, keras-hub.

```python
bertzoo.convert_checkpoint("path/to/hf_bert_dir", "presets_out/minilm")
bertzoo.convert_checkpoint("uncased_L-12_H-768_A-12", "out/base")
# Google's BERT uses the exact GELU; keras-hub's BERT the tanh form, accepted explicitly:
keras_hub_backbone = bertzoo.convert.to_keras_hub("out/base", allow_gelu_approximation=True)
```
"""

from bertzoo.convert.checkpoint import FORMATS
from bertzoo.convert.checkpoint import convert_checkpoint
from bertzoo.convert.checkpoint import detect_format
from bertzoo.convert.checkpoint import read_checkpoint
from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import ConversionResult
from bertzoo.convert.keras_hub import to_keras_hub

__all__ = [
    "FORMATS",
    "ConversionError",
    "ConversionResult",
    "convert_checkpoint",
    "detect_format",
    "read_checkpoint",
    "to_keras_hub",
]
