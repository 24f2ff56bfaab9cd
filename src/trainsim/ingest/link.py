"""Link execution-trace nodes to Kineto CPU ops, and annotate the IR with what the ET knows.

Two linking methods, chosen by what the Kineto trace carries (docs/execution-traces.md):

``rf_id`` (PyTorch ≥ 2.1 profiles): Kineto CPU ops carry ``args["Record function id"]``, the
    same RecordFunction handle the ET writes as ``rf_id``: a per-process counter assigned at op
    start. A node links to the event with its ``rf_id`` when the names agree too. Used when
    the ET's ids overlap the profile's (both recorded at the same time).
``thread_order`` (older profiles, e.g. the PARAM DLRM traces, schema 1.0.1; and any ET
    recorded in a separate pass from the profile, as ``trainsim capture`` does): Kineto has no
    usable record-function id, and its ``External id`` is not a fixed offset of ``rf_id`` (measured on
    DLRM rank 0: +1 for forward ops, +232…234 on the autograd thread, −683 for optimizer ops).
    Within one thread, though, both tools record the ops in the order they started. Each ET
    thread (its nodes in ``rf_id`` order) is aligned to the Kineto thread whose op names
    overlap most (events in ``(ts, External id)`` order) by a longest-common-subsequence match
    on names (difflib); an aligned pair links when the tensor input shapes also agree wherever
    Kineto recorded ``Input Dims``. The ET sequence is repeated once, so that a one-iteration
    ET aligns with a Kineto window cut at another phase of the training loop; such links are
    structural (same op, same shapes, another iteration), which is all such a pair can give.

Link rate = linked ET operator nodes / ET operator nodes that have a Kineto event. Operator
nodes exclude the synthetic process/thread roots. A node *has a Kineto event* when the Kineto
capture covered it: for ``rf_id``, its rf_id lies within the range of record-function ids in
the Kineto trace (the profiler was recording when it started); for ``thread_order``, it lies
on a thread mapped to a Kineto thread, within the span from the first to the last aligned node
of that thread (outside that span the two captures do not overlap).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from trainsim.errors import TraceMismatchError
from trainsim.gcpause import gc_paused
from trainsim.ingest.execution_trace import (
    EtNode,
    EtTensor,
    ExecutionTrace,
    _tensor_list,
    data_dependencies,
    parse_execution_trace,
)
from trainsim.ingest.kineto import Event, KinetoTrace, rank_from_name
from trainsim.ingest.multirank import LoadedTraces
from trainsim.ingest.rank_builder import _tid_int
from trainsim.ir.graph import Op, RankGraph, Workload

# A pair whose pids differ must prove it belongs together: below this link rate it does not.
MIN_LINK_RATE_WITHOUT_PID = 0.5
_CUDA_DEVICE = re.compile(r"^cuda:(\d+)$")


class LinkMethod(StrEnum):
    RF_ID = "rf_id"
    THREAD_ORDER = "thread_order"


@dataclass(frozen=True, slots=True)
class LinkStats:
    """How well one ET linked to one Kineto trace (module docstring: definitions)."""

    et_ops: int  # ET operator nodes (synthetic roots excluded)
    with_kineto_event: int  # of those, the ones the Kineto capture covered
    linked: int  # of those, the ones linked to their Kineto event
    link_rate: float  # linked / with_kineto_event (0.0 when nothing was covered)
    method: LinkMethod
    pid_match: bool = True  # ET pid equals the Kineto process pid
    shape_mismatches: int = 0  # thread_order: name-aligned pairs rejected for tensor shapes

    def to_dict(self) -> dict[str, object]:
        """The JSON object of ``replay``/``analyze --format json`` (``et_link.<rank>``)."""
        return {"et_ops": self.et_ops, "with_kineto_event": self.with_kineto_event, "linked": self.linked,
                "link_rate": self.link_rate, "method": self.method.value, "pid_match": self.pid_match,
                "shape_mismatches": self.shape_mismatches}  # fmt: skip


@dataclass(frozen=True, slots=True)
class EtKinetoLink:
    """The result of linking: node id → Kineto CPU event, plus statistics."""

    et: ExecutionTrace
    kineto_source: str
    stats: LinkStats
    events: Mapping[int, Event]


def link_execution_trace(
    et: ExecutionTrace, trace: KinetoTrace, *, window: tuple[float, float] | None = None
) -> EtKinetoLink:
    """Link ``et`` to ``trace``'s CPU ops. ``window`` (raw Kineto time unit) restricts the
    ``thread_order`` alignment to one iteration when Kineto recorded several; ``rf_id`` links
    are exact and ignore it. Raises TraceMismatchError for a pair that does not belong together.
    """
    pids = {e.pid for e in trace.cpu}
    pid_match = et.pid is not None and et.pid in pids
    events = [e for e in trace.cpu if e.pid == et.pid] if pid_match else list(trace.cpu)
    rf_ids = [rf for e in events if (rf := _rf_id(e)) is not None]
    if rf_ids and _rf_ranges_overlap(et, min(rf_ids), max(rf_ids)):
        method = LinkMethod.RF_ID
        linked, covered, mismatches = _link_by_rf_id(et, events)
    else:
        method = LinkMethod.THREAD_ORDER
        if window is not None:
            lo, hi = window
            events = [e for e in events if lo <= float(e.ts) < hi]  # type: ignore[arg-type]
        linked, covered, mismatches = _link_by_thread_order(et, events)
    ops = et.ops
    stats = LinkStats(
        et_ops=len(ops), with_kineto_event=covered, linked=len(linked),
        link_rate=len(linked) / covered if covered else 0.0, method=method,
        pid_match=pid_match, shape_mismatches=mismatches,
    )  # fmt: skip
    if not pid_match:
        _check_belongs(et, trace, stats)
    return EtKinetoLink(et=et, kineto_source=trace.source, stats=stats, events=linked)


LOW_LINK_RATE = 0.9  # below this share of the covered ET ops linked, the dependencies are partial


def low_link_warnings(et_link: Mapping[Any, Mapping[str, Any]]) -> list[str]:
    """One line per rank whose ET linked under :data:`LOW_LINK_RATE` of the ops the Kineto
    window covers (``LinkStats.to_dict`` per rank)."""
    return [f"rank {rank}: only {100 * st.get('link_rate', 0.0):.0f} % of the {st.get('with_kineto_event', 0)} "
            "execution-trace ops its Kineto window covers were linked: tensor ids and data dependencies "
            "are known for those only (capture the ET and the Kineto trace of the same program and sizes)"
            for rank, st in sorted(et_link.items(), key=lambda kv: str(kv[0]))
            if st.get("with_kineto_event") and st.get("link_rate", 0.0) < LOW_LINK_RATE]  # fmt: skip


def pid_mismatch_warnings(et_link: Mapping[Any, Mapping[str, Any]]) -> list[str]:
    """One line per rank whose execution trace was accepted though its pid is not the Kineto
    trace's (``LinkStats.to_dict`` per rank): the link then rests on op order and shapes, which
    another run of the same program also satisfies."""
    out = []
    for rank, st in sorted(et_link.items(), key=lambda kv: str(kv[0])):
        if st.get("pid_match", True):
            continue
        out.append(f"rank {rank}: its execution trace's pid is not the Kineto trace's: linked by op order and shapes "
                   f"({st.get('linked', 0)} of {st.get('with_kineto_event', 0)} ops the Kineto window covers); "
                   "if the two are not one program at the same sizes, its tensor ids and dependencies are another run's")  # fmt: skip
    return out


def _check_belongs(et: ExecutionTrace, trace: KinetoTrace, stats: LinkStats) -> None:
    """Different pids: reject on evidence of a different process or a failed link."""
    et_gpus = {int(m.group(1)) for d in et.devices if (m := _CUDA_DEVICE.match(d))}
    kineto_gpus = {g.args.device for g in trace.gpu if g.args and g.args.device is not None}
    kineto_pids = sorted({str(e.pid) for e in trace.cpu})[:3]
    both = (
        f"execution trace {et.source} (pid {et.pid}) and Kineto trace {trace.source} "
        f"(pid {', '.join(kineto_pids)})"
    )
    if et_gpus and kineto_gpus and not et_gpus & kineto_gpus:
        raise TraceMismatchError(
            et.source,
            f"{both} come from different processes: ET tensors live on GPU "
            f"{sorted(et_gpus)}, Kineto kernels ran on GPU {sorted(kineto_gpus)}. Pass the ET "
            "recorded by the same rank (same pid) as the Kineto trace.",
        )
    if stats.link_rate < MIN_LINK_RATE_WITHOUT_PID:
        raise TraceMismatchError(
            et.source,
            f"{both} do not belong together: pids differ and only {stats.linked} of "
            f"{stats.with_kineto_event} ET ops link ({stats.link_rate:.0%}, method "
            f"{stats.method}). Pass the ET recorded by the same process as the Kineto trace.",
        )


def _rf_id(e: Event) -> int | None:
    """Kineto's record-function id; 0 means none (a profile taken without an ET observer
    writes 0 on every op: handles are only assigned when an observer asks for them)."""
    rf = e.args.rf_id if e.args is not None else None
    return rf if rf else None


def _rf_ranges_overlap(et: ExecutionTrace, lo: int, hi: int) -> bool:
    """Whether the ET was recorded while this profile ran (shared record-function ids). An ET
    recorded in a separate pass of the same process (``trainsim capture`` does that) has ids
    outside the profile's range: then only the structural alignment can link it."""
    return any(n.rf_id is not None and lo <= n.rf_id <= hi for n in et.ops)


def _link_by_rf_id(et: ExecutionTrace, events: list[Event]) -> tuple[dict[int, Event], int, int]:
    """(links, ET ops covered, 0): equal record-function id and equal name."""
    by_rf = {rf: e for e in events if (rf := _rf_id(e)) is not None}
    lo, hi = min(by_rf), max(by_rf)
    out: dict[int, Event] = {}
    covered = 0
    for n in et.ops:
        if n.rf_id is None or not lo <= n.rf_id <= hi:
            continue
        covered += 1
        e = by_rf.get(n.rf_id)
        if e is not None and e.name == n.name:
            out[n.id] = e
    return out, covered, 0


def _kineto_order(e: Event) -> tuple[float, int, float]:
    ext = e.args.external_id if e.args is not None and e.args.external_id is not None else 0
    return (float(e.ts), ext, -e.dur)  # type: ignore[arg-type]


def _link_by_thread_order(
    et: ExecutionTrace, events: list[Event]
) -> tuple[dict[int, Event], int, int]:
    """(links, ET ops covered, shape mismatches) by per-thread name alignment."""
    k_threads: dict[object, list[Event]] = defaultdict(list)
    for e in events:
        k_threads[(e.pid, e.tid)].append(e)
    for lst in k_threads.values():
        lst.sort(key=_kineto_order)
    e_threads: dict[int, list[EtNode]] = defaultdict(list)
    for n in et.ops:
        e_threads[n.tid].append(n)
    for nodes in e_threads.values():
        nodes.sort(key=lambda n: (n.rf_id if n.rf_id is not None else -1, n.id))
    out: dict[int, Event] = {}
    covered = mismatches = 0
    for etid, ktid in _map_threads(e_threads, k_threads):
        nodes, kevents = e_threads[etid], k_threads[ktid]
        # The ET is matched twice over: a one-iteration ET may start at another phase of the
        # loop than the Kineto window (linear: ET from zero_grad, window from a backward op).
        period = len(nodes)
        pairs = _aligned_pairs([n.name for n in nodes] * 2, [e.name for e in kevents])
        if not pairs:
            continue
        # the ET span the window covers: never more ops than the window has events (an ET of
        # three steps against a one-step window, one stray match far off, read as 3x coverage)
        covered += min(pairs[-1][0] - pairs[0][0] + 1, period, len(kevents))
        for a, b in pairs:
            node = nodes[a % period]
            if node.id in out:
                continue
            if _shapes_agree(node, kevents[b]):
                out[node.id] = kevents[b]
            else:
                mismatches += 1
    return out, covered, mismatches


def _aligned_pairs(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """The aligned index pairs of difflib's match of ``a`` and ``b``: exactly
    ``SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()``, one pair per matched
    element, computed faster.

    difflib's recursion is kept: the longest common block of the two ranges (ties: the one
    that starts first in ``a``, then in ``b``), then the same on each side of it. Only the
    longest-block search differs: the names are coded as characters, and it grows the best
    length with substring tests (``str``'s C search) instead of difflib's scan over every
    position pair with equal names, quadratic on traces whose op names repeat (linking the 8
    shipped DLRM ranks: 0.15 s of CPU time with difflib, 0.045 s in all now).
    """
    codes: dict[str, str] = {}
    code = codes.setdefault
    try:
        sa = "".join([code(x, chr(len(codes))) for x in a])
        sb = "".join([code(x, chr(len(codes))) for x in b])
    except ValueError:  # more distinct names than characters
        sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
        return [(m.a + i, m.b + i) for m in sm.get_matching_blocks() for i in range(m.size)]
    blocks: list[tuple[int, int, int]] = []
    queue = [(0, len(sa), 0, len(sb))]
    while queue:  # difflib's get_matching_blocks
        alo, ahi, blo, bhi = rng = queue.pop()
        i, j, k = _longest_block(sa, sb, rng)
        if k:
            blocks.append((i, j, k))
            if alo < i and blo < j:
                queue.append((alo, i, blo, j))
            if i + k < ahi and j + k < bhi:
                queue.append((i + k, ahi, j + k, bhi))
    blocks.sort()
    return [(i + x, j + x) for i, j, k in blocks for x in range(k)]


def _longest_block(sa: str, sb: str, rng: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """difflib's ``find_longest_match(alo, ahi, blo, bhi)`` (``rng``) without junk: the longest common
    substring of ``sa[alo:ahi]`` and ``sb[blo:bhi]`` as (i, j, size); of several that long, the
    one that starts first in ``sa``, then first in ``sb`` (difflib scans ``sa`` by the end of
    the match and keeps the first strictly longer one). (alo, blo, 0) when none."""
    alo, ahi, blo, bhi = rng
    hay = sa[alo:ahi]
    best = 0
    for j in range(blo, bhi):
        room = bhi - j  # the longest block that can start at j
        if room <= best:
            break
        if sb[j : j + best + 1] not in hay:
            continue
        # the longest prefix of sb[j:bhi] found in hay is > best: gallop, then bisect
        lo, step = best + 1, 1
        while lo + step <= room and sb[j : j + lo + step] in hay:
            lo += step
            step *= 2
        top = min(lo + step, room + 1)  # the shortest length known not to be found (or past room)
        while top - lo > 1:
            mid = (lo + top) // 2
            if sb[j : j + mid] in hay:
                lo = mid
            else:
                top = mid
        best = lo
    if not best:
        return alo, blo, 0
    first_i, first_j = len(hay), blo
    for j in range(blo, bhi - best + 1):
        at = hay.find(sb[j : j + best], 0, first_i + best - 1)  # only a start before first_i wins
        if at >= 0 and at < first_i:
            first_i, first_j = at, j
    return alo + first_i, first_j, best


def _map_threads(
    e_threads: Mapping[int, list[EtNode]], k_threads: Mapping[object, list[Event]]
) -> list[tuple[int, object]]:
    """One-to-one ET thread → Kineto thread, greatest op-name overlap first."""
    e_names = {t: Counter(n.name for n in nodes) for t, nodes in e_threads.items()}
    k_names = {t: Counter(e.name for e in evs) for t, evs in k_threads.items()}
    scored = sorted(
        (
            (sum((en & kn).values()), et_t, k_t)
            for et_t, en in e_names.items()
            for k_t, kn in k_names.items()
        ),
        key=lambda x: -x[0],
    )
    used_e: set[int] = set()
    used_k: set[object] = set()
    out = []
    for score, et_t, k_t in scored:
        if score and et_t not in used_e and k_t not in used_k:
            used_e.add(et_t)
            used_k.add(k_t)
            out.append((et_t, k_t))
    return out


def _shapes_agree(n: EtNode, e: Event) -> bool:
    """Tensor input shapes equal Kineto's ``Input Dims`` at the same positions (when present)."""
    dims = e.args.input_dims if e.args is not None else None
    if not isinstance(dims, list):
        return True
    for i, v in enumerate(n.inputs):
        if not isinstance(v, EtTensor) or v.tensor_id is None:
            continue  # Kineto writes [] for scalars and lists: nothing to compare
        if i >= len(dims) or not isinstance(dims[i], list) or tuple(dims[i]) != v.shape:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Annotating the IR.


def attach_execution_traces(loaded: LoadedTraces) -> tuple[Workload, dict[int, LinkStats]]:
    """Parse ``loaded.et_blobs``, match each ET to its rank, link it, and return the workload
    with ``et_id``, ET ``inputs``/``outputs`` (tensor ids) and data ``deps`` on every linked
    op, plus the link statistics per rank. Ranks without an ET are returned unchanged."""
    with gc_paused():  # ET nodes, tensors and annotated ops: many acyclic objects (gcpause.py)
        return _attach(loaded)


def _attach(loaded: LoadedTraces) -> tuple[Workload, dict[int, LinkStats]]:
    ets = [parse_execution_trace(b.name, b.data) for b in loaded.et_blobs]
    by_rank = _assign_ranks(ets, loaded.traces)
    stats: dict[int, LinkStats] = {}
    ranks: list[RankGraph] = []
    for rg in loaded.workload.ranks:
        et = by_rank.get(rg.rank)
        if et is None:
            ranks.append(rg)
            continue
        trace = loaded.traces[rg.rank]
        w = loaded.chosen.get(rg.rank)
        link = link_execution_trace(et, trace, window=(w.start, w.end) if w else None)
        stats[rg.rank] = link.stats
        ranks.append(_annotate(rg, link, trace, loaded.origin))
    return replace(loaded.workload, ranks=tuple(ranks)), stats


def _assign_ranks(
    ets: list[ExecutionTrace], traces: Mapping[int, KinetoTrace]
) -> dict[int, ExecutionTrace]:
    """Rank of each ET: the Kineto trace with its pid, else the rank number in its file name
    (``dlrm_eg_3.json``), else the only loaded rank."""
    rank_of_pid: dict[object, int] = {}
    for r, t in sorted(traces.items()):
        for pid in {e.pid for e in t.cpu}:
            rank_of_pid.setdefault(pid, r)
    out: dict[int, ExecutionTrace] = {}
    for et in ets:
        rank = rank_of_pid.get(et.pid) if et.pid is not None else None
        if rank is None:
            rank = rank_from_name(et.source)
        if rank is None and len(traces) == 1:
            rank = next(iter(traces))
        if rank is None:
            raise TraceMismatchError(
                et.source,
                f"cannot tell which rank this execution trace belongs to: its pid {et.pid} is "
                "in no Kineto trace and its file name has no rank number (e.g. rank3_et.json)",
            )
        if rank not in traces:
            raise TraceMismatchError(
                et.source,
                f"execution trace of rank {rank} has no Kineto trace (loaded ranks: "
                f"{sorted(traces)}); pass the Kineto trace of the same rank",
            )
        if rank in out:
            raise TraceMismatchError(
                et.source, f"two execution traces for rank {rank} (also {out[rank].source})"
            )
        out[rank] = et
    return out


def _annotate(rg: RankGraph, link: EtKinetoLink, trace: KinetoTrace, origin_s: float) -> RankGraph:
    """Set et_id, inputs/outputs and deps on the ops of one rank graph.

    An op's deps are the earlier ops owning the *last writer* (``data_dependencies``) of a
    tensor read anywhere in the op's ET subtree: read-after-write edges; older writers of the
    same tensor are ordered before the last one already.
    """
    et = link.et
    et_ids = _et_ids(rg.ops, link, trace, origin_s)
    subtrees = _subtrees(et, et_ids)
    owner: dict[int, int] = {}
    for i, nodes in enumerate(subtrees):
        for node_id in nodes:
            if node_id not in owner:
                owner[node_id] = i
    owner_of = owner.get
    deps_of = data_dependencies(et).get
    by_id = {n.id: n for n in et.nodes}
    ops: list[Op] = []
    for i, (op, nid) in enumerate(zip(rg.ops, et_ids, strict=True)):
        if nid is None:
            ops.append(op)
            continue
        earlier = {o for n in subtrees[i] for p in deps_of(n, ()) if (o := owner_of(p)) is not None and o < i}
        node = by_id[nid]
        ops.append(
            replace(
                op,
                et_id=nid,
                inputs=tuple([t.meta() for t in _tensor_list(node.inputs)]),
                outputs=tuple([t.meta() for t in _tensor_list(node.outputs)]),
                deps=tuple([rg.ops[j].id for j in sorted(earlier)]),
            )
        )
    s = link.stats
    meta = {
        **rg.metadata, "execution_trace": et.source, "et_link_method": s.method.value,
        "et_link_rate": s.link_rate, "et_ops_linked": sum(1 for x in et_ids if x is not None),
    }  # fmt: skip
    return replace(rg, ops=tuple(ops), metadata=meta)


def _et_ids(
    ops: tuple[Op, ...], link: EtKinetoLink, trace: KinetoTrace, origin_s: float
) -> list[int | None]:
    """The linked ET node of each IR op: by record-function id when the link used them, else by
    its Kineto event, keyed as RankBuilder made the op (name, thread, start to the ns)."""
    origin_raw, scale = origin_s / trace.unit_to_s, trace.unit_to_s
    by_rf: dict[int, int] = {}
    by_key: dict[tuple[str, int, int], int] = {}
    for node_id, e in link.events.items():
        rf = _rf_id(e)
        if rf is not None and link.stats.method is LinkMethod.RF_ID:
            by_rf[rf] = node_id
        start_s = (float(e.ts) - origin_raw) * scale  # type: ignore[arg-type]
        by_key[(e.name, _tid_int(e.tid), round(start_s * 1e9))] = node_id
    out: list[int | None] = []
    for op in ops:
        nid = by_rf.get(op.rf_id) if op.rf_id is not None else None
        if nid is None and op.start_s is not None:
            nid = by_key.get((op.name, op.thread, round(op.start_s * 1e9)))
        out.append(nid)
    return out


def _subtrees(et: ExecutionTrace, roots: list[int | None]) -> list[list[int]]:
    """For each root node id (None: no node), the ids of the node and all its descendants
    (breadth first)."""
    children: dict[int, list[int]] = defaultdict(list)
    for n in et.nodes:
        if n.parent != n.id:
            children[n.parent].append(n.id)
    kids = children.get
    out: list[list[int]] = []
    for root in roots:
        if root is None:
            out.append([])
            continue
        nodes = [root]
        for nid in nodes:  # grows as it is walked
            more = kids(nid)
            if more:
                nodes += more
        out.append(nodes)
    return out
