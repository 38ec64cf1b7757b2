"""The hardware floor: the step's work counted from the spec (against counts made by hand),
the floor as the largest of its terms, the rates measured on this host, and the chunk plan
the training loop runs in."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.core.errors import HarnessError
from harness.run import hardware, runner
from harness.run.floor import Rates, floor, step_cost
from harness.run.runner import chunk_plan
from tests.conftest import quick_problem

CPU = Rates(matmul_flops_per_s=1e11, bandwidth_bytes_per_s=2e10, launch_latency_s=None, measured_with="fixture")
GPU = Rates(matmul_flops_per_s=5e13, bandwidth_bytes_per_s=3e12, launch_latency_s=2e-6, measured_with="fixture")


def test_peaks_step_counted_by_hand():
    problem = quick_problem("peaks_mlp")  # 50 x 50 = 2,500 points, full batch, Adam, 2-20-5-1
    batch = 2500
    products = 2 * (2 * 2 * 20) + 3 * (2 * 20 * 5) + 3 * (2 * 5 * 1)  # fwd + dW everywhere, dX above layer 1
    elementwise = 20 * 4 + 5 * 4 + 1 * 2 + 1 * 5  # bias, relu, relu', bias grad; identity: bias, bias grad; MSE
    params = (2 * 20 + 20) + (20 * 5 + 5) + (5 * 1 + 1)
    cost = step_cost(problem)
    assert cost.flops == batch * (products + elementwise) + 12 * params
    assert cost.bytes == batch * (2 + 1) * 4 + 2 * params * 3 * 4 + 4  # x, y; params, m, v read and written; log
    assert cost.unfused_bytes == cost.bytes + 6 * batch * (20 + 5 + 1) * 4
    assert cost.launches == 4 * 3 + 1


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
    on_gpu = floor(problem, GPU)
    assert on_gpu.launch_s == pytest.approx(13 * 2e-6)
    assert on_gpu.bound == "launches" and on_gpu.floor_s == on_gpu.launch_s


@given(st.floats(1e9, 1e15), st.floats(1e9, 1e13), st.floats(1e-7, 1e-4), st.floats(1.5, 100))
def test_faster_hardware_never_raises_the_floor(matmul, bandwidth, latency, factor):
    problem = quick_problem("peaks_mlp")
    slow = Rates(matmul, bandwidth, latency, "fixture")
    fast = dataclasses.replace(slow, matmul_flops_per_s=matmul * factor, bandwidth_bytes_per_s=bandwidth * factor)
    f_slow, f_fast = floor(problem, slow), floor(problem, fast)
    assert f_fast.floor_s <= f_slow.floor_s
    assert f_slow.floor_s >= max(f_slow.compute_s, f_slow.memory_s, f_slow.launch_s) - 1e-18


def test_cpu_rates_are_measured_here():
    rates = hardware.measure("cpu")
    assert rates.matmul_flops_per_s > 1e8 and rates.bandwidth_bytes_per_s > 1e8
    assert rates.launch_latency_s is None
    assert "numpy" in rates.measured_with and "GFLOP/s" in rates.measured_with


def test_gpu_rates_without_a_gpu_say_why_in_one_line():
    try:
        rates = hardware.measure("gpu")
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
