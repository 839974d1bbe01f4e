"""secagg logs through one ``secagg`` logger; only the command line prints.

Library modules log with ``logging.getLogger(__name__)``; the ``secagg`` logger has a
``NullHandler`` (a program that imports secagg chooses what it shows), and secagg's entry
points (the CLI, the SuperNode's guard and warm executor, Flower's apps) put the lines on
stderr as they read when they were printed (``secagg.logs``).
"""

from __future__ import annotations

import ast
import logging
import sys
from pathlib import Path

import pytest

import secagg
from secagg import logs

ROOT = Path(__file__).resolve().parent.parent
#: the folders installed as secagg's subpackages (secagg/flower -> ../flower, ...) and secagg
PACKAGES = ("secagg", "protocols", "clients", "server", "simulation", "flower")
#: the modules that may print: they render output for the person at the terminal
PRINTING = {
    "simulation/cli.py": "the `secagg` command line: tables, listings, results, errors",
    "flower/cli.py": "`secagg flower ...`'s output: commands to run, status tables, errors",
}


def library_modules() -> list[Path]:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):  # rglob does not follow secagg's links
            found.append(path)
    return sorted(found)


def prints_in(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]


def test_library_modules_log_instead_of_printing():
    modules = library_modules()
    names = {str(p.relative_to(ROOT)) for p in modules}
    assert set(PRINTING) <= names, "an exception names a module that is gone"
    assert {"flower/warm.py", "simulation/experiment.py", "secagg/wire.py"} <= names
    printing = {
        f"{p.relative_to(ROOT)}:{line}"
        for p in modules
        if str(p.relative_to(ROOT)) not in PRINTING
        for line in prints_in(p)
    }
    assert not printing, f"log through logging.getLogger(__name__) instead: {sorted(printing)}"


def test_named_loggers_are_under_secagg():
    """A module's logger is ``logging.getLogger(__name__)``: no other name, so every line is
    under the ``secagg`` logger the entry points configure."""
    named = []
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__")
                and path.name != "logs.py"  # secagg.logs configures the root "secagg" logger
                and not path.name == "__init__.py"
            ):
                named.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not named, named


def test_the_secagg_logger_has_a_null_handler():
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("secagg").handlers)
    assert secagg.__name__ == logs.ROOT


@pytest.fixture
def clean_secagg_logger():
    """The ``secagg`` logger as a program that imported secagg finds it (a module-scoped
    fixture that ran the CLI may have set it up; conftest puts it back after the test)."""
    logger = logging.getLogger("secagg")
    logger.handlers[:] = [logging.NullHandler()]
    logger.setLevel(logging.NOTSET)
    logger.propagate = True
    return logger


def test_to_stderr_writes_the_message_only_to_the_current_stderr(clean_secagg_logger, capsys):
    logs.to_stderr()
    logs.to_stderr()  # again: still one handler
    assert sum(isinstance(h, logs.StderrHandler) for h in clean_secagg_logger.handlers) == 1
    logging.getLogger("secagg.flower.guard").info("secagg flower node: error: %s", "100% bad")
    logging.getLogger("secagg.flower.guard").debug("not shown")
    assert capsys.readouterr().err == "secagg flower node: error: 100% bad\n"
    logs.to_stderr(logging.WARNING, prefix="[secagg] ")
    logging.getLogger("secagg.flower.apps").info("progress, not shown")
    logging.getLogger("secagg.flower.apps").warning("round 1/2")
    assert capsys.readouterr().err == "[secagg] round 1/2\n"
    assert logs.stderr_level() == logging.WARNING


def test_to_stderr_shows_each_line_once(clean_secagg_logger, capsys):
    """A handler on the root logger (opacus sets one up with basicConfig) gets no copy."""
    root = logging.getLogger()
    copies = logs.StderrHandler()
    root.addHandler(copies)
    try:
        logs.to_stderr()
        logging.getLogger("secagg.clients.runtime").warning("client_0 refused 'train'")
    finally:
        root.removeHandler(copies)
    assert capsys.readouterr().err == "client_0 refused 'train'\n"


def test_flowers_app_processes_show_the_log(clean_secagg_logger, capsys, monkeypatch):
    """Flower's flwr-serverapp (each line marked [secagg], as Flower's log of the run mixes
    Flower's lines in) and flwr-clientapp; not a test or another program calling the App."""
    from secagg.flower.apps import secagg_progress, show_log

    show_log(prefix="[secagg] ")
    assert logs.stderr_level() is None
    monkeypatch.setattr(sys, "argv", ["/venv/bin/flwr-serverapp", "--insecure"])
    show_log(prefix="[secagg] ")
    secagg_progress("nodes: client_0=1")
    assert capsys.readouterr().err == "[secagg] nodes: client_0=1\n"


def test_progress_to_stderr_shows_without_any_logging_set_up(clean_secagg_logger, capsys):
    from secagg.simulation.experiment import stderr_progress

    assert logs.stderr_level() is None
    stderr_progress("seed 42 round 1/3: accuracy 0.91")
    assert capsys.readouterr().err == "seed 42 round 1/3: accuracy 0.91\n"
    assert logs.stderr_level() == logging.INFO


def test_the_cli_sets_the_level_from_quiet(clean_secagg_logger, capsys):
    from secagg.simulation import cli

    assert cli.main(["protocols"]) == 0
    assert logs.stderr_level() == logging.INFO
    assert "fedavg" in capsys.readouterr().out
    cli.configure_logging(cli.build_parser().parse_args(["run", "--quiet"]))
    assert logs.stderr_level() == logging.WARNING


def test_the_supervisors_lines_reach_stderr(clean_secagg_logger, capsys, monkeypatch):
    """``secagg flower node`` (the guard's main) sets the handler up; the supervisor's
    default ``say`` is its logger."""
    from secagg.flower import supervise

    logs.to_stderr()

    class Refused:
        def wait(self) -> int:
            return supervise.ACTIVATION_REFUSED

        def poll(self) -> int:
            return supervise.ACTIVATION_REFUSED

    code = supervise.supervise(["node"], window=0, pause=0, start=lambda _: Refused())
    assert code == supervise.ACTIVATION_REFUSED
    err = capsys.readouterr().err
    assert "secagg flower node: the SuperLink refused this node's activation" in err
    assert err.endswith("giving up\n")


def test_library_import_writes_nothing(capfd):
    """Importing and logging without a configured handler writes nothing (NullHandler: no
    'No handlers could be found' and no last-resort line)."""
    import subprocess

    code = (
        "import logging, secagg; "
        "logging.getLogger('secagg.clients.runtime').warning('client_0 refused')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == ""
