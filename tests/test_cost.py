"""The cost model: which measure binds a step (the host's own work or the GPU's compute), what each
phase costs in it, and what taking work out of a step saves."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis.cost import GPU, HOST, Figures, phase_costs, saving_us

PHASES = ["data", "forward", "backward"]


def figures(cpu, wait=(0, 0, 0), compute=(0, 0, 0), exposed=(0, 0, 0), has_gpu=True, wall=None) -> Figures:
    """A typical step of three phases (µs); the figures the cost model does not read are zeros."""
    zeros = np.zeros(3)
    cpu = np.array(cpu, dtype=float)
    return Figures(phases=PHASES, steps=[1, 2, 3], wall_us=float(cpu.sum()) if wall is None else wall, host_us=cpu,
                   gpu_us=zeros, idle_us=zeros, wait_us=np.array(wait, dtype=float), launches=zeros, busy_us=zeros,
                   compute_us=np.array(compute, dtype=float), comm_us=zeros,
                   exposed_comm_us=np.array(exposed, dtype=float), step_idle_us=0.0, has_gpu=has_gpu)


def test_a_gpu_computing_as_long_as_the_hosts_own_work_binds_the_step():
    # host: 10 ms, of which 1 ms waiting for the GPU, so 9 ms of its own work; GPU compute: 9 ms
    c = phase_costs(figures(cpu=[1000, 3000, 6000], wait=[0, 1000, 0], compute=[0, 3000, 6000]))
    assert c.measure == GPU
    assert c.cost_us == {"data": 0.0, "forward": 3000.0, "backward": 6000.0}
    assert c.order == ["backward", "forward", "data"]
    assert (c.total_us, c.host_us, c.compute_us, c.wall_us) == (9000.0, 9000.0, 9000.0, 10000.0)
    assert c.share("backward") == pytest.approx(6000 / 9000)


def test_a_host_whose_own_work_outlasts_the_gpus_compute_binds_the_step():
    c = phase_costs(figures(cpu=[1000, 3000, 6000], wait=[0, 1000, 0], compute=[0, 3000, 5999], exposed=[0, 0, 500]))
    assert c.measure == HOST
    assert c.cost_us == {"data": 1000.0, "forward": 3000.0, "backward": 6000.0}
    assert (c.total_us, c.host_us, c.compute_us, c.gpu_busy_us) == (10000.0, 9000.0, 8999.0, 9499.0)
    assert c.share("data") == pytest.approx(0.1)


def test_without_a_gpu_every_phase_costs_its_host_time():
    c = phase_costs(figures(cpu=[4000, 1000, 2000], compute=[9000, 9000, 9000], exposed=[10, 10, 10], has_gpu=False))
    assert c.measure == HOST
    assert c.order == ["data", "backward", "forward"]
    assert (c.total_us, c.compute_us, c.gpu_busy_us) == (7000.0, 0.0, 0.0)


def test_a_gpu_that_computes_nothing_never_binds():
    c = phase_costs(figures(cpu=[0, 0, 0], compute=[0, 0, 0]))
    assert c.measure == HOST and c.total_us == 0.0
    assert c.share("forward") == 0.0


def test_the_saving_is_what_the_longer_of_host_and_gpu_loses():
    # host's own work 9 ms; GPU busy: 8 ms of compute and 2 ms of exposed communication
    c = phase_costs(figures(cpu=[1000, 3000, 6000], wait=[0, 1000, 0], compute=[0, 3000, 5000], exposed=[0, 0, 2000]))
    assert (c.host_us, c.gpu_busy_us) == (9000.0, 10000.0)
    assert saving_us(c) == 0.0
    assert saving_us(c, gpu_us=2000) == 1000.0  # the host's 9 ms then binds
    assert saving_us(c, gpu_us=500) == 500.0
    assert saving_us(c, host_us=3000) == 0.0  # the GPU still takes 10 ms
    assert saving_us(c, host_us=3000, gpu_us=4000) == 4000.0
    assert saving_us(c, host_us=-5000) == 0.0  # more work is never a saving


def test_a_step_under_a_microsecond_is_measured_like_any_other():
    c = phase_costs(figures(cpu=[0.1, 0.2, 0.3], compute=[0, 0.25, 0.5]))
    assert c.measure == GPU and c.total_us == 0.75
    assert c.share("backward") == pytest.approx(0.5 / 0.75)
