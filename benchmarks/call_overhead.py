"""Where an inference call's time goes, on Keras's JAX backend: the whole
`predict_on_batch` (NumPy in, NumPy out, what the peer benchmark times)
against the compiled forward pass alone (inputs already on the device,
`block_until_ready`), for bertzoo and keras-hub, beside PyTorch's eager
BERT with and without the copy of its output to NumPy. Two batch sizes
show whether a row is bound by per-call overhead (the times barely grow
with the batch) or by the arithmetic.

With `--kernels N` it also profiles N calls of each candidate that runs on
the device (JAX's profiler for the Keras models, PyTorch's for its BERT) and
adds to each row the accelerator's kernel time per call, by kind of kernel
(`benchmarks.kernel_trace`): whether a gap in wall time is device work or
time the device sits idle between kernels.

For int8 models it also summarises the compiled program's matmuls (which
library kernels the int8 products became: cuBLAS(Lt) custom calls, Triton
GEMM fusions, or plain XLA dots), the question behind "int8 is slower than
bfloat16 on the GPU".

Every candidate of one dtype and batch is timed interleaved in one process
(`harness.time_interleaved`), so the ratios compare like with like. Rows go
to `benchmarks/results.jsonl` (benchmark "call_overhead").

Usage (from the repository root; it sets `KERAS_BACKEND=jax` itself):
    python -m benchmarks.call_overhead --preset base --batches 32,256 --dtypes bfloat16,int8
    python -m benchmarks.call_overhead --batches 32 --dtypes bfloat16 --kernels 5 --libraries bertzoo,keras_hub
    python -m benchmarks.call_overhead --batches 32 --dtypes bfloat16 --kernels 5 --libraries transformers
"""

import argparse
import collections
import os
import re
import sys

LIBRARIES = ("bertzoo", "keras_hub", "transformers")
MEASURES = ("predict_on_batch", "keras_predict_on_batch", "compiled_forward", "eager_to_numpy", "eager_on_device")


def hlo_matmul_summary(text):
    """Counts, in an optimized HLO module's text, the custom-call targets,
    those with an int32 result (int8 products handed to a library, e.g.
    cuBLAS), the Triton GEMM fusions, and the dots with an int32 result left
    to XLA's own emitter: `{"custom_calls": {target: n}, "s32_custom_calls":
    n, "triton_gemm_fusions": n, "s32_dots": n}`.

    Example:
    ```python
    hlo_matmul_summary('%c = s32[2,2]{1,0} custom-call(%a, %b), custom_call_target="__cublas$gemm"')
    # {'custom_calls': {'__cublas$gemm': 1}, 's32_custom_calls': 1, 'triton_gemm_fusions': 0, 's32_dots': 0}
    ```
    """
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
    s32_calls = len(re.findall(r"= \(?s32\[[^=]*? custom-call\(", text))
    triton = len(re.findall(r'"kind":"__triton_gemm"', text))
    s32_dots = len(re.findall(r"= s32\[[^\]]*\]\S* dot\(", text))
    return {
        "custom_calls": dict(sorted(targets.items())),
        "s32_custom_calls": s32_calls,
        "triton_gemm_fusions": triton,
        "s32_dots": s32_dots,
    }


def keras_candidates(library, model, inputs):
    """`(candidates, compiled_text)`: `predict_on_batch` and the jitted
    stateless forward (device-resident inputs) of a Keras model on JAX, and
    the forward's optimized HLO text."""
    import jax
    import keras

    model.compile(jit_compile=True)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def forward(trainable, frozen, x):
        outputs = model.stateless_call(trainable, frozen, x)[0]
        return outputs["sequence_output"] if isinstance(outputs, dict) else outputs

    compiled = jax.jit(forward).lower(trainable, frozen, inputs).compile()
    on_device = jax.device_put(inputs)

    def run_compiled():
        # The variables' current buffers: Keras's own steps may replace them.
        trainable = [v.value for v in model.trainable_variables]
        frozen = [v.value for v in model.non_trainable_variables]
        return compiled(trainable, frozen, on_device).block_until_ready()

    candidates = {
        f"{library} predict_on_batch": lambda: model.predict_on_batch(inputs),
        f"{library} compiled_forward": run_compiled,
    }
    if type(model).predict_on_batch is not keras.Model.predict_on_batch:
        # bertzoo's own `predict_on_batch` (bertzoo.models.jax_predict) beside Keras's.
        candidates[f"{library} keras_predict_on_batch"] = lambda: keras.Model.predict_on_batch(model, inputs)
    return candidates, compiled.as_text()


def torch_candidates(model, inputs, peer):
    import torch

    features = peer._torch_inputs(inputs)
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def on_device():
        with torch.inference_mode():
            model(**features)
        synchronize()

    def to_numpy():
        with torch.inference_mode():
            model(**features).last_hidden_state.float().cpu().numpy()

    return {"transformers eager_to_numpy": to_numpy, "transformers eager_on_device": on_device}


def kernel_fields(name, candidate, calls):
    """The `kernel_trace.summarize` fields of `calls` profiled calls of a
    candidate named "library measure", or `{}` when the trace has no
    accelerator kernels (a CPU) or the profiler fails (the reason printed)."""
    from benchmarks import kernel_trace

    try:
        if name.startswith("transformers "):
            kernels = kernel_trace.profile_torch(candidate, calls)
        else:
            kernels = kernel_trace.profile_jax(candidate, calls)
    except Exception as error:  # A profiler missing a library (CUPTI) must not lose the timings.
        print(f"{name}: no kernel profile ({type(error).__name__}: {error})", flush=True)
        return {}
    if not kernels:
        print(f"{name}: no accelerator kernels in the trace (a CPU run)", flush=True)
        return {}
    summary = kernel_trace.summarize(kernels, calls)
    print(f"{name}: top kernels (name, ms per call, launches per call): {summary['top_kernels']}", flush=True)
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batches", default="32,256", help="comma-separated batch sizes")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument(
        "--dtypes",
        default="bfloat16,int8",
        help="float32, bfloat16, float16, int8, int8_static, int8_weights, int8_weights_bfloat16",
    )
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help=f"any of {', '.join(LIBRARIES)}")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--kernels",
        type=int,
        default=0,
        help="profile this many calls of each candidate and record the accelerator's kernel time (0: off)",
    )
    parser.add_argument("--results", default=None, help="results file (default: benchmarks/results.jsonl)")
    args = parser.parse_args(argv)
    if args.kernels < 0:
        raise SystemExit(f"--kernels must be 0 (off) or a number of calls to profile, got {args.kernels}.")
    libraries = [name for name in args.libraries.split(",") if name]
    unknown = sorted(set(libraries) - set(LIBRARIES))
    if unknown:
        raise SystemExit(f"Unknown libraries {unknown}: choose from {list(LIBRARIES)}.")
    if args.kernels and "transformers" in libraries and len(libraries) > 1:
        # Seen on an H100: after PyTorch's profiler has run, JAX's fails
        # ("CUPTI call error") for the rest of the process.
        raise SystemExit(
            "--kernels profiles PyTorch and JAX in separate runs (PyTorch's profiler keeps the GPU's "
            "tracing library from JAX's): run `--libraries transformers` and `--libraries bertzoo,keras_hub` apart."
        )
    # After the argument checks, so a bad command is told so on any machine.
    from benchmarks.harness import require  # (The harness imports no Keras.)

    require(["jax"], "benchmarks.call_overhead (bertzoo and keras-hub on Keras's JAX backend)")
    if "transformers" in libraries:
        require(["torch", "transformers"], "--libraries transformers")
    if "keras" in sys.modules and os.environ.get("KERAS_BACKEND") != "jax":
        raise SystemExit(
            "Run this benchmark in its own process (python -m benchmarks.call_overhead): it needs Keras on JAX."
        )
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # PyTorch shares the GPU.

    from benchmarks import harness
    from benchmarks import peers

    config = peers.backbone_config(args.preset)
    keras_libraries = {"bertzoo": peers.BertzooJax(), "keras_hub": peers.KerasHubJax()}
    torch_peer = peers.Transformers() if "transformers" in libraries else None
    device = keras_libraries["bertzoo"].device()
    path = args.results or harness.RESULTS_FILE
    command = harness.command_line("benchmarks.call_overhead", sys.argv[1:] if argv is None else argv)
    rows = []
    for dtype in [d for d in args.dtypes.split(",") if d]:
        # int8_static's input ranges come from another random batch, as in benchmarks.run.
        calibration = harness.token_batch(32, args.length, config["vocabulary_size"], seed=1)
        models = {
            name: keras_libraries[name].prepare("inference", dtype, config, calibration=calibration)[1]
            for name in libraries
            if name in keras_libraries
        }
        torch_model = None
        if torch_peer is not None and not dtype.startswith("int8"):
            torch_model = torch_peer.prepare("inference", dtype, config)[1]
        for batch in [int(b) for b in args.batches.split(",") if b]:
            inputs = harness.token_batch(batch, args.length, config["vocabulary_size"])
            candidates, hlo = {}, {}
            for name, model in models.items():
                found, text = keras_candidates(name, model, inputs)
                candidates.update(found)
                if dtype.startswith("int8"):
                    hlo[name] = hlo_matmul_summary(text)
                    print(f"{name} {dtype} matmuls: {hlo[name]}", flush=True)
            if torch_model is not None:
                candidates.update(torch_candidates(torch_model, inputs, torch_peer))
            timings = harness.time_interleaved(candidates, runs=args.runs, warmup=args.warmup)
            fields = {"dtype": dtype, "device": device, "preset": args.preset, "batch": batch, "length": args.length}
            if os.environ.get("XLA_FLAGS"):
                fields["xla_flags"] = os.environ["XLA_FLAGS"]
            timed = harness.library_measure_rows(timings, args.runs, **fields)
            for row in timed:
                if row["library"] in hlo:
                    row["int8_matmuls"] = hlo[row["library"]]
                if args.kernels:
                    name = f"{row['library']} {row['measure']}"
                    row.update(kernel_fields(name, candidates[name], args.kernels))
            # Recorded as soon as timed: a run cut off keeps what it finished.
            harness.append_results("call_overhead", timed, command, path=path)
            columns = ["dtype", "batch", "library", "measure", "median_ms", "min_ms"]
            if any("device_ms_per_call" in row for row in timed):
                columns += ["device_ms_per_call", "kernels_per_call", "short_gaps_ms_per_call", "long_gaps_ms_per_call"]
                columns += ["matmul_ms", "attention_ms", "copy_ms", "other_ms"]
            harness.print_table(timed, columns)
            rows.extend(timed)
    print(f"{len(rows)} rows appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
