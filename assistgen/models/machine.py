"""The machine a comparison ran on, as the page, the CLI and the JSON name it: its processor, the cores torch uses
(of those this process may use), and the device the models run on."""
from __future__ import annotations

import functools
import platform

import torch

from .devices import default_device
from .limits import usable_cpus


@functools.cache
def cpu_model() -> str:
    """The processor's marketing name (Linux's /proc/cpuinfo), else what the platform reports."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The vector extensions that move a CPU pass's cost (oneDNN's and fbgemm's kernels pick by them), as Linux names them
VECTOR_EXTENSIONS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


@functools.cache
def vector_extensions() -> tuple[str, ...]:
    """Which of `VECTOR_EXTENSIONS` this CPU has (Linux's /proc/cpuinfo flags); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return ()
    return tuple(name for name in VECTOR_EXTENSIONS if name in flags)


def machine(probe_s: dict[str, float] | None = None) -> dict:
    """The machine's facts; with the speed probes' seconds, their median plain target pass in milliseconds."""
    device = default_device()
    probes = sorted((probe_s or {}).values())
    return {"cpu": cpu_model(), "vector_extensions": list(vector_extensions()), "cores_used": torch.get_num_threads(),
            "cores": usable_cpus(),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "probe_ms_per_target_pass": round(probes[len(probes) // 2] * 1000, 1) if probes else None}


def machine_text(facts: dict) -> str:
    """One line: "AMD EPYC 9R14, 2 of 2 cores; a plain target pass took 372 ms in the speed probes"."""
    where = f"{facts['cpu']}, {facts['cores_used']} of {facts['cores']} cores"
    if facts["device"] != "cpu":
        where += f", models on {facts['device']}"
    probe = facts.get("probe_ms_per_target_pass")
    return where + (f"; a plain target pass took {probe:g} ms in the speed probes" if probe is not None else "")
