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


# ---- the secret package: one rule, one prefix (``secagg/secret/__init__.py``) ----------------
SECRET = "secagg.secret"
#: the one secret-key module outside the package: the build puts the native extension's full
#: module here (the encryptor and decryptor ``secagg.secret`` hands a key, beside the public
#: arithmetic); its public half, ``secagg.ckks._seal_public``, has no class that takes a key
NATIVE = "secagg.ckks._seal_native"
#: the modules that load the extension (by name, lazily, inside a function): the full module
#: through ``native.module`` only, the public half also for the threshold ring
NATIVE_LOADERS = {"secagg/ckks/native.py", "secagg/threshold/ring.py"}
#: the backend registry: its client factories and provisioning helpers import client
#: halves and key generation inside the functions that build a client or make keys
REGISTRY = "secagg/backends/__init__.py"


def is_secret(module: str) -> bool:
    """Whether ``module`` (a dotted name) is secret-key code: under ``secagg.secret``, or
    the native extension."""
    return module == SECRET or module.startswith(SECRET + ".") or module == NATIVE


def server_side_files() -> list[Path]:
    """The server's side, by package: the round engine (``server/``), the protocols
    (``protocols/``) and every module of the privacy layer (``secagg/``) outside
    ``secagg/secret``: its server halves and public modules."""
    privacy = [
        p
        for p in (ROOT / "secagg").rglob("*.py")
        if p.relative_to(ROOT / "secagg").parts[0] not in (*SUBPACKAGES, "secret")
    ]
    return sorted([*(ROOT / "server").rglob("*.py"), *(ROOT / "protocols").rglob("*.py"), *privacy])


def module_name(path: Path) -> str:
    """``secagg/ckks/public.py`` -> ``secagg.ckks.public``; ``server/engine.py`` ->
    ``secagg.server.engine`` (the top folders are installed under ``secagg``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "secagg":
        parts.insert(0, "secagg")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level(tree: ast.Module) -> list[ast.AST]:
    """The nodes a module runs when it is imported: everything but function bodies (a class
    body, an ``if``, a ``try`` and an ``if TYPE_CHECKING:`` block all count)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def imported_modules(
    path: Path, *, top_level_only: bool = False, name: str | None = None
) -> set[str]:
    """Every module ``path`` imports: ``import a.b`` gives ``a.b``; ``from a import b``
    gives ``a`` and ``a.b`` (b may be a module); relative imports are resolved against the
    module's package (``name``: the module's dotted name, by default its place in the
    checkout); ``importlib.import_module("a.b")`` and ``__import__("a.b")`` with a literal
    name give ``a.b``. Inside functions too, unless ``top_level_only``."""
    tree = ast.parse(path.read_text())
    package = (name or module_name(path)).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    mods = set()
    for node in _top_level(tree) if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            mods |= {module} | {f"{module}.{a.name}" for a in node.names}
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            mods.add(node.args[0].value)
    return mods


def secret_imports(path: Path) -> set[str]:
    """The secret-key modules a server-side file imports (the rule's exceptions applied)."""
    relative = str(path.relative_to(ROOT))
    found = {m for m in imported_modules(path, top_level_only=relative == REGISTRY) if is_secret(m)}
    return found - {NATIVE} if relative in NATIVE_LOADERS else found


@pytest.mark.parametrize("path", server_side_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_server_side_code_never_imports_secret_key_code(path):
    """Nothing on the server's side imports ``secagg.secret`` or the native extension.

    The server's side is defined by package (:func:`server_side_files`), so a new module
    there is checked without anyone listing it. Every import counts wherever it is: at the
    top, in an ``if TYPE_CHECKING:`` block, in a class body or inside a function (a function
    that imports secret code drags it into whatever process calls it, and which process
    calls a function is not something a static check can see); ``importlib.import_module``
    and ``__import__`` with a literal name count as imports. Relative imports are resolved.

    Two exceptions, each narrower than a file list:

    - the registry (``secagg/backends/__init__.py``) is held to its top level only: its
      client factories (``_ckks_client``, ``_threshold_client``) and provisioning helpers
      (``provision``, ``make_backends``) import client halves and key generation inside
      the function that builds a client or makes keys, which only a client's process or a
      driver calls. What makes this sound is the other half of the rule: a fresh
      interpreter that imports the server and builds its backends' server halves through
      that same registry loads no secret module
      (:func:`test_the_server_process_loads_no_secret_key_code`);
    - the native extension (``NATIVE``) is loaded by name, lazily, by its two loaders
      (``NATIVE_LOADERS``), which the public code of both sides uses for its public
      arithmetic; no other server-side module may name it. It holds no key of its own (a
      key is only ever handed to it by ``secagg.secret.ckks_keys``); neither importing nor
      running the server loads it: a server's native arithmetic (server-weighted sums, the
      threshold ring) runs on the public half.

    What no static check sees (an import by a computed name) the subprocess tests below
    see: they look at what a fresh interpreter actually holds."""
    assert not secret_imports(path)


def test_the_secret_check_sees_every_kind_of_import(tmp_path):
    """The static check finds secret imports at every level and in every spelling, and holds
    the registry to its top level only."""
    module = tmp_path / "module.py"
    module.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from secagg.secret.keywrap import KeyWrapper\n"
        "from secagg import secret\n"
        "from ..secret import holder\n"
        "class C:\n    import secagg.secret.sealing\n"
        "def f():\n    from secagg.secret.ckks_client import CKKSClient\n"
        "    return importlib.import_module('secagg.ckks._seal_native')\n"
    )
    name = "secagg.backends.probe"  # resolves ``..secret`` against secagg.backends
    found = {m for m in imported_modules(module, name=name) if is_secret(m)}
    assert {
        "secagg.secret",
        "secagg.secret.keywrap",
        "secagg.secret.holder",
        "secagg.secret.sealing",
        "secagg.secret.ckks_client",
        NATIVE,
    } <= found
    top = {m for m in imported_modules(module, name=name, top_level_only=True) if is_secret(m)}
    assert "secagg.secret.ckks_client" not in top and NATIVE not in top
    assert {"secagg.secret.keywrap", "secagg.secret.sealing", "secagg.secret.holder"} <= top
    assert {str(p.relative_to(ROOT)) for p in server_side_files()} >= {
        REGISTRY,  # the exceptions still name real files
        *NATIVE_LOADERS,
        "secagg/backends/ckks_server.py",
        "secagg/backends/threshold_server.py",
        "secagg/ckks/public.py",
        "server/engine.py",
        "protocols/__init__.py",
    }


def test_the_secret_package_holds_the_key_holding_modules():
    """What the rule protects is where the rule looks: the client halves, the key holders,
    the key wrapping, sealing, consents and key generation are all under the prefix."""
    names = {module_name(p) for p in (ROOT / "secagg" / "secret").rglob("*.py")}
    assert {
        "secagg.secret",
        "secagg.secret.ckks_keys",
        "secagg.secret.ckks_masks",
        "secagg.secret.keywrap",
        "secagg.secret.sealing",
        "secagg.secret.share_relay",
        "secagg.secret.consenting",
        "secagg.secret.holder",
        "secagg.secret.ckks_client",
        "secagg.secret.threshold_client",
        "secagg.secret.identities",
    } <= names
    assert all(is_secret(n) for n in names)


def printed_by(code: str) -> str:
    """What a fresh interpreter running ``code`` (from the checkout) prints."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def secret_modules_loaded_by(*modules: str, then: str = "") -> list[str]:
    """The secret-key modules (:func:`is_secret`) a fresh interpreter holds after importing
    ``modules`` (and running ``then``)."""
    code = (
        f"import sys, {', '.join(modules)}\n{then}\n"
        f"print(sorted(m for m in sys.modules if m == {NATIVE!r} or m == {SECRET!r} "
        f"or m.startswith({SECRET + '.'!r})))"
    )
    return ast.literal_eval(printed_by(code))


SERVER_MODULES = (
    "secagg.server.engine",
    "secagg.backends.ckks_server",
    "secagg.backends.threshold_server",
)


def _public_half_built() -> bool:
    from secagg.ckks import native

    return native.public_module() is not None


def test_importing_the_server_loads_no_secret_key_code():
    """Importing the engine and both encrypted backends' server halves loads nothing of
    ``secagg.secret`` and not the native extension."""
    assert secret_modules_loaded_by(*SERVER_MODULES) == []


@pytest.mark.skipif(not _public_half_built(), reason="needs the native extension")
def test_the_server_process_loads_no_secret_key_code():
    """Building the server halves through the registry and running the native arithmetic a
    server runs (a server-weighted sum's seed expansion and combination, the threshold
    ring) loads nothing of ``secagg.secret`` and only the extension's public half, which
    has no class that takes a key."""
    arithmetic = (
        "from secagg.backends import make_server_backend\n"
        "make_server_backend('ckks', {})\n"
        "make_server_backend('threshold', {})\n"
        "import numpy as np\n"
        "from secagg.ckks.public import PublicCKKS\n"
        "from secagg.ckks.presets import get_preset\n"
        "from secagg.ckks.server_sums import expander_for\n"
        "from secagg.threshold import ring\n"
        "e = expander_for(PublicCKKS(get_preset('compact')))\n"
        "assert e is not None, 'the native extension is not built'\n"
        "w = get_preset('compact').poly_modulus_degree * 2\n"
        "e.combine([np.zeros((1, w), dtype=np.uint64)], [3])\n"
        "ring._extension()\n"
    )
    built = secret_modules_loaded_by(*SERVER_MODULES, then=arithmetic)
    assert built == []
    public = printed_by(f"import sys\n{arithmetic}print('secagg.ckks._seal_public' in sys.modules)")
    assert public == "True"  # the arithmetic ran on the public half


@pytest.mark.skipif(not _public_half_built(), reason="needs the native extension")
def test_the_public_half_of_the_extension_has_no_class_that_takes_a_key():
    names = printed_by(
        "import secagg.ckks._seal_public as p; print(sorted(n for n in dir(p) if n[0] != '_'))"
    )
    assert ast.literal_eval(names) == [
        "Parameters",
        "Ring",
        "SEAL_VERSION",
        "SeedExpander",
        "ntt_prime",
    ]


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
    assert "secagg.secret.ckks_client" in secret_modules_loaded_by("secagg.secret.ckks_client")
    assert "secagg.secret.identities" in secret_modules_loaded_by(
        "secagg.backends", then="import secagg.backends as b; b.provision(['a'], 1)"
    )


def test_the_top_level_api_hands_no_key_out():
    """``secagg``'s lazy names (``secagg.__all__``) are none of ``secagg.secret``'s objects,
    and what ``secagg.run`` returns (``RunResult``) has no field whose type (or any type in
    it, or any field of a dataclass in it) comes from ``secagg.secret`` or is a private key
    of ``cryptography``'s."""
    import dataclasses
    import typing

    import secagg

    for name in secagg.__all__:
        assert not is_secret(secagg._LAZY.get(name, "secagg")), name
        value = getattr(secagg, name)
        assert not is_secret(getattr(value, "__module__", "") or ""), name

    def types_in(hint: object) -> typing.Iterator[object]:
        yield hint
        for arg in typing.get_args(hint):
            yield from types_in(arg)

    seen: set[object] = set()
    todo: list[object] = [secagg.RunResult]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, hint in typing.get_type_hints(cls).items():
            for t in types_in(hint):
                module = getattr(t, "__module__", "") or ""
                assert not is_secret(module), f"{cls.__name__}.{name}: {t!r}"
                assert "PrivateKey" not in getattr(t, "__name__", ""), f"{cls.__name__}.{name}"
                if dataclasses.is_dataclass(t) and module.startswith("secagg"):
                    todo.append(t)
    assert secagg.RunResult in seen and len(seen) > 1  # RunStatus, ExperimentConfig, ...


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
