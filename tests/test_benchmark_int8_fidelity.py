"""benchmarks.int8_fidelity refuses to run without the fine-tuned model it compares against."""

import pytest

from benchmarks import int8_fidelity


def test_missing_fine_tuned_model_names_the_fix(tmp_path):
    with pytest.raises(SystemExit, match=r"No fine-tuned model at .*run `python -m benchmarks.compression` first"):
        int8_fidelity.main(["--dense", str(tmp_path / "absent"), "--no-record"])
