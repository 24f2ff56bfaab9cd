"""``trainsim validate SUITE``: accuracy suites against real data, with per-case errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, stderr
from trainsim.validate.registry import default_data_dir, suite_names


@app.command()
def validate(
    *,
    suite: str = typer.Argument(..., metavar="SUITE", help=f"Suite: {', '.join(suite_names())}."),
    data: Path = typer.Option(default_data_dir(), "--data", help="The shared data folder (traces/, comm/, calibration/, ...)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
    overheads: str | None = typer.Option(None, "--overheads", help="replay: host gaps from stats (default), trace, or shared (leave-one-out)."),
    kernels: str | None = typer.Option(None, "--kernels", help="replay: kernel durations measured (default) or model."),
    files: str | None = typer.Option(None, "--files", help="llm, search: ground-truth sets (vtrain-multi, vtrain-single, seed001, and the shipped h100-gpt2, h100-llama, h100-llama13, h100-llama70), or a CSV of your own measured runs (columns model, system, iteration_ms, plan fields: docs/llm.md); comma-separated."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="llm: only the first N rows of each file; shard: only the first N table sets; cpu-e2e, gpu-e2e: only the first N models; memory: only the first N cases."),
    sets: int | None = typer.Option(None, "--sets", min=1, help="shard: random table sets to measure (default 10)."),
    repeats: int | None = typer.Option(None, "--repeats", min=1, help="shard: measurement repeats per sharder (interleaved); cpu-e2e: captures per configuration."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="shard: seed of the table sets; kernels: seed of the held-out split; predtop: seed of the train/test split and of the training (default 0)."),
    device: str | None = typer.Option(None, "--device", help="kernels: a100 (default), gh200 or all."),
    resume: str | None = typer.Option(None, "--resume", help="shard: JSONL file of measurements to reuse and append to; cpu-e2e: folder of captures to reuse; gpu-e2e: folder of GPU captures (default: the shipped H100 set); predtop: results folder to reuse (cases; predictors and search results too, not with --protocol)."),
    fractions: str | None = typer.Option(None, "--fractions", help="predtop: training fractions, comma-separated or 'all' (10 %–80 %); default 0.3."),
    models: str | None = typer.Option(None, "--models", help="predtop: dag_transformer,gcn,gat (default: all three)."),
    features: str | None = typer.Option(None, "--features", help="predtop: table1 (003 Table I) or table1+work (default)."),
    dataset: str | None = typer.Option(None, "--dataset", help="predtop: folder with gpt/, moe/ (and *-search/) stage datasets; default: the packaged ones."),
    protocol: bool = typer.Option(False, "--protocol", help="predtop: 003's own protocol instead (gpt-003/, moe-003/: one model, a predictor per Table III configuration; default fractions 10, 30, 80 %)."),
    members: int | None = typer.Option(None, "--members", min=1, help="predtop: train each predictor as a cross-validated bag of this many models, each early-stopped on its own validation fold (default 1: one model)."),
    readout: str | None = typer.Option(None, "--readout", help="predtop: the models' pooling — logsumexp (default), sum (node costs added in seconds), add (003 Eq. 2 as written), work."),
    stop: str | None = typer.Option(None, "--stop", help="predtop with --members: each member early-stopped on its own validation fold (each, default), or all at the epoch of the lowest mean validation loss over the folds (common)."),
    epochs: int | None = typer.Option(None, "--epochs", min=1, help="predtop: most training epochs per predictor (default 250; --protocol 500): fewer for a quick check, with figures that are not the suite's."),
    per: str | None = typer.Option(None, "--per", help="predtop --protocol: a predictor per Table III configuration (config, default) or per mesh (mesh: 003 §VI, one model for a mesh's configurations)."),
) -> None:  # fmt: skip
    """Run an accuracy suite and print every case's error beside the summary."""
    import os

    from trainsim.envvars import COMM_MODELS_ENV as COMM_ENV
    from trainsim.envvars import KERNEL_MODELS_ENV as KERNEL_ENV
    from trainsim.errors import ConfigError
    from trainsim.validate.registry import run_suite

    for name in (KERNEL_ENV, COMM_ENV):  # suites measure the shipped models, never a user's
        if os.environ.pop(name, None):
            stderr.print(f"note: ${name} ignored: validate measures the shipped models")

    params: dict[str, Any] = {
        "overheads": overheads, "kernels": kernels, "files": files, "limit": limit, "sets": sets, "repeats": repeats,
        "seed": seed, "resume": resume, "device": device, "fractions": fractions, "models": models,
        "features": features, "dataset": dataset, "protocol": protocol or None, "readout": readout,
        "members": members, "per": per, "stop": stop, "epochs": epochs,
    }  # fmt: skip
    _check_options(suite, params)
    with stderr.status(f"running suite {suite}...", spinner="dots"):
        doc = run_suite(suite, data, **params)
    if fmt is Format.JSON:
        emit_json(doc)
    else:
        _print_table(doc)
    # after the report: a run that validated nothing, or could not read a case it has, fails
    # replay: summary counts replayable cases, summary_all every evaluated one
    key = "summary_all" if isinstance(doc.get("summary_all"), dict) else "summary"
    summary: dict[str, Any] = doc[key] if isinstance(doc.get(key), dict) else {}
    failed = [c for c in doc.get("cases", []) if isinstance(c, dict) and c.get("status") == "failed"]
    if failed:
        raise ConfigError(f"suite {suite}: {len(failed)} case(s) failed; first: {failed[0].get('case', '?')}: "
                          f"{failed[0].get('reason', '')}")  # fmt: skip
    if summary.get("cases") == 0:
        why = next((c.get("reason") for c in doc.get("cases", []) if isinstance(c, dict) and c.get("reason")), None)
        raise ConfigError(f"suite {suite} validated no case under {data}" + (f" (e.g. {why})" if why else ""))


def _check_options(suite: str, params: dict[str, Any]) -> None:
    """The suite and its options on their own, before any data are read or anything is measured:
    a usage error (exit 2) naming the option."""
    from trainsim.cli.usage import one_of, usage
    from trainsim.sim.options import HostMode, KernelSource
    from trainsim.validate.registry import check_params

    with usage():
        check_params(suite, **params)  # the suite, and the options it takes
    for key, enum in (("overheads", HostMode), ("kernels", KernelSource)):
        if params[key] is not None:
            one_of(params[key], [e.value for e in enum], f"--{key}")
    if suite == "kernels" and params["device"] is not None:
        from trainsim.validate.kernels_suite import DEVICES

        one_of(params["device"], [*DEVICES, "all"], "--device")
    if suite == "predtop":
        from trainsim.learn.suite import check_predtop_options

        given = {k: v for k, v in params.items() if v is not None and k not in ("seed", "dataset", "limit")}
        with usage():
            check_predtop_options(**given)


# shard: a set's choice, its regret, rank agreement, the repeat-to-repeat noise (— when not
# measured: fewer than 2 repeats with clean steps) and whether the times were contended
_SHARD_COLUMNS = ("case", "tables", "status", "predicted", "fastest", "regret_pct", "success",
                  "spearman", "noise_pct", "contended")  # fmt: skip


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if unit == "ms":
            return f"{v * 1e3:.3f}"
        if unit == "%":
            return f"{v:+.2f}"
        return f"{v:.3g}"
    return str(v)


def _print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console

    out = Console(width=None if sys.stdout.isatty() else 160)
    cases = doc["cases"]
    if doc.get("suite") == "search":
        _print_search(out, doc)
    elif doc.get("suite") == "memory":
        out.print(_memory_table(doc))
    elif cases and "measured_step_s" in next((c for c in cases if c.get("status") == "ok"), {}):
        out.print(_replay_table(doc))
        for c in cases:
            if c.get("status") == "ok" and c.get("replayable") is False:
                out.print(f"[red]not replayable[/] {c['case']}: {c.get('reason', '')}")
    else:
        t = Table(title=f"suite {doc['suite']}", title_justify="left")
        keys = [k for k in (cases[0] if cases else {}) if not isinstance(cases[0][k], list | dict)][
            :8
        ]
        if cases and "err_pct" in cases[0] and "err_pct" not in keys:  # llm: error beside measured
            keys = [k for k in keys if k not in ("group", "gpus")] + ["err_pct"]  # the id names the group
        if doc.get("suite") == "shard":  # fixed columns: the first case may be incomplete
            keys = list(_SHARD_COLUMNS)
        for k in keys:
            t.add_column(k)
        for c in cases:
            t.add_row(*(_fmt(c.get(k)) for k in keys))
        out.print(t)
        for c in cases if doc.get("suite") == "shard" else ():  # e.g. a contended set
            for w in c.get("warnings") or ():
                out.print(f"[yellow]warning:[/] {w}")
        for key, title in (("seq_cases", "along the sequence"), ("hidden_cases", "along the hidden size")):
            if doc.get(key):  # cpu-e2e: the same resize along the sequence or the hidden size
                st = Table(title=title, title_justify="left")
                # the case, both steps, our error and the linear-scaling baseline's
                skeys = [k for k in ("case", "heads", "measured_s", "predicted_s", "error_pct", "naive_error_pct")
                         if k in doc[key][0]]  # fmt: skip
                for k in skeys:
                    st.add_column(k)
                for c in doc[key]:
                    st.add_row(*(_fmt(c.get(k)) for k in skeys))
                out.print(st)
        s001 = [c for c in cases if c.get("group") == "seed001"]
        if s001:  # comm: paper 001's sweeps, ours beside the paper's and the data's noise floor
            t = Table(title="paper 001's NCCL sweeps: held-out MAPE % (ours on the plausible held-out rows, then on "
                            "all of them; bad rows: faster than the links allow)", title_justify="left")  # fmt: skip
            for k in ("case", "points", "bad rows", "ours", "ours, all rows", "piecewise", "paper 001",
                      "neighbours' median", "family"):  # fmt: skip
                t.add_column(k, no_wrap=k == "case")
            for c in s001:
                bad = f"{c.get('implausible_rows', 0)}/{c.get('rows', 0)}" if c.get("rows") else "—"
                t.add_row(c["name"], str(c.get("points", 0)), bad, _fmt(c.get("mape_pct")), _fmt(c.get("mape_all_rows_pct")),
                          _fmt(c.get("piecewise_mape_pct")), _fmt(c.get("paper_error_pct")),
                          _fmt(c.get("neighbour_mape_pct")), c.get("family") or c.get("unusable", "—"))  # fmt: skip
            out.print(t)
        for g, v in doc.get("groups", {}).items():  # llm: per file, beside the published tools
            pub = ", ".join(f"{n} {x}" for n, x in v.get("published_mape_pct", {}).items())
            out.print(f"{g}: MAPE {_fmt(v.get('mape_pct'))} % (target {_fmt(v.get('target_mape_pct'))}; "
                      f"published: {pub or '—'}), median {_fmt(v.get('median_abs_err_pct'))}, max {_fmt(v.get('max_abs_err_pct'))}")  # fmt: skip
    if "mre_table" in doc:  # predtop: 003 Tables V/VI
        for fam, rows in doc["mre_table"].items():
            mt = Table(title=f"{fam}: test MRE % by training fraction", title_justify="left")
            kinds = sorted({k for cell in rows.values() for k in cell})
            for col in ("fraction", *kinds):
                mt.add_column(col, justify="right")
            for fr in sorted(rows, key=float):
                mt.add_row(f"{float(fr):.0%}", *(_fmt(rows[fr].get(k)) for k in kinds))
            out.print(mt)
        for fam, cols in doc.get("protocol_table", {}).items():  # 003 Table V: a column per configuration
            prm = doc.get("params", {})
            k = int(prm.get("members", 1))
            bag = "one model" if k == 1 else f"bags of {k}, {prm.get('stop', 'each')} stop"
            setting = (f"readout {prm.get('readout', 'logsumexp')}, {bag}, "
                       f"a predictor per {prm.get('per', 'config')}")  # fmt: skip
            pt = Table(title=f"{fam} (003 protocol): test MRE % per configuration ({setting})", title_justify="left")
            for col in ("fraction", "model", *doc["configs"], "mean"):
                pt.add_column(col, justify="right")
            for fr in sorted(cols, key=float):
                for kind, per in sorted(cols[fr].items()):
                    have = sum(per.get(c) is not None for c in doc["configs"])
                    mean = _fmt(doc["mre_table"][fam][fr][kind])
                    if have < len(doc["configs"]):  # a mean over fewer columns is not comparable
                        mean += f" ({have} of {len(doc['configs'])})"
                    pt.add_row(f"{float(fr):.0%}", kind, *(_fmt(per.get(c)) for c in doc["configs"]), mean)
            out.print(pt)
        if doc.get("protocol_table"):
            from trainsim.learn.protocol import RUNTIME_CONFIGS

            out.print("columns (003 Table III; mesh m, configuration c): " + ", ".join(
                f"{c.label} {c.describe()}" for c in RUNTIME_CONFIGS if c.label in doc["configs"]))  # fmt: skip
        for fam, srch in doc.get("search", {}).items():
            for name, a in srch["approaches"].items():
                out.print(f"search {fam} {name}: measured {a['measured']}/{srch['candidates']} stages, "
                          f"cost saved {a['saved_pct']:.1f} %, mean regret {a['mean_regret_pct']:.2f} % "
                          f"(max {a['max_regret_pct']:.2f}), stage MRE {a['mre_pct']:.2f} %")  # fmt: skip
    if doc.get("suite") == "predtop":
        _print_predtop_summary(out, doc)
        return
    for key in ("summary", "summary_all"):
        if key not in doc:
            continue
        label = {"summary": "summary", "summary_all": "summary (all cases)"}[key]
        if key == "summary" and "summary_all" in doc:
            label = "summary (replayable cases)"
        hide = {"rows_reused"} if doc.get("suite") == "shard" else set()  # = rows_copied_identical
        parts = [
            f"{k} {_fmt(v)}"
            for k, v in doc[key].items()
            if not isinstance(v, list | dict) and k not in hide
        ]
        out.print(f"{label}: " + ", ".join(parts))
        if doc.get("suite") == "shard":
            for w in doc[key].get("warnings") or ():
                out.print(f"[yellow]warning:[/] {w}")
    if isinstance(doc.get("kernel_models"), str):  # where the predictions' kernel times came from
        out.print(f"kernel models: {doc['kernel_models']}")
    if doc.get("suite") == "memory":
        _print_memory_summary(out, doc["summary"])


def _memory_table(doc: dict[str, Any]) -> Table:
    """memory: per case, measured and predicted peak, the error, the moment the prediction
    peaks at and the every-term baseline's error (the case's name carries its family, shape,
    optimizer, checkpointing and dtype; on a narrow terminal it folds, the figures stay whole)."""
    t = Table(title="suite memory: peak MiB of eager training steps on this CPU", title_justify="left")
    cols = ("case", "measured\nMiB", "predicted\nMiB", "err %", "predicted\nmoment", "every-term\nerr %")
    for col in cols:  # the case folds and the moment wraps between its words; the figures stay whole
        t.add_column(col, justify="left" if col in ("case", "predicted\nmoment") else "right",
                     no_wrap=col not in ("case", "predicted\nmoment"), overflow="fold" if col == "case" else "ellipsis")  # fmt: skip
    for c in doc["cases"]:
        t.add_row(str(c.get("case", "?")), _fmt_mib(c.get("measured_mib")), _fmt_mib(c.get("predicted_mib")),
                  _fmt(c.get("err_pct"), "%"), str(c.get("phase", "—")).replace("-", " "),
                  _fmt(c.get("every_term_err_pct"), "%"))  # fmt: skip
    return t


def _fmt_mib(v: Any) -> str:
    return "—" if not isinstance(v, int | float) else f"{v:,.1f}"


def _print_memory_summary(out: Any, summary: dict[str, Any]) -> None:
    """memory: the error by the moment each prediction peaks at, and the baseline beside it."""
    def line(s: dict[str, Any]) -> str:
        n = s.get("cases", 0)
        return f"MAPE {_fmt(s.get('mape_pct'))} %, max {_fmt(s.get('max_abs_err_pct'))} % ({n} case{'' if n == 1 else 's'})"

    for phase, s in (summary.get("by_predicted_phase") or {}).items():
        out.print(f"  predicted at {phase.replace('-', ' ')}: {line(s)}")
    if isinstance(summary.get("every_term"), dict):
        out.print(f"baseline, every term alive at once (the fused stacks' sum): {line(summary['every_term'])}")


def _print_predtop_summary(out: Any, doc: dict[str, Any]) -> None:
    """The predtop summary in words: the contract's error figures, the wins, the acceptance."""
    sm = doc["summary"]
    over = "the DAG Transformer's test MRE" if "DAG" in str(sm.get("errors_of", "")) else "every case's test MRE"
    per = "per (configuration, fraction)" if doc.get("protocol_table") else "per (family, fraction)"
    wall = sm.get("wall_s")
    took = "—" if wall is None else f"{wall:.1f} s" if wall < 600 else f"{wall / 60:.0f} min"
    out.print(f"summary over {sm.get('cases', 0)} cases ({over} {per}): mean {_fmt(sm.get('mape_pct'))} %, median "
              f"{_fmt(sm.get('median_abs_err_pct'))} %, max {_fmt(sm.get('max_abs_err_pct'))} %; {took}")  # fmt: skip
    if sm.get("cases_compared"):
        out.print(f"the DAG Transformer has the lowest MRE in {sm['dag_transformer_wins']} of "
                  f"{sm['cases_compared']} rows (family, fraction)")  # fmt: skip
    else:
        out.print("wins: not counted (a row needs all three models: --models dag_transformer,gcn,gat)")
    at30 = {k.removesuffix("_dag_transformer_mre_at_30pct"): v for k, v in sm.items()
            if k.endswith("_dag_transformer_mre_at_30pct")}  # fmt: skip
    at30 = at30 or dict((doc.get("summary") or {}).get("dag_transformer_mre_at_30pct") or {})
    acc = {k.removeprefix("acceptance_"): v for k, v in sm.items() if k.startswith("acceptance_")} or sm.get("acceptance", {})
    words = {"mre_at_30pct_le_4": "DAG Transformer MRE ≤ 4 % at 30 % training on each family",
             "wins_ge_75pct": "lowest of the three models in ≥ 75 % of the rows",
             "train_le_15min": "each predictor trained within 15 min"}  # fmt: skip
    ran_30 = {f: v for f, v in at30.items() if v is not None}
    if ran_30:
        out.print("DAG Transformer at 30 % training: " + ", ".join(f"{f} {_fmt(v)} %" for f, v in ran_30.items()))
    counted = bool(sm.get("cases_compared") or sm.get("complete_rows"))
    for k, v in acc.items():
        # a target whose cases were not run is not judged ("not met" read as a measured miss)
        judged = (k != "mre_at_30pct_le_4" or bool(ran_30)) and (k != "wins_ge_75pct" or counted)
        state = ("met" if v else "not met") if judged else "not judged (its cases were not run)"
        out.print(f"target: {words.get(k, k)}: {state}")


def _plan_cells(labels: list[str]) -> tuple[list[str], str]:
    """Plan labels for a table: without ``-gbN`` (a column of its own) and without the settings
    every one of them ends with (``-rc-full-fp16-attn-fused`` on vTrain's rows; degrees and
    micro-batch are always kept), and that end."""
    import re

    split = [re.sub(r"-gb\d+", "", x).split("-") for x in labels]
    n = 0
    degree = re.compile(r"^((tp|pp|dp|cp|ep|mb|zero|vpp)\d+|sp|distopt|gpipe)$")  # the plan's shape: kept
    while (split and all(len(t) > n + 1 for t in split) and len({t[-1 - n] for t in split}) == 1
           and not degree.match(split[0][-1 - n])):  # fmt: skip
        n += 1
    while n and split[0][-n] in ("full", "selective", "fused", "unfused"):  # "rc-full", "attn-fused" whole
        n -= 1
    if n == 0:
        return ["-".join(t) for t in split], ""
    return ["-".join(t[:-n]) for t in split], "-" + "-".join(split[0][-n:])


def _print_search(out: Any, doc: dict[str, Any]) -> None:
    """Per group: the predicted-best plan, its measured time against the measured best (the
    regret) and Spearman's rho; then each file's figures beside its targets."""
    t = Table(title="suite search: the predicted-best plan of each group, measured", title_justify="left")
    for col in ("file", "model", "GPUs", "global batch", "plans", "predicted best", "its measured s",
                "measured best", "best s", "regret %", "Spearman"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("file", "model", "predicted best", "measured best") else "right",
                     no_wrap=col in ("file", "model", "predicted best", "measured best", "its measured s"))  # fmt: skip
    by_file: dict[str, list[dict[str, Any]]] = {}
    for g in doc["cases"]:
        by_file.setdefault(g["file"], []).append(g)
    ends = []
    for name, groups in by_file.items():  # each file's plans share their precision, attention, ...
        cells, end = _plan_cells([x for g in groups for x in (g["predicted_best"], g["measured_best"])])
        ends += [f"{name} {end}"] if end else []
        for i, g in enumerate(groups):
            t.add_row(g["file"], g["model"], str(g["gpus"]), str(g["global_batch"]), str(g["plans"]), cells[2 * i],
                      f"{g['predicted_best_measured_s']:.4g}", cells[2 * i + 1], f"{g['measured_best_s']:.4g}",
                      f"{g['regret_pct']:.2f}", "—" if g["spearman"] is None else f"{g['spearman']:.3f}")  # fmt: skip
    out.print(t)
    if ends:
        out.print("plans are shown without their global batch (its column) and the end all of a file's plans "
                  f"share: {'; '.join(ends)} (JSON: whole labels)")  # fmt: skip
    for name, f in doc.get("files", {}).items():
        target = ("" if f.get("target_mean_regret_pct") is None else
                  f" (target ≤ {f['target_mean_regret_pct']:g} %, Spearman ≥ {f['target_median_spearman']:g})")
        pub = ", ".join(f"{n} {r:g} % / {s:g}" for n, (r, s) in f.get("published", {}).items())
        rho = "—" if f.get("median_spearman") is None else f"{f['median_spearman']:.3f}"
        out.print(f"{name}: mean regret {f['mean_regret_pct']:.2f} %, median Spearman {rho}{target}; "
                  f"max regret {f['max_regret_pct']:.2f} %, predicted best = measured best in {f['picked_best']} "
                  f"of {f['groups']} groups" + (f"; published: {pub}" if pub else ""))  # fmt: skip


def _replay_table(doc: dict[str, Any]) -> Table:
    """Per case: measured vs predicted, the kernel-sum baseline, and how much of the step the
    trace leaves unexplained (``replayable``: within the suite's target)."""
    t = Table(title=f"suite {doc['suite']} {doc.get('params', '')}", title_justify="left")
    cols = ("case", "ranks", "measured ms", "predicted ms", "err %", "kernel-sum ms",
            "kernel-sum err %", "unexplained %", "replayable")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "case" else "right")
    for c in doc["cases"]:
        if c.get("status") != "ok":
            t.add_row(c["case"], "", "", "", f"[yellow]{c.get('status')}[/]", "",
                      c.get("reason", "")[:60], "", "")  # fmt: skip
            continue
        replayable = c.get("replayable")
        mark = "—" if replayable is None else "yes" if replayable else "[red]no[/]"
        cover = c.get("kernel_model_coverage", 1.0)
        if cover is not None and cover < 1.0:  # --kernels model: how many kernels a model timed
            mark += f" ({100 * cover:.0f} % modelled)"
        unexplained = c.get("unexplained_step_pct")
        t.add_row(c["case"], str(c["ranks"]), _fmt(c["measured_step_s"], "ms"), _fmt(c["predicted_step_s"], "ms"),
                  _fmt(c["error_pct"], "%"), _fmt(c["kernel_sum_baseline_s"], "ms"),
                  _fmt(c["baseline_error_pct"], "%"),
                  "—" if unexplained is None else f"{unexplained:.2f}", mark)  # fmt: skip
    return t
