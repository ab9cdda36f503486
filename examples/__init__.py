"""Runnable examples. Each is a script (`python examples/NAME.py --help`)
and a module whose `run(...)` returns its figures (`from examples import
distill_to_small`), which the benchmarks use."""
