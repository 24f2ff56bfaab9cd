"""Training a stage-latency predictor (003 §IV-B6–8) and storing it without pickle.

Target: the log of the stage latency, standardized with the training set's mean and standard
deviation; loss: MAE (Eq. 3) on that target — on the log scale an absolute error is a relative
error of the latency, the quantity 003 reports (MRE, Eq. 5). Optimizer: Adam (β = 0.9, 0.999),
learning rate 1e-3 decayed to 0 by a cosine over ``epochs``; batches of 32 graphs (graphs of
similar size are batched together for the padded Transformer layout, batch order shuffled each
epoch). Early stopping: the weights with the lowest validation loss are kept, training stops
after ``patience`` epochs without improvement (or when ``max_time_s`` is spent) and the best
weights are restored. 003 trains 500 epochs with patience 200; the defaults here are 250 / 80 to
fit this machine's 2-core budget (measured: see docs/predtop.md). The ``sum`` readout keeps the
target unscaled (:func:`target_scaling`); ``TrainConfig.members`` > 1 trains a cross-validated bag
(:func:`train_members`) saved and loaded as one predictor.

A trained :class:`Predictor` is a folder::

    predictor.json          model config, operator vocabulary, target scaling, pruning, history
    predictor.safetensors   the weights (``safetensors``: tensors only, nothing is executed on load)
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from trainsim.errors import ConfigError, ModelError
from trainsim.learn.graphs import (
    PRUNED_OPS,
    StageGraph,
    depths,
    feature_names,
    node_features,
    prune,
    reachability,
)
from trainsim.learn.models import (
    GraphTensors,
    Members,
    ModelConfig,
    build_model,
    collate,
    size_chunks,
)

PREDICTOR_SCHEMA = "trainsim.predtop-predictor/1"
PRODUCER = "trainsim"  # the weights' header metadata: a predictor's own weights (predictor_folder)
STOP_MODES = ("each", "common")
_MAX_LOG_S = 700.0  # |ln latency| a prediction may reach (np.exp overflows past 709.78)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    epochs: int = 250
    batch_size: int = 32
    lr: float = 1e-3
    patience: int = 80
    seed: int = 0
    max_time_s: float | None = 900.0  # the 15-minute budget per predictor (all members)
    threads: int | None = None
    members: int = 1  # > 1: a cross-validated bag of that many models (train_members)
    # a bag's early stopping: "each" member at its own fold's best epoch, or "common": every
    # member at the epoch where the members' mean validation loss is lowest (train_members)
    stop: str = "each"


def check_stop(stop: str, members: int) -> None:
    """One-line errors for a bag's ``--stop`` (``TrainConfig.stop``) before any training."""
    if stop not in STOP_MODES:
        raise ConfigError(f"--stop must be one of {', '.join(STOP_MODES)}, got {stop!r}")
    if stop != "each" and members < 2:
        raise ConfigError(f"--stop {stop} chooses the epoch of a bag: it needs --members 2 or more")


@dataclass(slots=True)
class History:
    epochs_run: int = 0
    best_epoch: int = -1
    best_val_loss: float = math.inf
    train_s: float = 0.0
    stopped: str = ""
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


def log_work(g: StageGraph) -> float:
    """ln of the graph's operator FLOPs (graphs.eqn_work), 0.0 when the graph does not carry them."""
    total = sum(f for f, k in zip(g.flops, g.kind, strict=True) if k == "operator")
    return math.log(total) if total > 0 else 0.0


def featurize(graphs: Sequence[StageGraph], op_vocab: Sequence[str], *, reach: bool,
              pruned: bool = True, inputs: bool = False) -> list[GraphTensors]:  # fmt: skip
    """Prune each graph (§IV-B4) and build its tensors (Table I features, edges, depths, Eq. 1)."""
    out = []
    for g in graphs:
        p = prune(g) if pruned else g
        ei = np.array([p.src + p.dst, p.dst + p.src], dtype=np.int64).reshape(2, -1)
        out.append(
            GraphTensors(
                node_features(p, op_vocab, inputs=inputs),
                ei,
                depths(p),
                reachability(p) if reach else None,
                log_work(g),
            )
        )
    return out


def _batches(
    tensors: Sequence[GraphTensors], size: int, rng: np.random.Generator, *, by_size: bool
) -> list[list[int]]:
    idx = rng.permutation(len(tensors))
    if by_size:  # similar sizes together: less padding in the quadratic attention
        idx = np.array(sorted(idx, key=lambda i: (tensors[i].num_nodes, rng.random())))
    batches = [list(idx[k : k + size]) for k in range(0, len(idx), size)]
    rng.shuffle(batches)
    return batches


@dataclass
class Predictor:
    """A trained model with everything needed to predict latencies of new stage graphs."""

    config: ModelConfig
    op_vocab: list[str]
    target_mean: float
    target_std: float
    model: torch.nn.Module
    pruned: bool = True
    history: History | None = None
    part: str = "train"  # which stage graph it reads (trainsim.learn.stages.PARTS)
    input_features: bool = False  # graphs.INPUT_FEATURES appended to Table I
    per_work: bool = False  # target: ln(latency / FLOPs) instead of ln(latency)
    meta: dict[str, Any] = field(default_factory=dict)

    def tensors(self, graphs: Sequence[StageGraph]) -> list[GraphTensors]:
        return featurize(graphs, self.op_vocab, reach=self.config.kind == "dag_transformer",
                         pruned=self.pruned, inputs=self.input_features)  # fmt: skip

    def predict_tensors(self, tensors: Sequence[GraphTensors], batch_size: int = 32) -> np.ndarray:
        self.model.eval()
        padded = self.config.kind == "dag_transformer"
        out = np.zeros(len(tensors))
        with torch.no_grad():
            for ids in _eval_chunks(tensors, batch_size, padded=padded):
                y = self.model(collate([tensors[i] for i in ids], padded=padded)).numpy().astype(np.float64)
                off = np.array([tensors[i].log_work for i in ids]) if self.per_work else 0.0
                log_s = y * self.target_std + self.target_mean + off
                if not np.all(np.abs(log_s) < _MAX_LOG_S):  # e^710 overflows: finite but absurd weights
                    worst = float(log_s[~(np.abs(log_s) < _MAX_LOG_S)][0])
                    raise ModelError(f"the predictor gives a stage a latency of e^{worst:.3g} s, outside any float: "
                                     "its weights or target scaling are damaged (train it again)")  # fmt: skip
                out[ids] = np.exp(log_s)
        return out

    def predict(self, graphs: Sequence[StageGraph]) -> np.ndarray:
        """Predicted latency in seconds of each (full, unpruned) stage graph of :attr:`part`."""
        return self.predict_tensors(self.tensors(graphs))

    def save(self, folder: Path | str) -> Path:
        """Write the weights, then the JSON that names them, each atomically (a reader never
        sees a half-written file; a folder with only new weights still loads the old JSON's
        shapes and fails with one line, not garbage)."""
        from safetensors.torch import save as save_bytes

        from trainsim.ir.serialize import write_bytes_atomic, write_text_atomic

        folder = predictor_folder(folder)
        state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        write_bytes_atomic(folder / "predictor.safetensors", save_bytes(state, metadata={"producer": PRODUCER}))
        doc = {"schema": PREDICTOR_SCHEMA, "model": self.config.to_dict(), "op_vocab": self.op_vocab,
               "features": feature_names(self.op_vocab, inputs=self.input_features),
               "input_features": self.input_features, "target": {"transform": "log-per-flop" if self.per_work else "log", "mean": self.target_mean,
               "std": self.target_std}, "pruned": self.pruned, "pruned_ops": sorted(PRUNED_OPS), "part": self.part,
               "history": asdict(self.history) if self.history else None, "meta": self.meta}  # fmt: skip
        write_text_atomic(folder / "predictor.json", json.dumps(doc, indent=1))
        return folder

    @classmethod
    def load(cls, folder: Path | str) -> Predictor:
        """Load without executing code: JSON config + safetensors weights.

        Checked before the weights are read: the architecture's fields, the operator vocabulary
        against the input width, the target scaling, and every tensor's shape in the weights'
        header against the architecture (the model is built on the meta device first: a config
        that is not these weights' allocates nothing); then every weight must be finite."""
        from safetensors import SafetensorError, safe_open

        folder = Path(folder)
        if not folder.exists():
            raise ConfigError(f"{folder}: no such folder; expected a predictor folder (one written by `trainsim stages train`)")
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{folder}: not a predictor folder (one written by `trainsim stages train`)")
        meta, weights = folder / "predictor.json", folder / "predictor.safetensors"
        try:
            doc = json.loads(meta.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{folder}: no predictor.json; train a predictor first") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{meta}: unreadable predictor JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("schema") != PREDICTOR_SCHEMA:
            got = doc.get("schema") if isinstance(doc, dict) else None
            if isinstance(got, str) and got.startswith(PREDICTOR_SCHEMA.rpartition("/")[0] + "/"):
                raise ModelError(f"{meta}: a {got} predictor (another trainsim version); this one reads "
                                 f"{PREDICTOR_SCHEMA}: train it again with this version")  # fmt: skip
            raise ModelError(f"{meta} is not a {PREDICTOR_SCHEMA} document")
        _check_version_fields(doc, meta)
        if weights.is_dir():
            raise ConfigError(f"{weights}: is a folder; a predictor's weights are the file `trainsim stages train` writes")
        try:
            cfg = ModelConfig(**doc["model"])
            _check_config(cfg, meta)
            op_vocab, inputs = doc["op_vocab"], bool(doc.get("input_features", False))
            if not isinstance(op_vocab, list) or not all(isinstance(o, str) for o in op_vocab):
                raise ModelError(f"{meta}: op_vocab must be a list of operator names, got {op_vocab!r:.60}")
            if (width := len(feature_names(op_vocab, inputs=inputs))) != cfg.in_dim:
                raise ModelError(f"{meta}: op_vocab's {len(op_vocab)} operators make {width} node features, "
                                 f"the model reads model.in_dim {cfg.in_dim}: the file was edited or mixed up")  # fmt: skip
            mean, std = (_finite(doc["target"], k, meta) for k in ("mean", "std"))
            if std <= 0:
                raise ModelError(f"{meta}: target.std must be positive, got {std!r}")
            with safe_open(str(weights), framework="pt") as f:  # the header first, then the tensors
                _check_shapes(cfg, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118
                state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            bad = next((k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
            if bad is not None:
                raise ModelError(f"{weights}: tensor {bad} holds NaN or infinite values: the weights are damaged "
                                 "(train the predictor again)")  # fmt: skip
            model = build_model(cfg)
            own = model.state_dict()  # a tensor of another dtype would be cast silently by load_state_dict
            odd = next((k for k, v in state.items() if k in own and v.dtype != own[k].dtype), None)
            if odd is not None:
                raise ModelError(f"{weights}: tensor {odd} is {str(state[odd].dtype).removeprefix('torch.')}, "
                                 f"expected {str(own[odd].dtype).removeprefix('torch.')} (as `trainsim stages train` "
                                 "writes it): the weights were converted or damaged")  # fmt: skip
            model.load_state_dict(state)
            hist = History(**doc["history"]) if doc.get("history") else None
            return cls(cfg, list(op_vocab), mean, std, model, pruned=bool(doc.get("pruned", True)), history=hist,
                       part=str(doc.get("part", "train")), input_features=inputs,
                       per_work=doc["target"].get("transform") == "log-per-flop", meta=doc.get("meta", {}))  # fmt: skip
        except FileNotFoundError:
            raise ConfigError(f"{folder}: no predictor.safetensors beside predictor.json") from None
        except SafetensorError as e:
            raise ConfigError(f"{weights}: not a readable safetensors file ({e})") from None
        except OSError as e:
            raise ConfigError(f"{weights}: unreadable ({e.strerror or e})") from None
        except KeyError as e:
            raise ModelError(f"{meta}: no field {e} (a predictor.json `trainsim stages train` writes has it)") from None
        except (TypeError, ValueError, RuntimeError, AttributeError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ModelError(f"{folder}: predictor.json and its weights do not agree ({msg})") from None


_TARGETS = ("log", "log-per-flop")


def _check_version_fields(doc: dict[str, Any], meta: Path) -> None:
    """The fields whose values another trainsim version may write differently: a model field,
    graph part or target transform this version does not know is named, not misread (an
    unknown transform read as "log", an unknown part a KeyError on the dataset's rows)."""
    from dataclasses import fields

    from trainsim.learn.stages import PARTS

    again = "(another trainsim version, or an edited file: train it again with this version)"
    model = doc.get("model")
    unknown = sorted(set(model) - {f.name for f in fields(ModelConfig)}) if isinstance(model, dict) else []
    if unknown:
        raise ModelError(f"{meta}: model.{unknown[0]} is not a model field this version knows {again}")
    if doc.get("part", "train") not in PARTS:
        raise ModelError(f"{meta}: part must be one of {', '.join(PARTS)}, got {doc.get('part')!r} {again}")
    target = doc.get("target")
    if isinstance(target, dict) and target.get("transform", "log") not in _TARGETS:
        raise ModelError(f"{meta}: target.transform must be one of {', '.join(_TARGETS)}, "
                         f"got {target.get('transform')!r} {again}")  # fmt: skip
    _check_meta(doc.get("meta", {}), meta)


def _check_meta(info: Any, meta: Path) -> None:
    """The ``meta`` fields the ``stages`` commands read, of the shape ``stages train`` writes
    them (were AttributeError/TypeError tracebacks in predict and search when edited)."""
    if not isinstance(info, dict):
        raise ModelError(f"{meta}: meta must be an object, got {type(info).__name__}")

    def texts(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    def pair(v: Any) -> bool:
        return isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)

    bad = None
    if "families" in info and not texts(info["families"]):
        bad = "families must be a list of family names"
    elif not isinstance(info.get("spec_ranges") or {}, dict) or not all(map(pair, (info.get("spec_ranges") or {}).values())):
        bad = "spec_ranges must map each stage field to its [min, max]"
    elif any(not isinstance(info.get(k) or {}, dict) or not all(map(texts, (info.get(k) or {}).values()))
             for k in ("split_ids", "split_specs")):  # fmt: skip
        bad = "split_ids and split_specs must map each split to a list of stage ids or digests"
    elif not isinstance(info.get("host") or {}, dict):
        bad = "host must be an object"
    elif isinstance(info.get("test_mre_pct"), bool) or not isinstance(info.get("test_mre_pct", 0), (int, float, type(None))):
        bad = "test_mre_pct must be a number"
    if bad:
        raise ModelError(f"{meta}: meta.{bad} (as `trainsim stages train` writes it); the file was edited or damaged")


def _check_config(cfg: ModelConfig, meta: Path) -> None:
    """The architecture's sizes as a model needs them (one line naming the field)."""
    for name in ("in_dim", "hidden", "layers", "heads", "members"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelError(f"{meta}: model.{name} must be a positive integer, got {v!r}")
    if isinstance(cfg.work_col, bool) or not isinstance(cfg.work_col, int) or not -1 <= cfg.work_col < cfg.in_dim:
        raise ModelError(f"{meta}: model.work_col must be -1 or a feature column below {cfg.in_dim}, got {cfg.work_col!r}")


def _finite(target: Any, key: str, meta: Path) -> float:
    v = target[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ModelError(f"{meta}: target.{key} must be a finite number, got {v!r}")
    return float(v)


def _check_shapes(cfg: ModelConfig, held: dict[str, tuple[int, ...]]) -> None:
    """The tensors ``cfg``'s model has against those a weights file ``held`` (its header):
    a ValueError naming the first that differs. A model of more layers than the file has
    tensors is refused before it is built (each layer has weights)."""
    if cfg.layers * cfg.members > len(held):
        raise ValueError(f"model.layers {cfg.layers}"
                         + (f" × model.members {cfg.members}" if cfg.members > 1 else "")
                         + f" needs more tensors than the {len(held)} the weights hold")  # fmt: skip
    with torch.device("meta"):  # shapes only: nothing is allocated
        want = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
    for k, shape in want.items():
        if k not in held:
            raise ValueError(f"the model has tensor {k} {list(shape)}, the weights lack it")
        if held[k] != shape:
            raise ValueError(f"tensor {k}: the weights hold {list(held[k])}, the model config gives {list(shape)}")
    extra = sorted(set(held) - set(want))
    if extra:
        raise ValueError(f"the weights hold tensor {extra[0]}, which the model does not have")


def predictor_folder(folder: Path | str, what: str = "") -> Path:
    """``folder`` checked (and created) as where a predictor is written: one-line errors
    (``what``: the option to name, e.g. ``"--out "``). A predictor there is replaced in place;
    a ``predictor.json`` or ``predictor.safetensors`` that is not a predictor's is refused
    (:func:`_foreign`): nothing a user has is overwritten."""
    from trainsim.ir.serialize import output_folder

    out = output_folder(folder, what)
    foreign = _foreign(out)
    if foreign is not None:
        raise ConfigError(f"{what}{out}: {foreign} is not a predictor `trainsim stages train` wrote; "
                          "remove it or write the predictor elsewhere")  # fmt: skip
    return out


def _foreign(folder: Path) -> str | None:
    """The file of ``folder`` a predictor would replace that is not a trainsim predictor's, or None.

    A ``predictor.json`` must be a :data:`PREDICTOR_SCHEMA` document (its weights beside it
    are then its own); weights without one (a first save interrupted between the two files)
    must carry the producer mark :meth:`Predictor.save` writes in their header."""
    meta, weights = folder / "predictor.json", folder / "predictor.safetensors"
    if weights.is_dir():
        return weights.name
    if meta.exists():
        try:
            doc = json.loads(meta.read_bytes())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return meta.name
        return None if isinstance(doc, dict) and doc.get("schema") == PREDICTOR_SCHEMA else meta.name
    if weights.exists():
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(weights), framework="pt") as f:
                mark = (f.metadata() or {}).get("producer")
        except (OSError, SafetensorError):
            return weights.name
        return None if mark == PRODUCER else weights.name
    return None


def _eval_chunks(tensors: Sequence[GraphTensors], batch_size: int, *, padded: bool) -> list[list[int]]:
    """Positions of ``tensors`` in inference batches: by size, and for the padded layout in
    :func:`~trainsim.learn.models.size_chunks` (what a graph gets predicted does not depend on it)."""
    order = sorted(range(len(tensors)), key=lambda i: tensors[i].num_nodes)
    batches = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
    if not padded:
        return batches
    return [[b[i] for i in c] for b in batches for c in size_chunks([tensors[i].num_nodes for i in b])]


def _epoch_loss(model: torch.nn.Module, tensors: Sequence[GraphTensors], y: torch.Tensor, padded: bool,
                batch_size: int = 64) -> float:  # fmt: skip
    model.eval()
    total = 0.0
    with torch.no_grad():
        for ids in _eval_chunks(tensors, batch_size, padded=padded):
            pred = model(collate([tensors[i] for i in ids], padded=padded))
            total += float(torch.abs(pred - y[ids]).sum())
    return total / max(1, len(tensors))


def _prior_log_cost(cfg: ModelConfig, t: GraphTensors) -> float:
    """ln Σ_n (1 + FLOPs_n) over a graph's nodes (the ``sum`` readout's output at zero weights)."""
    lw = t.x[:, cfg.work_col] * math.log(2.0) if cfg.work_col >= 0 else np.zeros(t.num_nodes)
    m = float(np.max(lw))
    return m + math.log(float(np.exp(lw - m).sum()))


def target_scaling(cfg: ModelConfig, train: Sequence[GraphTensors], log_y: np.ndarray, *,
                   per_work: bool) -> tuple[float, float]:  # fmt: skip
    """(μ, σ) of the standardized target ``(ln y − μ) / σ``.

    The ``sum`` readout predicts ``ln Σ_n e^{c_n}``, which is a sum in seconds only if the target is
    not rescaled: σ = 1, and μ centres the target on what the readout gives at zero weights (the
    log of the graphs' summed node work), so training starts from "time proportional to FLOPs".
    """
    if cfg.readout != "sum":
        return float(log_y.mean()), float(log_y.std() or 1.0)
    if per_work:
        raise ConfigError("readout 'sum' adds node costs in seconds: use the log target, not log-per-flop")
    prior = np.array([_prior_log_cost(cfg, t) for t in train])
    return float((log_y - prior).mean()), 1.0


def train_predictor(train: Sequence[GraphTensors], train_latency_s: ArrayLike, val: Sequence[GraphTensors],
                    val_latency_s: ArrayLike, *, model_config: ModelConfig, op_vocab: Sequence[str],
                    config: TrainConfig = TrainConfig(), part: str = "train", input_features: bool = False,
                    per_work: bool = False, log: Callable[[str], None] | None = None,
                    scaling: tuple[float, float] | None = None,
                    on_epoch: Callable[[int, torch.nn.Module], None] | None = None) -> Predictor:  # fmt: skip
    """Fit ``model_config`` on featurized graphs (see :func:`featurize`) and latencies.

    ``scaling`` fixes the target's (μ, σ) instead of taking them from ``train`` (the members of a
    bag share one, :func:`train_members`). ``on_epoch(epoch, model)`` is called after every
    epoch's validation (a bag keeps its members' weights per epoch with it).
    """
    if model_config.members != 1:
        raise ConfigError("train_predictor fits one model; a bag of members is train_members")
    if len(train) < 2 or not val:
        raise ConfigError(
            f"need >= 2 training and >= 1 validation graphs, got {len(train)} and {len(val)}"
        )
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    if per_work and any(t.log_work == 0.0 for t in [*train, *val]):
        raise ConfigError("per-work target needs graphs with FLOPs (rebuild the dataset's graphs)")
    off_tr = np.array([t.log_work for t in train]) if per_work else 0.0
    off_va = np.array([t.log_work for t in val]) if per_work else 0.0
    log_y = np.log(np.asarray(train_latency_s, dtype=float)) - off_tr
    mean, std = scaling or target_scaling(model_config, train, log_y, per_work=per_work)
    y_tr = torch.tensor((log_y - mean) / std, dtype=torch.float32)
    y_va = torch.tensor(
        (np.log(np.asarray(val_latency_s, dtype=float)) - off_va - mean) / std, dtype=torch.float32
    )
    model = build_model(model_config)
    padded = model_config.kind == "dag_transformer"
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.epochs, eta_min=0.0)
    hist = History()
    best_state = copy.deepcopy(model.state_dict())
    t0 = time.perf_counter()
    for epoch in range(config.epochs):
        model.train()
        total = 0.0
        for ids in _batches(train, config.batch_size, rng, by_size=padded):
            opt.zero_grad(set_to_none=True)
            # one optimizer step on the batch's mean MAE; the padded layout computes it in size
            # chunks (less padding; the gradient is the same sum) — models.size_chunks
            chunks = size_chunks([train[i].num_nodes for i in ids]) if padded else [list(range(len(ids)))]
            for c in chunks:
                sub = [ids[i] for i in c]
                pred = model(collate([train[i] for i in sub], padded=padded))
                loss = torch.abs(pred - y_tr[sub]).sum() / len(ids)
                loss.backward()
                total += float(loss.detach()) * len(ids)
            opt.step()
        sched.step()
        hist.train_loss.append(total / len(train))
        val_loss = _epoch_loss(model, val, y_va, padded)
        hist.val_loss.append(val_loss)
        hist.epochs_run = epoch + 1
        if on_epoch is not None:
            on_epoch(epoch, model)
        if val_loss < hist.best_val_loss:
            hist.best_val_loss, hist.best_epoch = val_loss, epoch
            best_state = copy.deepcopy(model.state_dict())
        if log and (epoch % 25 == 0 or epoch == config.epochs - 1):
            left = (time.perf_counter() - t0) / (epoch + 1) * (config.epochs - epoch - 1)
            log(
                f"{model_config.kind} epoch {epoch + 1}/{config.epochs}: train {hist.train_loss[-1]:.4f} "
                f"val {val_loss:.4f} (best at {hist.best_epoch + 1}; at most {left:.0f} s more)"
            )
        if epoch - hist.best_epoch >= config.patience:
            hist.stopped = f"no validation improvement for {config.patience} epochs"
            if log:
                log(f"{model_config.kind}: stopped at epoch {epoch + 1} of {config.epochs}, {hist.stopped}; "
                    f"keeps epoch {hist.best_epoch + 1}'s weights")  # fmt: skip
            break
        elapsed = time.perf_counter() - t0
        # stop before an epoch that would overrun the budget (estimate: the mean epoch time so far)
        if config.max_time_s is not None and elapsed * (epoch + 2) / (epoch + 1) > config.max_time_s:
            hist.stopped = f"time budget {config.max_time_s:.0f} s"
            break
    else:
        hist.stopped = "epochs"
    hist.train_s = time.perf_counter() - t0
    model.load_state_dict(best_state)
    meta = {"train_graphs": len(train), "val_graphs": len(val), "train_config": asdict(config)}
    return Predictor(model_config, list(op_vocab), mean, std, model, pruned=True, history=hist, part=part,
                     input_features=input_features, per_work=per_work, meta=meta)  # fmt: skip


def member_folds(n_labelled: int, n_val: int, members: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, validate) positions of each member in a pool of ``n_labelled`` labelled graphs.

    Member j validates on the ``n_val`` positions from ``j * n_val`` on (wrapping around) and
    trains on the others, so member 0 keeps the split it was given (the pool lists its
    validation graphs first) and every labelled graph trains most members.
    """
    if not 0 < n_val < n_labelled - 1:
        raise ConfigError(f"{n_labelled} labelled graphs cannot give {n_val} to validation and >= 2 to training")
    pos = np.arange(n_labelled)
    out = []
    for j in range(members):
        va = (np.arange(n_val) + j * n_val) % n_labelled
        out.append((np.setdiff1d(pos, va), va))
    return out


def train_members(labelled: Sequence[GraphTensors], latency_s: ArrayLike, n_val: int, *,
                  model_config: ModelConfig, op_vocab: Sequence[str], config: TrainConfig = TrainConfig(),
                  part: str = "train", input_features: bool = False, per_work: bool = False,
                  log: Callable[[str], None] | None = None) -> Predictor:  # fmt: skip
    """A cross-validated bag: ``config.members`` models, each early-stopped on its own fold.

    ``labelled`` lists the validation graphs first (``n_val`` of them), then the training ones.
    With few labelled stages (003's protocol at 30 %: 8 train, 3 validate) the epoch early
    stopping picks depends on which three stages validate, and one mis-measured validation stage
    can stop a model at epoch 10; member j validates on fold j (:func:`member_folds`), trains on
    the rest, and the bag predicts the mean of the members' log latencies. The members share the
    target scaling of the whole labelled set and split the time budget: each member may use an
    equal share of what is left when it starts, so time a member stopped early leaves to the rest.

    ``config.stop == "common"`` chooses one epoch for the whole bag instead, k-fold style: every
    member runs the schedule without patience (its weights kept after each epoch), and each is
    restored at the epoch where the members' validation losses, averaged, are lowest (over the
    epochs all members reached). The epoch is then picked on ``k · n_val`` validation stages,
    not on ``n_val``.
    """
    k = config.members
    if k < 2:
        raise ConfigError(f"a bag needs at least 2 members, got {k}")
    check_stop(config.stop, k)
    common = config.stop == "common"
    lat = np.asarray(latency_s, dtype=float)
    one = replace(model_config, members=1)
    off = np.array([t.log_work for t in labelled]) if per_work else 0.0
    scaling = target_scaling(one, labelled, np.log(lat) - off, per_work=per_work)
    models: list[torch.nn.Module] = []
    hists: list[History] = []
    states: list[list[dict[str, torch.Tensor]]] = []  # "common": each member's weights per epoch
    for j, (tr, va) in enumerate(member_folds(len(labelled), n_val, k)):
        # each member gets an equal share of what the members before it left unspent
        budget = None
        if config.max_time_s is not None:
            budget = (config.max_time_s - sum(h.train_s for h in hists)) / (k - j)
        kept: list[dict[str, torch.Tensor]] = []
        states.append(kept)

        def keep(_epoch: int, m: torch.nn.Module, kept: list[dict[str, torch.Tensor]] = kept) -> None:
            kept.append({n: v.detach().clone() for n, v in m.state_dict().items()})

        mc = replace(config, seed=config.seed + j, max_time_s=budget, members=1)
        if common:
            mc = replace(mc, patience=config.epochs)
        p = train_predictor([labelled[i] for i in tr], lat[tr], [labelled[i] for i in va], lat[va],
                            model_config=one, op_vocab=op_vocab, config=mc,
                            part=part, input_features=input_features, per_work=per_work, log=log,
                            scaling=scaling, on_epoch=keep if common else None)  # fmt: skip
        models.append(p.model)
        assert p.history is not None
        hists.append(p.history)
    if common:
        reach = min(h.epochs_run for h in hists)
        curve = np.mean([h.val_loss[:reach] for h in hists], axis=0)
        epoch = int(np.argmin(curve))
        for m, h, kept in zip(models, hists, states, strict=True):
            m.load_state_dict(kept[epoch])
            h.best_epoch, h.best_val_loss = epoch, h.val_loss[epoch]
        states.clear()
    hist = History(epochs_run=sum(h.epochs_run for h in hists), best_epoch=int(np.median([h.best_epoch for h in hists])),
                   best_val_loss=float(np.mean([h.best_val_loss for h in hists])), train_s=sum(h.train_s for h in hists),
                   stopped="; ".join(sorted({h.stopped for h in hists})))  # fmt: skip
    meta = {"train_graphs": len(labelled) - n_val, "val_graphs": n_val, "train_config": asdict(config),
            "members": [{"best_epoch": h.best_epoch, "epochs": h.epochs_run, "best_val_loss": h.best_val_loss,
                         "train_s": h.train_s, "stopped": h.stopped} for h in hists]}  # fmt: skip
    return Predictor(replace(one, members=k), list(op_vocab), scaling[0], scaling[1], Members(models), pruned=True,
                     history=hist, part=part, input_features=input_features, per_work=per_work, meta=meta)  # fmt: skip


def mre_pct(pred_s: ArrayLike, true_s: ArrayLike) -> float:
    """003 Eq. 5: mean relative error in percent."""
    p, t = np.asarray(pred_s, dtype=float), np.asarray(true_s, dtype=float)
    return float(np.mean(np.abs(p - t) / t) * 100.0)


__all__ = [
    "PREDICTOR_SCHEMA",
    "STOP_MODES",
    "History",
    "Predictor",
    "TrainConfig",
    "check_stop",
    "featurize",
    "member_folds",
    "mre_pct",
    "target_scaling",
    "train_members",
    "train_predictor",
]
