"""benchmarks.call_overhead: the HLO summary by hand, and one tiny run on JAX."""

import importlib.util
import json

import pytest

from benchmarks import harness
from benchmarks.call_overhead import hlo_matmul_summary

OPTIMIZED_HLO = """
%fused_computation (param_0: s8[32,64], param_1: s8[64,64]) -> s32[32,64] {
  ROOT %dot.1 = s32[32,64]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%f = f32[32,64]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
%c = (s32[32,128]{1,0}, s8[0]{0}) custom-call(%x, %y), custom_call_target="__cublas$lt$matmul"
%d = bf16[32,128]{1,0} custom-call(%x, %z), custom_call_target="__cublas$lt$matmul"
%e = bf16[2,12,128,64]{3,2,1,0} custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaScaleBiasSoftmax"
%g = f32[32,64]{1,0} fusion(%p, %r), kind=kCustom, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
"""


def test_hlo_summary_counts_int8_products_by_where_they_run():
    assert hlo_matmul_summary(OPTIMIZED_HLO) == {
        "custom_calls": {"__cublas$lt$matmul": 2, "__cudnn$fmhaScaleBiasSoftmax": 1},
        "s32_custom_calls": 1,  # The int8 product cuBLASLt computes; not the bfloat16 one.
        "triton_gemm_fusions": 1,
        "s32_dots": 1,  # The int8 dot left to XLA; not the float32 one.
    }


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs JAX (pip install jax)")
def test_a_tiny_run_records_each_measure(tmp_path):
    results = tmp_path / "results.jsonl"
    arguments = ["--preset", "tiny", "--batches", "2", "--length", "8", "--dtypes", "int8,int8_static"]
    arguments += ["--libraries", "bertzoo", "--runs", "1", "--warmup", "1", "--results", results]
    done = harness.run_module("benchmarks.call_overhead", arguments, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert {row["measure"] for row in rows} == {"predict_on_batch", "keras_predict_on_batch", "compiled_forward"}
    assert {row["dtype"] for row in rows} == {"int8", "int8_static"}  # int8_static calibrates first.
    assert all(row["benchmark"] == "call_overhead" and row["median_ms"] > 0 for row in rows)
    # Each int8 model's products show up as int8 x int8 -> int32 matmuls (XLA dots on a CPU).
    for row in rows:
        assert row["int8_matmuls"]["s32_dots"] + row["int8_matmuls"]["s32_custom_calls"] >= 1
