"""A prepared deployment on this machine: a SuperLink and one SuperNode per client as
separate processes on loopback (ports chosen free at run time), the run submitted with
``flwr run``, every wait bounded, every process stopped at the end. Each SuperNode is
Flower's, guarded to run the deployment's own App only (``secagg.flower.guard``).

Each process gets its own ``FLWR_HOME`` (Flower installs the submitted App there and keeps
the CLI's connection settings there). Flower runs every message in a ClientApp process of its
own and its SuperNodes poll the SuperLink, so a message costs a fraction of a second (warm
executor) to seconds (``warm=False``: Flower's own) whatever its size; that is Flower's, not
secagg's, and ``python -m benchmarks.flower`` measures it. :meth:`LocalFederation.traffic`
reads what Flower counted of a run's bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from secagg.errors import ConfigError, SecaggError

#: the Flower executables live beside this interpreter (the venv's bin)
BIN = Path(sys.executable).parent
CONNECTION = "secagg"  # the CLI's name for the local SuperLink


class DeploymentError(SecaggError):
    """A Flower process did not start, or the run did not finish in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DeploymentError(f"{log.stem} exited with code {process.returncode}; see {log}")
        with socket.socket() as s:
            s.settimeout(0.3)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise DeploymentError(f"{log.stem} did not open port {port} within {timeout:.0f} s; see {log}")


def json_of(text: str) -> Any:
    """The JSON object the Flower CLI printed (``--format json`` prints it over lines)."""
    start, end = text.find("{"), text.rfind("}")
    if not 0 <= start < end:
        raise DeploymentError(f"the Flower CLI printed no JSON: {text[-400:]!r}")
    return json.loads(text[start : end + 1])


class LocalFederation:
    """The deployment prepared in ``folder`` (``secagg flower prepare``), run locally.

    Use as a context manager: ``with LocalFederation(folder) as fed: fed.run()``; leaving
    it stops every process (also on Ctrl-C). Logs go to ``folder/local/``.

    A deployment whose nodes made their own keys (``prepare --nodes``) runs only from the
    folders its nodes joined their bundles in (``node_dirs``: client id -> folder, each
    made by ``secagg flower init`` and ``join``); ``env`` is the coordinator's own
    environment (the SuperLink's and its ServerApps', not the SuperNodes')."""

    def __init__(
        self,
        folder: Path,
        *,
        log: Callable[[str], None] | None = None,
        warm: bool = True,
        node_dirs: Mapping[str, Path] | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.folder = Path(folder).resolve()
        #: secagg's warm executor on every SuperNode (False: Flower's own, a fresh process
        #: per message; see secagg.flower.warm)
        self.warm = warm
        try:
            self.spec = json.loads((self.folder / "deployment.json").read_text())
        except (OSError, ValueError):
            raise ConfigError(
                f"{self.folder} is not a prepared deployment: run `secagg flower prepare` first"
            ) from None
        if self.spec.get("keys") == "nodes" and node_dirs is None:
            raise ConfigError(
                f"{self.folder}'s keys were made on its nodes (prepare --nodes): its "
                "nodes/ folders are public bundles, which cannot run here; start each node "
                "where its keys are (`secagg flower commands` prints how)"
            )
        if node_dirs is not None and set(node_dirs) != set(self.spec["clients"]):
            raise ConfigError(
                f"node_dirs names {sorted(node_dirs)}; the deployment's clients are "
                f"{self.spec['clients']}: give one node folder for each"
            )
        #: each client's node folder: the deployment's nodes/<client> unless given (a
        #: rehearsal of sites that made their own keys: the folders they joined the bundle in)
        self.node_dirs = {
            c: Path(node_dirs[c]).resolve() if node_dirs else self.folder / "nodes" / c
            for c in self.spec["clients"]
        }
        #: set for the SuperLink and the ServerApp processes it starts (the coordinator's
        #: environment, e.g. where its test set is), not for the SuperNodes
        self.coordinator_env = dict(env or {})
        self.tls, self.auth = bool(self.spec["tls"]), bool(self.spec["auth"])
        self.work = self.folder / "local"
        self.log = log or (lambda line: None)
        #: the SuperLink's one HTTP(S) port: Fleet, Control and ServerApp (Runtime) APIs
        self.ports = {"superlink": free_port()}
        self.superlink: subprocess.Popen | None = None
        self.nodes: dict[str, subprocess.Popen] = {}
        #: the node id the SuperLink gave each registered key (node authentication only)
        self.node_ids: dict[str, int] = {}
        self._node_ports = {c: free_port() for c in self.spec["clients"]}
        #: the Flower run id of the last run submitted by :meth:`run`
        self.run_id: int | None = None

    # ---- processes ----------------------------------------------------------------------
    def _env(self, home: str) -> dict[str, str]:
        env = dict(os.environ)
        if home == "superlink":
            env.update(self.coordinator_env)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # flower-superexec and co.
        env["FLWR_HOME"] = str(self.work / home)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start(self, name: str, command: list[str], home: str) -> subprocess.Popen:
        self.work.mkdir(parents=True, exist_ok=True)
        log = open(self.work / f"{name}.log", "a")  # noqa: SIM115 - the process owns it
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(home),
            cwd=self.work,
            start_new_session=True,  # its own process group: stopping it stops its children
        )

    def start(self, timeout: float = 60.0) -> None:
        tls = self.folder / "tls"
        command = [
            str(BIN / "flower-superlink"),
            "--host", "127.0.0.1", "--port", str(self.ports["superlink"]),
            # the App's code is the installed secagg: nothing is installed for a run
            "--disable-runtime-dependency-installation",
        ]  # fmt: skip
        if self.tls:
            command += [
                "--ssl-ca-certfile", str(tls / "ca.crt"),
                "--ssl-certfile", str(tls / "server.pem"),
                "--ssl-keyfile", str(tls / "server.key"),
            ]  # fmt: skip
        else:
            command.append("--insecure")
        if self.auth:
            command.append("--enable-supernode-auth")
        self.superlink = self._start("superlink", command, "superlink")
        wait_for_port(self.ports["superlink"], self.superlink, timeout, self.work / "superlink.log")
        self._write_cli_config()
        if self.auth:
            for cid in self.spec["clients"]:
                self._register(cid)
        for cid in self.spec["clients"]:
            self.start_node(cid)
        self.log(
            f"SuperLink on 127.0.0.1:{self.ports['superlink']} "
            f"({'TLS' if self.tls else 'insecure'}{', node authentication' if self.auth else ''})"
            f", {len(self.nodes)} SuperNodes started; logs in {self.work}"
        )

    def _write_cli_config(self) -> None:
        home = self.work / "cli"
        home.mkdir(parents=True, exist_ok=True)
        trust = (
            f'root-certificates = "{self.folder / "tls" / "ca.crt"}"'
            if self.tls
            else "insecure = true"
        )
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.ports["superlink"]}"\n{trust}\n'
        )

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                [str(BIN / "flwr"), *args],
                env=self._env("cli"),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise DeploymentError(f"`flwr {' '.join(args)}` took over {timeout:.0f} s") from None

    def _register(self, cid: str) -> None:
        done = self.flwr(
            "supernode", "register", str(self.folder / "auth" / f"{cid}.pub"), CONNECTION,
            "--format", "json",
        )  # fmt: skip
        if done.returncode != 0:
            raise DeploymentError(f"registering {cid}'s key failed: {done.stdout}{done.stderr}")
        self.node_ids[cid] = int(json_of(done.stdout)["node-id"])

    def node_status(self, cid: str) -> str:
        """What the SuperLink says of ``cid``'s node ("online", "offline", ...; node
        authentication only, where the node's id is known before it connects)."""
        done = self.flwr("supernode", "ls", CONNECTION, "--format", "json")
        try:
            nodes = json_of(done.stdout)["nodes"]
        except (DeploymentError, KeyError):
            return "unknown"
        return next(
            (str(n.get("status")) for n in nodes if int(n["node-id"]) == self.node_ids[cid]),
            "unknown",
        )

    def node_command(self, cid: str) -> list[str]:
        """The command that starts ``cid``'s SuperNode: Flower's, guarded so that it runs
        only the App pinned in its node folder (``secagg.flower.guard``)."""
        node = self.node_dirs[cid]
        command = [
            sys.executable, "-m", "secagg.flower.guard", str(node),
            "--superlink", f"127.0.0.1:{self.ports['superlink']}",
            "--host", "127.0.0.1", "--port", str(self._node_ports[cid]),
        ]  # fmt: skip
        command += ["--root-certificates", str(node / "ca.crt")] if self.tls else ["--insecure"]
        command += [] if self.warm else ["--cold"]
        if self.auth:
            command += ["--auth-supernode-private-key", str(node / "auth.key")]
        return command

    def start_node(self, cid: str) -> None:
        """Start (or restart) the SuperNode of ``cid`` with its node folder."""
        self.nodes[cid] = self._start(f"supernode-{cid}", self.node_command(cid), f"node-{cid}")

    def kill_node(self, cid: str) -> None:
        """SIGKILL the SuperNode of ``cid`` and its ClientApp (a machine that died)."""
        _stop(self.nodes.pop(cid), signal.SIGKILL)

    def stop(self) -> None:
        for process in [*self.nodes.values(), self.superlink]:
            if process is not None:
                _stop(process, signal.SIGTERM)
        self.nodes, self.superlink = {}, None

    def __enter__(self) -> LocalFederation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- runs ---------------------------------------------------------------------------
    def submit(self, **run_config: Any) -> int:
        """``flwr run`` the deployment's App with ``run_config`` (its keys: deployment,
        out, timeout, connect-timeout); returns the Flower run id. The App names no folder
        (it is relocatable): ``deployment`` is this one unless given."""
        run_config.setdefault("deployment", str(self.folder))
        if "out" in run_config:  # the ServerApp runs in another working directory
            run_config["out"] = str(Path(run_config["out"]).resolve())
        overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
        args = ["run", str(self.folder / "app"), CONNECTION, "--format", "json"]
        done = self.flwr(*args, *(["--run-config", overrides] if overrides else []))
        if done.returncode != 0:
            raise DeploymentError(f"flwr run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return int(json_of(done.stdout)["run-id"])

    def status(self, run_id: int) -> str:
        done = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        try:
            return str(json_of(done.stdout)["runs"][0]["status"])
        except (DeploymentError, KeyError, IndexError):
            return "unknown"

    def wait(self, run_id: int, timeout: float, poll: float = 5.0) -> str:
        """The run's final status (``finished:completed`` when it went well); a run still
        going after ``timeout`` seconds is stopped and DeploymentError raised. Every ``poll``
        seconds: each look is a ``flwr ls`` process, about a quarter of a core while it runs,
        which a benchmark's rounds would otherwise compete with."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            time.sleep(poll)
        self.flwr("stop", str(run_id), CONNECTION)
        raise DeploymentError(
            f"run {run_id} did not finish within {timeout:.0f} s; see {self.work}/superlink.log"
        )

    def run(self, *, out: Path, timeout: float = 1800.0, **run_config: Any) -> str:
        """Submit the run, wait for it, return its status; results in ``out``. Its Flower
        run id is ``self.run_id`` from the submission on."""
        out = Path(out).resolve()  # the ServerApp runs in another working directory
        if out.exists():
            shutil.rmtree(out)
        self.run_id = run_id = self.submit(out=str(out), **run_config)
        self.log(f"Flower run {run_id} submitted; results will be in {out}")
        return self.wait(run_id, timeout)

    def traffic(self, run_id: int) -> dict[str, int]:
        """What the SuperLink counted of a run's traffic with its SuperNodes (``flwr ls``'s
        network-traffic: ``inbound-bytes`` from the nodes, ``outbound-bytes`` to them)."""
        done = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        try:
            counted = json_of(done.stdout)["runs"][0]["network-traffic"]
            return {k: int(counted[k]) for k in ("inbound-bytes", "outbound-bytes")}
        except (DeploymentError, KeyError, IndexError, TypeError, ValueError):
            raise DeploymentError(
                f"`flwr ls` gave no traffic for run {run_id}: {done.stdout[-400:]}"
            ) from None


def _stop(process: subprocess.Popen, sig: int) -> None:
    """Stop a process we started and every process of its group (SuperExec, ClientApps)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(5)
