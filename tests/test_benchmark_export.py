"""benchmarks.export: `--data` names a shared sentiment file or a file's
path; anything else is refused (it silently served synthetic sentences)."""

import pytest

from benchmarks import export


def test_data_that_is_neither_a_shared_file_nor_a_path_is_refused(capsys, tmp_path):
    # "tweet": a typo of "tweets". (--output: where a run that went ahead would append, not the repository.)
    with pytest.raises(SystemExit):
        export.main(["--data", "tweet", "--runs", "1", "--loads", "1", "--output", str(tmp_path / "r.jsonl")])
    assert "--data 'tweet' is neither one of amazon, tweets, nyt nor a file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--batches", "abc"], "--batches takes positive integers separated by commas"),  # A traceback.
        (["--variants", "bogus"], "--variants: unknown ['bogus']"),  # Refused only after the model was saved.
    ],
)
def test_bad_batches_and_variants_are_refused_before_a_model_is_built(capsys, tmp_path, arguments, message):
    with pytest.raises(SystemExit) as exited:
        export.main(arguments + ["--output", str(tmp_path / "r.jsonl")])
    assert message in capsys.readouterr().err + str(exited.value.code)
