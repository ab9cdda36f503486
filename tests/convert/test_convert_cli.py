"""`bertzoo convert SRC DEST` and `bertzoo presets` from the command line."""

import subprocess
import sys

import bertzoo
from bertzoo.cli import main


def test_convert_command(ref, rng, tmp_path, capsys):
    model = ref.random_model(rng, num_layers=1)
    source = ref.write_hf(tmp_path / "hf", ref.hf_config(model), ref.hf_bert_arrays(model))
    assert main(["convert", str(source), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "Converted huggingface checkpoint" in printed and "pre-training heads kept" in printed
    assert bertzoo.BertBackbone.from_preset(tmp_path / "out").num_layers == 1

    # An existing destination needs --overwrite; errors are one line on stderr, exit status 1.
    assert main(["convert", str(source), str(tmp_path / "out")]) == 1
    assert "bertzoo convert: error:" in capsys.readouterr().err
    assert main(["convert", str(source), str(tmp_path / "out"), "--overwrite"]) == 0
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_presets_command(capsys):
    assert main(["presets"]) == 0
    assert "`albert_base`" in capsys.readouterr().out


def test_python_dash_m_bertzoo():
    done = subprocess.run(
        [sys.executable, "-m", "bertzoo", "convert", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "SRC" in done.stdout and "--overwrite" in done.stdout
