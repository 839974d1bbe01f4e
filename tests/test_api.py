"""The Python API: ``import secagg``, a custom task and protocol from outside the package,
run in-process and in worker processes; the Python API page's example
(docs/how-to/python-api.md) is run exactly as printed."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import secagg

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- example: tests/test_api.py runs this block as a script -->"


def readme_example() -> str:
    text = (ROOT / "docs" / "how-to" / "python-api.md").read_text()
    after = text[text.index(MARKER) + len(MARKER) :]
    match = re.match(r"\s*```python\n(.*?)```", after, re.S)
    assert match, "the Python API page's example block follows its marker"
    return match.group(1)


def test_importing_secagg_loads_no_torch_until_the_api_is_used():
    code = (
        "import sys, secagg; before = 'torch' in sys.modules; secagg.ExperimentConfig; "
        "config = 'torch' in sys.modules; secagg.run; print(before, config, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    # a configuration is built and checked without torch; running one needs it
    assert out == ["False", "False", "True"]


@pytest.mark.slow
def test_the_readme_example_runs_as_printed(tmp_path):
    script = tmp_path / "custom.py"
    script.write_text(readme_example())
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].split() == ["round", "test_pooled_mean"]
    final = float(lines[-2].split()[1])  # round 5: -MSE close to the noise level 0.01
    assert -0.05 < final < 0, done.stdout
    assert (tmp_path / "results/lines-equal/audit_summary.json").is_file()
    assert "'metrics.csv'" in lines[-1]


@pytest.fixture
def restore_registries():
    """Unregister what a test registers: a task or protocol left behind travels to the
    worker processes of later tests, which cannot import its module."""
    from secagg.clients.tasks import TASKS
    from secagg.protocols import PROTOCOLS

    tasks, protocols = dict(TASKS), dict(PROTOCOLS)
    yield
    TASKS.clear()
    TASKS.update(tasks)
    PROTOCOLS.clear()
    PROTOCOLS.update(protocols)
    sys.modules.pop("custom_example", None)


@pytest.mark.usefixtures("restore_registries")
@pytest.mark.slow
def test_a_custom_protocol_and_task_run_in_process_and_in_workers(tmp_path, monkeypatch):
    """The custom protocol is really used (its equal weights differ from FedAvg's on clients
    of different sizes), and worker processes, which register it again, agree."""
    (tmp_path / "custom_example.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path
    import custom_example  # noqa: F401  registers the task "lines" and the protocol "equal"

    settings = dict(
        task="lines", backend="plain", rounds=3, seeds=[0], local_steps=5, client_lr="0.1"
    )
    equal = secagg.run(protocol="equal", **settings)
    fedavg = secagg.run(protocol="fedavg", **settings)
    assert np.max(np.abs(equal.final_params[0] - fedavg.final_params[0])) > 1e-3
    parallel = secagg.run(protocol="equal", workers=2, **settings)
    np.testing.assert_allclose(parallel.final_params[0], equal.final_params[0], atol=1e-9)
    assert equal.files == {}
    written = secagg.run(protocol="equal", out=tmp_path / "out", **settings)
    assert set(written.files) >= {"metrics.csv", "audit.jsonl", "convergence.png"}
    assert all(path.is_file() for path in written.files.values())


def test_register_refuses_builtin_names_and_non_protocols():
    from secagg.errors import ConfigError

    with pytest.raises(ConfigError, match="already registered"):
        secagg.register_protocol("larc", secagg.Protocol)
    with pytest.raises(ConfigError, match="not a Protocol class"):
        secagg.register_protocol("mine", object)
    with pytest.raises(ConfigError, match="already registered"):
        secagg.register_task("tcga-brca", secagg.Task("x", "", None, None, None, None, ""))


def test_an_injected_transport_carries_every_message():
    """``secagg.run(transport=...)`` replaces the in-process transport: every envelope of the
    run goes through the one given (here a wrapper that counts what it carries)."""
    from secagg.simulation.experiment import default_transport

    carried: list[str] = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        @property
        def peers(self):
            return self.inner.peers

        def exchange(self, requests):
            for peer, reply in self.inner.exchange(requests):
                carried.append(peer)
                yield peer, reply

    result = secagg.run(
        task="tcga-brca",
        protocol="fedavg",
        rounds=2,
        seeds=[0],
        local_steps=2,
        transport=lambda factory, ids: Counting(default_transport(factory, ids)),
    )
    received = [
        r for r in result.audit.records if r["event"] == "message" and r["direction"] == "received"
    ]
    assert len(carried) == len(received) == 6 + 2 * 6  # enrolment, then two training rounds


def test_in_process_clients_train_on_the_configured_torch_threads():
    """--threads sets torch's intra-op threads while the run trains (1 by default) and puts
    back what was there after."""
    import torch

    before = torch.get_num_threads()
    for threads in (3, 1):
        seen: list[int] = []
        secagg.run(
            task="tcga-brca",
            rounds=1,
            local_steps=1,
            threads=threads,
            progress=lambda _line: seen.append(torch.get_num_threads()),
        )
        assert seen and set(seen) == {threads}
        assert torch.get_num_threads() == before
    assert secagg.runspec.config.ExperimentConfig().threads == 1
    with pytest.raises(secagg.errors.ConfigError, match="threads"):
        secagg.run(task="tcga-brca", rounds=1, threads=0)
