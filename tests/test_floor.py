"""The hardware floor: the step's work counted from the spec (against counts made by hand),
the floor as the largest of its terms, the rates measured on this host, and the chunk plan
the training loop runs in."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.core.errors import HarnessError
from harness.hardware.floor import Floor, Rates, floor, step_cost
from harness.hardware.rates import measure
from harness.run import runner
from harness.run.runner import chunk_plan
from tests.conftest import quick_problem

CPU = Rates(matmul_flops_per_s=1e11, bandwidth_bytes_per_s=2e10, launch_latency_s=None, measured_with="fixture")
GPU = Rates(matmul_flops_per_s=5e13, bandwidth_bytes_per_s=3e12, launch_latency_s=2e-6, measured_with="fixture")
# Fast arithmetic, negligible launches, slow memory: bandwidth sets the floor.
SLOW_MEMORY = Rates(matmul_flops_per_s=1e15, bandwidth_bytes_per_s=1e9, launch_latency_s=1e-9, measured_with="fixture")

# peaks_mlp's quick step, counted by hand: 50 x 50 = 2,500 points, full batch, Adam, 2-20-5-1.
PEAKS_BATCH = 2500
PEAKS_PRODUCTS = 2 * (2 * 2 * 20) + 3 * (2 * 20 * 5) + 3 * (2 * 5 * 1)  # fwd + dW everywhere, dX above layer 1
PEAKS_ELEMENTWISE = 20 * 4 + 5 * 4 + 1 * 2 + 1 * 5  # bias, relu, relu', bias grad; identity: bias, bias grad; MSE
PEAKS_PARAMS = (2 * 20 + 20) + (20 * 5 + 5) + (5 * 1 + 1)
PEAKS_FLOPS = PEAKS_BATCH * (PEAKS_PRODUCTS + PEAKS_ELEMENTWISE) + 12 * PEAKS_PARAMS  # = 2,244,552
PEAKS_BYTES = PEAKS_BATCH * (2 + 1) * 4 + 2 * PEAKS_PARAMS * 3 * 4 + 4  # x, y; params, m, v read and written; log: 34,108
PEAKS_LAUNCHES = 4 * 3 + 1


def hand_terms(rates: Rates) -> dict[str, float]:
    """peaks_mlp's three floor terms, from the hand counts above and the rates alone."""
    return {
        "arithmetic": PEAKS_FLOPS / rates.matmul_flops_per_s,
        "bandwidth": PEAKS_BYTES / rates.bandwidth_bytes_per_s,
        "launches": PEAKS_LAUNCHES * (rates.launch_latency_s or 0.0),
    }


def assert_floor_is_the_largest_hand_term(result: Floor, rates: Rates) -> None:
    """The floor of peaks_mlp on `rates` against terms computed here, not read from `result`:
    each term, the floor as the largest, and `bound` naming a term that is the largest."""
    expected = hand_terms(rates)
    got = {"arithmetic": result.compute_s, "bandwidth": result.memory_s, "launches": result.launch_s}
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-12, abs=0), f"{name}: {got[name]} != {value} by hand"
    largest = max(expected.values())
    assert result.floor_s == pytest.approx(largest, rel=1e-12, abs=0), f"floor {result.floor_s} != the largest term {largest}"
    assert result.bound in expected, result.bound
    # the named term is the largest (a tie within rounding may name either of the tied terms)
    assert expected[result.bound] == pytest.approx(largest, rel=1e-12, abs=0), f"bound {result.bound!r} is not the largest of {expected}"


def test_peaks_step_counted_by_hand():
    problem = quick_problem("peaks_mlp")
    assert len(problem.x_train) == PEAKS_BATCH and len(problem.bounds) == 1  # full batch
    cost = step_cost(problem)
    assert cost.flops == PEAKS_FLOPS == 2_244_552
    assert cost.bytes == PEAKS_BYTES == 34_108
    assert cost.unfused_bytes == cost.bytes + 6 * PEAKS_BATCH * (20 + 5 + 1) * 4
    assert cost.launches == PEAKS_LAUNCHES


def test_moons_and_mnist_launches_and_batches(mnist_dir):
    moons = step_cost(quick_problem("moons_net"))
    assert moons.launches == 4 * 2 + 1  # full batch: no gather
    assert moons.flops > 1000 * 5 * 2 * 2 * 1000  # at least the five products of a 1,000-wide layer
    mnist = quick_problem("mnist_mlp", mnist_dir)
    cost = step_cost(mnist)
    assert cost.launches == 4 * 2 + 1 + 1  # + the gather of the shuffled batch's rows
    mean_batch = len(mnist.x_train) / len(mnist.bounds)  # 8,000 rows in 63 steps: 62 of 128 and one of 64
    assert cost.bytes == pytest.approx(mean_batch * (784 + 1 + 1) * 4 + 2 * (784 * 32 + 32 + 32 * 10 + 10) * 4 + 4)


def test_floor_is_the_largest_term_and_the_cpu_launches_nothing():
    problem = quick_problem("peaks_mlp")
    on_cpu = floor(problem, CPU)
    assert on_cpu.launch_s == 0
    assert on_cpu.floor_s == max(on_cpu.compute_s, on_cpu.memory_s) and on_cpu.bound == "arithmetic"
    assert on_cpu.floor_s == pytest.approx(2_244_552 / 1e11, rel=1e-12)  # flops / matmul rate, counted by hand
    assert_floor_is_the_largest_hand_term(on_cpu, CPU)
    on_gpu = floor(problem, GPU)
    assert on_gpu.launch_s == pytest.approx(13 * 2e-6)
    assert on_gpu.bound == "launches" and on_gpu.floor_s == on_gpu.launch_s == pytest.approx(13 * 2e-6, rel=1e-12)
    assert_floor_is_the_largest_hand_term(on_gpu, GPU)
    slow_memory = floor(problem, SLOW_MEMORY)
    assert slow_memory.bound == "bandwidth" and slow_memory.floor_s == pytest.approx(34_108 / 1e9, rel=1e-12)
    assert_floor_is_the_largest_hand_term(slow_memory, SLOW_MEMORY)


def test_the_floor_check_rejects_a_wrong_floor():
    """assert_floor_is_the_largest_hand_term catches broken floors: a wrong term, a floor that
    is not the largest term, a bound that names another term."""
    real = floor(quick_problem("peaks_mlp"), GPU)  # launches 2.6e-5 > arithmetic 4.5e-8 > bandwidth 1.1e-8
    assert_floor_is_the_largest_hand_term(real, GPU)

    class SmallestTerm(Floor):
        floor_s = property(lambda self: min(self.compute_s, self.memory_s, self.launch_s))

    class FirstTerm(Floor):
        bound = property(lambda self: "arithmetic")

    def stand_in(cls):
        return cls(real.cost, real.rates, real.compute_s, real.memory_s, real.launch_s)

    broken = [
        dataclasses.replace(real, compute_s=real.compute_s * 2),  # flops counted twice
        dataclasses.replace(real, launch_s=real.launch_s / 13),  # one launch, not 13
        stand_in(SmallestTerm),
        stand_in(FirstTerm),
    ]
    for wrong in broken:
        with pytest.raises(AssertionError):
            assert_floor_is_the_largest_hand_term(wrong, GPU)


@given(st.floats(1e9, 1e15), st.floats(1e9, 1e13), st.floats(1e-7, 1e-4), st.floats(1.5, 100))
def test_faster_hardware_never_raises_the_floor(matmul, bandwidth, latency, factor):
    problem = quick_problem("peaks_mlp")
    slow = Rates(matmul, bandwidth, latency, "fixture")
    fast = dataclasses.replace(slow, matmul_flops_per_s=matmul * factor, bandwidth_bytes_per_s=bandwidth * factor)
    f_slow, f_fast = floor(problem, slow), floor(problem, fast)
    assert f_fast.floor_s <= f_slow.floor_s
    assert_floor_is_the_largest_hand_term(f_slow, slow)
    assert_floor_is_the_largest_hand_term(f_fast, fast)


def test_cpu_rates_are_measured_here():
    rates = measure("cpu")
    assert rates.matmul_flops_per_s > 1e8 and rates.bandwidth_bytes_per_s > 1e8
    assert rates.launch_latency_s is None
    assert "numpy" in rates.measured_with and "GFLOP/s" in rates.measured_with


def test_gpu_rates_without_a_gpu_say_why_in_one_line():
    try:
        rates = measure("gpu")
    except HarnessError as exc:
        assert "cannot measure the gpu's rates" in str(exc) and "\n" not in str(exc)
    else:  # a CUDA host: the GPU's rates, with the launch latency of a graph's kernel
        assert rates.launch_latency_s is not None and rates.launch_latency_s > 0


@pytest.mark.parametrize("name", ["peaks_mlp", "moons_net"])
def test_chunk_plan_covers_every_step_once_and_stops_where_the_runner_looks(name):
    problem = quick_problem(name)
    plan = chunk_plan(problem)
    total = problem.total_steps
    assert plan[0][0] == 0 and plan[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:])) and all(start < stop for start, stop in plan)
    stops = {stop for _, stop in plan}
    every = problem.spec.logging.print_every
    assert {1, problem.spec.checks.params_after_steps.step} <= stops
    assert set(range(every, total, every)) <= stops
    twentieth = max(1, total // runner.PROGRESS_CUTS)
    assert set(range(twentieth, total, twentieth)) <= stops  # progress shows, whatever print_every says
    assert len(plan) <= 3 + total // every + runner.PROGRESS_CUTS  # nothing else cuts it
