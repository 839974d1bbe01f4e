"""Backends are as open as protocols: the registry entry (``BackendSpec``) owns every fact the
rest of secagg asks about a backend, and a backend written outside the package is one module
that registers itself (``--import``) or an installed package's entry point."""

from __future__ import annotations

import json

import pytest

from secagg import plugins
from secagg.backends import (
    BACKENDS,
    BackendSpec,
    backend_spec,
    load_backend_entry_points,
    make_server_backend,
    register_backend,
)
from secagg.errors import ConfigError
from secagg.runspec.config import ExperimentConfig
from secagg.simulation.cli import main
from tests.test_plugins import install_distribution

#: a backend of a researcher's own: uploads rounded to an int8 grid, which the server reads
#: (so robust aggregators, which need the individual uploads, run on it)
INT8_MODULE = """
import numpy as np

from secagg import wire
from secagg.backends import BackendOption, BackendSpec, register_backend
from secagg.backends.base import no_client_weight
from secagg.backends.plain import PlainClient, PlainServer


class Int8Client(PlainClient):
    name = "{name}"

    def __init__(self, step):
        super().__init__("float32")
        self.step = step

    def protect(self, values, weight=None, *, basis="", request=""):
        no_client_weight(self.name, weight)
        q = np.clip(np.round(np.asarray(values) / self.step), -127, 127)
        return wire.vector((q * self.step).astype(np.float32))


class Int8Server(PlainServer):
    name = "{name}"
    can_read = {can_read}
    who_can_decrypt = "nothing is encrypted: the server reads every int8-rounded upload"


SPEC = BackendSpec(
    "{name}",
    "uploads rounded to an int8 grid; the server reads them",
    lambda options, signers: Int8Server(),
    lambda client_id, options, provision: Int8Client(options["step"]),
    (BackendOption("step", "int8-step", float, 0.01, "the grid's step"),),
    server_reads_uploads=True,
)
if {register}:
    register_backend(SPEC)
"""


@pytest.fixture
def registry():
    """Unregister the backends a test registers, and forget the entry points it installed."""
    import sys

    saved, modules = dict(BACKENDS), set(sys.modules)
    path, loaded = list(sys.path), set(plugins._loaded_groups)
    yield
    BACKENDS.clear()
    BACKENDS.update(saved)
    for name in set(sys.modules) - modules:
        if name.startswith(("toy_int8", "ep_int8")):
            del sys.modules[name]
    sys.path[:] = path
    plugins._loaded_groups.clear()
    plugins._loaded_groups.update(loaded)


def write_backend(folder, module, name="int8", *, can_read=True, register=True):
    path = folder / f"{module}.py"
    path.write_text(
        INT8_MODULE.replace("{name}", name)
        .replace("{can_read}", str(can_read))
        .replace("{register}", str(register))
    )
    return path


@pytest.mark.usefixtures("registry")
def test_a_backend_from_outside_the_package_runs_what_its_facts_allow(tmp_path, capsys):
    """One module, no edit to secagg: its flag is a CLI flag, the run checks what the server
    can read from the entry (trimmed mean needs the individual uploads: allowed, as on
    plain, refused on ckks), and the audit says who can decrypt in the backend's words."""
    module = write_backend(tmp_path, "toy_int8")
    with pytest.raises(ConfigError, match="(?i)individual|read"):
        ExperimentConfig(protocol="trimmedmean", backend="ckks").validate()
    out = tmp_path / "run"
    args = ["run", "--import", str(module), "--backend", "int8", "--int8-step", "0.001"]
    args += ["--protocol", "trimmedmean", "--rounds", "1", "--seeds", "1"]
    args += ["--local-steps", "2", "--quiet", "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())["resolved"]
    assert config["backend"] == "int8"
    assert config["resolved_backend_options"] == {"step": 0.001}
    summary = json.loads((out / "audit_summary.json").read_text())
    assert summary["who_can_decrypt"].endswith("every int8-rounded upload")
    assert summary["individual_updates_revealed"] is True
    # and the run did not provision keys it has no use for
    assert backend_spec("int8").keyed is False


@pytest.mark.usefixtures("registry")
def test_an_installed_package_declares_a_backend_by_entry_point(tmp_path, monkeypatch):
    write_backend(tmp_path, "ep_int8", name="ep-int8", register=False)
    install_distribution(
        tmp_path, "ep-int8", "[secagg.backends]\nep-int8 = ep_int8:SPEC\n", monkeypatch
    )
    assert "ep-int8" not in BACKENDS
    assert backend_spec("ep-int8").server_reads_uploads  # loaded on the first lookup
    config = ExperimentConfig(backend="ep-int8", rounds=1, seeds=[1], local_steps=1).validate()
    assert config.resolved_backend_options() == {"step": 0.01}


@pytest.mark.usefixtures("registry")
def test_an_entry_point_that_is_not_a_backend_is_refused(tmp_path, monkeypatch):
    (tmp_path / "ep_int8_bad.py").write_text("NOT_A_BACKEND = 3\n")
    install_distribution(
        tmp_path,
        "ep-int8-bad",
        "[secagg.backends]\nep-int8-bad = ep_int8_bad:NOT_A_BACKEND\n",
        monkeypatch,
    )
    with pytest.raises(ConfigError, match="(?i)not callable|not a BackendSpec"):
        load_backend_entry_points()


@pytest.mark.usefixtures("registry")
def test_a_server_half_that_contradicts_its_entry_is_refused(tmp_path, monkeypatch):
    """The entry says the server reads uploads; a server half that cannot (or the reverse)
    would make the run's checks and the audit wrong: refused when the server is built."""
    monkeypatch.syspath_prepend(str(tmp_path))
    write_backend(tmp_path, "toy_int8_liar", name="int8-liar", can_read=False)
    __import__("toy_int8_liar")
    with pytest.raises(ConfigError, match="can_read=False.*server_reads_uploads=True"):
        make_server_backend("int8-liar", {})


@pytest.mark.usefixtures("registry")
def test_register_backend_refuses_what_it_cannot_use():
    plain = BACKENDS["plain"]
    with pytest.raises(ConfigError, match="already registered"):
        register_backend(plain)
    with pytest.raises(ConfigError, match="not a BackendSpec"):
        register_backend("plain")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="letters, digits"):
        register_backend(BackendSpec("no spaces", "", plain.make_server, plain.make_client))
    with pytest.raises(ConfigError, match="presets but no 'preset' option"):
        register_backend(
            BackendSpec(
                "presetless",
                "",
                plain.make_server,
                plain.make_client,
                presets=BACKENDS["ckks"].presets,
            )
        )
    register_backend(plain, replace=True)  # replace=True: allowed


@pytest.mark.parametrize(
    "backend, protocol, preset",
    [
        ("ckks", "fedadam", "lean"),  # weights planned before the uploads, streamed
        ("ckks", "larc", "compact"),  # weights from the uploads
        ("ckks", "admm", "compact"),  # streams, but needs precise sums
        ("threshold", "fedadam", "lean"),
        ("threshold", "larc", "wide"),
    ],
)
def test_a_run_gets_its_default_preset_from_the_registry_rule(backend, protocol, preset):
    config = ExperimentConfig(protocol=protocol, backend=backend)
    assert config.resolved_backend_options()["preset"] == preset
    assert ExperimentConfig(protocol=protocol, backend="plain").resolved_backend_options() == {
        "dtype": "float32",
        "max_weight_share": 1.0,
    }


def test_a_client_weighted_preset_for_a_protocol_that_weighs_later_names_the_one_to_use():
    with pytest.raises(ConfigError, match="--ckks-preset compact"):
        ExperimentConfig(
            protocol="larc", backend="ckks", backend_options={"preset": "lean"}
        ).validate()
    with pytest.raises(ConfigError, match="--threshold-preset wide"):
        ExperimentConfig(
            protocol="larc", backend="threshold", backend_options={"preset": "lean"}
        ).validate()


def test_only_the_registry_decides_by_a_backend_name():
    """No library module compares a backend's name with a literal: each fact is the
    registry entry's (``BackendSpec``) or the backend half's."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = set(BACKENDS)
    offenders = []
    for folder in ("secagg", "simulation", "server", "clients", "protocols", "flower"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "__init__.py" and path.parent.name == "backends":
                continue  # the registry itself
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                named = any(
                    (isinstance(s, ast.Attribute) and s.attr == "backend")
                    or (isinstance(s, ast.Name) and s.id == "backend")
                    for s in sides
                )
                literal = any(
                    isinstance(s, ast.Constant)
                    and s.value in names
                    or isinstance(s, ast.Tuple | ast.Set | ast.List)
                    and any(isinstance(e, ast.Constant) and e.value in names for e in s.elts)
                    for s in sides
                )
                if named and literal:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders
