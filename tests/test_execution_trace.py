"""PyTorch execution traces: every shipped schema parses, against an independent stdlib reading."""

from __future__ import annotations

import functools
import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from trainsim.errors import TraceFormatError, UnsupportedSchemaError
from trainsim.ingest.execution_trace import (
    SUPPORTED_SCHEMAS,
    EtTensor,
    ExecutionTrace,
    data_dependencies,
    load_execution_trace,
    parse_execution_trace,
    start_order,
)
from trainsim.ingest.sources import BlobKind, read_path
from trainsim.ir.graph import TensorMeta
from trainsim.ir.kinds import CollectiveKind

# (file under ../shared/data/traces, schema, nodes per trace, traces in the file)
SHIPPED = [
    ("param_dlrm_8xv100/dlrm_pytorch_et.tar.gz", "1.0.1", 1675, 8),
    ("param_linear_2080ti/linear_et.json.gz", "1.0.1", 931, 1),
    ("hta_misc/benchmark_simple_add_et.json.gz", "1.0.1", 38, 1),
    ("chakra_resnet50_rank0/allgather_2rank_et_1.0.2.tgz", "1.0.2-chakra.0.0.4", 263, 1),
    ("param_et_schemas/resnet50_1gpu_et_1.0.3.json.gz", "1.0.3-chakra.0.0.4", 14391, 1),
    ("param_et_schemas/resnet50_2gpu_et_1.1.0.json.gz", "1.1.0-chakra.0.0.4", 14392, 1),
    ("param_et_schemas/resnet50_ddp_et_1.1.0.json.gz", "1.1.0-chakra.0.0.4", 14392, 1),
    pytest.param(
        "param_et_schemas/hf_gpt2_et.json.tar.gz", "1.1.0-chakra.0.0.4", 27156, 1,
        marks=pytest.mark.slow,  # 24 MB of JSON, read twice (ours and the stdlib's)
    ),
]  # fmt: skip


def _blobs(shared_data: Path, rel: str) -> list:
    return [
        b for b in read_path(shared_data / "traces" / rel) if b.kind is BlobKind.EXECUTION_TRACE
    ]


@functools.cache
def _ets(shared_data: Path, rel: str) -> list[ExecutionTrace]:
    return [parse_execution_trace(b.name, b.data) for b in _blobs(shared_data, rel)]


def _raw_fields(node: dict) -> tuple[list, list]:
    """(input types, output types) of a raw node in either layout."""
    if isinstance(node.get("inputs"), dict):
        return node["inputs"]["types"], node["outputs"]["types"]
    return node["input_types"], node["output_types"]


def _tensor_count(types: list[str]) -> int:
    return sum(t.count("Tensor(") for t in types)


@pytest.mark.parametrize(("rel", "schema", "nodes", "files"), SHIPPED)
def test_shipped_execution_traces_parse(shared_data, rel, schema, nodes, files):
    blobs = _blobs(shared_data, rel)
    assert len(blobs) == files
    for b in blobs:
        et, raw = parse_execution_trace(b.name, b.data), json.loads(b.data)  # independent reading
        assert et.schema == schema
        assert et.pid == raw["pid"]
        assert len(et.nodes) == len(raw["nodes"]) == nodes
        by_id = {n.id: n for n in et.nodes}
        # Names, and one EtTensor per "Tensor(" in the raw type strings.
        assert Counter(n.name for n in et.nodes) == Counter(r["name"] for r in raw["nodes"])
        for n, r in zip(et.nodes, raw["nodes"], strict=True):
            in_types, out_types = _raw_fields(r)
            assert len(n.input_tensors()) == _tensor_count(in_types), n
            assert len(n.output_tensors()) == _tensor_count(out_types), n
        # The tree: every operator's parent exists; roots are the synthetic process/thread nodes.
        assert all(n.parent in by_id for n in et.ops)
        assert {n.name.rsplit("|", 1)[-1] for n in et.nodes if n.is_root} == {"thread]", "process]"}
        rf_ids = [n.rf_id for n in et.ops]
        assert None not in rf_ids and len(set(rf_ids)) == len(rf_ids)
        assert any(d.startswith("cuda:") for d in et.devices)


def test_dlrm_ranks_live_on_their_own_gpu(shared_data):
    ets = _ets(shared_data, "param_dlrm_8xv100/dlrm_pytorch_et.tar.gz")
    for et in ets:
        rank = int(et.source.rsplit("_", 1)[-1].removesuffix(".json"))
        assert set(et.devices) == {"cpu", f"cuda:{rank}"}
    assert len({et.pid for et in ets}) == 8


def test_tensor_metadata_from_a_known_op(shared_data):
    (et, *_) = _ets(shared_data, "hta_misc/benchmark_simple_add_et.json.gz")
    rand = next(n for n in et.ops if n.name == "aten::rand")
    (out,) = rand.output_tensors()
    assert out.meta() == TensorMeta((256, 256), "float", out.tensor_id)
    assert out.tensor_id is not None and out.storage_id is not None
    # Scalars and lists survive as Python values; "<None>" becomes None.
    assert rand.inputs[0] == (256, 256) and None in rand.inputs
    uniform = next(n for n in et.ops if n.name == "aten::uniform_")
    assert uniform.input_tensors()[0].tensor_id == uniform.output_tensors()[0].tensor_id  # in place


def test_collectives_ddp_1_1_0_from_attrs(shared_data):
    (et, *_) = _ets(shared_data, "param_et_schemas/resnet50_2gpu_et_1.1.0.json.gz")
    comms = [n.comm for n in et.nodes if n.comm is not None and n.comm.kind is not None]
    assert Counter(c.kind for c in comms) == {
        CollectiveKind.ALL_REDUCE: 15,
        CollectiveKind.BROADCAST: 6,
    }
    for c in comms:
        assert (c.pg_name, c.pg_desc, c.group_size, c.group_ranks) == ("0", "default_pg", 2, (0, 1))
        assert c.in_nelems == c.out_nelems and c.in_nelems > 0
        assert c.in_bytes == {"Float": 4, "Long": 8}[c.dtype] * c.in_nelems
    # The attrs agree with the tensors the node lists.
    for n in et.nodes:
        if n.comm is not None and n.comm.kind is not None:
            assert sum(t.numel for t in n.input_tensors()) == n.comm.in_nelems


def test_collectives_dlrm_1_0_1_positional(shared_data):
    for et in _ets(shared_data, "param_dlrm_8xv100/dlrm_pytorch_et.tar.gz"):
        comms = [n.comm for n in et.nodes if n.comm is not None]
        kinds = Counter(c.kind for c in comms)
        # Kineto of the same run: 5 all_to_all(v) and 3 all_reduce; the rest are waits.
        assert kinds[CollectiveKind.ALL_TO_ALLV] + kinds[CollectiveKind.ALL_TO_ALL] == 5
        assert kinds[CollectiveKind.ALL_REDUCE] == 3
        assert kinds[None] == sum(1 for c in comms if c.collective == "wait")
        seqs = [c.seq for c in comms if c.kind is not None]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        for c in comms:
            if c.kind is CollectiveKind.ALL_TO_ALLV:
                assert len(c.in_splits) == len(c.out_splits) == 8
            if c.kind is not None:
                assert c.in_bytes is not None and c.in_bytes > 0
        pgs = {c.pg_name for c in comms if c.kind is not None}
        assert len(pgs) == 1  # one process group handle per rank


def test_collectives_all_gather_1_0_2(shared_data):
    (et, *_) = _ets(shared_data, "chakra_resnet50_rank0/allgather_2rank_et_1.0.2.tgz")
    gathers = [n.comm for n in et.nodes if n.comm is not None and n.comm.kind is not None]
    assert len(gathers) == 10
    for c in gathers:
        assert c.kind is CollectiveKind.ALL_GATHER and c.group_size == 2
        assert c.out_bytes == 2 * c.in_bytes  # type: ignore[operator]


def test_data_dependencies_point_back_to_real_producers(shared_data):
    (et, *_) = _ets(shared_data, "param_dlrm_8xv100/dlrm_pytorch_et.tar.gz")
    order = {n.id: i for i, n in enumerate(start_order(et))}
    by_id = {n.id: n for n in et.nodes}
    deps = data_dependencies(et)
    assert len(deps) > len(et.ops) // 2
    for node, producers in deps.items():
        consumed = {t.key for t in by_id[node].input_tensors()}
        for p in producers:
            assert order[p] < order[node]
            assert consumed & {t.key for t in by_id[p].output_tensors()}


# -- schema table -------------------------------------------------------------------------------


def _flat_doc(schema: str) -> dict:
    node = {
        "name": "aten::add", "id": 5, "rf_id": 3, "parent": 2, "fw_parent": 0, "seq_id": -1,
        "scope": 0, "tid": 1, "fw_tid": 0, "op_schema": "aten::add.Tensor(...)",
        "inputs": [[7, 8, 0, 6, 4, "cuda:0"], [9, 10, 0, 6, 4, "cuda:0"], 1],
        "input_shapes": [[2, 3], [2, 3], []], "input_types": ["Tensor(float)", "Tensor(float)", "Int"],
        "outputs": [[11, 12, 0, 6, 4, "cuda:0"]], "output_shapes": [[2, 3]],
        "output_types": ["Tensor(float)"],
    }  # fmt: skip
    return {"schema": schema, "pid": 42, "nodes": [node]}


def _attr_doc(schema: str) -> dict:
    flat = _flat_doc(schema)["nodes"][0]
    attrs = [
        {"name": "rf_id", "type": "uint64", "value": 3}, {"name": "tid", "type": "uint64", "value": 1},
        {"name": "op_schema", "type": "string", "value": flat["op_schema"]},
    ]  # fmt: skip
    node = {
        "id": 5, "name": "aten::add", "ctrl_deps": 2, "attrs": attrs,
        "inputs": {"values": flat["inputs"], "shapes": flat["input_shapes"], "types": flat["input_types"]},
        "outputs": {"values": flat["outputs"], "shapes": flat["output_shapes"], "types": flat["output_types"]},
    }  # fmt: skip
    return {"schema": schema, "pid": 42, "nodes": [node]}


@pytest.mark.parametrize("schema", SUPPORTED_SCHEMAS)
def test_every_supported_schema_has_a_working_parser(schema):
    doc = _flat_doc(schema) if schema == "1.0.1" else _attr_doc(schema)
    et = parse_execution_trace("mem.json", json.dumps(doc).encode())
    (n,) = et.nodes
    assert (n.id, n.name, n.parent, n.rf_id, n.tid) == (5, "aten::add", 2, 3, 1)
    assert n.input_tensors() == (EtTensor((2, 3), "float", 7, 8), EtTensor((2, 3), "float", 9, 10))
    assert n.inputs[2] == 1 and n.output_tensors() == (EtTensor((2, 3), "float", 11, 12),)
    assert et.devices == ("cuda:0",)


def test_shipped_and_torch_schemas_are_all_supported(shared_data):
    shipped = {p.values[1] if hasattr(p, "values") else p[1] for p in SHIPPED}
    assert shipped | {"1.1.1-chakra.0.0.4"} <= set(SUPPORTED_SCHEMAS)


def test_unsupported_schema_names_file_and_supported_versions():
    doc = _flat_doc("9.9.9")
    with pytest.raises(UnsupportedSchemaError) as err:
        parse_execution_trace("future_et.json", json.dumps(doc).encode())
    msg = str(err.value)
    assert "future_et.json" in msg and "9.9.9" in msg
    assert all(s in msg for s in SUPPORTED_SCHEMAS)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"{not json", "invalid or truncated JSON"),
        (b"[1, 2]", "not a PyTorch execution trace"),
        (json.dumps({"schema": "1.0.1", "pid": 1}).encode(), "no 'nodes'"),
        (json.dumps({"schema": 101, "pid": 1, "nodes": []}).encode(), "'schema'"),
        (json.dumps({"schema": "1.0.1", "pid": "x", "nodes": []}).encode(), "'pid'"),
        (json.dumps({"schema": "1.0.1", "pid": 1, "nodes": {}}).encode(), "nodes"),
        (json.dumps({"schema": "1.0.1", "pid": 1, "nodes": [{"id": "5", "name": "a"}]}).encode(), "nodes[0].id"),
    ],
)  # fmt: skip
def test_bad_documents_raise_trace_format_error(data, needle):
    with pytest.raises(TraceFormatError) as err:
        parse_execution_trace("bad_et.json", data)
    assert "bad_et.json" in str(err.value) and needle in str(err.value)


def test_malformed_tensor_value_names_node_and_argument():
    doc = _attr_doc("1.1.0-chakra.0.0.4")
    doc["nodes"][0]["inputs"]["values"][1] = "not-a-tensor"
    with pytest.raises(TraceFormatError) as err:
        parse_execution_trace("bad_et.json", json.dumps(doc).encode())
    assert "node 5 (aten::add)" in str(err.value) and "inputs.values[1]" in str(err.value)


def _tree_doc(parents: dict[int, int]) -> bytes:
    """A 1.0.1 document of bare ``aten::relu`` nodes with these parents (root 1 its own)."""
    nodes = [{"id": 1, "name": "[pytorch|profiler|execution_graph|process]", "parent": 1}]
    nodes += [{"id": i, "name": "aten::relu", "parent": p} for i, p in parents.items()]
    return json.dumps({"schema": "1.0.1", "pid": 1, "nodes": nodes}).encode()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (_tree_doc({2: 1, 10: 4, 4: 10}), "node 10's parent chain loops (10 → 4 → 10)"),
        (_tree_doc({2: 3, 3: 2, 5: 2}), "parent chain loops (2 → 3 → 2)"),
        (_tree_doc({4: 2, 2: 3, 3: 2}), "node 2's parent chain loops (2 → 3 → 2)"),  # leads into one
        (_tree_doc({2: 1, 3: 2}).replace(b'"id": 3', b'"id": 2'), "node id 2 appears twice"),
        (json.dumps({"schema": "1.0.1", "pid": 1, "nodes": []}).encode(), "'nodes' is empty"),
        (_tree_doc({}), "'nodes' holds only process/thread roots (1)"),
    ],
)  # fmt: skip
def test_impossible_node_trees_rejected(data, needle):
    """A parent loop made the linker's subtree walk run forever; no node or duplicate ids gave
    a link rate of 0 % without a word."""
    with pytest.raises(TraceFormatError) as err:
        parse_execution_trace("bad_et.json", data)
    assert str(err.value).startswith("bad_et.json: ") and needle in str(err.value)


def test_a_deep_tree_parses():
    chain = {i: i - 1 for i in range(2, 20_000)}  # nesting depth 20 000: no recursion
    assert len(parse_execution_trace("deep.json", _tree_doc(chain)).nodes) == 19_999


def test_mismatched_type_and_value_lists_rejected():
    doc = _flat_doc("1.0.1")
    doc["nodes"][0]["input_types"].pop()
    with pytest.raises(TraceFormatError, match="3 values but 2 types"):
        parse_execution_trace("bad_et.json", json.dumps(doc).encode())


# -- torch 2.13 writes 1.1.1 ---------------------------------------------------------------------


@functools.cache
def capture_torch_pair() -> tuple[Path, Path, Path]:
    """Record CPU training steps of a small MLP with torch 2.13: (Kineto JSON, ET recorded with
    it, ET recorded in a separate later pass of the same process, as ``trainsim capture``
    does)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import (
        ExecutionTraceObserver,
        ProfilerActivity,
        profile,
        record_function,
        schedule,
    )

    out = Path(tempfile.mkdtemp(prefix="trainsim_et_"))
    kineto, et_path, later_et = out / "k.json", out / "et.json", out / "et_later.json"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, execution_trace_observer=observer,
        schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(kineto)),
    ) as prof:  # fmt: skip
        for _ in range(3):
            step()
            prof.step()
    observer.unregister_callback()
    observer = ExecutionTraceObserver().register_callback(str(later_et))
    observer.start()
    for i in range(2):
        with record_function(f"ProfilerStep#{10 + i}"):
            step()
    observer.unregister_callback()
    return kineto, et_path, later_et


@pytest.mark.slow
def test_torch_2_13_execution_trace_parses():
    _, et_path, _ = capture_torch_pair()
    et = load_execution_trace(et_path)
    assert et.schema == "1.1.1-chakra.0.0.4"
    assert et.devices == ("cpu",)
    addmms = [n for n in et.ops if n.name == "aten::addmm"]
    assert len(addmms) == 4  # two Linear layers, two profiled steps
    shapes = {tuple(t.shape for t in n.input_tensors()) for n in addmms}
    assert shapes == {((32,), (8, 16), (16, 32)), ((4,), (8, 32), (32, 4))}
    deps = data_dependencies(et)
    order = start_order(et)
    relu = next(n for n in order if n.name == "aten::relu")
    first_linear = next(n for n in order if n.name == "aten::linear")
    # relu reads what the first Linear wrote: its producer lies inside that aten::linear.
    by_id = {n.id: n for n in et.nodes}

    def inside_first_linear(nid: int) -> bool:
        while nid in by_id and nid != first_linear.id and by_id[nid].parent != nid:
            nid = by_id[nid].parent
        return nid == first_linear.id

    assert deps[relu.id] and all(inside_first_linear(p) for p in deps[relu.id])
