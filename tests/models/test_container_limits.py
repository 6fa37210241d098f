"""A container sees the host's cores and memory while its cgroup gives it less: the app sizes its threads, its memory
budget and what it says of the hardware by the cgroup's limits, read from a fake /proc and /sys/fs/cgroup here."""
import pytest
import torch

from assistgen.models import devices, limits, machine, pool

GB = 2**30
PAGE = 4096


@pytest.fixture
def host(monkeypatch, tmp_path):
    """A 64-core, 256 GB machine whose /proc and /sys/fs/cgroup are empty folders under tmp_path; yields a function
    that writes files there: put("proc/self/cgroup", "0::/\\n")."""
    sysconf = {"SC_PAGE_SIZE": PAGE, "SC_PHYS_PAGES": 256 * GB // PAGE}
    monkeypatch.setattr(limits.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(limits.os, "sysconf", lambda name: sysconf[name])
    monkeypatch.setattr(limits, "PROC", tmp_path / "proc")
    monkeypatch.setattr(limits, "CGROUP", tmp_path / "cgroup")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ASSISTGEN_MEMORY_BUDGET_GB"):
        monkeypatch.delenv(name, raising=False)

    def put(path: str, text: str) -> None:
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    return put


def v2_container(put, cpu_max: str = "200000 100000", memory_max: str = str(16 * GB)) -> None:
    """A cgroup v2 container: 2 CPUs and 16 GB unless told otherwise."""
    put("proc/self/cgroup", "0::/kubepods/pod1/space\n")
    put("cgroup/kubepods/pod1/space/cpu.max", cpu_max + "\n")
    put("cgroup/kubepods/pod1/space/memory.max", memory_max + "\n")


@pytest.fixture
def torch_threads(monkeypatch):
    """torch's thread count, as a one-item list the fakes of get_num_threads and set_num_threads share: 64 to start."""
    threads = [64]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    return threads


def test_a_two_cpu_16_gb_container_on_a_big_host_is_treated_as_two_cpus_and_16_gb(host, torch_threads, monkeypatch):
    v2_container(host)
    cpu = torch.device("cpu")
    monkeypatch.setattr(pool, "default_device", lambda: cpu)
    monkeypatch.setattr(machine, "default_device", lambda: cpu)
    assert limits.usable_cpus() == 2
    assert limits.usable_memory_bytes() == 16 * GB
    assert limits.limit_threads_to_usable_cpus() == 2 and torch_threads == [2]
    assert pool.budget_from_env() <= 16 * GB - pool.CPU_HEADROOM_GB * GB
    assert pool.budget_from_env() == pool.DEFAULT_BUDGET_GB * GB == 14 * GB   # a 16 GB Space keeps its 14 GB
    assert devices.hardware(cpu) == "CPU, 2 cores, 16 GB"
    assert devices.hardware_key(cpu) == "cpu-2-cores"
    assert machine.machine()["cores"] == 2


def test_a_small_container_lowers_the_memory_budget_and_the_environment_still_overrides_it(host, monkeypatch):
    v2_container(host, memory_max=str(8 * GB))
    monkeypatch.setattr(pool, "default_device", lambda: torch.device("cpu"))
    assert pool.budget_from_env() == 8 * GB - pool.CPU_HEADROOM_GB * GB
    monkeypatch.setenv("ASSISTGEN_MEMORY_BUDGET_GB", "20")
    assert pool.budget_from_env() == 20 * GB


def test_threads_set_by_the_environment_or_already_fewer_are_left_alone(host, torch_threads, monkeypatch):
    v2_container(host)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert limits.limit_threads_to_usable_cpus() == 64
    monkeypatch.delenv("OMP_NUM_THREADS")
    torch_threads[0] = 1
    assert limits.limit_threads_to_usable_cpus() == 1   # only ever lowered


def test_without_limit_files_the_machine_is_what_counts(host):
    host("proc/self/cgroup", "0::/kubepods/pod1/space\n")
    assert limits.usable_cpus() == 64 and limits.usable_memory_bytes() == 256 * GB


def test_without_a_proc_cgroup_file_the_machine_is_what_counts(host):
    host("cgroup/cpu.max", "100000 100000\n")   # a limit, but nothing says this process is under it
    assert limits.cpu_limit(limits.PROC, limits.CGROUP) is None
    assert limits.usable_cpus() == 64 and limits.usable_memory_bytes() == 256 * GB


def test_max_means_no_limit(host):
    v2_container(host, cpu_max="max 100000", memory_max="max")
    assert limits.usable_cpus() == 64 and limits.usable_memory_bytes() == 256 * GB


@pytest.mark.parametrize("garbage", ["", "lots", "200000 0", "-5 100000", "\x00\x01"])
def test_a_limit_that_cannot_be_read_as_one_is_no_limit(host, garbage):
    v2_container(host, cpu_max=garbage, memory_max=garbage)
    assert limits.usable_cpus() == 64 and limits.usable_memory_bytes() == 256 * GB


def test_an_unreadable_limit_file_is_no_limit(host, tmp_path):
    host("proc/self/cgroup", "0::/space\n")
    (tmp_path / "cgroup/space/cpu.max").mkdir(parents=True)            # reading it fails (IsADirectoryError)
    (tmp_path / "cgroup/space/memory.max").write_bytes(b"\xff\xfe16")   # not text (UnicodeDecodeError)
    assert limits.usable_cpus() == 64 and limits.usable_memory_bytes() == 256 * GB


def test_a_fraction_of_a_cpu_counts_as_a_whole_one(host):
    v2_container(host, cpu_max="150000 100000")
    assert limits.usable_cpus() == 2
    v2_container(host, cpu_max="50000 100000")
    assert limits.usable_cpus() == 1


def test_an_ancestors_tighter_limit_wins(host):
    v2_container(host)                                  # the container itself: 2 CPUs, 16 GB
    host("cgroup/kubepods/cpu.max", "100000 100000")    # its pod's parent: 1 CPU, 4 GB
    host("cgroup/kubepods/memory.max", str(4 * GB))
    host("cgroup/kubepods/pod1/memory.max", "max")
    assert limits.usable_cpus() == 1 and limits.usable_memory_bytes() == 4 * GB


def test_the_cgroups_own_tighter_limit_wins_over_its_ancestors(host):
    v2_container(host)
    host("cgroup/kubepods/cpu.max", "800000 100000")
    host("cgroup/kubepods/memory.max", str(64 * GB))
    assert limits.usable_cpus() == 2 and limits.usable_memory_bytes() == 16 * GB


def test_a_host_path_missing_under_the_mount_reads_the_mounts_own_limits(host):
    """Without a cgroup namespace, /proc/self/cgroup names the host's path while /sys/fs/cgroup is the container's
    own cgroup: the limits at the mount's root count."""
    host("proc/self/cgroup", "0::/system.slice/docker-abc.scope\n")
    host("cgroup/cpu.max", "200000 100000")
    host("cgroup/memory.max", str(16 * GB))
    assert limits.usable_cpus() == 2 and limits.usable_memory_bytes() == 16 * GB


def v1_container(put, quota: str = "200000", limit: str = str(16 * GB)) -> None:
    """A cgroup v1 container: 2 CPUs (cpu,cpuacct mounted together) and 16 GB unless told otherwise."""
    put("proc/self/cgroup", "12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    put("cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", quota + "\n")
    put("cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    put("cgroup/memory/docker/abc/memory.limit_in_bytes", limit + "\n")


def test_cgroup_v1_limits_count_too(host, torch_threads, monkeypatch):
    v1_container(host)
    assert limits.usable_cpus() == 2 and limits.usable_memory_bytes() == 16 * GB
    assert limits.limit_threads_to_usable_cpus() == 2
    assert devices.hardware(torch.device("cpu")) == "CPU, 2 cores, 16 GB"


def test_cgroup_v1_unlimited_is_no_limit(host):
    v1_container(host, quota="-1", limit="9223372036854771712")   # what v1 writes for "no limit"
    assert limits.usable_cpus() == 64 and limits.usable_memory_bytes() == 256 * GB


def test_cgroup_v1_ancestors_limit_wins(host):
    v1_container(host)
    host("cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "100000")
    host("cgroup/cpu,cpuacct/docker/cpu.cfs_period_us", "100000")
    host("cgroup/memory/memory.limit_in_bytes", str(2 * GB))
    assert limits.usable_cpus() == 1 and limits.usable_memory_bytes() == 2 * GB


def test_affinity_narrower_than_the_quota_wins(host, monkeypatch):
    v2_container(host, cpu_max="800000 100000")
    monkeypatch.setattr(limits.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert limits.usable_cpus() == 3


def test_cgroup_v1_read_through_a_controllers_own_mount_name(host):
    """Some systems mount v1's cpu controller as /sys/fs/cgroup/cpu (cpu,cpuacct a link to it, or absent)."""
    host("proc/self/cgroup", "3:cpu,cpuacct:/docker/abc\n")
    host("cgroup/cpu/docker/abc/cpu.cfs_quota_us", "300000")
    host("cgroup/cpu/docker/abc/cpu.cfs_period_us", "100000")
    assert limits.usable_cpus() == 3


def test_the_roots_can_be_passed_in(host, tmp_path):
    v2_container(host)
    assert limits.usable_cpus(str(tmp_path / "proc"), str(tmp_path / "cgroup")) == 2
    assert limits.usable_memory_bytes(tmp_path / "proc", tmp_path / "cgroup") == 16 * GB
    assert limits.usable_cpus(tmp_path / "nowhere", tmp_path / "cgroup") == 64
