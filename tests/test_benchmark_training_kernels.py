"""benchmarks.training_kernels: its Keras AdamW peer is bertzoo's optimizer's
settings on Keras's class (it failed to build from bertzoo's config, which
names its weight-decay exclusions in a key of its own)."""

import keras
import pytest

from benchmarks import training_kernels
from bertzoo.models.optimizers import bert_optimizer


def test_the_keras_adamw_peer_has_bert_optimizers_settings():
    peer, ours = training_kernels.keras_adamw(), bert_optimizer()
    assert type(peer) is keras.optimizers.AdamW
    settings = ("weight_decay", "beta_1", "beta_2", "epsilon", "global_clipnorm")
    assert {k: peer.get_config()[k] for k in settings} == {k: ours.get_config()[k] for k in settings}
    assert peer.get_config()["learning_rate"] == ours.get_config()["learning_rate"]
    decayed = [keras.Variable(1.0, name=name) for name in ("kernel", "bias", "gamma", "beta")]
    peer.build(decayed)
    assert [peer._use_weight_decay(v) for v in decayed] == [True, False, False, False]


def test_bad_arguments_are_refused_before_anything_is_built(capsys):
    with pytest.raises(SystemExit):
        training_kernels.main(["--runs", "0"])
    assert "must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        training_kernels.main(["--dtypes", "float32,fp16"])
    assert "--dtypes: unknown ['fp16']" in capsys.readouterr().err
