"""Planning on recorded topologies: the properties every plan must have, on every machine shape."""

from __future__ import annotations

from itertools import combinations

import pytest

from autotune.base.errors import LibraryMissing, TopologyError
from autotune.config.knobs import Config
from autotune.host.libs import Libraries
from autotune.host.topology import Topology
from autotune.measure.plan import (
    PRIMITIVE_CACHE_VAR,
    BenchSpec,
    LaunchPlan,
    child_environment,
    plan_launch,
)
from autotune.model.knobs import JEMALLOC_CONF
from tests.conftest import lscpu

BENCH = BenchSpec(model="resnet18", item_shape=(3, 224, 224))


def make(config: list[str], topo: Topology, libs: Libraries, **kw: object) -> LaunchPlan:
    return plan_launch(Config.from_assignments(config), BENCH, topo, libs, "python", **kw)  # type: ignore[arg-type]


def core_of(topo: Topology) -> dict[int, tuple[int, int]]:
    return {c.cpu: (c.socket, c.core) for c in topo.cpus}


def assert_well_placed(plan: LaunchPlan, topo: Topology) -> None:
    cores = core_of(topo)
    per_instance = [{cores[c] for c in inst.cpus} for inst in plan.instances]
    for a, b in combinations(plan.instances, 2):
        assert not set(a.cpus) & set(b.cpus), "instances share a logical CPU"
    for a, b in combinations(per_instance, 2):
        assert not a & b, "instances share a physical core"
    for inst, used in zip(plan.instances, per_instance, strict=False):
        assert len(used) == len(inst.cpus), "one logical CPU per physical core"
        assert set(inst.cpus) <= topo.allowed
        assert inst.env["OMP_NUM_THREADS"] == str(len(inst.cpus))


def assert_env_matches_runtime(plan: LaunchPlan) -> None:
    runtime = plan.config.get("omp_runtime")
    for inst in plan.instances:
        preload = inst.env.get("LD_PRELOAD", "")
        assert ("libiomp5" in preload) == (runtime == "intel")
        assert ("libomp.so" in preload) == (runtime == "llvm")
        if runtime != "intel":
            assert not [k for k in inst.env if k.startswith("KMP_")]
        else:
            assert not [k for k in inst.env if k.startswith(("OMP_PROC_BIND", "OMP_PLACES"))]


@pytest.mark.parametrize("machine", ["xeon_2s_ht", "amd_1s_smt", "cloud_vm_gaps"])
@pytest.mark.parametrize("instances", [1, 2, 4])
@pytest.mark.parametrize(
    "runtime",
    [["omp_runtime=gnu", "omp_proc_bind=close"], ["omp_runtime=intel", "kmp_affinity=compact",
                                                  "kmp_blocktime=1"], ["omp_runtime=llvm"]],
)
def test_instances_get_disjoint_whole_cores(machine: str, instances: int, runtime: list[str],
                                            fake_libs: Libraries) -> None:
    topo = lscpu(machine)
    plan = make([f"instances={instances}", *runtime], topo, fake_libs)
    assert len(plan.instances) == instances
    assert_well_placed(plan, topo)
    assert_env_matches_runtime(plan)


def test_xeon_instances_stay_inside_one_numa_node(fake_libs: Libraries) -> None:
    topo = lscpu("xeon_2s_ht")
    plan = make(["instances=4", "omp_threads=2"], topo, fake_libs)
    assert [i.numa_node for i in plan.instances] == [0, 0, 1, 1]
    assert [i.cpus for i in plan.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert plan.instances[2].command[:3] == ("/usr/bin/numactl", "--physcpubind=4-5", "--membind=1")


def test_xeon_instance_larger_than_a_node_spans_and_binds_memory_to_both(fake_libs: Libraries) -> None:
    topo = lscpu("xeon_2s_ht")
    plan = make(["instances=1", "omp_threads=6"], topo, fake_libs)
    inst = plan.instances[0]
    assert inst.numa_node is None
    assert inst.command[:3] == ("/usr/bin/numactl", "--physcpubind=0-5", "--membind=0,1")


def test_xeon_three_instances_of_three_cores_fit_nodes_first(fake_libs: Libraries) -> None:
    topo = lscpu("xeon_2s_ht")
    plan = make(["instances=2", "omp_threads=3"], topo, fake_libs)
    assert [i.numa_node for i in plan.instances] == [0, 1]


def test_container_with_restricted_cpus_uses_only_allowed_ones(fake_libs: Libraries) -> None:
    full = lscpu("xeon_2s_ht")
    topo = Topology(full.cpus, frozenset({2, 3, 10, 11, 4, 5, 6}))
    plan = make(["instances=5"], topo, fake_libs)
    assert_well_placed(plan, topo)
    assert sorted(c for i in plan.instances for c in i.cpus) == [2, 3, 4, 5, 6]
    with pytest.raises(TopologyError, match=r"above the 5 usable physical cores \(CPUs 2-6,10-11\)"):
        make(["instances=6"], topo, fake_libs)


def test_threads_times_instances_above_cores_is_refused(fake_libs: Libraries) -> None:
    topo = lscpu("amd_1s_smt")
    with pytest.raises(TopologyError) as info:
        make(["instances=3", "omp_threads=3"], topo, fake_libs)
    assert str(info.value) == ("omp_threads=3 x instances=3 = 9 threads is above the 8 usable physical "
                               "cores (CPUs 0-15); lower omp_threads or instances")
    with pytest.raises(TopologyError, match="omp_threads=9 x instances=1"):
        make(["omp_threads=9"], topo, fake_libs)


def test_defaults_change_nothing(fake_libs: Libraries) -> None:
    plan = make([], lscpu("amd_1s_smt"), fake_libs, parent_env={"OMP_NUM_THREADS": "4", "HOME": "/r"})
    assert plan.binding == "none"
    (inst,) = plan.instances
    assert inst.env == {}
    assert inst.command[:3] == ("python", "-m", "autotune.child.worker")
    assert plan.cleared == ("OMP_NUM_THREADS",)


def test_allocators_preload_with_their_tuning(fake_libs: Libraries) -> None:
    topo = lscpu("amd_1s_smt")
    jemalloc = make(["allocator=jemalloc", "omp_runtime=intel"], topo, fake_libs).instances[0].env
    assert jemalloc["LD_PRELOAD"] == "/opt/env/lib/libiomp5.so:/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert jemalloc["MALLOC_CONF"] == JEMALLOC_CONF
    tcmalloc = make(["allocator=tcmalloc"], topo, fake_libs).instances[0].env
    assert tcmalloc["LD_PRELOAD"].endswith("libtcmalloc_minimal.so.4")
    assert "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" in tcmalloc
    assert "MALLOC_CONF" not in tcmalloc


@pytest.mark.parametrize(("shapes", "lengths", "capacity"), [
    ("dynamic", (32, 128, 384), "6144"),  # 16 primitives for each length up to 384
    ("dynamic", (8, 16), "1024"),  # never below oneDNN's own default
    ("buckets", (32, 128, 384), None),  # one shape per compiled model: the default holds them
])
def test_a_model_that_runs_every_length_gets_a_primitive_cache_for_them(
        shapes: str, lengths: tuple[int, ...], capacity: str | None, fake_libs: Libraries) -> None:
    bench = BenchSpec(model="hf:bert", item_shape=(lengths[-1],), seq_lens=lengths,
                      seq_len_weights=tuple(1 / len(lengths) for _ in lengths))
    plan = plan_launch(Config.from_assignments(["backend=inductor", f"shapes={shapes}", "omp_threads=2"]), bench,
                       lscpu("amd_1s_smt"), fake_libs, "python")
    assert plan.instances[0].env.get(PRIMITIVE_CACHE_VAR) == capacity


def test_missing_library_names_the_package(fake_libs: Libraries) -> None:
    libs = Libraries(paths={**fake_libs.paths, "jemalloc": None})
    with pytest.raises(LibraryMissing) as info:
        make(["allocator=jemalloc"], lscpu("amd_1s_smt"), libs)
    assert str(info.value) == ("allocator=jemalloc needs jemalloc, which is not installed; install it "
                               "with `apt-get install libjemalloc2` or pick another value")


def test_binding_falls_back_to_taskset_then_affinity(fake_libs: Libraries) -> None:
    topo = lscpu("amd_1s_smt")
    no_numa = Libraries(paths=fake_libs.paths, numactl=fake_libs.numactl, numactl_usable=False,
                        taskset=fake_libs.taskset)
    plan = make(["instances=2"], topo, no_numa)
    assert plan.binding == "taskset"
    assert plan.instances[1].command[:3] == ("/usr/bin/taskset", "-c", "4-7")
    bare = make(["instances=2"], topo, Libraries(paths=fake_libs.paths))
    assert bare.binding == "sched_setaffinity"
    assert bare.instances[0].command[0] == "python"


def test_omp_places_only_when_binding_threads(fake_libs: Libraries) -> None:
    topo = lscpu("amd_1s_smt")
    assert make(["omp_proc_bind=false"], topo, fake_libs).instances[0].env == {"OMP_PROC_BIND": "false"}
    env = make(["omp_proc_bind=spread"], topo, fake_libs).instances[0].env
    assert env == {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}


def test_child_environment_is_allow_listed() -> None:
    parent = {"PATH": "/bin", "LC_ALL": "C", "OMP_NUM_THREADS": "8", "LD_PRELOAD": "/x.so",
              "SECRET_TOKEN": "s", "PYTHONPATH": "/src"}
    env = child_environment(parent, {"OMP_NUM_THREADS": "2"})
    assert env == {"PATH": "/bin", "LC_ALL": "C", "PYTHONPATH": "/src", "OMP_NUM_THREADS": "2"}


def test_plan_json_has_what_users_script_against(fake_libs: Libraries) -> None:
    data = make(["instances=2"], lscpu("amd_1s_smt"), fake_libs).to_json()
    inst = data["instances"][0]  # type: ignore[index]
    assert set(inst) == {"index", "cpus", "numa_node", "env", "command"}
    assert inst["cpus"] == [0, 1, 2, 3]
    assert inst["numa_node"] == 0


@pytest.mark.parametrize("runtime", [["backend=openvino", "ov_hint=throughput", "ov_streams=2"],
                                     ["backend=onnxruntime", "ort_execution=parallel", "ort_inter_threads=2"]])
def test_a_peer_backend_sets_the_threads_and_no_openmp_runtime_and_its_knobs_reach_the_child(
        fake_libs: Libraries, runtime: list[str]) -> None:
    """OpenVINO and ONNX Runtime take their threads from omp_threads; the OpenMP knobs do not apply."""
    plan = make([*runtime, "omp_threads=3", "instances=2"], lscpu("xeon_2s_ht"), fake_libs)
    assert_well_placed(plan, lscpu("xeon_2s_ht"))
    for inst in plan.instances:
        assert inst.env == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
        flags = dict(zip(inst.command, inst.command[1:], strict=False))
        assert all(flags[f"--{name.replace('_', '-')}"] == value
                   for name, _, value in (pair.partition("=") for pair in runtime))


def test_the_instruction_set_limits_autotune_runs_under_reach_every_child(fake_libs: Libraries) -> None:
    """`ONEDNN_MAX_CPU_ISA=AVX2 autotune search` is another machine (host class, probe, artifact keys):
    its children and its export run under the same limits, which are no setting to clear."""
    parent = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "4"}
    plan = make(["instances=2"], lscpu("amd_1s_smt"), fake_libs, parent_env=parent)
    assert all(i.env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and i.env["ATEN_CPU_CAPABILITY"] == "avx2" for i in plan.instances)
    assert plan.cleared == ("OMP_NUM_THREADS",)
    assert "ONEDNN_MAX_CPU_ISA" not in make([], lscpu("amd_1s_smt"), fake_libs, parent_env={}).instances[0].env
