"""benchmarks.kernel_trace: kernels read from hand-written JAX and PyTorch
traces, per-call figures computed by hand, and call_overhead's --kernels
arguments."""

import gzip
import json

import pytest

from benchmarks import call_overhead
from benchmarks import kernel_trace

# Kernel names as an H100 run of `call_overhead --kernels` printed them.
GEMM = "nvjet_sm90_tst_256x96_64x4_1x2_h_bz_coopA_bias_NNT"
FLASH = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
LAYER_NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>"


def metadata(kind, pid, name, tid=None):
    event = {"ph": "M", "name": kind, "pid": pid, "args": {"name": name}}
    return event if tid is None else {**event, "tid": tid}


def test_category_of_real_kernel_names():
    assert kernel_trace.category(GEMM) == "matmul"
    assert kernel_trace.category("gemm_fusion_dot_general_75") == "matmul"
    assert kernel_trace.category(FLASH) == "attention"  # Not "matmul", though it names wgmma tiles.
    assert kernel_trace.category("MemcpyD2H") == "copy"
    assert kernel_trace.category("Memcpy DtoH (Device -> Pageable)") == "copy"
    assert kernel_trace.category("loop_multiply_fusion_11") == "other"
    assert kernel_trace.category(LAYER_NORM) == "other"


def test_jax_kernels_are_the_stream_events_of_the_device(tmp_path):
    events = [
        metadata("process_name", 1, "/host:CPU"),
        metadata("process_name", 2, "/device:GPU:0"),
        metadata("thread_name", 2, "Stream #13(compute)", tid=13),
        metadata("thread_name", 2, "XLA Ops", tid=99),
        metadata("thread_name", 1, "python3", tid=5),
        {"ph": "X", "pid": 2, "tid": 13, "name": GEMM, "ts": 100.0, "dur": 40.0},
        {"ph": "X", "pid": 2, "tid": 13, "name": "input_reduce_fusion_47", "ts": 145.0, "dur": 5.0},
        {"ph": "X", "pid": 2, "tid": 99, "name": "dot.3", "ts": 100.0, "dur": 40.0},  # The same time again, per op.
        {"ph": "X", "pid": 1, "tid": 5, "name": "PjitFunction(forward)", "ts": 90.0, "dur": 70.0},
        {"ph": "i", "pid": 2, "tid": 13, "name": "marker", "ts": 120.0},
    ]
    path = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert kernel_trace.jax_kernels(path) == [(GEMM, 100.0, 40.0), ("input_reduce_fusion_47", 145.0, 5.0)]


def test_jax_kernels_of_a_cpu_trace_are_none(tmp_path):
    events = [metadata("process_name", 1, "/host:CPU"), {"ph": "X", "pid": 1, "tid": 1, "name": "fusion", "dur": 3}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))  # A bare list of events is a valid trace too.
    assert kernel_trace.jax_kernels(path) == []


def test_torch_kernels_are_its_kernel_and_copy_events(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": LAYER_NORM, "ts": 10.0, "dur": 2.5},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "ts": 20.0, "dur": 7.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::layer_norm", "ts": 9.0, "dur": 30.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9.5, "dur": 4.0},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert kernel_trace.torch_kernels(path) == [
        (LAYER_NORM, 10.0, 2.5),
        ("Memcpy DtoH (Device -> Pageable)", 20.0, 7.0),
    ]


def test_summarize_per_call_by_hand():
    # Two calls. Call 1: gemm 0-1000 us, a fusion 1010-1510 (a 10 us launch gap).
    # Call 2 starts 2510 (a 1000 us host gap): gemm 2510-3510; on another stream a
    # flash kernel 2600-2700 inside it (no gap, and the device stays busy until 3510,
    # not 2700) and one 3500-3700 overlapping its end; a copy 3720-3740 (a 20 us gap).
    # Listed out of order, as streams interleave in a trace.
    kernels = [
        ("MemcpyD2H", 3720.0, 20.0),
        (FLASH, 2600.0, 100.0),
        (GEMM, 2510.0, 1000.0),
        ("loop_add_fusion", 1010.0, 500.0),
        (FLASH, 3500.0, 200.0),
        (GEMM, 0.0, 1000.0),
    ]
    summary = kernel_trace.summarize(kernels, calls=2, top=2)
    assert summary == {
        "kernels_per_call": 3.0,
        "device_ms_per_call": 1.41,  # (1000 + 500 + 1000 + 100 + 200 + 20) / 2 us, overlaps counted twice
        "short_gaps_ms_per_call": 0.015,  # (10 + 20) / 2 us
        "long_gaps_ms_per_call": 0.5,  # 1000 / 2 us
        "long_gaps_per_call": 0.5,
        "matmul_ms": 1.0,
        "attention_ms": 0.15,
        "copy_ms": 0.01,
        "other_ms": 0.25,
        "top_kernels": [[GEMM, 1.0, 1.0], ["loop_add_fusion", 0.25, 0.5]],
    }
    with pytest.raises(ValueError, match="calls must be at least 1"):
        kernel_trace.summarize(kernels, calls=0)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--kernels", "-1"], "--kernels must be 0"),
        (["--kernels", "3", "--libraries", "bertzoo,transformers"], "separate runs"),
    ],
)
def test_call_overhead_refuses_bad_kernel_arguments(arguments, message):
    with pytest.raises(SystemExit, match=message):
        call_overhead.main(arguments)
