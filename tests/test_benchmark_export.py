"""benchmarks.export: `--data` names a shared sentiment file or a file's
path; anything else is refused (it silently served synthetic sentences)."""

import pytest

from benchmarks import export


def test_data_that_is_neither_a_shared_file_nor_a_path_is_refused(capsys, tmp_path):
    # "tweet": a typo of "tweets". (--output: where a run that went ahead would append, not the repository.)
    with pytest.raises(SystemExit):
        export.main(["--data", "tweet", "--runs", "1", "--loads", "1", "--output", str(tmp_path / "r.jsonl")])
    assert "--data 'tweet' is neither one of amazon, tweets, nyt nor a file" in capsys.readouterr().err
