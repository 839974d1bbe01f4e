"""secagg on a real Flower deployment: a SuperLink and one SuperNode per client (6 for
Fed-TCGA-BRCA) as separate processes on loopback, ports chosen at run time, every wait
bounded and every process stopped at the end (``secagg.flower.launch``).

Flower starts a fresh ClientApp process for every message, so these runs take minutes:
they are marked slow (CI runs them)."""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import secagg
from secagg.flower.deployment import prepare
from secagg.flower.launch import BIN, CONNECTION, LocalFederation, free_port, json_of
from secagg.runspec.config import ExperimentConfig
from tests.flower_grid import audits_match
from tests.test_layering import is_secret
from tests.test_plugins import registries  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

LARC = ExperimentConfig(
    task="tcga-brca", protocol="larc", backend="ckks", rounds=2, seeds=[3], local_steps=5
)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    secagg.run(LARC, out=out)
    return out


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_larc_on_ckks_over_superlink_and_supernodes_gives_the_in_process_run(tmp_path, in_process):
    """With TLS and node authentication (without them the run is the same but for the
    transport; one run of each kind kept the real-SuperLink tests under 3 minutes)."""
    folder = tmp_path / "deployment"
    prepare(folder, LARC, tls=True, auth=True)
    out = folder / "results"  # where the demo puts them, and `secagg flower status` looks
    with LocalFederation(folder) as federation:
        pids = [federation.superlink.pid, *(p.pid for p in federation.nodes.values())]
        status = federation.run(out=out, timeout=1200)
        _operate(federation, folder, tmp_path)
        # a SuperNode whose key the SuperLink does not know is turned away
        code, said = _intruder(federation, folder, tmp_path)
        assert code != 0 and "Failed to activate SuperNode" in said
        why = (federation.work / "superlink.log").read_text()  # the node is not told why
        assert "No SuperNode found with the given public key" in why
        # another App submitted to the same SuperLink reaches every node and runs on
        # none: each answers with Flower's "invalid FAB" error, nothing of the node's
        replies = _foreign_app(federation, tmp_path)
        assert len(replies) == 6 and all(r.get("error") == 7 for r in replies), replies
        assert all("runs only the secagg App" in r["reason"] for r in replies)
    deadline = time.monotonic() + 15
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(gone(p) for p in pids)  # every process stopped

    assert status == "finished:completed"
    seed = LARC.seeds[0]
    np.testing.assert_allclose(  # CKKS noise is fresh in every run: equal to its precision
        np.load(out / "models" / f"seed-{seed}.npy"),
        np.load(in_process / "models" / f"seed-{seed}.npy"),
        rtol=0,
        atol=1e-6,
    )
    audits_match(out, in_process)
    # tcga-brca's test sets are the sites' own: the coordinator holds none and scores
    # nothing (test_flower.py's pilot test scores a test set the coordinator holds)
    a = pd.read_csv(out / "metrics.csv")
    assert list(a["round"]) == list(pd.read_csv(in_process / "metrics.csv")["round"])
    assert not [c for c in a.columns if c.startswith(("test_", "train_"))]
    flower = json.loads((out / "flower.json").read_text())
    assert sorted(flower["nodes"]) == [f"client_{k}" for k in range(6)]
    assert not [m for m in flower["secagg_modules"] if is_secret(m)]  # the server held no key code
    assert flower["framing"]["messages_sent"] == flower["framing"]["messages_received"] > 0
    # every node kept its state on its own disk, readable by itself only
    for k in range(6):
        states = list((folder / "nodes" / f"client_{k}" / "state").rglob("*.bin"))
        assert len(states) == 1 and states[0].stat().st_mode & 0o077 == 0


def _operate(federation, folder, tmp_path) -> None:
    """status, flwr log and stop, as an operator runs them against the demo's SuperLink."""
    from secagg.flower import operations
    from secagg.simulation.cli import main

    (run,) = operations.runs(folder)
    assert run["status"] == "finished:completed"
    assert run["progress"].startswith("done: results in")
    assert run["network-traffic"]["total-bytes"] > 0
    # the ServerApp's progress streams where Flower's own log command shows it
    shown = federation.flwr("log", run["run-id"], CONNECTION, "--show")
    assert f"[secagg] Flower run {run['run-id']}: waiting for 6 SuperNodes" in shown.stdout
    # tcga-brca: the coordinator holds no test set of it, so its rounds are not scored
    assert "[secagg]   seed 3 round 2/2: not scored" in shown.stdout, shown.stdout[-2000:]
    # a second run of the deployment, stopped from the command line
    again = federation.submit(out=str(tmp_path / "again"))
    assert main(["flower", "stop", str(folder), str(again)]) == 0
    assert federation.wait(again, 60, poll=0.5) == "finished:stopped"


def _intruder(federation, folder, tmp_path) -> tuple[int, str]:
    """A SuperNode with a key of its own making: its exit code and what it printed."""
    from secagg.flower.certificates import make_node_key

    key = tmp_path / "intruder.key"
    make_node_key(key)
    log = tmp_path / "intruder.log"
    with open(log, "w") as f:  # a file, not a pipe: its children may keep a pipe open
        process = subprocess.Popen(
            [
                str(BIN / "flower-supernode"),
                "--superlink",
                f"127.0.0.1:{federation.ports['superlink']}",
                "--root-certificates",
                str(folder / "tls" / "ca.crt"),
                "--auth-supernode-private-key",
                str(key),
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--max-retries",
                "0",
            ],  # fmt: skip
            stdout=f,
            stderr=subprocess.STDOUT,
            env=federation._env("intruder"),
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=120)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return code, log.read_text()


FOREIGN_APP = """
import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

server = ServerApp()
client = ClientApp()


@client.query()
def steal(message, context):
    loot = (Path(context.node_config["node-dir"]) / "identity.json").read_text()
    return Message(RecordDict({"loot": ConfigRecord({"identity": loot})}), reply_to=message)


@server.main()
def main(grid, context):
    deadline = time.monotonic() + 120
    while len(grid.get_node_ids()) < context.run_config["nodes"] and time.monotonic() < deadline:
        time.sleep(1)
    asks = [
        Message(RecordDict({"q": ConfigRecord({"a": 1})}), node, "query")
        for node in grid.get_node_ids()
    ]
    said = []
    for reply in grid.send_and_receive(asks, timeout=120):
        if reply.has_error():
            said.append({"error": reply.error.code, "reason": reply.error.reason})
        else:
            said.append({"loot": reply.content.config_records["loot"]["identity"]})
    Path(context.run_config["out"]).write_text(json.dumps(said))
"""


def _foreign_app(federation, tmp_path) -> list[dict]:
    """Someone else's App (its ClientApp returns the node's identity file), submitted to
    the deployment's SuperLink: what each node answered."""
    app = tmp_path / "foreign-app"
    app.mkdir()
    (app / "foreign.py").write_text(FOREIGN_APP)
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "innocent-app"\nversion = "1.0.0"\ndependencies = []\n\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["."]\n\n'
        '[tool.flwr.app]\npublisher = "someone-else"\n\n'
        '[tool.flwr.app.components]\nserverapp = "foreign:server"\n'
        'clientapp = "foreign:client"\n\n[tool.flwr.app.config]\nout = ""\nnodes = 0\n'
    )
    said = tmp_path / "foreign.json"
    config = f"out={json.dumps(str(said))} nodes={len(federation.nodes)}"
    done = federation.flwr("run", str(app), CONNECTION, "--format", "json", "--run-config", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert federation.wait(int(json_of(done.stdout)["run-id"]), 300) == "finished:completed"
    return json.loads(said.read_text())


def test_a_supernode_killed_and_restarted_at_once_is_excluded_then_back(tmp_path):
    """ckks FedAvg, 10 rounds, warm executor: client_2's SuperNode is SIGKILLed once round
    1 is done and started again at once. The SuperLink refuses its activation while it still
    counts the dead session online (Flower exits 305); the supervisor starts it again
    until the SuperLink has marked it offline (20 s: a guarded node beats every 10 s), and
    requests reach it while it is still starting. Meanwhile its requests get Flower's
    "node unavailable" (or time out) and it is excluded. Killed before its upload, the
    round goes on without it; killed between its upload and its consent, the round makes no
    update (its upload is in the sum) and it is a dropout, not a refuser: either way it is
    back, continuing from the state on its node, and the summary names the rounds it
    missed. Killed while pushing a reply (its upload, or its decryption as a decryptor), the
    reply is given up before the others' expire. No other node is lost. The run is degraded
    (Flower: finished:failed)."""
    # rounds take ~2 s once the SuperLink answers "node unavailable": enough of them to
    # cover its 20 s to mark the node offline and the restarted node's start
    config = replace(LARC, protocol="fedavg", rounds=10, local_steps=1)
    folder = tmp_path / "deployment"
    prepare(folder, config, tls=True, auth=True)  # with auth a restarted node keeps its id
    out = tmp_path / "out"
    progress = out.with_name(out.name + "-progress.log")
    with LocalFederation(folder) as federation:
        # a request waits at most 30 s for a node (the SuperLink's TTL too): a round that
        # asks the restarting node costs no more (the dead node's requests mostly get
        # Flower's "unavailable" at once); not less, so that on a loaded machine the live
        # nodes' answers are not taken for dropouts and the round aborted
        run_id = federation.submit(out=str(out), timeout=30.0)
        _wait_for(progress, r"round 1/10", federation, run_id, poll=0.1)
        federation.kill_node("client_2")
        # on a loaded machine this process may look late: rounds done when it died
        done = len(re.findall(r"round \d+/10", progress.read_text()))
        federation.start_node("client_2")
        status = federation.wait(run_id, timeout=600)
        restarts = (federation.work / "supernode-client_2.log").read_text()
    said = progress.read_text()  # what the run printed: the failure message shows it
    print(said)  # whole (an assertion's message is cut), with what the nodes logged
    print(restarts)
    # client_2 missed rounds: the run is degraded, and its ServerApp fails on purpose once
    # the folder is written
    assert status == "finished:failed", said
    assert json.loads((out / "run.json").read_text())["status"] == "degraded", said
    assert "previous session as online" in restarts  # refused at first, then started again
    clients = pd.read_csv(out / "metrics.csv")["clients"].tolist()[1:]
    assert len(clients) == 10 and clients[0] == 6 and 5 in clients, (clients, said)
    assert clients.index(5) <= done + 1, said  # the round it died in, or the next
    assert clients[-1] == 6, (clients, said)  # back
    summary = json.loads((out / "audit_summary.json").read_text())
    assert {e["peer"] for e in summary["exclusions"]} == {"client_2"}, said  # no other lost
    missed = summary["rounds_missed"]
    assert [m["peer"] for m in missed] == ["client_2"], said
    assert missed[0]["rounds"] == [k for k, n in enumerate(clients, 1) if n == 5], said
    assert "client_2 missed round" in said


def _wait_for(path, pattern, federation, run_id, timeout=600, poll=2.0):
    deadline, asked = time.monotonic() + timeout, 0.0
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, path.read_text()):
            return
        if time.monotonic() - asked > 2.0:  # `flwr ls` is a process: not at every look
            asked, status = time.monotonic(), federation.status(run_id)
            if status.startswith("finished"):
                raise AssertionError(f"the run ended ({status}) before {pattern!r} appeared")
        time.sleep(poll)
    raise AssertionError(f"{pattern!r} never appeared in {path}; see {federation.work}")


# ---- the three-site pilot (docs/tutorials/three-sites.md walks the same path) ---------------
OWN_MODEL = Path(__file__).resolve().parents[1] / "examples" / "own_model"


def _logs_of(federation, run_id: int, out: Path) -> str:
    """What the coordinator sees of a run: its progress log and Flower's log of its
    ServerApp (``flwr log``)."""
    shown = federation.flwr("log", str(run_id), CONNECTION, "--show")
    assert f"[secagg] Flower run {run_id}: waiting for 3 SuperNodes" in shown.stdout, shown
    return out.with_name(out.name + "-progress.log").read_text() + shown.stdout + shown.stderr


def _ledger_runs(site: Path) -> dict[int, dict]:
    """A site's privacy ledger: its runs by Flower run id (none before its first admission)."""
    path = site / "privacy-ledger.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else {}
    return {int(key.split("|")[1]): record for key, record in runs.items()}


@pytest.mark.usefixtures("registries")
def test_a_three_site_pilot_a_broken_site_costs_nothing_and_a_foreign_app_is_refused(tmp_path):
    """The three-sites walkthrough, on one machine over a real SuperLink (TLS, node
    authentication): three sites make their own keys (``secagg flower init --auth``), each
    holding only its own CSV and its own copy of the task's code (the own-model walkthrough's
    ``sites-mlp`` with three sites), named in its own node.toml; the coordinator holds only
    the test set and prepares from the sites' public.json files (``--min-clients all``); each
    site joins its bundle.

    1. Site 1's CSV lacks its label column: its node fails at set-up and the coordinator
       learns a code only (no column, path or cell in its logs); with min_clients all the
       seed aborts at set-up, before anything is released, so no ledger is charged.
    2. Site 1 fixes its CSV; the same seed again on the same deployment is admitted by
       every node's ledger and completes, scored on the coordinator's test set only.
    3. A copy of the deployment's App with one byte changed is refused by every node (once
       each), and the coordinator says so with the remedy.

    No site's CSV is ever anywhere but in its own site's folder."""
    from secagg.simulation.cli import main

    # the data: three sites' CSVs (make_sites.py deals four: the fourth is not the pilot's)
    coordinator, made = tmp_path / "coordinator", tmp_path / "made"
    coordinator.mkdir()
    runpy.run_path(str(OWN_MODEL / "make_sites.py"), run_name="make_sites")["main"](made)
    code = (OWN_MODEL / "sites_task.py").read_text()
    assert "\nN_SITES = 4\n" in code
    (coordinator / "sites_task.py").write_text(code.replace("\nN_SITES = 4\n", "\nN_SITES = 3\n"))
    (made / "test.csv").rename(coordinator / "test.csv")

    # 1. each site makes its keys where it runs; only public.json leaves it
    sites = {f"client_{k}": tmp_path / f"site_{k}" for k in range(3)}
    for k, (cid, site) in enumerate(sites.items()):
        assert main(["flower", "init", str(site), "--client", cid, "--auth"]) == 0
        (site / "data").mkdir()
        (made / f"site_{k}.csv").rename(site / "data" / f"site_{k}.csv")
    shutil.rmtree(made)
    broken = sites["client_1"] / "data" / "site_1.csv"
    good = broken.read_text()
    without_label = pd.read_csv(broken).drop(columns="label")
    without_label.to_csv(broken, index=False)  # the site's export lost a column
    cell = broken.read_text().splitlines()[1].split(",")[0]
    # 2. the coordinator prepares from the public keys; its experiment names its own code
    deploy = tmp_path / "deploy"
    prepared = main(
        [
            "flower", "prepare", str(deploy), "--import", str(coordinator / "sites_task.py"),
            "--task", "sites-mlp", "--backend", "ckks", "--rounds", "2", "--seeds", "1",
            "--local-steps", "3", "--min-clients", "all", "--tls", "--auth",
            "--nodes", *(str(site / "public.json") for site in sites.values()),
        ]
    )  # fmt: skip
    assert prepared == 0
    # 3. each site takes its bundle and names its own copy of the code and its own data
    for cid, site in sites.items():
        assert main(["flower", "join", str(site), str(deploy / "nodes" / cid)]) == 0
        (site / "code").mkdir()
        shutil.copy(coordinator / "sites_task.py", site / "code" / "sites_task.py")
        (site / "node.toml").write_text(
            f'imports = ["code/sites_task.py"]\n\n[environment]\nSITES_DIR = "{site / "data"}"\n'
        )

    def csvs() -> list[Path]:
        return sorted(p for p in tmp_path.rglob("*.csv") if p.name.startswith("site_"))

    where = [site / "data" / f"site_{k}.csv" for k, site in enumerate(sites.values())]
    assert csvs() == where  # each site's CSV in its own folder only
    assert sorted(p.name for p in coordinator.glob("*.csv")) == ["test.csv"]

    with LocalFederation(
        deploy, node_dirs=sites, env={"SITES_DIR": str(coordinator)}
    ) as federation:
        pids = [federation.superlink.pid, *(p.pid for p in federation.nodes.values())]
        # 4. the first run: site 1 fails at set-up, the seed aborts before any release
        first = tmp_path / "run-1"
        run_1 = federation.submit(out=str(first))
        # an aborted run is a failed Flower run (RunNotComplete), with secagg's own status
        assert federation.wait(run_1, 300, poll=1.0) == "finished:failed"
        seen = _logs_of(federation, run_1, first)
        assert json.loads((first / "run.json").read_text())["status"] == "aborted", seen
        aborted = json.loads((first / "flower.json").read_text())["aborted"]
        assert list(aborted) == ["1"], seen
        assert "set-up left 2 of 3 clients, need 3 (min_clients all)" in aborted["1"]
        assert "client_1" in aborted["1"] and "the node failed: internal_error" in aborted["1"]
        assert "seed 1 aborted in set-up" in seen
        for secret in ("label", "site_1.csv", str(sites["client_1"]), cell):
            assert secret not in seen, secret  # a code reached the coordinator, nothing else
        node_log = (federation.work / "supernode-client_1.log").read_text()
        assert "'label'" in node_log and "internal_error" in node_log  # the detail stayed
        assert not [r for s in sites.values() for r in _ledger_runs(s).values() if r["released"]]
        assert run_1 not in _ledger_runs(sites["client_1"])  # refused before admission

        # 5. the site fixes its CSV; the same seed again is admitted everywhere and completes
        broken.write_text(good)
        second = tmp_path / "run-2"
        run_2 = federation.submit(out=str(second))
        assert federation.wait(run_2, 600, poll=1.0) == "finished:completed"
        seen = _logs_of(federation, run_2, second)
        assert json.loads((second / "flower.json").read_text())["aborted"] == {}, seen
        metrics = pd.read_csv(second / "metrics.csv")
        assert metrics["round"].tolist() == [0, 1, 2] and metrics["clients"].tolist()[1:] == [3, 3]
        assert metrics[["test_pooled", "test_auc"]].notna().all().all()
        assert not [c for c in metrics.columns if c.startswith("train_")]
        for site in sites.values():
            runs = _ledger_runs(site)
            assert runs[run_2]["released"] and runs[run_2]["open"], runs
            assert all(not r["released"] and not r["open"] for i, r in runs.items() if i != run_2)

        # 6. a foreign App: the deployment's own with one byte changed
        foreign = tmp_path / "foreign-app"
        shutil.copytree(deploy / "app", foreign)
        pyproject = (foreign / "pyproject.toml").read_text()
        assert 'version = "1.0.0"' in pyproject
        (foreign / "pyproject.toml").write_text(pyproject.replace('"1.0.0"', '"1.0.1"'))
        third = tmp_path / "run-3"
        config = f"deployment={json.dumps(str(deploy))} out={json.dumps(str(third))}"
        done = federation.flwr(
            "run", str(foreign), CONNECTION, "--format", "json", "--run-config", config
        )
        assert done.returncode == 0, done.stdout + done.stderr
        run_3 = int(json_of(done.stdout)["run-id"])
        assert federation.wait(run_3, 300, poll=1.0) == "finished:failed"
        seen = _logs_of(federation, run_3, third)
        said = third.with_name(third.name + "-progress.log").read_text()
        refused = re.findall(r"node (\d+) refused this run: invalid_fab", said)
        assert sorted(map(int, refused)) == sorted(federation.node_ids.values()), seen
        assert "not the one pinned in the node's node.json" in seen, seen
        assert not (third / "flower.json").exists()
    deadline = time.monotonic() + 15
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(gone(p) for p in pids)  # every process stopped
    assert csvs() == where  # and no site's CSV was copied anywhere
