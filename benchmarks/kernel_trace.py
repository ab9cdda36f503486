"""Accelerator kernel time from profiler traces: which kernels ran, how long
each took on the device, grouped into matmuls, attention, copies and the
rest (element-wise, normalization and softmax fusions).

Two trace formats are read, both Chrome-trace JSON:
- JAX's (`jax.profiler.trace(folder, create_perfetto_trace=True)` writes
  `perfetto_trace.json.gz`): the kernels are the complete events on the
  threads named "Stream #..." of a process named "/device:..." (the other
  threads of that process, e.g. "XLA Ops", repeat the same time per HLO op
  and are left out);
- PyTorch's (`torch.profiler.profile(...).export_chrome_trace(path)`): the
  events of category "kernel", "gpu_memcpy" and "gpu_memset".

`profile_jax` and `profile_torch` run a callable under each profiler and
return the kernels; `summarize` turns them into per-call figures.

Example:
```python
kernels = profile_jax(run_compiled_forward, calls=5)
summarize(kernels, calls=5)
# {"kernels_per_call": 183.0, "device_ms_per_call": 5.1, "matmul_ms": 3.2,
#  "attention_ms": 0.4, "copy_ms": 0.0, "other_ms": 1.5, "top_kernels": [...]}
```
"""

import collections
import glob
import gzip
import json
import os
import re
import tempfile

CATEGORIES = ("matmul", "attention", "copy", "other")
_ATTENTION = re.compile(r"fmha|flash|sdpa|attention", re.IGNORECASE)
_MATMUL = re.compile(r"gemm|cublas|cutlass|matmul|xmma|nvjet", re.IGNORECASE)
_COPY = re.compile(r"memcpy|memset|copy", re.IGNORECASE)


def category(name):
    """The group a kernel's name falls in: "attention", "matmul", "copy" or
    "other" (tested in that order: cuDNN's attention kernels also name
    their matmul tiles). "copy" is host-device transfers and memsets, and
    also on-device kernels named copy (XLA's layout-changing copies,
    PyTorch's casting `direct_copy_kernel`).

    Example:
    ```python
    category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")  # "matmul"
    ```
    """
    if _ATTENTION.search(name):
        return "attention"
    if _MATMUL.search(name):
        return "matmul"
    if _COPY.search(name):
        return "copy"
    return "other"


def _load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def jax_kernels(path):
    """`[(kernel name, start, device microseconds)]` (start in the trace's
    microseconds) from a JAX perfetto trace: the
    complete events on the "Stream #..." threads of "/device:..." processes.
    Empty when the trace has no accelerator (JAX on a CPU)."""
    events = _load(path)
    processes, threads = {}, {}
    for event in events:
        if event.get("ph") != "M":
            continue
        if event.get("name") == "process_name":
            processes[event["pid"]] = event["args"]["name"]
        elif event.get("name") == "thread_name":
            threads[(event["pid"], event.get("tid"))] = event["args"]["name"]
    return [
        (event["name"], float(event.get("ts", 0.0)), float(event.get("dur", 0.0)))
        for event in events
        if event.get("ph") == "X"
        and processes.get(event.get("pid"), "").startswith("/device:")
        and threads.get((event.get("pid"), event.get("tid")), "").startswith("Stream")
    ]


def torch_kernels(path):
    """`[(kernel name, start, device microseconds)]` from a PyTorch chrome trace:
    the kernel, memcpy and memset events. Empty on a CPU."""
    return [
        (event["name"], float(event.get("ts", 0.0)), float(event.get("dur", 0.0)))
        for event in _load(path)
        if event.get("ph") == "X" and event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]


SHORT_GAP_US = 50.0


def summarize(kernels, calls, top=8):
    """Per-call figures for the kernels of `calls` profiled calls: how many
    kernels, their device time in ms (summed over streams: kernels that
    overlap count twice), the time no kernel runs (gaps under
    `SHORT_GAP_US`, and the longer ones with their count), the kernel time
    by `category` ("matmul_ms" ...), and the `top` kernels by time as
    `[name, ms per call, launches per call]`.

    The gaps are measured under the profiler, which slows the host: they
    are longer than in an unprofiled call. Short gaps are launch latency
    between kernels; long ones are the host preparing a call, or a call
    waiting for the host (eager PyTorch has many of those inside a call).

    Example:
    ```python
    summarize([("gemm_a", 0.0, 1000.0), ("fusion_1", 1010.0, 500.0)], calls=1)
    # {"kernels_per_call": 2.0, "device_ms_per_call": 1.5, "short_gaps_ms_per_call": 0.01,
    #  "long_gaps_ms_per_call": 0.0, "long_gaps_per_call": 0.0, "matmul_ms": 1.0,
    #  "attention_ms": 0.0, "copy_ms": 0.0, "other_ms": 0.5,
    #  "top_kernels": [["gemm_a", 1.0, 1.0], ["fusion_1", 0.5, 1.0]]}
    ```
    """
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}.")
    by_category = dict.fromkeys(CATEGORIES, 0.0)
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for name, _, microseconds in kernels:
        by_category[category(name)] += microseconds
        by_name[name][0] += microseconds
        by_name[name][1] += 1
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    # Time no kernel runs, from the kernels sorted by start (streams overlap).
    short_gaps = long_gaps = 0.0
    long_count = 0
    busy_until = None
    for _, start, microseconds in sorted(kernels, key=lambda kernel: kernel[1]):
        if busy_until is not None and start > busy_until:
            gap = start - busy_until
            if gap < SHORT_GAP_US:
                short_gaps += gap
            else:
                long_gaps += gap
                long_count += 1
        busy_until = max(busy_until or start, start + microseconds)
    return {
        "kernels_per_call": round(len(kernels) / calls, 1),
        "device_ms_per_call": round(sum(us for _, _, us in kernels) / calls / 1000, 3),
        "short_gaps_ms_per_call": round(short_gaps / calls / 1000, 3),
        "long_gaps_ms_per_call": round(long_gaps / calls / 1000, 3),
        "long_gaps_per_call": round(long_count / calls, 1),
        **{f"{name}_ms": round(us / calls / 1000, 3) for name, us in by_category.items()},
        "top_kernels": [[name[:120], round(us / calls / 1000, 3), round(n / calls, 1)] for name, (us, n) in ranked],
    }


def profile_jax(function, calls):
    """Runs `function` (which should block until its results are ready)
    `calls` times under JAX's profiler; returns `jax_kernels` of the trace."""
    import jax

    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(calls):
                function()
        traces = glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True)
        if not traces:
            raise RuntimeError(f"JAX's profiler wrote no perfetto trace under {folder}.")
        return jax_kernels(traces[0])


def profile_torch(function, calls):
    """Runs `function` (which should synchronize) `calls` times under
    PyTorch's profiler (CPU and CUDA activity); returns `torch_kernels`."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as profiler:
        for _ in range(calls):
            function()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(path)
        return torch_kernels(path)
