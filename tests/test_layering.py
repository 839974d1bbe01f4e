"""Dependencies point one way: server -> protocols -> secagg; clients -> protocols, secagg;
both drivers (simulation/, flower/) -> runspec -> clients, server, protocols, secagg.

The folders are installed as one namespace (``secagg.protocols`` is the ``protocols/``
folder, and so on); "secagg" below means the privacy layer itself, the ``secagg/`` folder.
The server never imports the client package, a task, or anything that loads data; only the
drivers wire both sides together: the in-process one (simulation/) and the Flower one
(flower/), which both stand on the definition of a run (runspec/: configuration, settings,
provisioning, evaluation, status). runspec imports neither driver, and the Flower package
(a deployed node above all) never imports the simulator. The simulator's CLI may import
the Flower package (``secagg flower``), never the other way round.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("protocols", "clients", "server", "runspec", "simulation", "flower")
RUNS = {"runspec", "simulation", "flower"}  # a run's definition and its two drivers
FORBIDDEN = {
    "secagg": {"protocols", "clients", "server", *RUNS, "torch", "pandas", "lifelines"},
    "protocols": {"clients", "server", *RUNS, "torch", "pandas", "lifelines"},
    "server": {"clients", *RUNS, "torch", "pandas", "lifelines", "sklearn"},
    "clients": {"server", *RUNS},
    "runspec": {"simulation", "flower"},
    "flower": {"simulation"},
}


def layer(module: str) -> str:
    """``secagg.server.engine`` -> "server"; ``secagg.wire`` -> "secagg"; ``torch.nn`` ->
    "torch"."""
    parts = module.split(".")
    if parts[0] == "secagg":
        return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "secagg"
    return parts[0]


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {layer(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(layer(node.module))
            if node.module == "secagg":  # from secagg import protocols
                roots |= {a.name for a in node.names if a.name in SUBPACKAGES}
    return roots


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_static_imports_respect_layering(package):
    offenders = {}
    for path in (ROOT / package).rglob("*.py"):
        bad = imported_roots(path) & FORBIDDEN[package]
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"layering violated: {offenders}"


def test_importing_the_server_loads_no_client_code_or_data_library():
    code = (
        "import sys, secagg.server.engine, secagg.server.round, secagg.server.audit, "
        "secagg.protocols; bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'pandas', 'lifelines') or m.startswith(('secagg.clients', "
        "'secagg.simulation'))]; print(bad)"
    )
    assert printed_by(code) == "[]"


SECRET_MODULES = {
    "secagg.ckks.secret",
    "secagg.ckks._seal_native",  # the native extension encrypts and opens with the key
    "secagg.backends.ckks_client",
    "secagg.ckks.keywrap",
    "secagg.sealing",
    "secagg.threshold.shares",
    "secagg.threshold.share_relay",
    "secagg.backends.threshold_client",
    "secagg.backends.consenting",
}
PUBLIC_SIDE = [
    *(ROOT / "server").rglob("*.py"),
    *(ROOT / "protocols").rglob("*.py"),
    ROOT / "secagg/backends/ckks_server.py",
    ROOT / "secagg/ckks/public.py",
    ROOT / "secagg/ckks/presets.py",
    ROOT / "secagg/ckks/flooding.py",
    ROOT / "secagg/backends/threshold_server.py",
    ROOT / "secagg/backends/consent.py",
    ROOT / "secagg/threshold/params.py",
]


def imported_modules(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return mods


@pytest.mark.parametrize("path", PUBLIC_SIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_server_side_code_never_imports_secret_key_code(path):
    assert not imported_modules(path) & SECRET_MODULES


def printed_by(code: str) -> str:
    """What a fresh interpreter running ``code`` (from the checkout) prints."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def secret_modules_loaded_by(*modules: str) -> list[str]:
    """The secret-key modules a fresh interpreter holds after importing ``modules``."""
    code = (
        f"import sys, {', '.join(modules)}; "
        f"print(sorted(m for m in sys.modules if m in {sorted(SECRET_MODULES)!r}))"
    )
    return ast.literal_eval(printed_by(code))


def test_the_server_process_loads_no_secret_key_code():
    assert (
        secret_modules_loaded_by(
            "secagg.server.engine",
            "secagg.backends.ckks_server",
            "secagg.backends.threshold_server",
        )
        == []
    )


def test_the_flower_server_app_loads_no_secret_key_code():
    """The ServerApp's process runs the experiment driver; clients and keys are imported only
    where one is made (never there). test_flower_e2e checks it after a real run too."""
    assert (
        secret_modules_loaded_by(
            "secagg.flower.apps",
            "secagg.flower.experimenter",  # a server-blind ServerApp keeps sealed copies
            "secagg.simulation.api",
            "secagg.simulation.experiment",
        )
        == []
    )


def test_the_check_sees_a_secret_module_when_one_is_loaded():
    assert secret_modules_loaded_by("secagg.backends.ckks_client") != []


def test_a_flower_node_builds_its_client_without_the_simulator_or_the_server(tmp_path):
    """A node's message builds the client from the node's own settings
    (``secagg.runspec.provisioning``): no module of the simulator (``secagg.simulation``)
    and none of the server's code but the round plan (the data type its policy compares) is
    loaded."""
    from secagg.flower.deployment import prepare
    from secagg.runspec.config import ExperimentConfig

    config = ExperimentConfig(
        task="tcga-brca", protocol="larc", backend="ckks", rounds=1, seeds=[0], local_steps=1
    )
    node = prepare(tmp_path / "deployment", config)["client_1"]
    code = (
        "import sys\nfrom secagg.flower.node import NodeClient\n"
        f"client = NodeClient({str(node)!r})._client(0, None)\n"
        "assert type(client).__name__ == 'Client'\n"
        "print(sorted(m for m in sys.modules if m.startswith(('secagg.server', "
        "'secagg.simulation', 'secagg.runspec'))))"
    )
    loaded = set(ast.literal_eval(printed_by(code)))
    assert "secagg.runspec.provisioning" in loaded  # what it builds the client with
    assert not {m for m in loaded if m.startswith("secagg.server.")} - {"secagg.server.plan"}
    assert not {m for m in loaded if m.startswith("secagg.simulation")}


def test_importing_the_flower_node_loads_no_simulator_module():
    """A deployed node (its ClientApp, the guarded SuperNode and its warm executor) stands on
    ``secagg.runspec``, never on the in-process driver; nor does the warm executor preload
    any of the simulator's modules."""
    code = (
        "import sys, secagg.flower.node, secagg.flower.apps, secagg.flower.guard, "
        "secagg.flower.warm as warm; "
        "print(sorted(m for m in sys.modules if m.startswith('secagg.simulation')) "
        "+ [m for m in warm.WARM_MODULES + warm.WARM_OPTIONAL_MODULES "
        "if m.startswith('secagg.simulation')])"
    )
    assert printed_by(code) == "[]"


def test_the_layering_check_sees_imports_inside_functions(tmp_path):
    """``imported_roots`` walks the whole tree (``ast.walk``): an import inside a function,
    a method or an ``if TYPE_CHECKING:`` block counts as much as one at the top."""
    module = tmp_path / "module.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from secagg.server.audit import AuditLog\n"
        "def f():\n    from secagg.simulation import experiment\n"
        "class C:\n    def g(self):\n        import secagg.flower.node\n"
        "        from secagg import runspec\n"
    )
    assert {"server", "simulation", "flower", "runspec"} <= imported_roots(module)


#: the Flower modules that run in the ServerApp's process (apps.py holds the ClientApp too)
#: and the node-side modules that start and warm a SuperNode's processes
FLOWER_SERVER_SIDE = ("transport.py", "apps.py", "messages.py", "process.py")
FLOWER_NODE_PROCESSES = {"secagg.flower.guard", "secagg.flower.warm", "secagg.flower.supervise"}


@pytest.mark.parametrize("name", FLOWER_SERVER_SIDE)
def test_the_flower_server_side_never_imports_the_node_processes(name):
    """The ServerApp's transport shares with a node's processes only what both may import
    (``secagg.flower.messages``, ``secagg.flower.process``): the modules that start, guard
    and warm a SuperNode are the node's."""
    assert not imported_modules(ROOT / "flower" / name) & FLOWER_NODE_PROCESSES
