"""Decode PyTorch execution traces (ET) into typed, immutable nodes.

An execution trace (``torch.profiler.ExecutionTraceObserver``) records every operator a process
ran: its parent (nesting), record-function id, thread, schema, and the *identity* of every tensor
it read and wrote. That identity is what Kineto lacks and what data dependencies need.

Two layouts exist, chosen by the file's ``schema`` string through ``_PARSERS`` (the one table of
supported versions):

* ``1.0.1`` (PyTorch 2.0/2.1): flat node fields (``parent``, ``rf_id``, ``tid``, ``inputs``,
  ``input_shapes``, ``input_types``, ...).
* ``1.0.2-chakra.0.0.4`` … ``1.1.1-chakra.0.0.4`` (PyTorch 2.2+; torch 2.13 writes 1.1.1):
  ``ctrl_deps`` is the parent, ``inputs``/``outputs`` are ``{values, shapes, types[, strides]}``
  and the scalar fields live in an ``attrs`` list. From 1.1.0 on, ``record_param_comms`` nodes
  carry their collective metadata as attrs; before that it is positional in the inputs.

A tensor value is ``[tensor_id, storage_id, offset, numel, elem_bytes, device]`` with its dtype
in the type string (``Tensor(float)``) and its shape in the shapes list.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeAlias

import msgspec

from trainsim.errors import TraceFormatError, UnsupportedSchemaError
from trainsim.gcpause import gc_paused
from trainsim.ingest.collectives import dtype_bytes, kind_from_name
from trainsim.ingest.kineto import short_text
from trainsim.ingest.sources import too_large
from trainsim.ir.graph import TensorMeta
from trainsim.ir.kinds import CollectiveKind

EtScalar: TypeAlias = int | float | bool | str | None
EtValue: TypeAlias = "EtTensor | EtScalar | tuple[EtValue, ...]"

# Synthetic nodes the observer writes for the process and each thread; they are not operators.
_ROOT_PREFIXES = ("[pytorch|profiler|execution_trace|", "[pytorch|profiler|execution_graph|")
_ROOT_NAMES = frozenset({"__ROOT_PROCESS__", "__ROOT_THREAD__"})
COMM_OP = "record_param_comms"


@dataclass(frozen=True, slots=True)
class EtTensor(TensorMeta):
    """A tensor argument: the IR's TensorMeta plus the ET's storage id.

    The ET's tensor id comes from the TensorImpl address and is reused once a tensor is freed
    (81 of the 283 tensor ids of a DLRM rank reappear with another storage), so a tensor's
    identity for data dependencies is ``(tensor_id, storage_id)``: ``key``.
    """

    storage_id: int | None = None

    @property
    def key(self) -> tuple[int, int | None] | None:
        return None if self.tensor_id is None else (self.tensor_id, self.storage_id)

    def meta(self) -> TensorMeta:
        """The plain IR value (shape, dtype, tensor id)."""
        return TensorMeta(self.shape, self.dtype, self.tensor_id)


@dataclass(frozen=True, slots=True)
class CommMeta:
    """Collective metadata of one ``record_param_comms`` node, as far as the schema records it.

    ``collective`` is PyTorch's own name (``allreduce``, ``all_to_allv``, ``broadcast``,
    ``wait``, ...). Group ranks are known from 1.0.3 on (global rank start, stride, size);
    1.0.1 records only a process-group handle. Bytes are counted from the tensors the node lists.
    """

    collective: str
    pg_name: str = ""
    pg_desc: str = ""
    group_size: int | None = None
    group_ranks: tuple[int, ...] = ()
    in_nelems: int | None = None
    out_nelems: int | None = None
    in_bytes: int | None = None
    out_bytes: int | None = None
    dtype: str = ""
    in_splits: tuple[int, ...] = ()
    out_splits: tuple[int, ...] = ()
    seq: int | None = None

    @property
    def kind(self) -> CollectiveKind | None:
        """The IR collective kind; None for non-collectives such as ``wait``."""
        kind = kind_from_name(self.collective)
        if kind is CollectiveKind.ALL_TO_ALL and (self.in_splits or self.out_splits):
            return CollectiveKind.ALL_TO_ALLV
        return kind


@dataclass(frozen=True, slots=True)
class EtNode:
    """One ET node. ``inputs``/``outputs`` keep every argument: tensors as EtTensor (with
    ``tensor_id``), lists as tuples, scalars as Python values (``<None>`` becomes None)."""

    id: int
    name: str
    parent: int
    rf_id: int | None
    tid: int
    op_schema: str
    inputs: tuple[EtValue, ...]
    outputs: tuple[EtValue, ...]
    comm: CommMeta | None = None

    @property
    def is_root(self) -> bool:
        """True for the synthetic process/thread nodes (never an operator, never in Kineto)."""
        return self.name.startswith(_ROOT_PREFIXES) or self.name in _ROOT_NAMES

    def input_tensors(self) -> tuple[EtTensor, ...]:
        return tuple(_tensor_list(self.inputs))

    def output_tensors(self) -> tuple[EtTensor, ...]:
        return tuple(_tensor_list(self.outputs))


@dataclass(frozen=True, slots=True)
class ExecutionTrace:
    """One process's execution trace. ``devices`` lists the tensor devices seen (``cuda:3``)."""

    source: str
    schema: str
    pid: int | None
    nodes: tuple[EtNode, ...]
    devices: tuple[str, ...] = ()

    @property
    def ops(self) -> tuple[EtNode, ...]:
        """Operator nodes: every node except the synthetic process/thread roots."""
        return tuple(n for n in self.nodes if not n.is_root)


def _tensor_list(values: tuple[EtValue, ...]) -> list[EtTensor]:
    """The tensors among ``values``, lists (tuples) flattened, in order."""
    out: list[EtTensor] = []
    for v in values:
        if isinstance(v, EtTensor):
            out.append(v)
        elif isinstance(v, tuple):
            out += _tensor_list(v)
    return out


# ---------------------------------------------------------------------------------------------
# Raw layouts (msgspec structs: the C decoder validates field types and skips unknown fields).


class _FlatNode(msgspec.Struct):
    """Schema 1.0.1."""

    id: int
    name: str
    parent: int = 0
    rf_id: int | None = None
    tid: int = 0
    op_schema: str = ""
    inputs: list[Any] = msgspec.field(default_factory=list)
    input_shapes: list[Any] = msgspec.field(default_factory=list)
    input_types: list[str] = msgspec.field(default_factory=list)
    outputs: list[Any] = msgspec.field(default_factory=list)
    output_shapes: list[Any] = msgspec.field(default_factory=list)
    output_types: list[str] = msgspec.field(default_factory=list)


class _Io(msgspec.Struct):
    values: list[Any] = msgspec.field(default_factory=list)
    shapes: list[Any] = msgspec.field(default_factory=list)
    types: list[str] = msgspec.field(default_factory=list)


class _Attr(msgspec.Struct):
    name: str
    value: Any = None


class _AttrNode(msgspec.Struct):
    """Schemas 1.0.2-chakra.0.0.4 and later."""

    id: int
    name: str
    ctrl_deps: int = 0
    inputs: _Io = msgspec.field(default_factory=_Io)
    outputs: _Io = msgspec.field(default_factory=_Io)
    attrs: list[_Attr] = msgspec.field(default_factory=list)


class _Head(msgspec.Struct):
    schema: Any = None
    pid: Any = None
    nodes: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # decoded per schema


class _BadValue(Exception):
    """Internal: a malformed argument value; re-raised as TraceFormatError with its node."""


# ---------------------------------------------------------------------------------------------
# Argument values, decoded by their type string (``Tensor(float)``, ``GenericList[Int,Int]``).

_Decoder: TypeAlias = Callable[[Any, Any, set[str]], EtValue]  # (value, shape, devices) -> value
_is_int = int.__instancecheck__


def _split_types(inner: str) -> list[str]:
    """Split ``A,B[C,D],E(F,G)`` at top-level commas."""
    out: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(inner):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(inner[start:i].strip())
            start = i + 1
    tail = inner[start:].strip()
    if tail or out:
        out.append(tail)
    return out


def _plain(value: Any) -> EtValue:
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    if value == "<None>":
        return None
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


def _decode_plain(value: Any, shape: Any, devices: set[str]) -> EtValue:
    del shape, devices
    return _plain(value)


def _tensor_decoder(dtype: str) -> _Decoder:
    undefined = dtype.startswith(("nullptr", "undefined"))

    def decode(value: Any, shape: Any, devices: set[str]) -> EtValue:
        if not isinstance(value, list) or not value or not isinstance(value[0], int):
            raise _BadValue(
                f"tensor value {str(value)[:60]} is not "
                "[tensor_id, storage_id, offset, numel, elem_bytes, device]"
            )
        if not isinstance(shape, list) or not all(map(_is_int, shape)):
            raise _BadValue(f"tensor shape {str(shape)[:60]} is not a list of integers")
        if len(value) >= 6 and isinstance(value[5], str) and value[5]:
            devices.add(value[5])
        if undefined:
            return EtTensor(tuple(shape), dtype)
        storage = value[1] if len(value) > 1 and type(value[1]) is int else None
        return EtTensor(tuple(shape), dtype, value[0], storage)

    return decode


def _sequence_decoder(elems: list[_Decoder]) -> _Decoder:
    def decode(value: Any, shape: Any, devices: set[str]) -> EtValue:
        if not isinstance(value, list):
            return _plain(value)
        shapes = (
            shape if isinstance(shape, list) and len(shape) == len(value) else [[]] * len(value)
        )
        if len(elems) == len(value):
            return tuple(d(v, s, devices) for d, v, s in zip(elems, value, shapes, strict=True))
        if len(elems) == 1:
            return tuple(elems[0](v, s, devices) for v, s in zip(value, shapes, strict=True))
        return _plain(value)

    return decode


def _decode_none(value: Any, shape: Any, devices: set[str]) -> EtValue:
    del value, shape, devices
    return None


@lru_cache(maxsize=8192)
def _decoder(type_str: str) -> _Decoder:
    """A decoder for one type string; type strings repeat, so decoders are cached."""
    t = type_str.strip()
    if t.startswith("Tensor(") and t.endswith(")"):
        return _tensor_decoder(t[len("Tensor(") : -1])
    if t == "Tensor":
        return _tensor_decoder("")
    for head in ("GenericList[", "Tuple[", "List[", "Optional["):
        if t.startswith(head) and t.endswith("]"):
            return _sequence_decoder([_decoder(e) for e in _split_types(t[len(head) : -1])])
    if t == "None":
        return _decode_none
    return _decode_plain  # Int, Double, Bool, String, Device, Object, Stream, Storage, ...


def _decode_args(
    values: list[Any], shapes: list[Any], types: list[str], devices: set[str], what: str
) -> tuple[EtValue, ...]:
    n = len(values)
    if len(types) != n:
        raise _BadValue(f"{what}: {n} values but {len(types)} types")
    if not n:
        return ()
    if len(shapes) != n:
        shapes = [*shapes, *([[]] * (n - len(shapes)))][:n]
    try:
        return tuple([_decoder(t)(v, s, devices) for v, s, t in zip(values, shapes, types, strict=True)])
    except _BadValue:
        pass
    for i, (v, s, t) in enumerate(zip(values, shapes, types, strict=True)):  # which one, and why
        try:
            _decoder(t)(v, s, devices)
        except _BadValue as e:
            raise _BadValue(f"{what}[{i}] ({t}): {e}") from None
    raise AssertionError("unreachable: a decoder failed once and not again")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Collective metadata of record_param_comms nodes.


def _raw_tensors(value: Any, type_str: str) -> Iterator[list[Any]]:
    """Raw tensor lists inside one argument (``[id, storage, offset, numel, elem_bytes, dev]``)."""
    t = type_str.strip()
    if t.startswith("Tensor"):
        if isinstance(value, list) and len(value) >= 5:
            yield value
        return
    for head in ("GenericList[", "Tuple[", "List["):
        if t.startswith(head) and isinstance(value, list):
            elems = _split_types(t[len(head) : -1])
            for i, v in enumerate(value):
                yield from _raw_tensors(v, elems[i] if i < len(elems) else (elems or [""])[-1])


def _message(values: list[Any], types: list[str]) -> tuple[int | None, int | None, str]:
    """(numel, bytes, dtype) summed over every tensor in the arguments."""
    numel = nbytes = 0
    dtype = ""
    found = False
    for v, t in zip(values, types, strict=False):
        for raw in _raw_tensors(v, t):
            if not (isinstance(raw[3], int) and isinstance(raw[4], int)):
                continue
            found = True
            numel += raw[3]
            nbytes += raw[3] * raw[4]
        if not dtype and "Tensor(" in t:
            dtype = t[t.index("Tensor(") + len("Tensor(") :].split(")")[0]
    return (numel, nbytes, dtype) if found else (None, None, dtype)


def _int_list(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return ()
    if isinstance(value, list) and all(type(v) is int for v in value):
        return tuple(value)
    return ()


def _ranks(start: Any, stride: Any, size: Any) -> tuple[int, ...]:
    if all(type(x) is int for x in (start, stride, size)) and size > 0 and stride > 0:
        return tuple(range(start, start + stride * size, stride))
    return ()


def _comm_from_inputs(n: _AttrNode | _FlatNode, values: list[Any], types: list[str]) -> CommMeta:
    """Positional metadata (schemas 1.0.1–1.0.4): ``[tensors,] seq, pg, rank, collective_name,
    in_splits, out_splits[, global_rank_start, global_rank_stride], [world_size]``."""
    c = next((i for i, t in enumerate(types) if t == "String"), None)
    if c is None or c < 3:
        return CommMeta(collective="")
    outs = n.outputs if isinstance(n, _FlatNode) else n.outputs.values
    out_types = n.output_types if isinstance(n, _FlatNode) else n.outputs.types
    in_numel, in_bytes, dtype = _message(values[: max(c - 3, 0)], types[: max(c - 3, 0)])
    out_numel, out_bytes, out_dtype = _message(outs, out_types)
    pg = values[c - 2]
    pg_name, pg_desc = (
        (str(pg[0]), str(pg[1])) if isinstance(pg, list) and len(pg) == 2 else (str(pg), "")
    )
    tail = values[c + 3 :]
    size = tail[-1] if tail and type(tail[-1]) is int else None
    ranks = _ranks(tail[0], tail[1], size) if len(tail) >= 3 else ()
    return CommMeta(
        collective=str(values[c]), pg_name=pg_name, pg_desc=pg_desc, group_size=size,
        group_ranks=ranks, in_nelems=in_numel, out_nelems=out_numel, in_bytes=in_bytes,
        out_bytes=out_bytes, dtype=dtype or out_dtype,
        in_splits=_int_list(values[c + 1]) if len(values) > c + 1 else (),
        out_splits=_int_list(values[c + 2]) if len(values) > c + 2 else (),
        seq=values[c - 3] if type(values[c - 3]) is int else None,
    )  # fmt: skip


def _comm_from_attrs(n: _AttrNode, attrs: dict[str, Any]) -> CommMeta:
    """Attribute metadata (schemas 1.1.0+): collective_name, dtype, in/out_msg_nelems, splits,
    global_rank_start/stride, pg_name/desc/size."""
    if "collective_name" not in attrs:
        return _comm_from_inputs(n, n.inputs.values, n.inputs.types)
    positional = _comm_from_inputs(n, n.inputs.values, n.inputs.types)
    in_n, out_n = attrs.get("in_msg_nelems"), attrs.get("out_msg_nelems")
    dtype = str(attrs.get("dtype") or positional.dtype)
    # Element size: from the listed tensors where there are any, else from the dtype name.
    elem = None
    if positional.in_nelems:
        elem = (positional.in_bytes or 0) // positional.in_nelems
    elem = elem or dtype_bytes(dtype)
    size = attrs.get("pg_size")
    return CommMeta(
        collective=str(attrs["collective_name"]), pg_name=str(attrs.get("pg_name", "")),
        pg_desc=str(attrs.get("pg_desc", "")), group_size=size if type(size) is int else None,
        group_ranks=_ranks(attrs.get("global_rank_start"), attrs.get("global_rank_stride"), size),
        in_nelems=in_n if type(in_n) is int else None,
        out_nelems=out_n if type(out_n) is int else None,
        in_bytes=in_n * elem if type(in_n) is int and elem else None,
        out_bytes=out_n * elem if type(out_n) is int and elem else None,
        dtype=dtype, in_splits=_int_list(attrs.get("in_split_size")),
        out_splits=_int_list(attrs.get("out_split_size")), seq=positional.seq,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Per-layout node builders; ``_PARSERS`` maps each supported schema to one of them.


def _flat_nodes(raw: bytes, devices: set[str]) -> list[EtNode]:
    """Schema 1.0.1: flat fields."""
    out = []
    for n in msgspec.json.decode(raw, type=list[_FlatNode]):
        try:
            ins = _decode_args(n.inputs, n.input_shapes, n.input_types, devices, "inputs")
            outs = _decode_args(n.outputs, n.output_shapes, n.output_types, devices, "outputs")
            comm = _comm_from_inputs(n, n.inputs, n.input_types) if n.name == COMM_OP else None
        except _BadValue as e:
            raise _BadValue(f"node {n.id} ({short_text(n.name)}): {e}") from None
        out.append(EtNode(n.id, n.name, n.parent, n.rf_id, n.tid, n.op_schema, ins, outs, comm))
    return out


def _attr_nodes(raw: bytes, devices: set[str], *, comm_attrs: bool) -> list[EtNode]:
    """Schemas 1.0.2-chakra.0.0.4 and later: ``ctrl_deps`` parent, ``attrs`` list."""
    out = []
    for n in msgspec.json.decode(raw, type=list[_AttrNode]):
        attrs = {a.name: a.value for a in n.attrs}
        rf_id, tid, schema = attrs.get("rf_id"), attrs.get("tid", 0), attrs.get("op_schema", "")
        i, o = n.inputs, n.outputs
        try:
            if rf_id is not None and type(rf_id) is not int:
                raise _BadValue(f"attr rf_id is {rf_id!r}, expected an integer")
            if type(tid) is not int:
                raise _BadValue(f"attr tid is {tid!r}, expected an integer")
            ins = _decode_args(i.values, i.shapes, i.types, devices, "inputs.values")
            outs = _decode_args(o.values, o.shapes, o.types, devices, "outputs.values")
            comm = None
            if n.name == COMM_OP:
                comm = (
                    _comm_from_attrs(n, attrs)
                    if comm_attrs
                    else _comm_from_inputs(n, i.values, i.types)
                )
        except _BadValue as e:
            raise _BadValue(f"node {n.id} ({short_text(n.name)}): {e}") from None
        out.append(
            EtNode(n.id, n.name, n.ctrl_deps, rf_id, tid, str(schema or ""), ins, outs, comm)
        )
    return out


def _positional_comm(raw: bytes, devices: set[str]) -> list[EtNode]:
    return _attr_nodes(raw, devices, comm_attrs=False)


def _attr_comm(raw: bytes, devices: set[str]) -> list[EtNode]:
    return _attr_nodes(raw, devices, comm_attrs=True)


# The one table of supported schema versions (what PyTorch writes; see module docstring).
_PARSERS: dict[str, Callable[[bytes, set[str]], list[EtNode]]] = {
    "1.0.1": _flat_nodes,  # PyTorch 2.0–2.1
    "1.0.2-chakra.0.0.4": _positional_comm,  # attrs layout; comm metadata positional
    "1.0.3-chakra.0.0.4": _positional_comm,  # pg name becomes (pg_name, pg_desc) + rank range
    "1.0.4-chakra.0.0.4": _positional_comm,  # adds kernel_backend/kernel_file attrs (PT2)
    "1.1.0-chakra.0.0.4": _attr_comm,  # comm metadata as attrs
    "1.1.1-chakra.0.0.4": _attr_comm,  # adds tensor strides (torch 2.13 writes this)
}
SUPPORTED_SCHEMAS: tuple[str, ...] = tuple(_PARSERS)


def parse_execution_trace(name: str | Path, data: bytes) -> ExecutionTrace:
    """Decode one ET JSON document. Raises TraceFormatError (naming file and field) on bad
    input and UnsupportedSchemaError for a schema version without a parser."""
    name = str(name)
    try:
        head = msgspec.json.decode(data, type=_Head)
    except msgspec.ValidationError as e:
        raise TraceFormatError(name, f"not a PyTorch execution trace ({e})") from e
    except msgspec.DecodeError as e:
        raise TraceFormatError(name, f"invalid or truncated JSON ({e})") from e
    except MemoryError:
        raise too_large(name, f"{len(data) / 1e9:.2f} GB of JSON") from None
    if not head.nodes:
        raise TraceFormatError(name, "no 'nodes' list: not a PyTorch execution trace")
    if not isinstance(head.schema, str):
        raise TraceFormatError(
            name, f"field 'schema' must be a version string, got {head.schema!r}"
        )
    if head.pid is not None and type(head.pid) is not int:
        raise TraceFormatError(name, f"field 'pid' must be an integer, got {head.pid!r}")
    parse = _PARSERS.get(head.schema)
    if parse is None:
        raise UnsupportedSchemaError(
            name,
            f"execution-trace schema {head.schema!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_SCHEMAS)}. Record the trace with a PyTorch version that "
            "writes one of these, or report the new version.",
        )
    devices: set[str] = set()
    try:
        with gc_paused():
            nodes = parse(head.nodes, devices)
    except _BadValue as e:
        raise TraceFormatError(name, str(e)) from None
    except msgspec.ValidationError as e:
        where = str(e).replace("`$", "`nodes")
        raise TraceFormatError(name, f"field 'nodes' has a wrong type: {where}") from e
    except msgspec.DecodeError as e:
        raise TraceFormatError(name, f"invalid JSON in 'nodes' ({e})") from e
    except MemoryError:
        raise too_large(name, f"{len(data) / 1e9:.2f} GB of JSON") from None
    _check_tree(name, nodes)
    return ExecutionTrace(name, head.schema, head.pid, tuple(nodes), tuple(sorted(devices)))


def _check_tree(name: str, nodes: list[EtNode]) -> None:
    """Operators exist, node ids are unique and every parent chain ends (at a root, its own
    parent, or an id not in the file): the tree walks of linking would otherwise never end."""
    if not any(not n.is_root for n in nodes):
        held = f"holds only process/thread roots ({len(nodes)})" if nodes else "is empty"
        raise TraceFormatError(name, f"'nodes' {held}: the execution trace recorded no operator")
    parent: dict[int, int] = {}
    for n in nodes:
        if n.id in parent:
            raise TraceFormatError(name, f"node id {n.id} appears twice in 'nodes'")
        parent[n.id] = n.parent
    done: set[int] = set()
    for start in parent:
        path: dict[int, None] = {}  # the chain walked from ``start``, in order
        nid = start
        while nid in parent and nid not in done and parent[nid] != nid:
            if nid in path:
                walked = list(path)
                chain = [*walked[walked.index(nid) :], nid]
                shown = " → ".join(map(str, chain if len(chain) <= 8 else [*chain[:4], "…", *chain[-3:]]))
                raise TraceFormatError(name, f"node {nid}'s parent chain loops ({shown})")
            path[nid] = None
            nid = parent[nid]
        done.update(path)


def load_execution_trace(path: str | Path) -> ExecutionTrace:
    """Read one ET file (``.json``, ``.json.gz`` or an archive holding exactly one ET)."""
    from trainsim.ingest.sources import BlobKind, read_path

    blobs = [b for b in read_path(path) if b.kind is BlobKind.EXECUTION_TRACE]
    if len(blobs) != 1:
        raise TraceFormatError(path, f"expected one execution trace, found {len(blobs)}")
    return parse_execution_trace(blobs[0].name, blobs[0].data)


# ---------------------------------------------------------------------------------------------
# Data dependencies between nodes.


def start_order(et: ExecutionTrace) -> list[EtNode]:
    """Operator nodes in the order they started (record-function ids are a global counter
    assigned at op start; node ids follow the same order and break ties)."""
    return sorted(et.ops, key=lambda n: (n.rf_id if n.rf_id is not None else -1, n.id))


def data_dependencies(et: ExecutionTrace) -> dict[int, tuple[int, ...]]:
    """Node id → ids of the nodes that last wrote the tensors it reads (read-after-write).

    Tensors are identified by ``EtTensor.key`` (tensor id, storage id). Nodes are visited in
    start order. A node's producer for tensor ``t`` is the latest earlier
    node listing ``t`` among its outputs, skipping the node's own ancestors (a parent lists the
    outputs its children compute). Tensors nobody produced (weights, inputs from before the
    trace) give no edge. In-place ops both read and write ``t``: they depend on the previous
    writer and become the next one.
    """
    by_id = {n.id: n for n in et.nodes}
    writers: dict[tuple[int, int | None], list[int]] = {}
    deps: dict[int, tuple[int, ...]] = {}
    for n in start_order(et):
        ancestors: set[int] | None = None  # walked the first time a read has a writer
        found: list[int] = []
        for t in _tensor_list(n.inputs):
            history = writers.get((t.tensor_id, t.storage_id)) if t.tensor_id is not None else None
            if not history:
                continue
            if ancestors is None:
                ancestors = _ancestors(n, by_id)
            for w in reversed(history):
                if w not in ancestors:
                    if w not in found:
                        found.append(w)
                    break
        if found:
            deps[n.id] = tuple(found)
        for t in _tensor_list(n.outputs):
            if t.tensor_id is not None:
                key = (t.tensor_id, t.storage_id)
                history = writers.get(key)
                if history is None:
                    writers[key] = [n.id]
                else:
                    history.append(n.id)
    return deps


def _ancestors(n: EtNode, by_id: dict[int, EtNode]) -> set[int]:
    out: set[int] = set()
    p = by_id.get(n.parent)
    while p is not None and p.id not in out and p.id != n.id:
        out.add(p.id)
        p = by_id.get(p.parent) if p.parent != p.id else None
    return out
