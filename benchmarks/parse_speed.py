"""Parse speed and peak memory of ``trainsim.ingest.load_traces`` on real Kineto traces.

Measures, each in a fresh subprocess (so that one run's heap does not flatter the next):

* the largest shipped Kineto trace in ``../shared/data/traces`` (by uncompressed size), and
* a ≥ 200 MB trace made from it by repeating its recording: every copy's events are shifted
  past the previous copy and get fresh correlation, external, record-function and event ids
  (and step numbers), so the result is a valid, longer recording of the same job.

Throughput is uncompressed JSON bytes / wall time of ``load_traces``; peak memory is the
process's peak RSS minus its RSS just before the call (interpreter + imports), also given as a
multiple of the uncompressed size. Targets: ≥ 20 MB/s, ≤ 4× the uncompressed size.

    python benchmarks/parse_speed.py [--base TRACE] [--target-mb 200] [--profile]

Prints a markdown table (paste it into the README) and, with --profile, where the time goes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "data" / "traces"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_ID_KEYS = ("correlation", "External id", "Record function id", "Ev Idx")

_CHILD = r"""
import json, sys, time, cProfile, pstats, io
from trainsim.ingest import load_traces
path, profile = sys.argv[1], sys.argv[2] == "1"

def status_kib(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key))

# VmHWM, not ru_maxrss: ru_maxrss survives exec and starts at the parent's size.
def rss_kib():
    return status_kib("VmRSS:")

base = rss_kib()
prof = cProfile.Profile() if profile else None
t0, c0 = time.perf_counter(), time.process_time()
if prof: prof.enable()
lt = load_traces([path])
if prof: prof.disable()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
peak = status_kib("VmHWM:")
r = lt.workload.ranks[0]
out = {"wall_s": wall, "cpu_s": cpu, "base_kib": base, "peak_kib": peak, "steps": len(lt.steps[r.rank]),
       "kernels": len(r.kernels()), "step_s": lt.workload.measured_step_s}
if prof:
    s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
    out["profile"] = s.getvalue()
print(json.dumps(out))
"""


def uncompressed_size(path: Path) -> int:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
    return path.stat().st_size


def largest_kineto_trace() -> Path:
    candidates = [
        p
        for p in SHARED_TRACES.rglob("*.json.gz")
        if "_et" not in p.name and "chakra" not in str(p)
    ]
    return max((p for p in candidates if _is_kineto(p)), key=uncompressed_size)


def _is_kineto(path: Path) -> bool:
    with gzip.open(path) as f:
        return b'"traceEvents"' in f.read(1 << 16)


def _shift(e: dict, k: int, dt: float, id_span: dict[str, int], step_span: int) -> dict:
    e = dict(e)
    if isinstance(e.get("ts"), int | float):
        e["ts"] = e["ts"] + k * dt
    if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * id_span["correlation"]  # flow ids are correlation ids
    m = _STEP.match(str(e.get("name", "")))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_span}"
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in _ID_KEYS:
            if isinstance(args.get(key), int):
                args[key] = args[key] + k * id_span[key]
        e["args"] = args
    return e


def make_repeated_trace(base: Path, out: Path, target_bytes: int) -> int:
    """Write ``base`` repeated until ≥ target_bytes of JSON; returns the number of copies."""
    doc = json.loads(
        gzip.decompress(base.read_bytes()) if base.name.endswith(".gz") else base.read_bytes()
    )
    events = doc.pop("traceEvents")
    timed = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    dt = (t1 - t0) + 1000.0
    id_span = {
        key: 1
        + max(
            (
                e["args"][key]
                for e in events
                if isinstance(e.get("args"), dict) and isinstance(e["args"].get(key), int)
            ),
            default=0,
        )
        for key in _ID_KEYS
    }
    steps = [int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    step_span = (max(steps) + 1) if steps else 0
    per_copy = len(msgspec.json.encode(events))
    copies = max(1, -(-target_bytes // per_copy))
    enc = msgspec.json.Encoder()
    with out.open("wb") as f:
        header = enc.encode(doc)
        f.write(header[:-1] + (b',"traceEvents":[' if len(header) > 2 else b'{"traceEvents":['))
        first = True
        for k in range(copies):
            for e in events:
                if e.get("ph") == "M" and k > 0:
                    continue  # process/thread names once
                f.write((b"" if first else b",") + enc.encode(_shift(e, k, dt, id_span, step_span)))
                first = False
        f.write(b"]}")
    return copies


def measure(path: Path, *, profile: bool = False) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), "1" if profile else "0"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best_of(path: Path, repeat: int, *, profile: bool) -> dict:
    """Fastest of ``repeat`` fresh runs (other load on the machine only slows runs down); the
    largest peak memory of them (memory does not benefit from luck)."""
    runs = [measure(path, profile=profile) for _ in range(repeat)]
    best = min(runs, key=lambda m: m["wall_s"])
    best["peak_kib"] = max(m["peak_kib"] - m["base_kib"] for m in runs) + best["base_kib"]
    return best


def row(label: str, path: Path, size: int, m: dict) -> str:
    mb = size / 1e6
    rss_mb = (m["peak_kib"] - m["base_kib"]) * 1024 / 1e6
    return (
        f"| {label} | {path.stat().st_size / 1e6:.1f} | {mb:.1f} | {m['steps']} | {m['wall_s']:.2f} "
        f"| {mb / m['wall_s']:.1f} | {mb / m['cpu_s']:.1f} | {rss_mb:.0f} | {rss_mb / mb:.2f}× |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--base", type=Path, help="trace to measure and repeat (default: largest shipped)"
    )
    ap.add_argument("--target-mb", type=float, default=200.0)
    ap.add_argument("--repeat", type=int, default=3, help="fresh runs per input; best is shown")
    ap.add_argument("--profile", action="store_true", help="print the top functions by own time")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()
    base = args.base or largest_kineto_trace()
    big = args.workdir / f"trainsim_repeated_{base.name.removesuffix('.gz')}"
    copies = make_repeated_trace(base, big, int(args.target_mb * 1e6))
    big_gz = big.with_name(big.name + ".gz")
    with big.open("rb") as src, gzip.open(big_gz, "wb", compresslevel=1) as dst:
        while chunk := src.read(1 << 24):
            dst.write(chunk)
    cases = [
        (
            f"`{base.relative_to(SHARED_TRACES.parent.parent) if base.is_relative_to(SHARED_TRACES) else base}`",
            base,
        ),
        (f"same, repeated ×{copies} (.json)", big),
        (f"same, repeated ×{copies} (.json.gz)", big_gz),
    ]
    print(
        "| trace | file MB | JSON MB | steps | load s (wall) | MB/s (wall) | MB/s (CPU) | peak RSS MB | RSS / JSON |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    profiles = []
    for label, path in cases:
        m = best_of(path, args.repeat, profile=args.profile)
        size = uncompressed_size(path)
        print(row(label, path, size, m), flush=True)
        if "profile" in m:
            profiles.append((label, m["profile"]))
    for label, text in profiles:
        print(f"\n### profile: {label}\n```\n{text}\n```")
    load1, _, _ = os.getloadavg()
    print(
        f"\n{os.cpu_count()} CPUs, load average {load1:.1f} during the run; Python {sys.version.split()[0]}"
    )


if __name__ == "__main__":
    main()
