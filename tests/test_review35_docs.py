"""Session-35 documentation walkthrough: the commands and links the docs show must still exist.

Each check reads README.md and docs/*.md as a new user would: every ``trainsim`` command in a
shell block or an inline code span must parse with today's CLI (its subcommand, its options and
their choices; nothing is run), every relative link must reach a file (and a heading), and
``--help`` must name what the docs tell users to pass.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SHELL = {"", "bash", "sh", "shell", "console", "text"}
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # `--limit N`, `DIR`: the user's value


def _doc_commands() -> Iterator[tuple[str, str]]:
    """(where, command line) of every `trainsim ...` the docs show, continuations joined."""
    for path in DOCS:
        fence: str | None = None
        pending = ""
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            s = line.strip()
            if s.startswith("```"):
                fence = s[3:].strip() if fence is None else None
                continue
            where = f"{path.name}:{no}"
            if fence is not None:
                if fence not in _SHELL:
                    continue
                s = pending + s
                if s.endswith("\\"):
                    pending = s[:-1] + " "
                    continue
                pending = ""
                if not s.startswith("#"):
                    yield where, s
            else:
                for m in re.finditer(r"`((?:python -m )?trainsim [^`]+)`", line):
                    yield where, m.group(1).replace("\\|", "|")


def _invocations(text: str) -> Iterator[list[str]]:
    """The argument lists of the trainsim calls in one shell line: comments dropped, `&&`, `;`
    and pipes split, synopsis brackets opened and `a|b` alternatives read as their first."""
    text = re.sub(r"\s#.*$", "", re.sub(r"^\$\s*", "", text))
    for part in re.split(r"&&|;|\s\|\s", text):
        m = re.search(r"(?:^|\s)(?:python -m )?trainsim\s+(.*)$", part.strip())
        if not m:
            continue
        body = re.sub(r"[\[\]]", " ", m.group(1))
        body = re.sub(r"(?<=[\w.%-])\|[\w.,+%-]+", "", body)  # dlrm|gpt2|resnet -> dlrm
        try:
            args = [t for t in shlex.split(body) if t not in ("…", "...") and not t.startswith("(")]
        except ValueError:
            continue
        if args and not _PLACEHOLDER.match(
            next((t for t in args if not t.startswith("-")), "-")
        ):  # `--debug COMMAND`: none named
            yield ["1" if _PLACEHOLDER.match(t) else t for t in args]


def _parse(args: list[str]) -> None:
    """Parse ``args`` as the CLI would, without invoking anything; raise the usage error."""
    import typer
    from typer import _click as click

    from trainsim.cli.main import _register, app

    _register()
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("trainsim", list(args))
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    while hasattr(cmd, "resolve_command") and rest:
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd = sub
        rest = (
            [*getattr(ctx, "_protected_args", []), *ctx.args]
            if hasattr(cmd, "resolve_command")
            else []
        )
    if cmd.name == "validate":
        from trainsim.validate.registry import suite_names

        suite = ctx.params.get("suite")
        if suite not in suite_names() and not str(suite).isupper():
            raise click.exceptions.UsageError(f"no validate suite {suite!r}")


def test_every_documented_command_parses_with_todays_cli() -> None:
    from typer import _click as click

    bad: list[str] = []
    seen = 0
    for where, line in _doc_commands():
        for args in _invocations(line):
            seen += 1
            try:
                _parse(args)
            except click.exceptions.MissingParameter:
                pass  # prose mentions a command without its required inputs
            except click.exceptions.NoArgsIsHelpError:
                pass  # `trainsim stages` alone: the group's help
            except click.exceptions.UsageError as e:
                msg = e.format_message()
                if "unexpected extra argument" in msg or (
                    msg.endswith("requires an argument.") and args[-1].startswith("-")
                ):
                    continue  # a synopsis' alternatives, or prose naming an option without its value
                bad.append(f"{where}: trainsim {' '.join(args)}: {msg}")
    assert seen > 150, f"only {seen} documented commands found: the extraction broke"
    assert not bad, "\n".join(bad)


def test_the_parse_check_catches_a_flag_that_does_not_exist() -> None:
    from typer import _click as click

    with pytest.raises(click.exceptions.NoSuchOption):
        _parse(["replay", "x.json", "--kernel", "model"])
    with pytest.raises(click.exceptions.BadParameter):
        _parse(["replay", "x.json", "--kernels", "modelled"])
    with pytest.raises(click.exceptions.UsageError, match="no validate suite"):
        _parse(["validate", "e2e-cpu"])
    assert list(_invocations("trainsim analyze t.json --format json | jq .x  # note")) == [
        ["analyze", "t.json", "--format", "json"]
    ]


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_between_docs_reach_a_file_and_heading() -> None:
    heads = {p: {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", p.read_text(encoding="utf-8"), re.M)}
             for p in DOCS}  # fmt: skip
    bad = []
    for p in DOCS:
        for m in re.finditer(r"\]\(([^)\s#]*)(?:#([^)\s]+))?\)", p.read_text(encoding="utf-8")):
            target, anchor = m.group(1), m.group(2)
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            dest = (p.parent / target).resolve() if target else p
            if not dest.exists():
                bad.append(f"{p.name}: {target} does not exist")
            elif anchor and dest in heads and anchor not in heads[dest]:
                bad.append(f"{p.name}: {target}#{anchor}: no such heading")
    assert not bad, "\n".join(bad)


def test_validate_files_help_names_every_ground_truth_set() -> None:
    """`--help` listed h100-gpt2 only of the shipped sets; docs/gpu.md passes h100-llama13,h100-llama70."""
    import typer

    from trainsim.cli.main import _register, app
    from trainsim.validate.llm_cases import FILES, SHIPPED_TAGS

    _register()
    validate = typer.main.get_command(app).commands["validate"]  # type: ignore[attr-defined]
    help_text = next(p.help for p in validate.params if p.name == "files")
    for tag in (*FILES, *SHIPPED_TAGS):
        assert re.search(rf"\b{re.escape(tag)}\b(?!\d)", help_text), tag


def _fenced_after(doc: str, marker: str) -> list[str]:
    """The lines of the first fenced block after ``marker`` in ``doc``."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    rest = text[text.index(marker) :]
    a = rest.index("```")
    a = rest.index("\n", a) + 1
    return rest[a : rest.index("```", a)].strip().splitlines()


def _run(args: list[str]) -> tuple[int, str]:
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "trainsim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    return p.returncode, p.stdout + p.stderr


def test_predtop_doc_prints_the_shipped_protocol_rows_as_written(tmp_path: Path) -> None:
    """predtop.md left out --protocol: the command as written trained the broad-set suite
    (minutes) instead of printing the shipped rows (a second)."""
    mkdir, cmd = _fenced_after("predtop.md", "To print the shipped rows' tables without training")
    assert "docs/results/predtop_protocol_cases.jsonl DIR/protocol_cases.jsonl" in mkdir
    (tmp_path / "protocol_cases.jsonl").write_bytes(
        (ROOT / "docs/results/predtop_protocol_cases.jsonl").read_bytes()
    )
    args = shlex.split(cmd.replace("DIR", str(tmp_path)))
    assert args[0] == "trainsim"
    rc, out = _run(args[1:])
    assert rc == 0, out
    # the README's acceptance figures (its PredTOP table's first row)
    assert "DAG Transformer at 30 % training: moe 3.34 %, gpt 2.29 %" in out
    assert not (tmp_path / "cases.jsonl").exists()  # nothing was trained


def test_simulator_doc_h100_resize_example_prints_what_it_says(tmp_path: Path) -> None:
    """simulator.md named captures/... without saying where they come from, and quoted
    29.091 ms (+94.27 %) where the command prints 29.099 ms (+94.32 %)."""
    import tarfile

    lines = _fenced_after("simulator.md", "or each traced head count → its new count).")
    untar = lines[0].removeprefix("$ ").split("#")[0].split()
    assert untar[:2] == ["tar", "xJf"] and untar[3:] == ["-C", "/tmp"]
    with tarfile.open(ROOT / untar[2]) as tf:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
            tf.extractall(tmp_path, filter="data")
        else:
            tf.extractall(tmp_path)
    replay = lines[1].removeprefix("$ ").split("#")[0].replace("/tmp/", f"{tmp_path}/")
    quoted = re.search(
        r"\): ([\d.]+ ms \([+-][\d.]+ % against the replayed step\))", "\n".join(lines[2:])
    )
    assert quoted is not None
    rc, out = _run(shlex.split(replay)[1:])
    assert rc == 0, out
    assert quoted.group(1) in " ".join(out.split()), out[-600:]
