"""Edges between lanes that the IR does not state directly.

- **Thread edges** (fork/join). PyTorch runs backward on an autograd thread while the main
  thread blocks in ``backward()``, then the main thread runs the optimizer. Nothing in a Kineto
  trace names that hand-off, but its footprint is plain: an op on one thread starts after a gap
  on its own thread during which another thread was working. For every op X we take the op Y of
  another thread that ended last inside X's own-thread gap (the previous op's end → X's start)
  and require X to start after Y; the delay is the measured one in ``TRACE`` mode and X's T1
  otherwise. ``Op.deps`` across threads add edges with no delay.
- **Intra-rank synchronization** (000 §III-D, Alg. 1 lines 11–15): "successive communication
  kernels [...] should be launched at least after the first dependent kernel of the previous
  communication kernel [...] we set the communication stream time front to the same value as
  the launch time of the first dependent kernel." For consecutive collectives C, C' of one
  stream, the first kernel issued before C' on another stream that waits (event or data) on C
  or a later kernel of C's stream before C' bounds C''s start. A rule the measurement
  contradicts (C' started before that dependent) is skipped and counted.
"""

from __future__ import annotations

import bisect
import itertools
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from trainsim.sim.syncs import TOLERANCE_S

if TYPE_CHECKING:
    from trainsim.sim.program import RankProgram


Preds = tuple[tuple[int, float | None], ...]


def thread_edges(rp: RankProgram, *, infer: bool) -> list[Preds]:
    """Per op, its cross-thread predecessors as (op index, measured delay after its end);
    the delay is None for ``Op.deps`` edges (no delay). Most ops have none: ``()``."""
    ops = rp.ops
    out: dict[int, list[tuple[int, float | None]]] = {}
    if any(map(attrgetter("deps"), ops)):
        index = {op.id: i for i, op in enumerate(ops)}
        for oi, op in enumerate(ops):
            for d in op.deps:
                di = index[d]
                if ops[di].thread != op.thread or di > oi:
                    out.setdefault(oi, []).append((di, None))
    if infer and len(rp.cpu_lanes) > 1:
        _fork_join(rp, out)
    preds: list[Preds] = [()] * len(ops)
    for oi, lst in out.items():
        preds[oi] = tuple(lst)
    return preds


def _fork_join(rp: RankProgram, out: dict[int, list[tuple[int, float | None]]]) -> None:
    """Vectorised over each lane's ops: the other-thread op that ended last in each gap."""
    ops = rp.ops
    lanes = []
    for lane in rp.cpu_lanes:
        timed = [
            oi for oi in lane if ops[oi].start_s is not None and ops[oi].duration_s is not None
        ]
        starts = np.array([ops[oi].start_s for oi in timed], dtype=float)
        ends = starts + np.array([ops[oi].duration_s for oi in timed], dtype=float)
        order = np.argsort(ends, kind="stable")
        lanes.append((np.array(timed, dtype=np.int64), starts, ends, order, ends[order]))
    for no, (idx, starts, ends, _, _) in enumerate(lanes):
        if idx.size == 0:
            continue
        lower = np.concatenate(([-np.inf], np.maximum.accumulate(ends)[:-1]))
        best_end = np.full(idx.size, -np.inf)
        best_op = np.full(idx.size, -1, dtype=np.int64)
        for other, (oidx, _, _, oorder, oends) in enumerate(lanes):
            if other == no or oidx.size == 0:
                continue
            j = np.searchsorted(oends, starts, side="right") - 1
            jj = np.maximum(j, 0)
            cand = np.where((j >= 0) & (oends[jj] >= lower), oends[jj], -np.inf)
            better = cand > best_end
            best_end = np.where(better, cand, best_end)
            best_op = np.where(better, oidx[oorder[jj]], best_op)
        found = np.flatnonzero(best_op >= 0)
        for i in found.tolist():
            out.setdefault(int(idx[i]), []).append(
                (int(best_op[i]), float(starts[i] - best_end[i]))
            )
        rp.diagnostics["thread_edges"] += int(found.size)


def intra_rank_rule(rp: RankProgram, keys: list[float]) -> None:
    """Add 000 §III-D's bound to every collective that follows another on its stream."""
    pos = [0] * len(rp.kernels)
    colls_of_lane: dict[int, list[int]] = {}
    for lane, ks in enumerate(rp.stream_lanes):
        cs = []
        for p, k in enumerate(ks):
            pos[k] = p
            if rp.kernels[k].collective is not None:
                cs.append(k)
        if len(cs) > 1:
            colls_of_lane[lane] = cs
    if not colls_of_lane:
        return
    cover_pos = {lane: [pos[c] for c in cs] for lane, cs in colls_of_lane.items()}
    first_dep: dict[int, int] = {}  # collective kernel → its first dependent kernel
    for d, waits in enumerate(rp.k_waits):
        for w in waits:
            lane = rp.k_lane[w]
            if lane not in colls_of_lane or rp.k_lane[d] == lane:
                continue
            j = bisect.bisect_right(cover_pos[lane], pos[w]) - 1
            if j < 0:
                continue
            c = colls_of_lane[lane][j]
            cur = first_dep.get(c)
            if cur is None or keys[d] < keys[cur]:
                first_dep[c] = d
    for cs in colls_of_lane.values():
        for c, nxt in itertools.pairwise(cs):
            dep = first_dep.get(c)
            if dep is None or keys[dep] >= keys[nxt]:
                continue
            s_next, s_dep = rp.kernels[nxt].start_s, rp.kernels[dep].start_s
            if s_next is not None and s_dep is not None and s_next < s_dep - TOLERANCE_S:
                rp.diagnostics["intra_rank_rule_contradicted"] += 1
                continue
            rp.k_after[nxt] = (*rp.k_after[nxt], dep)
            rp.diagnostics["intra_rank_rules"] += 1
