"""The generated reference pages (docs/reference/, scripts/docs_reference.py) match the
registries, and the generator follows a registry change and names a stale page."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Annotated

import pytest

from secagg.options import Flag
from secagg.protocols import PROTOCOLS, register_protocol
from secagg.protocols.fedavg import FedAvg

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "docs_reference.py"
PAGES = ("protocols.md", "tasks.md", "presets.md", "cli.md", "benchmarks.md")


def load_generator() -> ModuleType:
    # scripts/ is no package (and `scripts` may name an installed one): load it by path
    spec = importlib.util.spec_from_file_location("docs_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_reference = load_generator()


class Shrinking(FedAvg):
    """A throwaway protocol with one declared option (FedAvg's aggregation)."""

    name = "docs-shrinking"

    def __init__(
        self,
        # a "|" in the help: the page must escape it, or the table row breaks
        shrink: Annotated[float, Flag("docs-shrink", "shrink every update | by this")] = 0.25,
        spare: int = 7,
    ):
        self.shrink, self.spare = shrink, spare


@pytest.fixture
def shrinking() -> Iterator[str]:
    """``Shrinking`` registered for one test (the registry is process-wide)."""
    register_protocol(Shrinking.name, Shrinking, summary="docs test protocol")
    try:
        yield Shrinking.name
    finally:
        PROTOCOLS.pop(Shrinking.name, None)


def test_the_committed_pages_are_current(capsys):
    assert docs_reference.main(["--check"]) == 0, (
        f"{capsys.readouterr().err}(regenerate with: {docs_reference.REGENERATE})"
    )


def test_a_registered_protocol_appears_with_its_options(shrinking, tmp_path, capsys):
    assert docs_reference.main(["--out", str(tmp_path)]) == 0
    page = (tmp_path / "protocols.md").read_text()
    assert f"## {shrinking}\n" in page
    assert f"[`{shrinking}`](#{shrinking}) | docs test protocol |" in page
    # the declared option: key, its own flag and TOML key, type, default, escaped help
    assert (
        "| `shrink` | `--docs-shrink` / `docs_shrink` | `float` | `0.25` | "
        "shrink every update \\| by this |"
    ) in page
    # a constructor argument without an Option: set through --protocol-option, no help
    assert "| `spare` | — | `int` | `7` |" in page
    # the new flag reaches `secagg run --help`, so the CLI page follows the registry too
    assert "--docs-shrink" in (tmp_path / "cli.md").read_text()
    # and the committed pages no longer match: --check names both
    capsys.readouterr()
    assert docs_reference.main(["--check"]) == 1
    stale = capsys.readouterr().err
    assert "protocols.md" in stale and "cli.md" in stale and "tasks.md" not in stale


def test_check_names_an_altered_or_missing_page(tmp_path, capsys):
    assert docs_reference.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)
    assert docs_reference.main(["--check", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    tasks = tmp_path / "tasks.md"
    tasks.write_text(tasks.read_text().replace("| `tcga-brca` |", "| `tcga-brca-old` |"))
    (tmp_path / "cli.md").unlink()
    assert docs_reference.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "tasks.md" in err and "cli.md" in err
    assert "protocols.md" not in err and "presets.md" not in err
    # --check wrote nothing; a plain run restores both pages
    assert not (tmp_path / "cli.md").exists()
    assert docs_reference.main(["--out", str(tmp_path)]) == 0
    assert docs_reference.main(["--check", "--out", str(tmp_path)]) == 0


def test_every_page_is_marked_generated_and_names_no_machine(tmp_path):
    pages = docs_reference.render()
    assert sorted(pages) == sorted(PAGES)
    for name, text in pages.items():
        assert text.startswith(docs_reference.HEADER + "\n\n# "), name
        assert str(ROOT) not in text and str(Path.home()) not in text, name


def test_the_pages_need_neither_torch_nor_data():
    """Listing the registries reads names only: a fresh interpreter renders every page
    without importing torch (the tasks name their loaders by reference)."""
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('d', {str(SCRIPT)!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.render(); "
        "print(sorted(x for x in ('torch', 'pandas', 'sklearn') if x in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
