"""A researcher's own code reaches every entry point: ``--import`` on the command line, the
``imports`` key of a config, the rerun command a run writes, ``load_model``, and installed
packages' entry points."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from secagg import plugins
from secagg.clients.tasks import TASKS, get_task, load_task_entry_points
from secagg.errors import ConfigError
from secagg.protocols import PROTOCOLS
from secagg.simulation.cli import main
from tests.test_api import readme_example

#: a user module registering a task (not the README's name, so it cannot clash with it)
USER_TASK = """
import numpy as np
import torch
from secagg.clients.tasks import ClientData, FederatedData, Task, register_task


def load():
    rng = np.random.default_rng(0)
    parts = []
    for k in range(3):
        x = rng.normal(size=(30 + 10 * k, 2)).astype(np.float32)
        y = (x @ np.array([1.5, -2.0], dtype=np.float32))[:, None]
        parts.append(ClientData(torch.tensor(x), torch.tensor(y)))
    return FederatedData("{name}", parts[:2], None, pooled_test=parts[2])


def make_model():
    return torch.nn.Linear(2, 1)


def mse(pred, y):
    return ((pred - y) ** 2).mean()


def neg_mse(y, out):
    return -float(((out.reshape(-1) - y.reshape(-1)) ** 2).mean())


TASK = Task("{name}", "two lines", load, make_model, mse, neg_mse, "-MSE")
if {register}:
    register_task("{name}", TASK)
"""


@pytest.fixture
def registries():
    """Unregister what a test registers, and forget the modules it imported (a task left
    behind would travel to later tests' worker processes, which cannot import it)."""
    tasks, protocols, modules = dict(TASKS), dict(PROTOCOLS), set(sys.modules)
    path, loaded = list(sys.path), set(plugins._loaded_groups)
    yield
    TASKS.clear()
    TASKS.update(tasks)
    PROTOCOLS.clear()
    PROTOCOLS.update(protocols)
    for name in set(sys.modules) - modules:
        if name.startswith(("user_lines", "custom_example", "ep_", "sites_task")):
            del sys.modules[name]
    sys.path[:] = path
    plugins._loaded_groups.clear()
    plugins._loaded_groups.update(loaded)


def write_module(folder: Path, name: str, *, register: bool = True) -> Path:
    path = folder / f"{name}.py"
    path.write_text(USER_TASK.replace("{name}", name).replace("{register}", str(register)))
    return path


def install_distribution(folder: Path, name: str, entry_points: str, monkeypatch) -> None:
    """A distribution named ``name`` installed in ``folder`` (its dist-info with
    ``entry_points``, the text of entry_points.txt), on sys.path; the entry-point groups
    are read again on the next lookup."""
    dist = folder / f"{name.replace('-', '_')}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(folder))
    plugins.forget_entry_points()


@pytest.mark.usefixtures("registries")
@pytest.mark.slow
def test_a_run_from_the_command_line_imports_the_user_module_and_its_rerun_does_too(
    tmp_path, monkeypatch, capsys
):
    code = tmp_path / "code"
    code.mkdir()
    (code / "custom_example.py").write_text(readme_example())
    monkeypatch.chdir(code)
    first = tmp_path / "first"
    args = ["run", "--import", "custom_example", "--task", "lines", "--protocol", "equal"]
    args += ["--rounds", "2", "--local-steps", "3", "--quiet", "--out", str(first)]
    assert main(args) == 0
    assert 'imports = ["custom_example"]' in (first / "config.toml").read_text()
    # the rerun hint, in a fresh process (nothing registered yet) from the module's folder:
    # it reproduces the run's numbers
    again = tmp_path / "again"
    rerun = subprocess.run(
        [sys.executable, "-m", "secagg.simulation.cli", "run", "--config"]
        + [str(first / "config.toml"), "--quiet", "--out", str(again)],
        cwd=code,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert rerun.returncode == 0, rerun.stderr
    assert _same_metrics(first, again)
    # load_model in a process that never imported the module: the folder's imports suffice
    loaded = subprocess.run(
        [sys.executable, "-c", f"import secagg; print(secagg.load_model({str(first)!r}))"],
        cwd=code,
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "Linear(in_features=1" in loaded.stdout  # the README example's model


def _same_metrics(a: Path, b: Path) -> bool:
    import pandas as pd

    cols = ["round", "test_pooled", "train_pooled"]
    return pd.read_csv(a / "metrics.csv")[cols].equals(pd.read_csv(b / "metrics.csv")[cols])


@pytest.mark.usefixtures("registries")
def test_a_py_path_is_recorded_absolute_and_a_module_name_as_given(tmp_path, monkeypatch):
    from secagg.runspec.config import ExperimentConfig

    write_module(tmp_path, "user_lines_a")
    monkeypatch.chdir(tmp_path)
    config = ExperimentConfig(task="user_lines_a", imports=["./user_lines_a.py"]).validate()
    assert config.imports == [str(tmp_path / "user_lines_a.py")]
    assert get_task("user_lines_a").description == "two lines"
    write_module(tmp_path, "user_lines_b")
    config = ExperimentConfig(task="user_lines_b", imports=["user_lines_b"]).validate()
    assert config.imports == ["user_lines_b"]


@pytest.mark.usefixtures("registries")
def test_what_cannot_be_imported_is_refused_with_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no such module.*PYTHONPATH"):
        plugins.import_user_modules(["user_lines_missing"])
    with pytest.raises(ConfigError, match="no such file"):
        plugins.import_user_modules(["missing/user_lines.py"])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="ends in .py"):
        plugins.import_user_modules(["./notes.txt"])
    # a module whose own import fails shows its own error, not "no such module"
    (tmp_path / "user_lines_broken.py").write_text("import user_lines_absent_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="user_lines_absent_dependency"):
        plugins.import_user_modules(["user_lines_broken"])
    # two files of the same name cannot both be the module of that name
    write_module(tmp_path, "user_lines_c")
    other = tmp_path / "other"
    other.mkdir()
    write_module(other, "user_lines_c")
    plugins.import_user_modules([str(tmp_path / "user_lines_c.py")])
    with pytest.raises(ConfigError, match="already imported"):
        plugins.import_user_modules([str(other / "user_lines_c.py")])
    # on the command line: a clear error, exit status 2, no traceback
    assert main(["run", "--import", "user_lines_missing", "--task", "x"]) == 2
    assert "cannot import 'user_lines_missing'" in capsys.readouterr().err


@pytest.mark.usefixtures("registries")
def test_an_unknown_task_names_the_way_to_bring_ones_own():
    with pytest.raises(ConfigError, match="--import MODULE"):
        get_task("user_lines_never_registered")


@pytest.mark.usefixtures("registries")
def test_installed_packages_register_tasks_and_protocols_by_entry_point(tmp_path, monkeypatch):
    write_module(tmp_path, "ep_lines", register=False)
    (tmp_path / "ep_protocol.py").write_text(
        "from secagg.protocols.fedavg import FedAvg\n\nclass Mine(FedAvg):\n    pass\n"
    )
    install_distribution(
        tmp_path,
        "ep-demo",
        "[secagg.tasks]\nep-lines = ep_lines:TASK\n\n"
        "[secagg.protocols]\nep-mine = ep_protocol:Mine\n",
        monkeypatch,
    )
    assert "ep-lines" not in TASKS
    # the first lookup that misses loads them; the CLI's listing loads them up front
    assert get_task("ep-lines").description == "two lines"
    assert "ep-mine" not in PROTOCOLS
    from secagg.protocols.registry import protocol_spec

    assert protocol_spec("ep-mine").protocol.__name__ == "Mine"
    assert main(["tasks"]) == 0


@pytest.mark.usefixtures("registries")
def test_an_entry_point_that_is_not_a_task_is_refused(tmp_path, monkeypatch):
    (tmp_path / "ep_bad.py").write_text("NOT_A_TASK = 3\n")
    install_distribution(
        tmp_path, "ep-bad", "[secagg.tasks]\nep-bad = ep_bad:NOT_A_TASK\n", monkeypatch
    )
    with pytest.raises(ConfigError, match="ep-bad.*is not a Task"):
        load_task_entry_points()


@pytest.mark.usefixtures("registries")
def test_a_flower_node_imports_the_module_its_experiment_names(tmp_path):
    """A node reads its experiment from its own folder, in a process of its own: the user
    module the experiment names is imported there, and its task builds the node's client."""
    from secagg.flower.deployment import prepare
    from secagg.runspec.config import ExperimentConfig

    path = write_module(tmp_path, "user_lines_node")
    config = ExperimentConfig(
        task="user_lines_node", imports=[str(path)], rounds=1, seeds=[0], local_steps=2
    ).validate()
    nodes = prepare(tmp_path / "deployment", config)
    assert sorted(nodes) == ["client_0", "client_1"]
    assert str(path) in (nodes["client_1"] / "experiment.toml").read_text()
    code = (
        "from secagg.flower.node import NodeClient\n"
        f"node = NodeClient({str(nodes['client_1'])!r})\n"
        "client = node._client(0, None)\n"
        "print(node.config.task, len(client.trainer.data))\n"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split() == ["user_lines_node", "40"]  # client 1's 40 samples


@pytest.mark.usefixtures("registries")
def test_the_listings_show_what_an_imported_module_registers(tmp_path, capsys):
    path = write_module(tmp_path, "user_lines_listed")
    assert main(["tasks", "--import", str(path)]) == 0
    assert "user_lines_listed" in capsys.readouterr().out
