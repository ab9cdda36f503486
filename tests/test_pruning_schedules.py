"""Pruning schedules: tfmot's formulas and step semantics, checked by hand."""

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.compression.schedules import check_schedule


def _call(schedule, step):
    should, sparsity = schedule(step)
    return bool(keras.ops.convert_to_numpy(should)), float(keras.ops.convert_to_numpy(sparsity))


def test_polynomial_decay_matches_hand_computation():
    schedule = bertzoo.PolynomialDecay(0.1, 0.9, begin_step=100, end_step=500, power=3, frequency=50)
    # step 300: p = (300 - 100) / 400 = 0.5; 0.9 + (0.1 - 0.9) * 0.5**3 = 0.9 - 0.1 = 0.8
    assert _call(schedule, 300) == (True, pytest.approx(0.8))
    # step 200: p = 0.25; 0.9 - 0.8 * 0.75**3 = 0.9 - 0.3375 = 0.5625
    assert _call(schedule, 200) == (True, pytest.approx(0.5625))
    # Before the start the sparsity is the initial one, and no pruning happens.
    assert _call(schedule, 0) == (False, pytest.approx(0.1))
    assert _call(schedule, 100) == (True, pytest.approx(0.1))
    # At and after the end: the final sparsity; pruning stops after end_step.
    assert _call(schedule, 500) == (True, pytest.approx(0.9))
    assert _call(schedule, 550) == (False, pytest.approx(0.9))
    # Off-turn steps do not prune.
    assert _call(schedule, 125)[0] is False


def test_polynomial_decay_power_one_is_linear():
    schedule = bertzoo.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=10, power=1, frequency=1)
    values = [_call(schedule, s)[1] for s in range(11)]
    np.testing.assert_allclose(values, np.linspace(0.0, 0.5, 11), rtol=1e-6)


def test_constant_sparsity_turns():
    schedule = bertzoo.ConstantSparsity(0.7, begin_step=4, frequency=3)
    turns = [s for s in range(20) if _call(schedule, s)[0]]
    assert turns == [4, 7, 10, 13, 16, 19]  # end_step=-1: no end.
    assert _call(schedule, 5)[1] == pytest.approx(0.7)
    bounded = bertzoo.ConstantSparsity(0.7, begin_step=4, end_step=10, frequency=3)
    assert [s for s in range(20) if _call(bounded, s)[0]] == [4, 7, 10]


def test_schedules_run_on_tensors_and_round_trip_config():
    schedule = bertzoo.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=2000, frequency=100)
    should, sparsity = schedule(keras.ops.convert_to_tensor(1000, "int64"))
    assert bool(should) and float(sparsity) == pytest.approx(0.9 - 0.9 * 0.5**3)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert again == schedule and again is not schedule
    constant = bertzoo.ConstantSparsity(0.5, 0)
    assert bertzoo.ConstantSparsity.from_config(constant.get_config()) == constant


def test_numpy_numbers_are_numbers_too():
    # e.g. steps computed with NumPy: len(x) // batch_size * np.int64(epochs)
    schedule = bertzoo.PolynomialDecay(0.0, np.float32(0.5), begin_step=np.int64(0), end_step=np.int32(10))
    assert schedule == bertzoo.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=10)
    assert type(schedule.get_config()["begin_step"]) is int  # JSON-serializable in a preset's config.
    assert _call(bertzoo.ConstantSparsity(np.float64(0.25), np.int64(2)), 2) == (True, 0.25)
    with pytest.raises(ValueError, match="`begin_step` must be an integer, got 1.5"):
        bertzoo.ConstantSparsity(0.5, begin_step=1.5)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: bertzoo.PolynomialDecay(0.0, 1.0, 0, 10), r"final_sparsity.*\[0, 1\)"),
        (lambda: bertzoo.PolynomialDecay(-0.1, 0.5, 0, 10), r"initial_sparsity.*\[0, 1\)"),
        (lambda: bertzoo.ConstantSparsity(1.5, 0), r"target_sparsity.*\[0, 1\)"),
        (lambda: bertzoo.PolynomialDecay(0.0, 0.5, begin_step=100, end_step=50), r"end_step.*before.*begin_step"),
        (lambda: bertzoo.PolynomialDecay(0.0, 0.5, begin_step=100, end_step=100), r"end_step.*at.*begin_step"),
        (lambda: bertzoo.ConstantSparsity(0.5, begin_step=10, end_step=5), r"end_step.*before.*begin_step"),
        (lambda: bertzoo.ConstantSparsity(0.5, begin_step=-1), r"begin_step.*>= 0"),
        (lambda: bertzoo.ConstantSparsity(0.5, begin_step=0, frequency=0), r"frequency"),
        (lambda: bertzoo.PolynomialDecay(0.0, 0.5, 0, 10, power=0), r"power"),
        # NaN kept the sparsity at NaN (nothing pruned); inf made the ramp a step at end_step.
        (lambda: bertzoo.PolynomialDecay(0.0, 0.5, 0, 10, power=float("nan")), r"`power` must be a finite positive"),
        (lambda: bertzoo.PolynomialDecay(0.0, 0.5, 0, 10, power=float("inf")), r"`power` must be a finite positive"),
        (lambda: check_schedule(0.5), r"pruning schedule"),
    ],
)
def test_bad_schedules_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("steps", [1, 2, 3, 10, 37, 1128])
def test_the_ramp_schedule_reaches_its_sparsity_within_the_steps(steps):
    schedule = bertzoo.compression.ramp_schedule(steps, 0.9)
    turns = [(step, sparsity) for step in range(steps) for prune, sparsity in [_call(schedule, step)] if prune]
    assert turns and turns[-1][1] == pytest.approx(0.9)
    reached = next(step for step, sparsity in turns if sparsity == pytest.approx(0.9))
    assert reached <= max(0, 2 * steps // 3)  # The last third trains at the target.
    assert all(b >= a for (_, a), (_, b) in zip(turns, turns[1:]))  # Rising, never falling.


def test_the_ramp_schedule_prunes_at_least_as_often_as_asked():
    ramp = bertzoo.compression.ramp_schedule
    # 752 ramp steps (2/3 of 1128) in 20 prunings: every 37 steps, the last at 740.
    schedule = ramp(np.int64(1128), 0.9, prunings=20)
    assert (schedule.frequency, schedule.end_step) == (37, 740)
    # A ramp shorter than 2 x prunings (19 steps) prunes on each: steps 0 to 19.
    assert [step for step in range(29) if _call(ramp(29, 0.9, prunings=10), step)[0]] == list(range(20))


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 0.9), r"`steps` must be a positive integer, got 0\."),
        ((2.5, 0.9), r"`steps` must be a positive integer, got 2\.5\."),
        ((True, 0.9), r"`steps` must be a positive integer, got True\."),
        ((10, 0.9, 0), r"`prunings` must be a positive integer, got 0\."),
        ((1, 1.5), r"`final_sparsity` must be a sparsity in \[0, 1\)"),  # Named even with one step.
    ],
)
def test_the_ramp_schedule_refuses_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        bertzoo.compression.ramp_schedule(*args)
