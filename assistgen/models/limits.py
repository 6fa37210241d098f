"""The CPUs and memory this process may use: the machine's, less what its container (its cgroup) limits.

A container, a Hugging Face Space among them, sees the host's cores and memory (`os.sched_getaffinity`,
`SC_PHYS_PAGES`) while its cgroup gives it far fewer: 2 CPUs of a 64-core host. The cgroup's limits are read from
cgroup v2 (`cpu.max`, `memory.max`) and v1 (`cpu.cfs_quota_us` over `cpu.cfs_period_us`, `memory.limit_in_bytes`),
in the process's own cgroup and each of its ancestors, the tightest winning. A file that is missing or unreadable,
or says "max" (v2) or -1 (v1), sets no limit.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

PROC = Path("/proc")             # where /proc/self/cgroup names the process's cgroups
CGROUP = Path("/sys/fs/cgroup")  # where the cgroup hierarchies are mounted

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")   # what torch itself reads for its thread count


def affinity_cpus() -> int:
    """The CPUs the scheduler lets this process run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def usable_cpus(proc: str | Path | None = None, cgroup: str | Path | None = None) -> int:
    """The CPUs affinity allows, at most the cgroup's CPU quota (rounded up: 1.5 CPUs is 2). `proc` and `cgroup`
    default to `PROC` and `CGROUP`."""
    limit = cpu_limit(proc or PROC, cgroup or CGROUP)
    return affinity_cpus() if limit is None else max(1, min(affinity_cpus(), limit))


def usable_memory_bytes(proc: str | Path | None = None, cgroup: str | Path | None = None) -> int:
    """The machine's physical memory, at most the cgroup's memory limit."""
    limit = memory_limit(proc or PROC, cgroup or CGROUP)
    return physical_memory_bytes() if limit is None else min(physical_memory_bytes(), limit)


def cpu_limit(proc: str | Path, cgroup: str | Path) -> int | None:
    """The tightest CPU quota set on this process's cgroups, in whole CPUs; None where none is."""
    proc, cgroup = Path(proc), Path(cgroup)
    quotas = [_v2_cpus(d) for d in _v2_dirs(proc, cgroup)] + [_v1_cpus(d) for d in _v1_dirs(proc, cgroup, "cpu")]
    return min((q for q in quotas if q is not None), default=None)


def memory_limit(proc: str | Path, cgroup: str | Path) -> int | None:
    """The tightest memory limit set on this process's cgroups, in bytes; None where none is. (v1's "unlimited" is a
    huge number, more than the machine has, so `usable_memory_bytes` ignores it.)"""
    proc, cgroup = Path(proc), Path(cgroup)
    limits = ([_number(d / "memory.max") for d in _v2_dirs(proc, cgroup)]
              + [_number(d / "memory.limit_in_bytes") for d in _v1_dirs(proc, cgroup, "memory")])
    return min((b for b in limits if b is not None), default=None)


def limit_threads_to_usable_cpus() -> int:
    """At start-up: no more torch threads than usable CPUs, unless $OMP_NUM_THREADS or $MKL_NUM_THREADS chose them.

    torch starts as many intra-op threads as affinity allows (or the physical cores among them), not what the cgroup
    allows: in a 2-CPU container on a 64-core host, 64 threads would share 2 CPUs' time. Only ever lowers the count,
    so a smaller one set before (the tests' one thread) stays. Returns the count now in force."""
    if not any(os.environ.get(name) for name in THREAD_ENV):
        cpus = usable_cpus()
        if torch.get_num_threads() > cpus:
            torch.set_num_threads(cpus)
    return torch.get_num_threads()


# --- reading the cgroup files ---------------------------------------------------------------------------------------
def _cgroups(proc: Path) -> list[tuple[list[str], str]]:
    """/proc/self/cgroup's lines as (controllers, path): "4:memory:/a/b" -> (["memory"], "/a/b"); v2's "0::/a" ->
    ([], "/a")."""
    entries = []
    for line in (_read(proc / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            entries.append(([c for c in parts[1].split(",") if c], parts[2]))
    return entries


def _upwards(root: Path, path: str) -> list[Path]:
    """The cgroup's directory under its mount, then each ancestor's up to the mount itself. In a container whose
    /proc/self/cgroup names the host's path, that path is missing under the mount and the mount (the container's own
    cgroup) is read instead."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_dirs(proc: Path, cgroup: Path) -> list[Path]:
    return [d for controllers, path in _cgroups(proc) if not controllers for d in _upwards(cgroup, path)]


def _v1_dirs(proc: Path, cgroup: Path, controller: str) -> list[Path]:
    """A v1 controller's directories, under its mount: /sys/fs/cgroup/cpu,cpuacct, or .../cpu (often a link to it)."""
    dirs = []
    for controllers, path in _cgroups(proc):
        if controller in controllers:
            for mount in dict.fromkeys([",".join(controllers), *controllers]):
                dirs += _upwards(cgroup / mount, path)
    return dirs


def _read(file: Path) -> str | None:
    try:
        return file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _number(file: Path) -> int | None:
    """A limit file's number; None for "max", -1 (or 0), or a file that is missing, unreadable or not a number."""
    try:
        value = int(_read(file) or "")
    except ValueError:
        return None
    return value if value > 0 else None


def _v2_cpus(directory: Path) -> int | None:
    """cpu.max: "200000 100000" (quota and period, in microseconds) is 2 CPUs; "max 100000" is no limit."""
    fields = (_read(directory / "cpu.max") or "").split()
    try:
        quota, period = int(fields[0]), (int(fields[1]) if len(fields) > 1 else 100_000)
    except (IndexError, ValueError):
        return None
    return math.ceil(quota / period) if quota > 0 and period > 0 else None


def _v1_cpus(directory: Path) -> int | None:
    quota, period = _number(directory / "cpu.cfs_quota_us"), _number(directory / "cpu.cfs_period_us")
    return math.ceil(quota / period) if quota and period else None
