"""GPU checks of bertzoo on one Keras backend, for a lent accelerator machine.

Prints one `PROBE {json}` line per finding:
- which backend and device ran, and whether `import bertzoo` imported
  TensorFlow (it need not be installed: the lent GPU image has PyTorch and
  JAX only);
- a tiny classifier trained for a few steps (the loss must fall), its int8
  copy's largest logit difference, and the fast-path choice on this device;
- on JAX, whether BERT-base's attention compiles to cuDNN's fused attention
  (`__cudnn$fmha*` custom calls) in bfloat16 and float16, with a padding
  mask; on torch, which attention kernels the profiler sees.

Usage (from the repository root; `benchmarks/gpu_run.sh` runs it):
    python -m benchmarks.gpu_probe --backend jax
"""

import argparse
import json
import os
import sys
from pathlib import Path

PRESETS = Path(__file__).resolve().parents[1] / "presets"


def say(**finding):
    print("PROBE " + json.dumps(finding), flush=True)


def token_batch(rng, batch, length, vocabulary_size):
    """Random token ids; the first half of the rows padded after half the
    length, so the attention mask matters."""
    import numpy as np

    mask = np.ones((batch, length), "int32")
    mask[: batch // 2, length // 2 :] = 0
    return {
        "token_ids": rng.integers(1, vocabulary_size, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": mask,
    }


def tiny_classifier_check(rng):
    import keras
    import numpy as np

    import bertzoo
    from bertzoo.layers import dense

    config = dict(
        vocabulary_size=200, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128, max_sequence_length=32
    )
    keras.utils.set_random_seed(0)
    model = bertzoo.BertClassifier(bertzoo.BertBackbone(**config), 2, preprocessor=None)
    x, y = token_batch(rng, 32, 32, 200), np.arange(32) % 2
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = model.fit(x, y, epochs=8, batch_size=16, verbose=0)
    logits = model.predict(x, verbose=0)
    calls = []
    torch_int8 = getattr(dense, "_torch_int8_dense", None)
    if torch_int8 is not None:  # Counts the layers that ran PyTorch's int8 matmul.
        dense._torch_int8_dense = lambda layer, inputs: calls.append(layer.name) or torch_int8(layer, inputs)
    int8_logits = bertzoo.quantize(model, "int8").predict(x, verbose=0)
    say(
        check="tiny classifier",
        losses=[round(v, 4) for v in history.history["loss"]],
        jit_compile=bool(model.jit_compile),
        int8_max_logit_diff=float(np.abs(int8_logits - logits).max()),
        torch_int8_matmul_calls=len(calls),
    )
    say(explain=str(bertzoo.explain_fast_path(model)))


def attention_kernels(rng, policy):
    import keras

    import bertzoo

    config = json.loads((PRESETS / "base.json").read_text())["backbone"]
    keras.utils.set_random_seed(0)
    backbone = bertzoo.BertBackbone(**config, dtype=policy)
    inputs = token_batch(rng, 32, 128, config["vocabulary_size"])
    if keras.backend.backend() == "jax":
        import jax

        trainable = [v.value for v in backbone.trainable_variables]
        frozen = [v.value for v in backbone.non_trainable_variables]
        forward = jax.jit(lambda t, f, x: backbone.stateless_call(t, f, x)[0]["sequence_output"])
        text = forward.lower(trainable, frozen, inputs).compile().as_text()
        targets = sorted({t.split('"')[0] for t in text.split('custom_call_target="')[1:]})
        say(
            check="attention kernels", policy=policy, cudnn_fmha=any("fmha" in t for t in targets), custom_calls=targets
        )
    else:
        import torch
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile

        with torch.no_grad():
            backbone(inputs)
            with profile(activities=[ProfilerActivity.CUDA]) as profiler:
                backbone(inputs)
                torch.cuda.synchronize()
        words = ("flash", "fmha", "attention", "efficient", "softmax")
        names = sorted({e.key for e in profiler.key_averages() if any(w in e.key.lower() for w in words)})
        say(check="attention kernels", policy=policy, kernels=names[:12])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("jax", "torch"), required=True)
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = args.backend  # Before Keras is imported.
    import keras
    import numpy as np

    import bertzoo  # noqa: F401  (before the check below)

    say(backend=keras.backend.backend(), tensorflow_imported_by_import_bertzoo="tensorflow" in sys.modules)
    if args.backend == "jax":
        import jax

        say(device=jax.devices()[0].device_kind)
    else:
        import torch

        say(device=torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU")
    rng = np.random.default_rng(0)
    tiny_classifier_check(rng)
    for policy in ("bfloat16", "float16"):
        try:
            attention_kernels(rng, policy)
        except Exception as error:  # Reported, and the next check still runs.
            say(check="attention kernels", policy=policy, error=repr(error)[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
