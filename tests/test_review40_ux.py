"""Review 40, a new user's walk through README.md and docs/ (helper ux_review).

Each case was a traceback, a hang, a silent wrong answer or a message that named the wrong
thing:

* ``shard --world 1e20`` was an OverflowError traceback (a sharder sized a per-rank list by it
  before the batch was checked); ``--capacity-gb 1e308`` (inf bytes) named "capacity ... bytes";
* ``search --trim-end-stages 1e11`` never returned (end_stage_splits looped over every trim);
* ``validate search --files runs.csv`` of single runs said "validated no case under
  <the shared data folder>", which the file has nothing to do with;
* ``--step -1`` (analyze, replay) was blamed on the first trace file, after reading it;
* an empty hardware YAML or model spec said "expected a mapping at the top level"; a folder
  given as ``--system``/``--device`` (or to ``hw show``) was an "unknown system" name;
  ``validate llm --files DIR`` an "unknown ground-truth tag";
* ``search --recompute ''`` searched the default modes in silence (``--schedule ''`` is refused);
* ``--family`` errors printed a Python list (``['gpt', 'moe']``);
* ``--format``'s help read three ways; ``fit``'s summary in ``trainsim --help`` broke mid-line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli_review import _error, _run, _usage

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "examples" / "dlrm_tables.json"
DLRM = ROOT / "examples" / "data" / "param_dlrm_8xv100"


def test_shard_world_beyond_the_batch_is_one_line_not_an_overflow():
    msg = _error(_run("shard", str(TABLES), "--world", str(10**20), "--device", "a100-sxm4-80gb"))
    assert f"--world {10**20}" in msg and "batch 4096" in msg and "dlrm_tables.json" in msg
    from trainsim.builders.dlrm import load_dlrm_spec
    from trainsim.errors import ConfigError
    from trainsim.search.sharders import select_sharder

    with pytest.raises(ConfigError, match="smaller than the world size"):  # the API too
        select_sharder(load_dlrm_spec(TABLES), 10**20, device="a100-sxm4-80gb")


def test_shard_capacity_that_overflows_bytes_names_the_flag():
    msg = _usage(_run("shard", str(TABLES), "--world", "2", "--device", "a100-sxm4-80gb", "--capacity-gb", "1e308"))
    assert msg.startswith("--capacity-gb must be a positive number of GB")


@pytest.mark.timeout(60)
def test_a_trim_beyond_the_layers_returns_the_same_splits():
    from trainsim.search.space import end_stage_splits

    for layers, pp in ((32, 2), (61, 16), (24, 3), (80, 8)):
        assert list(end_stage_splits(layers, pp, 10**11)) == list(end_stage_splits(layers, pp, 2 * layers))
    # and the bound loses nothing: no split past 2 x layers, at any size
    for layers in range(1, 40):
        for pp in range(2, 20):
            assert list(end_stage_splits(layers, pp, 2 * layers)) == list(end_stage_splits(layers, pp, 6 * layers))


def test_validate_search_of_single_runs_says_why(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text("model,system,gpus,tp,pp,micro_batch,global_batch,iteration_ms\n"
                    "llama2-7b,dgx-a100,16,2,2,2,256,15000\n", encoding="utf-8")  # fmt: skip
    msg = _error(_run("validate", "search", "--files", str(runs), "--data", str(tmp_path)))
    assert "no plans to rank" in msg and "two or more runs" in msg and "under" not in msg
    assert "llama2-7b on 16 GPUs, global batch 256, dgx-a100" in msg


def test_validate_llm_files_folder_is_named_a_folder(tmp_path):
    msg = _error(_run("validate", "llm", "--files", str(tmp_path), "--data", str(tmp_path)))
    assert msg == f"--files {tmp_path}: is a folder; give a CSV file of measured runs (docs/llm.md)"


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_a_bad_step_selector_names_the_option_before_any_trace_is_read(tmp_path, command):
    msg = _usage(_run(command, str(tmp_path / "no-such-trace.json"), "--step", "-1"))
    assert msg == "--step must be median, first, last or a ProfilerStep number (0, 1, ...), got '-1'"
    # the selectors it takes still run
    res = _run("analyze", str(DLRM), "--step", "last", "--format", "json")
    assert res.exit_code == 0, res.output


def test_empty_hardware_files_say_they_are_empty(tmp_path):
    empty = tmp_path / "mine.yaml"
    empty.write_text("# nothing yet\n", encoding="utf-8")
    msg = _error(_run("predict", "llama2-7b", "--system", str(empty)))
    assert msg.startswith(f"{empty}: file is empty; expected a system YAML mapping")
    msg = _error(_run("shard", str(TABLES), "--world", "2", "--device", str(empty)))
    assert msg.startswith(f"{empty}: file is empty; expected a device YAML mapping")
    msg = _error(_run("hw", "show", str(empty)))
    assert msg.startswith(f"{empty}: file is empty; expected a device or system YAML mapping")


def test_a_folder_given_for_hardware_is_named_a_folder(tmp_path):
    folder = tmp_path / "my_cluster"
    folder.mkdir()
    assert _error(_run("predict", "llama2-7b", "--system", str(folder))) == (
        f"system {folder}: is a folder; give a system YAML file or a catalog name")
    assert "is a folder" in _error(_run("shard", str(TABLES), "--world", "2", "--device", str(folder)))
    assert _error(_run("hw", "show", str(folder))).startswith(f"{folder}: is a folder")


@pytest.mark.parametrize("name", ["m.yaml", "config.json"])
def test_an_empty_model_file_says_it_is_empty(tmp_path, name):
    empty = tmp_path / name
    empty.write_text("\n", encoding="utf-8")
    assert _error(_run("predict", str(empty))).startswith(f"{empty}: file is empty; expected a ")


def test_search_refuses_an_empty_recompute_list():
    msg = _usage(_run("search", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--recompute", ""))
    assert msg == "--recompute must be among none, selective, full, got ''"


def test_family_errors_list_the_names_not_a_python_list():
    measured = ROOT / "src" / "trainsim" / "learn" / "data" / "predtop" / "gpt-search"
    msg = _usage(_run("stages", "search", "--family", "bert", "--devices", "8", "--measured", str(measured)))
    assert msg == "--family must be one of gpt, moe, got 'bert'"
    from trainsim.errors import ConfigError
    from trainsim.learn.dataset import sample_stages

    with pytest.raises(ConfigError, match=r"^family must be one of gpt, moe, got 'bert'$"):
        sample_stages("bert", 1)


def _commands():
    import typer.main

    from trainsim.cli.main import _register, app

    _register()

    def walk(cmd, path):
        for name, sub in getattr(cmd, "commands", {}).items():
            yield (*path, name), sub
            yield from walk(sub, (*path, name))

    return list(walk(typer.main.get_command(app), ()))


def test_format_help_reads_the_same_on_every_command():
    helps = {}
    for path, cmd in _commands():
        for p in cmd.params:
            if "--format" in getattr(p, "opts", ()) and path != ("stages", "collect"):  # collect: stdout either way
                helps[" ".join(path)] = p.help
    assert len(helps) >= 15
    assert {k: v for k, v in helps.items() if v != "table or json (JSON goes to stdout alone)."} == {}


def test_every_command_summary_is_one_line_in_the_listing():
    broken = [" ".join(path) for path, cmd in _commands() if "\n" in (cmd.help or "").strip().split("\n\n")[0]]
    assert broken == []


def test_a_cost_beyond_a_float_is_refused_not_ranked_as_a_tie():
    """1e308 tokens at 1e308 a GPU-hour made every plan's cost inf: the table ranked them in
    enumeration order (a slower plan first) with exit 0."""
    msg = _error(_run("search", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--objective", "cost",
                      "--train-tokens", "1e308", "--gpu-hour-price", "1e308"))  # fmt: skip
    assert msg.startswith("--train-tokens 1e+308 and --gpu-hour-price 1e+308: the cost of plan ")
    assert msg.endswith("is inf (beyond a float); give smaller numbers")
