"""Outputs into FIFOs and devices (``--timeline /dev/stdout``, a named pipe): written straight
into, not replaced by a temporary file (as root that turned ``/dev/null`` into a plain file and
chmod'ed it), and not read beforehand (the pre-flight check's read of a FIFO blocked forever)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainsim.ir.serialize import is_stream, write_text_atomic

PREDICT = ["predict", "gpt3-1.3b", "--system", "dgx-a100", "--gpus", "8", "--tp", "8", "--global-batch", "8"]


def _trainsim(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], check=False, capture_output=True, text=True, timeout=timeout)


def test_a_timeline_into_a_fifo_is_streamed_to_its_reader(tmp_path: Path):
    fifo = tmp_path / "timeline.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = _trainsim(*PREDICT, "--timeline", str(fifo))
    reader.join(30)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still the pipe, not a file put in its place
    assert got and b'"traceEvents"' in got[0] and b"trainsim" in got[0]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="mknod of a device needs root")
def test_a_device_output_stays_the_device_and_keeps_its_mode(tmp_path: Path):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null
    null.chmod(0o666)  # (mknod applies the umask)
    res = _trainsim(*PREDICT, "--timeline", str(null), "--format", "json")
    assert res.returncode == 0, res.stderr
    st = null.stat()
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    write_text_atomic(null, "{}")  # the writer itself
    assert stat.S_ISCHR(null.stat().st_mode)


def test_is_stream_tells_files_folders_and_nodes_apart(tmp_path: Path):
    f = tmp_path / "f.json"
    f.write_text("{}")
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    assert not is_stream(f) and not is_stream(tmp_path) and not is_stream(tmp_path / "absent")
    assert is_stream(fifo) and is_stream("/dev/null")


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="mknod of a device needs root")
def test_save_workload_into_a_device_does_not_replace_it(tmp_path: Path):
    """The old code's os.replace put a 3.3 MB plain file where the device node was (an empty
    head passes the artifact check): as root, ``--save-workload /dev/null`` replaced /dev/null."""
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    dlrm = Path(__file__).resolve().parents[1] / "examples" / "data" / "param_dlrm_8xv100"
    res = _trainsim("analyze", str(dlrm), "--save-workload", str(null), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert stat.S_ISCHR(null.stat().st_mode) and null.stat().st_size == 0
