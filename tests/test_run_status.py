"""A run's status: ``complete`` only when every seed ran every round with every client;
``degraded`` (a client missed rounds) and ``aborted`` (a seed stopped early) exit non-zero
from the command line, say so in their closing line, and carry the same status in run.json,
``secagg compare`` and the Python API's result. A protocol that cannot train the task is
refused at configuration."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import secagg
from secagg.errors import ConfigError
from secagg.runspec.status import EXIT_CODES, decide, rounds_text
from secagg.simulation.cli import main
from secagg.simulation.compare import IncompleteRunWarning, compare_runs
from tests.test_plugins import registries  # noqa: F401 - the fixture

#: a user module: FedAvg whose client_1 fails its training request in protocol round
#: ``{round}`` (-1: in every round), as a site that goes offline would
FLAKY = """
from secagg.protocols.fedavg import FedAvg
from secagg.protocols.base import ClientHalf
from secagg.protocols.registry import register_protocol


class FlakyClient(ClientHalf):
    def local_update(self, client, request):
        if client.id == "client_1" and {round} in (-1, request.round):
            raise RuntimeError("client_1's site is offline")
        return None


class Flaky(FedAvg):
    name = "{name}"
    client = FlakyClient


register_protocol("{name}", Flaky)
"""

FAST = ["--task", "tcga-brca", "--backend", "plain", "--seeds", "1", "--local-steps", "1"]


def flaky_module(folder: Path, name: str, round: int) -> Path:
    path = folder / f"user_{name}.py"
    path.write_text(FLAKY.replace("{name}", name).replace("{round}", str(round)))
    return path


def state(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def compare(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["compare", *args])
    said = capsys.readouterr()
    return code, said.out, said.err


# ---- the rule -------------------------------------------------------------------------------
def outcome(ran=3, rounds=3, **more):
    return {"rounds": rounds, "ran": ran, "missed": [], "skipped": [], **more}


def test_the_status_rule():
    assert decide([1, 2], {1: outcome(), 2: outcome()}).status == "complete"
    # a protocol that stops by design (ADMM's residuals, the Cox model's Newton step)
    converged = decide([1], {1: outcome(ran=2, stopped="Newton step 1e-10 < tol 1e-09")})
    assert converged.status == "complete" and "converged after round 2 of 3" in converged.notes[0]
    missed = {"client": "client_2", "rounds": [2, 3, 4, 5], "stage": None}
    degraded = decide([3], {3: outcome(missed=[missed], skipped=[7])})
    assert degraded.status == "degraded" and degraded.exit_code == 4
    assert degraded.problems == (
        "client_2 missed rounds 2-5 of seed 3",
        "round 7 of seed 3 made no update (skipped)",
    )
    assert degraded.line().startswith("degraded: client_2 missed rounds 2-5 of seed 3")
    abort = {"round": 0, "stage": "setup", "phase": "setup", "reason": "set-up left 1 of 2"}
    aborted = decide([3, 42], {3: outcome(missed=[missed]), 42: outcome(ran=0, aborted=abort)})
    assert aborted.status == "aborted" and aborted.exit_code == 3  # outranks degraded
    assert aborted.problems[0] == ("seed 42 in round 0 (set-up, phase setup): set-up left 1 of 2")
    # stopped early with no reason recorded is no convergence; a seed not run is no result
    assert decide([1], {1: outcome(ran=1)}).status == "aborted"
    assert decide([1, 2], {1: outcome()}).status == "interrupted"
    assert rounds_text([2, 3, 4, 7]) == "rounds 2-4, 7" and rounds_text([5]) == "round 5"
    assert EXIT_CODES == {"complete": 0, "aborted": 3, "degraded": 4, "interrupted": 130}


# ---- the command line -----------------------------------------------------------------------
@pytest.mark.usefixtures("registries")
def test_degraded_and_aborted_runs_exit_non_zero_with_their_status_everywhere(tmp_path, capsys):
    complete, degraded, aborted = tmp_path / "complete", tmp_path / "degraded", tmp_path / "ab"
    once = flaky_module(tmp_path, "drops_once", 1)  # misses round 2 (protocol round 1)
    always = flaky_module(tmp_path, "drops_always", -1)
    sys.path.insert(0, str(tmp_path))

    code = main(["run", *FAST, "--rounds", "3", "--quiet", "--out", str(complete)])
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        code == 0 and state(complete)["status"] == "complete" and state(complete)["problems"] == []
    )
    assert closing == f"results in {complete}/"

    code = main(
        ["run", "--import", str(once), "--protocol", "drops_once", *FAST, "--rounds", "3",
         "--quiet", "--out", str(degraded)]
    )  # fmt: skip
    said = capsys.readouterr()
    assert code == 4
    assert said.out.strip().splitlines()[-1] == (
        "degraded: client_1 missed round 2 of seed 1 (exit status 4)"
    )
    assert "degraded run, drops_once on plain" in said.out  # its scores, labelled
    run = state(degraded)
    assert run["status"] == "degraded" and run["exit_code"] == 4
    assert run["problems"] == ["client_1 missed round 2 of seed 1"]
    recorded = run["finished"]["1"]["outcome"]
    assert recorded["ran"] == 3 and recorded["missed"][0]["rounds"] == [2]

    # min_clients all: losing client_1 in round 1 stops the seed before anything is combined
    code = main(
        ["run", "--import", str(always), "--protocol", "drops_always", *FAST, "--rounds", "3",
         "--min-clients", "all", "--quiet", "--out", str(aborted)]
    )  # fmt: skip
    said = capsys.readouterr()
    assert code == 3
    closing = said.out.strip().splitlines()[-1]
    assert closing.startswith("aborted: seed 1 in round 1 (phase train): ")
    assert closing.endswith("(exit status 3)")
    assert "c_index" not in said.out  # an aborted seed's scores are no result
    run = state(aborted)
    assert run["status"] == "aborted" and run["exit_code"] == 3
    assert run["finished"]["1"]["outcome"]["aborted"]["round"] == 1

    # compare: each run's status; runs that are not complete are refused unless asked for
    code, out, err = compare(capsys, str(complete), str(degraded))
    assert code == 2 and "degraded is degraded (client_1 missed round 2 of seed 1)" in err
    assert "--include-incomplete" in err
    code, out, err = compare(capsys, str(complete), str(degraded), "--include-incomplete")
    assert code == 0 and "warning: comparing runs that are not complete" in err
    header, _, first, second, *notes = out.splitlines()
    assert "status" in header.split() and " complete " in first and " degraded " in second
    assert any("degraded: client_1 missed round 2 of seed 1" in n for n in notes)
    with pytest.warns(IncompleteRunWarning, match="degraded is degraded"):
        table = compare_runs([complete, degraded], include_incomplete=True)
    assert list(table["status"]) == ["complete", "degraded"]
    with pytest.raises(ConfigError, match="ab is aborted"):
        compare_runs([complete, aborted])


@pytest.mark.usefixtures("registries")
def test_the_python_api_returns_the_status_and_does_not_raise(tmp_path):
    """A site lost at set-up (its enrolment reply does not decode): the run trains on the
    other five, which is a result of fewer sites than configured, so it is degraded."""
    from secagg import wire
    from secagg.simulation.experiment import default_transport

    class LosesClient2AtSetUp:
        def __init__(self, inner):
            self.inner = inner

        @property
        def peers(self):
            return self.inner.peers

        def exchange(self, requests):
            for peer, reply in self.inner.exchange(requests):
                lost = peer == "client_2" and isinstance(reply, bytes)
                if lost and wire.Envelope.from_bytes(reply).phase == "enroll":
                    reply = b"junk"
                yield peer, reply

        def close(self):
            getattr(self.inner, "close", lambda: None)()

    result = secagg.run(
        task="tcga-brca",
        protocol="fedavg",
        rounds=2,
        seeds=[0],
        local_steps=1,
        out=tmp_path / "run",
        transport=lambda factory, ids: LosesClient2AtSetUp(default_transport(factory, ids)),
    )
    assert result.status.status == "degraded" and not result.status.complete
    assert result.status.problems == ("client_2 missed rounds 1-2 of seed 0",)
    assert state(tmp_path / "run")["status"] == "degraded"


def test_a_convergence_stop_is_complete(tmp_path):
    # the Newton step is far below this tolerance after the first round: the protocol stops
    result = secagg.run(
        task="coxph-gbsg2-times",
        protocol="coxph",
        protocol_options={"tol": 1e3},
        rounds=3,
        seeds=[0],
        out=tmp_path / "cox",
    )
    assert result.metrics["round"].max() == 1
    assert result.status.status == "complete"
    assert "converged after round 1 of 3" in result.status.notes[0]
    assert state(tmp_path / "cox")["notes"] == list(result.status.notes)


# ---- refused at configuration ----------------------------------------------------------------
def test_a_protocol_that_cannot_train_the_default_task_is_refused_before_anything_runs(
    tmp_path, capsys
):
    out = tmp_path / "cox"
    assert main(["run", "--protocol", "coxph", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "protocol 'coxph' cannot train task 'tcga-brca': it needs a coxph-* task" in err
    assert "--task coxph-gbsg2-times" in err  # its registered example's task
    assert not out.exists()
    for protocol in ("admm", "dec", "dgd", "pvi", "savae_prior", "xgboost"):
        with pytest.raises(ConfigError, match=f"protocol '{protocol}' cannot train task"):
            secagg.ExperimentConfig(protocol=protocol).validate()


def test_every_protocols_example_task_is_one_it_can_train():
    from secagg.protocols import PROTOCOLS
    from secagg.protocols.registry import serves

    for name, spec in PROTOCOLS.items():
        task = spec.example.settings.get("task", "tcga-brca")
        assert serves(name, task), (name, task)
