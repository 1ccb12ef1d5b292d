"""The README and docs/ as specifications: their Python examples run as printed, the command
table lists exactly the ``pafka`` subcommands, links resolve, quoted figures are in
``bench/RESULTS.md``, and sentences stay short.

A README example runs when a ``<!-- test: run expect="..." -->`` comment stands right before its
```` ```python ```` block: the block runs as a script in a fresh directory outside the
repository, with no PYTHONPATH (only the install can provide the project), and must exit 0
printing every ``expect`` string."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import pafka_source
from pafka_source.cli import build_parser

from .conftest import ROOT
from .support import isolated_env

README = Path(ROOT) / "README.md"
DOCS = [README, *sorted((Path(ROOT) / "docs").glob("*.md"))]
RESULTS = Path(ROOT) / "bench" / "RESULTS.md"
TIMEOUT = 300  # seconds per example: Spark start-up on a loaded 2-core machine is slow
MAX_WORDS = 25  # per sentence of prose (the project's style)

_RUN_RE = re.compile(r"<!-- test: run((?:\s+expect=\"[^\"]*\")*)\s*-->\s*\n```python\n(.*?)\n```",
                     re.DOTALL)
_EXPECT_RE = re.compile(r'expect="([^"]*)"')


@dataclass(frozen=True)
class Example:
    """A runnable ```python block of the README and what it must print."""

    line: int
    code: str
    expect: tuple[str, ...]

    @property
    def uses_spark(self) -> bool:
        return "pyspark" in self.code

    def __str__(self) -> str:
        return f"README.md:{self.line}"


def examples() -> list[Example]:
    text = README.read_text()
    return [Example(text.count("\n", 0, m.start(2)) + 1, m.group(2),
                    tuple(_EXPECT_RE.findall(m.group(1))))
            for m in _RUN_RE.finditer(text)]


def _env(tmp: Path) -> dict[str, str]:
    """The caller's environment without anything that could point Python at the repository;
    ``tempfile.mkdtemp()`` in an example makes its directory under ``tmp``."""
    env = {**isolated_env(sys.executable), "TMPDIR": str(tmp)}
    del env["PYSPARK_PYTHON"]  # as a user runs them: an example sets what it needs
    return env


def _run(example: Example, cwd: Path) -> None:
    script = cwd / "example.py"
    script.write_text(example.code + "\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=_env(cwd),
                          capture_output=True, text=True, timeout=TIMEOUT)
    took = time.monotonic() - started
    tail = f"\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{example} exited with {proc.returncode} after {took:.1f} s{tail}"
    for s in example.expect:
        assert s in proc.stdout, f"{example} did not print {s!r}{tail}"
    print(f"{example} ran in {took:.1f} s")


def test_every_python_block_of_the_readme_runs_and_says_what_it_prints():
    found = examples()
    blocks = README.read_text().count("```python\n")
    assert blocks == len(found), "every ```python block of the README needs a <!-- test: run " \
                                 "expect=\"...\" --> comment right before it"
    assert all(e.expect for e in found), [str(e) for e in found if not e.expect]
    assert {e.uses_spark for e in found} == {True, False}  # a Spark job and plain Python


_SHELL_RE = re.compile(r"<!-- test: shell((?:\s+expect=\"[^\"]*\")*)\s*-->\s*\n```bash\n(.*?)\n```",
                       re.DOTALL)


def test_readme_shell_session_runs_outside_the_repository(tmp_path):
    """The Operating section's commands, run by bash with the install's ``pafka`` first on
    PATH, in an empty directory: each must succeed (``set -e``)."""
    found = list(_SHELL_RE.finditer(README.read_text()))
    assert found, "the README's Operating section has no <!-- test: shell --> block"
    bindir = str(Path(sys.executable).parent)
    env = {**_env(tmp_path), "PATH": bindir + ":" + _env(tmp_path).get("PATH", "")}
    for m in found:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", m.group(2)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT)
        tail = f"\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, tail
        for want in _EXPECT_RE.findall(m.group(1)):
            assert want in proc.stdout + proc.stderr, f"{want!r} not printed{tail}"


def test_readme_plain_python_example_runs(tmp_path):
    for example in examples():
        if not example.uses_spark:
            _run(example, tmp_path)


def test_readme_spark_example_runs(tmp_path):
    spark_examples = [e for e in examples() if e.uses_spark]
    assert spark_examples
    if not hasattr(pafka_source, "track_groups"):
        pytest.skip("pafka_source.track_groups, which the example calls, is not there yet")
    for example in spark_examples:
        _run(example, tmp_path)


# The command table.

def _table(text: str, name: str) -> list[list[str]]:
    """The rows of the table between <!-- name:start --> and <!-- name:end -->, as cells."""
    m = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", text, re.DOTALL)
    assert m, f"README.md has no {name} markers"
    rows = []
    for line in m.group(1).splitlines()[2:]:  # after the header and its rule
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows.append(cells)
    return rows


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _subcommand_help() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help or "" for a in sub._choices_actions}


def _readme_commands() -> dict[str, tuple[str, str]]:
    """command name -> (its synopsis, its purpose), from the README's command table."""
    out = {}
    for cells in _table(README.read_text(), "cli-table"):
        m = re.fullmatch(r"`pafka ([\w-]+)([^`]*)`", cells[0])
        assert m, f"a command cell must read `pafka COMMAND ARGS`: {cells[0]!r}"
        assert len(cells) == 2 and cells[1], f"a command needs a purpose: {cells}"
        assert m.group(1) not in out, f"pafka {m.group(1)} is listed twice"
        out[m.group(1)] = (m.group(2).replace("\\|", "|"), cells[1])
    return out


def test_readme_command_table_lists_exactly_the_parsers_subcommands():
    parser_commands, listed = _subcommands(), _readme_commands()
    helps = _subcommand_help()
    missing = [f"| `pafka {c}` | {helps.get(c, '')} |" for c in parser_commands
               if c not in listed]
    assert not missing, "README's command table lacks:\n" + "\n".join(missing)
    unknown = sorted(set(listed) - set(parser_commands))
    assert not unknown, f"README's command table lists commands pafka does not have: {unknown}"


def test_readme_command_synopses_match_the_parser():
    for name, (synopsis, _) in _readme_commands().items():
        sub = _subcommands()[name]
        options = {s: a for a in sub._actions for s in a.option_strings}
        positionals = [a for a in sub._actions if not a.option_strings
                       and a.help != argparse.SUPPRESS]  # hidden: answers a misuse only
        tokens = re.findall(r"--[\w-]+|[A-Z][A-Z_=]*|…", synopsis)
        named, i = [], 0
        while i < len(tokens):
            t = tokens[i]
            if t.startswith("--"):
                assert t in options, f"pafka {name} has no option {t}"
                if options[t].nargs != 0:
                    i += 1  # its value's placeholder
            elif t != "…":
                named.append(t)
            i += 1
        assert named == [a.dest.upper() for a in positionals], \
            f"pafka {name}: README shows {named}, the parser takes " \
            f"{[a.dest.upper() for a in positionals]}"
        for a in positionals:
            bracketed = f"[{a.dest.upper()}]" in synopsis
            assert bracketed == (a.nargs == "?"), f"pafka {name}: {a.dest} is optional " \
                                                  f"exactly when the README brackets it"


# Links, figures and sentences of README.md and docs/*.md.

def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _sections(path: Path) -> dict[str, str]:
    """Anchor -> the text of its section (to the next heading of any level)."""
    text = _strip_code(path.read_text())
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.MULTILINE)
    out = {"": parts[0]}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        out[_slug(heading.lstrip("#"))] = heading + body
    return out


def _strip_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


_LINK_RE = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _links(path: Path) -> list[tuple[str, Path, str]]:
    """(text, target file, anchor) of each relative link in ``path``."""
    out = []
    for text, target in _LINK_RE.findall(_strip_code(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        file, _, anchor = target.partition("#")
        out.append((text, (path.parent / file).resolve() if file else path, anchor))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    for text, target, anchor in _links(doc):
        assert target.exists(), f"{doc.name}: [{text}] points to {target}, which is missing"
        if anchor:
            assert anchor in _sections(target), \
                f"{doc.name}: [{text}] points to #{anchor}, no heading of {target.name}"


_FIGURE_RE = re.compile(r"\d[\d,]*(?:\.\d+)?")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_quoted_figures_are_links_to_the_results_that_hold_them(doc):
    results = _sections(RESULTS)
    for text, target, anchor in _links(doc):
        if target != RESULTS.resolve():
            continue
        section = results.get(anchor, RESULTS.read_text())
        for figure in _FIGURE_RE.findall(text):
            assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", section), \
                f"{doc.name}: [{text}] quotes {figure}, which bench/RESULTS.md#{anchor} " \
                "does not hold (re-run benchmarks change it: quote the new figure)"
    # Measured figures appear only as such links.
    prose = _prose(doc.read_text())
    unlinked = _LINK_RE.sub("", prose)
    measured = re.findall(r"\d[\d,.]*\s?(?:×|%|MB/s|GB/s|M rec/s|M rows/s|ms\b)", unlinked)
    assert not measured, f"{doc.name}: measured figures outside links to bench/RESULTS.md: " \
                         f"{measured}"


def _prose(text: str) -> str:
    """Paragraphs and list items: no code blocks, tables, headings or HTML comments."""
    text = _strip_code(text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    lines = [ln for ln in text.splitlines()
             if not ln.lstrip().startswith("|") and not ln.startswith("#")]
    return "\n".join(lines)


def _sentences(text: str) -> list[str]:
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", _prose(text))
    out = []
    for block in blocks:
        flat = " ".join(block.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", flat) if s]
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_sentences_are_short(doc):
    long = [s for s in _sentences(doc.read_text())
            if len(_LINK_RE.sub(r"\1", s).split()) > MAX_WORDS]
    assert not long, f"{doc.name}: sentences of more than {MAX_WORDS} words:\n" + "\n".join(long)
