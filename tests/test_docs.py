"""The documentation keeps its promises: a short README, no project-tracking words in user
docs, every ``secagg`` command a page shows is one the command line accepts (``secagg run``
commands are resolved as the run would resolve them, with ``--show-config``), and every
Python block runs. The site itself is built with ``mkdocs build --strict`` in ``.ci/run``."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from secagg.simulation.cli import load_user_code, main
from tests.test_plugins import registries  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
#: the results pages link the benchmarks' own files through docs/results/data (a link to
#: benchmarks/results/): those are the benchmarks' output, not pages written by hand
USER_DOCS = sorted(
    p for p in (ROOT / "docs").rglob("*.md") if "data" not in p.relative_to(ROOT / "docs").parts
)
PAGES = [ROOT / "README.md", *USER_DOCS]
#: Python blocks another test already runs exactly as printed, with checks of its own
RUN_ELSEWHERE = {
    "docs/how-to/python-api.md": "tests/test_api.py",
    "docs/tutorials/own-model.md": "tests/test_own_model.py",
}
#: words of the project's own tracking, which mean nothing to a reader of the docs
TRACKING = re.compile(
    r"\bissue\s*#?\d+|\bthe issue\b|design card|\b(this|previous|last) session\b|\bthe review\b",
    re.I,
)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, and of every indented block (as "console")."""
    blocks = [
        (m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)
    ]
    unfenced = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for m in re.finditer(r"(?:^|\n\n)((?:    .*\S.*\n?)+)", unfenced):
        blocks.append(("console", "\n".join(line[4:] for line in m.group(1).splitlines())))
    return blocks


def secagg_commands(page: Path) -> list[list[str]]:
    """Every ``secagg ...`` command line a page shows (continuations joined, comments cut)."""
    commands = []
    for language, body in code_blocks(page.read_text()):
        if language not in ("", "console", "sh", "bash", "shell"):
            continue
        for line in re.sub(r"\\\s*\n\s*", " ", body).splitlines():
            if re.match(r"\s*(\.venv/bin/)?secagg\s", line):
                try:
                    commands.append(shlex.split(line, comments=True)[1:])
                except ValueError as exc:
                    raise ValueError(f"{page.relative_to(ROOT)}: {line!r}: {exc}") from None
    return commands


def test_the_readme_is_short_and_links_only_to_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_carry_no_tracking_words(page):
    found = [m.group(0) for m in TRACKING.finditer(page.read_text())]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_the_tracking_check_can_fail():
    assert TRACKING.search("as issue 34 asked") and TRACKING.search("the design card says")
    assert not TRACKING.search("a server that deviates issues a request")


COMMANDS = [(page, command) for page in PAGES for command in secagg_commands(page) if command]


def test_the_pages_show_commands():
    # the parser below must have something to check: the quick start and the how-to pages
    shown = {p.relative_to(ROOT).as_posix() for p, _ in COMMANDS}
    assert {"README.md", "docs/how-to/run-experiments.md", "docs/how-to/flower.md"} <= shown


@pytest.mark.parametrize(
    "page,command",
    COMMANDS,
    ids=[f"{p.relative_to(ROOT)}:{' '.join(c[:2])}" for p, c in COMMANDS],
)
def test_every_command_shown_is_accepted(page, command, tmp_path, monkeypatch, capsys, request):
    if page.relative_to(ROOT).as_posix() == "docs/tutorials/own-model.md":
        pytest.skip("tests/test_own_model.py runs this page's commands in order, as written")
    # a placeholder stands for what the reader fills in: a Flower run's number; "..." for
    # the options the page has just listed
    command = ["1" if w == "RUN" else w for w in command if w != "..."]
    monkeypatch.chdir(tmp_path)
    if "--import" in command:
        # the walkthroughs' own modules (examples/own_model), registered for this test only
        request.getfixturevalue("registries")
        shutil.copytree(ROOT / "examples" / "own_model", tmp_path, dirs_exist_ok=True)
        load_user_code(command)
    if command[0] == "run" and "--resume" not in command:
        # resolved as the run would be (protocol and backend options, presets, files), not run
        assert main([*command, "--show-config"]) == 0, capsys.readouterr().err
        return
    from secagg.simulation.cli import build_parser

    try:
        build_parser().parse_args(command)
    except SystemExit as exc:
        pytest.fail(f"{page.relative_to(ROOT)}: `secagg {shlex.join(command)}` exits {exc.code}")


def test_a_command_with_a_flag_that_does_not_exist_is_caught(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["run", "--protocol", "larc", "--backend-option", "x=1", "--show-config"])


PYTHON_BLOCKS = [
    (page, body)
    for page in PAGES
    for language, body in code_blocks(page.read_text())
    if language == "python" and page.relative_to(ROOT).as_posix() not in RUN_ELSEWHERE
]


def test_the_blocks_run_elsewhere_are_there():
    for page in RUN_ELSEWHERE:
        assert any(lang == "python" for lang, _ in code_blocks((ROOT / page).read_text())), page


@pytest.mark.slow
@pytest.mark.parametrize(
    "page,body", PYTHON_BLOCKS, ids=[str(p.relative_to(ROOT)) for p, _ in PYTHON_BLOCKS]
)
def test_every_python_block_runs(page, body, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(body)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{page.relative_to(ROOT)}:\n{done.stderr[-3000:]}"


def test_every_page_the_code_points_users_to_exists():
    """A path like ``docs/tutorials/own-model.md`` in a message or help text of the library
    names a page that is there (``secagg tasks`` once pointed at one that was not)."""
    named = {
        match
        for folder in ("clients", "flower", "protocols", "server", "simulation", "secagg")
        for source in (ROOT / folder).rglob("*.py")
        for match in re.findall(r"\bdocs/[\w./-]+\.md\b", source.read_text())
    }
    assert named, "no page named at all: the pattern is wrong"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
