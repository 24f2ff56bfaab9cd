"""A hardware-catalog device file for the machine a sweep ran on, from its roofline probes.

Kernel models are fitted against a :class:`~trainsim.hardware.schema.DeviceSpec` (its peaks
give the roofline features). A CPU, or a GPU missing from the catalog, has none; the roofline
suite measures one: best FLOP/s per dtype and best memory bandwidth (002 §4.3.2.1 takes "the
maximum measured bandwidth of the benchmark as the corrected peak bandwidth") of the probes
well beyond the last-level cache (:func:`last_level_cache_bytes`;
:func:`~trainsim.bench.suites.roofline.roofline_peaks`). Measured peaks are below datasheet
peaks; the file says so, and which probes gave the bandwidth, in its ``sources``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError

_PRECISION = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
# Where the OS does not say: large enough that a probe beyond it is beyond most CPUs' L3
# (server parts with more are read from sysfs), so the guess errs towards "maybe cache".
DEFAULT_CACHE_BYTES = 64 * 2**20
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)


def _as_memory_gb(usable_bytes: float) -> float:
    """``memory_GB`` as the catalog means it (marketed GiB, of which
    :attr:`~trainsim.hardware.schema.DeviceSpec.memory_bytes` keeps the usable fraction), so that
    a measured device's ``memory_bytes`` is what was measured."""
    from trainsim.hardware.schema import USABLE_FRACTION

    return round(usable_bytes / 2**30 / USABLE_FRACTION, 2)


def _memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return _as_memory_gb(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return _as_memory_gb(pages * size)


def last_level_cache_bytes(kind: str = "cpu", *, sysfs: Path = Path("/sys/devices/system/cpu")) -> tuple[int, str]:  # fmt: skip
    """(bytes, where from) of the last-level cache a bandwidth probe must outgrow: on a CPU the
    highest cache level in sysfs summed over its distinct instances (threads may spread over
    several L3 slices), else glibc's ``SC_LEVEL3_CACHE_SIZE``, else :data:`DEFAULT_CACHE_BYTES`;
    on CUDA, GPU 0's L2."""
    if kind == "cuda":
        try:
            import torch

            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
        except (ImportError, RuntimeError, AssertionError):  # no CUDA here: rows of another machine
            l2 = 0
        return (l2, "the GPU's L2") if l2 > 0 else (DEFAULT_CACHE_BYTES, "assumed (the GPU does not say)")
    got = _sysfs_llc(sysfs)
    if got is not None:
        return got[0], f"{sysfs} (level-{got[1]} caches)"
    try:
        l3 = int(os.sysconf("SC_LEVEL3_CACHE_SIZE"))
    except (ValueError, OSError, AttributeError):
        l3 = 0
    if l3 > 0:
        return l3, "sysconf SC_LEVEL3_CACHE_SIZE"
    return DEFAULT_CACHE_BYTES, "assumed (the OS does not say)"


def _sysfs_caches(sysfs: Path) -> dict[tuple[int, str], int]:
    """{(level, CPUs sharing it): bytes} of every data or unified cache of every CPU."""
    out: dict[tuple[int, str], int] = {}
    for d in sysfs.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (d / "type").read_text(encoding="utf-8").strip() == "Instruction":
                continue
            level = int((d / "level").read_text(encoding="utf-8"))
            shared = (d / "shared_cpu_list").read_text(encoding="utf-8").strip() if (d / "shared_cpu_list").exists() else str(d.parent.parent.name)
            m = _SIZE.match((d / "size").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if m:
            out[(level, shared)] = int(m[1]) * 1024 ** " KMG".index(m[2].upper() or " ")
    return out


def _sysfs_llc(sysfs: Path) -> tuple[int, int] | None:
    """(bytes, level) of the highest cache level, summed over its distinct instances."""
    caches = _sysfs_caches(sysfs)
    if not caches:
        return None
    top = max(lvl for lvl, _ in caches)
    total = sum(b for (lvl, _), b in caches.items() if lvl == top)
    return (total, top) if total else None


def measured_device(rows: Iterable[Mapping[str, Any]], *, fingerprint: str, cache_bytes: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The device document (catalog schema) measured by the roofline rows of ``fingerprint``
    (``cache_bytes``: the last-level cache the bandwidth probes must outgrow; None: this
    machine's, see :func:`~trainsim.bench.suites.roofline.roofline_peaks`)."""
    from trainsim.bench.suites.roofline import CACHE_FACTOR, roofline_peaks
    from trainsim.hardware.schema import DeviceSpec

    mine = [r for r in rows if r.get("fingerprint") == fingerprint]
    peaks = roofline_peaks(mine, cache_bytes=cache_bytes)
    if "fp32" not in peaks["flops_per_s"] or not peaks["bandwidth_Bps"]:
        raise ConfigError(
            "no fp32 peak_mm and bandwidth probe rows for this machine; run `trainsim bench roofline` first"
        )
    name = peaks["device"]
    kind = next((r.get("device_kind") for r in mine if r.get("device_kind")), "cpu")
    tflops = {
        _PRECISION[d]: round(v / 1e12, 4)
        for d, v in peaks["flops_per_s"].items()
        if d in _PRECISION
    }
    doc = {
        "schema_version": 1,
        "name": f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{fingerprint[:8]}",
        "aliases": [name], "vendor": _vendor(name), "architecture": platform.machine() if kind == "cpu" else _gpu_architecture(),
        "memory_GB": _memory_gb() if kind == "cpu" else _gpu_memory_gb(),
        "memory_bandwidth_GBps": round(peaks["bandwidth_Bps"] / 1e9, 2), "peak_tflops": tflops,
        **({"vector_bits": v} if kind == "cpu" and (v := _vector_bits()) else {}),
        **(_gpu_layout() if kind == "cuda" else {}),
        "sources": [{"kind": "measurement",
                     "title": "trainsim bench roofline probes (best of peak_mm; best of the stream_* probes "
                              f"whose working set is at least {CACHE_FACTOR:g}x the last-level cache)",
                     "note": f"fingerprint {fingerprint}; {dt.date.today().isoformat()}; measured peaks, "
                             f"below datasheet peaks; {_bandwidth_note(peaks['bandwidth_probes'])}"}],
    }  # fmt: skip
    DeviceSpec.model_validate(doc)  # the catalog must accept it
    return doc


def _bandwidth_note(b: Mapping[str, Any]) -> str:
    """What the bandwidth came from, for the device file's note."""
    cache = f"{b['cache_bytes'] / 2**20:.0f} MiB last-level cache ({b['cache_source']})"
    if b["note"]:
        return f"memory bandwidth: {b['note']}; {cache}"
    return (f"memory bandwidth from {b['qualifying']} of {b['probes']} stream probes with working sets of at least "
            f"{b['min_working_set_bytes'] / 1e6:.0f} MB, beyond the {cache}")  # fmt: skip


def _gpu_architecture() -> str:
    import torch

    if getattr(torch.version, "hip", None):  # ROCm reports its own capability numbers (MI300X: 9.4)
        gfx = str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")).split(":")[0]
        return _amd_architecture(gfx)
    major, minor = torch.cuda.get_device_capability(0)
    names = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell"}
    return names.get(major, f"sm_{major}{minor}")


def _amd_architecture(gfx: str) -> str:
    """The catalog's name of an AMD GPU's architecture from its gfx target (gfx942: MI300X)."""
    names = {"gfx908": "cdna", "gfx90a": "cdna2", "gfx940": "cdna3", "gfx941": "cdna3", "gfx942": "cdna3",
             "gfx950": "cdna4"}  # fmt: skip
    return names.get(gfx, gfx or "amd-gpu")


def _vendor(name: str) -> str:
    low = name.lower()
    return next((v for v in ("intel", "amd", "nvidia", "arm", "apple") if v in low), "unknown")


def _vector_bits(cpuinfo: str | None = None) -> int | None:
    """The widest SIMD registers of this x86 CPU from ``/proc/cpuinfo``'s flags (oneDNN blocks
    channels by their width in elements); None where the flags are not there to read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None
    return 512 if "avx512f" in flags else 256 if "avx2" in flags or "avx" in flags else 128


def _gpu_layout() -> dict[str, Any]:
    """SM count and L2 size of GPU 0 (kernel models read ``sm_count``: waves, and no host path
    columns)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {"sm_count": int(props.multi_processor_count)}
    l2 = getattr(props, "L2_cache_size", None)
    if l2:
        out["l2_cache_MB"] = round(l2 / 1e6, 1)  # DeviceSpec.l2_cache_bytes reads MB as 1e6 B
    return out


def _gpu_memory_gb() -> float:
    import torch

    return _as_memory_gb(torch.cuda.get_device_properties(0).total_memory)


def write_device_yaml(doc: Mapping[str, Any], path: Path) -> Path:
    """Write ``doc`` as YAML atomically (temporary file, then rename)."""
    import yaml

    from trainsim.ir.serialize import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True))
    return path


__all__ = ["measured_device", "write_device_yaml"]
