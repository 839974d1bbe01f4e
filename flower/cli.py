"""``secagg flower``: prepare a deployment, run it on this machine, or print the commands
that start it on several."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from secagg.errors import ConfigError, SecaggError

if TYPE_CHECKING:
    from secagg.flower.redeploy import Reprepared

#: Flower's defaults: the SuperLink's one port (SuperNodes, CLI, ServerApp), and a SuperNode's
#: Runtime API (``flower-supernode --port``), which ``commands`` counts up from, one per node
SUPERLINK_PORT, NODE_PORT = 9092, 9094
#: seconds a SuperNode has to answer one message, unless `prepare --timeout` says otherwise
DEFAULT_TIMEOUT = 120.0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}")
    return port


def superlink_address(given: str, port: int | None) -> tuple[str, int]:
    """(host, port) of ``--superlink HOST[:PORT]`` and ``--superlink-port`` (ConfigError where they
    name two ports). A bare IPv6 address is a host; ``[::1]:9092`` names a port."""
    host, named = given, None
    head, sep, tail = given.rpartition(":")
    if sep and tail.isdigit() and (":" not in head or head.startswith("[")):
        host, named = head, _port(tail)
    if named is not None and port is not None and named != port:
        raise ConfigError(
            f"--superlink {given} and --superlink-port {port} name two ports: give one"
        )
    return host, named or port or SUPERLINK_PORT


def add_parser(sub: Any, add_settings: Any) -> None:
    """``secagg flower`` and its verbs, on ``sub`` (``secagg``'s sub-commands): each parser
    is of ``sub``'s class (``secagg.simulation.cli.SuggestingParser``: no abbreviated flags,
    "did you mean" for flags, choices and verbs)."""
    from secagg.runspec.settings import preset_names

    flower = sub.add_parser(
        "flower",
        help="run an experiment over Flower: SuperLink and SuperNodes, TLS, node "
        "authentication (`secagg flower -h`)",
        description="secagg over Flower: `prepare` writes a deployment folder for one "
        "experiment (settings, keys, one folder per SuperNode, the Flower App); `demo` runs "
        "it on this machine with a SuperLink and one SuperNode per client as separate "
        "processes; `commands` prints the commands that start it on separate machines.",
    )
    verbs = flower.add_subparsers(dest="verb", metavar="VERB", required=True)
    prepare = verbs.add_parser(
        "prepare",
        help="write a deployment folder for an experiment, or re-prepare one (--update)",
        description="Write DIR: the experiment's settings (the same flags and TOML keys as "
        "`secagg run`), each client's secagg identity in its own node folder (mode 0600), "
        "the server's roster of public signing keys, the Flower App, and with --tls a demo "
        "CA and SuperLink certificate, with --auth each SuperNode's authentication key. "
        "With --update, re-prepare the deployment DIR in place for changed settings: "
        "DIR's own settings with --preset, --config and the flags over them; the CA, the "
        "SuperLink's certificate and key, the SuperNode keys, the nodes' keys and rosters "
        "and the experimenter's key are kept as they are, the settings, the App and the "
        "node bundles rewritten, and it prints which sites must take their new bundle "
        "(`secagg flower join`). It refuses what cannot keep them: other clients, TLS or "
        "authentication switched on, other certificates, changed public.json files.",
    )
    prepare.add_argument(
        "folder", type=Path, metavar="DIR", help="a new or empty folder (--update: a deployment)"
    )
    prepare.add_argument(
        "--update",
        action="store_true",
        help="re-prepare the deployment DIR in place, keeping its CA, certificates and keys "
        "(after a failed run, only if the settings must change: else submit it again)",
    )
    prepare.add_argument("--tls", action="store_true", help="make a demo CA and certificate")
    prepare.add_argument(
        "--auth", action="store_true", help="SuperNode authentication keys (needs --tls)"
    )
    own = prepare.add_argument_group(
        "your own CA (instead of --tls's demo CA: all three, checked before anything is written)"
    )
    own.add_argument("--ca-cert", type=Path, metavar="PEM", help="the CA certificate nodes trust")
    own.add_argument(
        "--server-cert", type=Path, metavar="PEM", help="the SuperLink's certificate, by that CA"
    )
    own.add_argument("--server-key", type=Path, metavar="PEM", help="the SuperLink's private key")
    prepare.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a SuperNode has to answer one message before the server counts it "
        f"missing (default {DEFAULT_TIMEOUT:g}; --update: the deployment's)",
    )
    prepare.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="the SuperLink machine's host name or address, for its TLS certificate "
        "(repeatable; loopback is always in it)",
    )
    prepare.add_argument(
        "--nodes",
        nargs="+",
        type=Path,
        default=[],
        metavar="PUBLIC_JSON",
        help="the public.json of every node (`secagg flower init` on each node): the "
        "rosters are assembled from them and no private key is made here; nodes/<client>/ "
        "then holds each node's public bundle, for `secagg flower join`",
    )
    prepare.add_argument(
        "--observer",
        type=Path,
        metavar="PUBLIC",
        help="server-blind runs: the experimenter's observer.pub (`secagg flower experimenter`"
        " where the experimenter works); without it prepare makes the key pair in "
        "DIR/experimenter/, which must then leave the server's machine",
    )
    prepare.add_argument(
        "--preset",
        choices=preset_names(),
        metavar="NAME",
        help="a bundled preset (`secagg presets` lists them)",
    )
    prepare.add_argument("--config", type=Path, help="a TOML file of settings")
    add_settings(prepare)
    demo = verbs.add_parser(
        "demo",
        help="run a prepared deployment on this machine",
        description="Start a SuperLink and one SuperNode per client (separate processes on "
        "loopback, free ports), submit the run with `flwr run`, wait for it, stop every "
        "process. Results go to DIR/results/ (the run folder of `secagg run`, plus "
        "flower.json: Flower's framing overhead and the node ids).",
    )
    demo.add_argument("folder", type=Path, metavar="DIR", help="a prepared deployment")
    demo.add_argument("--wait", type=float, default=7200.0, help="give up after this many seconds")
    node = verbs.add_parser(
        "node",
        help="start a SuperNode for a node folder that runs only the deployment's own App",
        description="Start Flower's SuperNode for the node folder DIR (its --node-config is "
        "the folder), guarded: it runs only the Flower App whose digest `prepare` pinned in "
        "DIR/node.json and answers every other App's run with Flower's 'invalid FAB' error, "
        "before any of its code runs or sees the folder. Each message runs in a process "
        "of its own, forked from a warm one that imported everything once (--cold: "
        "Flower's own executor, a fresh process per message). Every other option is "
        "flower-supernode's (--superlink, --root-certificates, "
        "--auth-supernode-private-key, ...).",
    )
    node.add_argument("folder", type=Path, metavar="DIR", help="a node folder")
    node.add_argument(
        "flower_args",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="flower-supernode's options",
    )
    init = verbs.add_parser(
        "init",
        help="on a node's machine: make its keys; only public.json leaves it",
        description="Make this node's secagg keys (X25519 and Ed25519, keys.json, mode 0600) "
        "and with --auth its SuperNode key (auth.key, 0600) in DIR, and write public.json: "
        "the public halves, the one file to send to the coordinator (`secagg flower "
        "prepare --nodes ...`). Nothing private leaves DIR.",
    )
    init.add_argument("folder", type=Path, metavar="DIR", help="the node's own folder")
    init.add_argument("--client", required=True, help="the client this node is (client_0 ...)")
    init.add_argument("--auth", action="store_true", help="also a SuperNode key")
    join = verbs.add_parser(
        "join",
        help="on a node's machine: take in the coordinator's bundle for it",
        description="Copy the coordinator's bundle for this node (nodes/<client>/ of a "
        "deployment prepared with --nodes: settings, the pinned App's digest, the rosters, "
        "the CA certificate) into the node's folder, after checking that the rosters hold "
        "this node's own public keys (a bundle that fails leaves the node's own in place). "
        "Then start the node with `secagg flower node DIR`. After the coordinator "
        "re-prepares (`prepare --update`), join again with the new bundle: the keys stay.",
    )
    join.add_argument("folder", type=Path, metavar="DIR", help="the node's own folder")
    join.add_argument("bundle", type=Path, metavar="BUNDLE", help="its nodes/<client> folder")
    experimenter = verbs.add_parser(
        "experimenter",
        help="server-blind runs: make the experimenter's key pair where the experimenter works",
        description="Make the X25519 key pair the clients of a server-blind run seal the "
        "global model for: observer.key (mode 0600, stays in DIR) and observer.pub (give it "
        "to the coordinator: `secagg flower prepare --observer observer.pub`). The server "
        "relays sealed copies it cannot open; `secagg flower open` reads them here.",
    )
    experimenter.add_argument("folder", type=Path, metavar="DIR", help="the experimenter's folder")
    opener = verbs.add_parser(
        "open",
        help="server-blind runs: open and evaluate the models sealed for the experimenter",
        description="Open every model the clients sealed for the experimenter in the run "
        "folder RUN (RUN/sealed/, copied from the server) with the experimenter's private "
        "key, and evaluate each on the task's test set as `secagg run` does: "
        "RUN/experimenter/metrics.csv and RUN/experimenter/models/seed-S.npy.",
    )
    opener.add_argument("run_folder", type=Path, metavar="RUN", help="the run's results folder")
    opener.add_argument("--key", type=Path, required=True, help="the experimenter's observer.key")
    status = verbs.add_parser(
        "status",
        help="a deployment's runs: Flower's status and traffic, secagg's progress",
        description="List the runs on the deployment's SuperLink (`flwr ls` on the "
        "connection `secagg`: the demo's while `secagg flower demo DIR` runs, else the one "
        "`secagg flower commands` prints), each with its status, elapsed time and traffic, "
        "and the ServerApp's last progress line (seed, round, metric, bytes) where its log "
        "is in DIR/results. The same progress streams with `flwr log RUN secagg`.",
    )
    status.add_argument("folder", type=Path, metavar="DIR", help="a prepared deployment")
    status.add_argument("--run", type=int, metavar="ID", help="only this Flower run")
    stopper = verbs.add_parser(
        "stop",
        help="stop a run of the deployment (`flwr stop`)",
        description="Stop Flower run ID on the deployment's SuperLink (`flwr stop ID secagg`). "
        "The nodes keep their state of the run, but a stopped run is not resumed: submit it "
        "again as a new run, which each node admits if the stopped run released none of its "
        "data or its node.toml allows another run of the seed ([privacy] runs_per_seed).",
    )
    stopper.add_argument("folder", type=Path, metavar="DIR", help="a prepared deployment")
    stopper.add_argument("run", type=int, metavar="ID", help="the Flower run id")
    commands = verbs.add_parser(
        "commands",
        help="print the commands that start a prepared deployment on separate machines",
        description="Print the commands that start the SuperLink (listening on --superlink-port), "
        "register the nodes' keys, start each node's guarded SuperNode (connecting to "
        "--superlink HOST:PORT, each with a Runtime API port of its own from --node-port "
        "on, so that several nodes can share a machine) and submit the run.",
    )
    commands.add_argument("folder", type=Path, metavar="DIR", help="a prepared deployment")
    commands.add_argument(
        "--superlink",
        default="SUPERLINK_HOST",
        metavar="HOST[:PORT]",
        help="the SuperLink's host name or address, with its port if not --superlink-port's",
    )
    commands.add_argument(
        "--superlink-port",
        type=_port,
        default=None,
        metavar="PORT",
        help=f"the SuperLink's port (default {SUPERLINK_PORT}, or the one --superlink names)",
    )
    commands.add_argument(
        "--node-port",
        type=_port,
        default=NODE_PORT,
        metavar="PORT",
        help=f"the first node's Runtime API port (default {NODE_PORT}); the next node's is "
        "one more, and so on: nodes on one machine must not share one",
    )


def run(args: argparse.Namespace, resolve: Any) -> int:
    if args.verb == "prepare":
        return _prepare(args, resolve)
    if args.verb == "demo":
        return _demo(args)
    if args.verb == "init":
        from secagg.flower.deployment import init_node

        public = init_node(args.folder, args.client, auth=args.auth)
        print(
            f"keys of {args.client} made in {args.folder}/; send {public} (public keys "
            "only) to the coordinator"
        )
        return 0
    if args.verb == "join":
        from secagg.flower.deployment import join_node

        missing = join_node(args.folder, args.bundle)
        if missing:
            print(
                f"the experiment imports {', '.join(missing)}: a node runs only code its "
                f"operator names, so put the path of your own copy of each in "
                f"{args.folder}/node.toml (imports = [...]) before you start the node"
            )
            return 0
        print(
            f"{args.folder} is ready: start its node (stop it first if it runs: a node reads "
            f"its pinned App when it starts): secagg flower node {args.folder} --superlink ..."
        )
        return 0
    if args.verb == "experimenter":
        from secagg.flower.experimenter import make_experimenter

        public = make_experimenter(args.folder)
        print(
            f"experimenter key made in {args.folder}/ (observer.key stays there); give "
            f"{public} to the coordinator: secagg flower prepare ... --observer {public.name}"
        )
        return 0
    if args.verb == "open":
        from secagg.flower.experimenter import open_sealed

        table = open_sealed(args.run_folder, args.key, progress=_stderr)
        print(f"the experimenter's metrics: {table}")
        return 0
    if args.verb == "status":
        from secagg.flower import operations

        print(operations.format_runs(operations.runs(args.folder, args.run)))
        return 0
    if args.verb == "stop":
        from secagg.flower import operations

        print(operations.stop(args.folder, args.run) or f"run {args.run} stopped")
        return 0
    if args.verb == "node":
        from secagg.flower import guard

        guard.main([str(args.folder), *args.flower_args])  # supervised: restarts come back
        return 0
    return _commands(args)


def _prepare(args: argparse.Namespace, resolve: Any) -> int:
    from secagg.flower.deployment import prepare
    from secagg.runspec import settings as S

    args.resume, args.overwrite = None, False
    own_tls = _own_tls(args)
    if args.update:
        return _update(args, resolve, own_tls)
    config, _ = S.to_config(resolve(args))
    nodes = prepare(
        args.folder,
        config,
        tls=args.tls,
        auth=args.auth,
        timeout=DEFAULT_TIMEOUT if args.timeout is None else args.timeout,
        hosts=tuple(args.host),
        publics=tuple(args.nodes),
        own_tls=own_tls,
        observer=args.observer,
    )
    if config.server_blind and args.observer is None:
        _say_experimenter_key(args.folder)
    print(
        f"deployment of {config.protocol} on {config.backend} ({config.task}, "
        f"{len(nodes)} clients) written to {args.folder}/"
    )
    if args.nodes:  # the sites' keys are theirs: the nodes can only run where those are
        print(
            "each site takes its bundle (a copy of nodes/<client>/) with `secagg flower join "
            "NODE_DIR BUNDLE` and starts its node; every command, for every machine: "
            f"secagg flower commands {args.folder} --superlink HOST"
        )
    else:
        print(
            f"run it here: secagg flower demo {args.folder}\n"
            f"or on separate machines: secagg flower commands {args.folder}"
        )
    return 0


def _own_tls(args: argparse.Namespace) -> dict[str, Path] | None:
    """The deployment's own CA, certificate and key (all three given), or None (none)."""
    given = {"ca": args.ca_cert, "cert": args.server_cert, "key": args.server_key}
    flags = {"ca": "--ca-cert", "cert": "--server-cert", "key": "--server-key"}
    missing = [flags[k] for k, v in given.items() if v is None]
    if any(given.values()) and missing:
        raise ConfigError(
            "your own CA takes all three: --ca-cert, --server-cert and --server-key "
            f"(missing: {', '.join(missing)})"
        )
    return given if not missing else None


def _say_experimenter_key(folder: Path) -> None:
    print(
        f"server-blind: the experimenter's private key is in {folder}/experimenter/"
        "; move that folder off the server's machine before the run (or make the key "
        "where the experimenter works: secagg flower experimenter, prepare --observer)"
    )


def _update(args: argparse.Namespace, resolve: Any, own_tls: dict[str, Path] | None) -> int:
    """``prepare DIR --update``: DIR re-prepared in place, and what each site must do."""
    from secagg.flower.redeploy import read_deployment, reprepare, updated_settings
    from secagg.runspec import settings as S

    read_deployment(args.folder)  # before its settings are read: a deployment, whole
    config, _ = S.to_config(updated_settings(args.folder, resolve(args)))
    made_experimenter = not (args.folder / "experimenter").exists()
    done = reprepare(
        args.folder,
        config,
        tls=args.tls or None,  # a flag not given keeps the deployment's
        auth=args.auth or None,
        timeout=args.timeout,
        hosts=tuple(args.host),
        publics=tuple(args.nodes),
        own_tls=own_tls,
        observer=args.observer,
    )
    made_experimenter = made_experimenter and (args.folder / "experimenter").exists()
    if made_experimenter:
        _say_experimenter_key(args.folder)
    was = "unchanged" if done.previous == done.experiment else f"was {done.previous}"
    print(
        f"{args.folder}/ re-prepared in place: experiment {done.experiment} ({was}), "
        f"{config.protocol} on {config.backend}, {config.rounds} round"
        f"{'s' if config.rounds != 1 else ''}; kept as they were: "
        f"{_kept(args.folder, done, experimenter=not made_experimenter)}"
    )
    for line in _site_steps(args.folder, done):
        print(line)
    return 0


def _site_steps(folder: Path, done: Reprepared) -> list[str]:
    """What each site must do after ``prepare --update``, then how to run it."""
    submit = submit_command(folder.resolve())
    if not done.rejoin:
        lines = ["no site must take a new bundle: nothing a node's bundle pins changed"]
    else:
        lines = [
            f"{cid}: " + (f"new bundle ({', '.join(names)} changed)" if names else "unchanged")
            for cid, names in done.changed.items()
        ]
    if done.rejoin and done.keys == "nodes":
        lines.append(
            "each site with a new bundle: stop its node, `secagg flower join NODE_DIR "
            f"BUNDLE` (BUNDLE: a copy of {folder}/nodes/<client>/), start its node again"
        )
    elif done.rejoin:  # a demo's node folders are the nodes, rewritten in place
        lines.append(
            f"a node started from a copy of {folder}/nodes/<client>/ takes the changed "
            "files and starts again"
        )
    if done.keys == "nodes":
        lines.append(f"then submit (`secagg flower commands {folder}` prints all): {submit}")
    else:
        lines.append(
            f"then run it here: secagg flower demo {folder}; or, its nodes on other "
            f"machines, submit: {submit}"
        )
    return lines


def _kept(folder: Path, done: Reprepared, *, experimenter: bool) -> str:
    """What ``prepare --update`` kept as it was, in words (``experimenter``: the
    experimenter's key, where there is one, was not made just now)."""
    kept = [name for name in ("tls/", "auth/") if (folder / name).is_dir()]
    kept += ["server/signers.json"]
    kept += ["the sites' rosters" if done.keys == "nodes" else "the nodes' keys"]
    if experimenter and (folder / "observer.pub").exists():
        kept.append("the experimenter's key")
    return ", ".join(kept)


def submit_command(folder: Path) -> str:
    """The command that submits a run of the deployment in ``folder`` (the Flower CLI's
    connection ``secagg``)."""
    return f"flwr run {folder}/app secagg --stream --run-config 'deployment=\"{folder}\"'"


def _demo(args: argparse.Namespace) -> int:
    from secagg.flower.launch import LocalFederation

    out = args.folder.resolve() / "results"
    say = _stderr
    with LocalFederation(args.folder, log=say) as federation:
        run_id = federation.submit(out=str(out))
        say(f"Flower run {run_id}: progress in {out}-progress.log")
        status = federation.wait(run_id, args.wait)
    flower = (
        json.loads((out / "flower.json").read_text()) if (out / "flower.json").is_file() else None
    )
    # a degraded or aborted run fails its ServerApp on purpose (Flower: finished:failed),
    # after writing its folder: report secagg's status and exit with its code
    mine = (flower or {}).get("status", "complete")
    if flower is None or (status != "finished:completed" and mine == "complete"):
        raise SecaggError(f"the Flower run ended {status}; logs in {federation.work}/")
    for problem in flower.get("problems", []):
        say(f"{mine}: {problem}")
    framing = flower["framing"]
    print(
        f"results in {out}/; Flower's framing: {framing['messages_sent']} requests "
        f"(+{framing['bytes_sent'] / max(framing['messages_sent'], 1):.0f} B each), "
        f"{framing['messages_received']} replies "
        f"(+{framing['bytes_received'] / max(framing['messages_received'], 1):.0f} B each)"
    )
    if mine != "complete":
        from secagg.runspec.status import EXIT_CODES, RunStatus

        line = RunStatus(mine, tuple(flower.get("problems", []))).line()
        print(f"{line} (Flower: {status}; exit status {EXIT_CODES.get(mine, 1)})")
        return EXIT_CODES.get(mine, 1)
    return 0


def _commands(args: argparse.Namespace) -> int:
    folder = args.folder.resolve()
    try:
        spec = json.loads((folder / "deployment.json").read_text())
    except (OSError, ValueError):
        raise SecaggError(f"{folder} is not a prepared deployment") from None
    host, port = superlink_address(args.superlink, args.superlink_port)
    if args.node_port + len(spec["clients"]) - 1 > 65535:
        raise ConfigError(f"--node-port {args.node_port} leaves too few ports for every node")
    link_address = f"{host}:{port}"
    trust = "--root-certificates ca.crt" if spec["tls"] else "--insecure"
    lines = [
        f"# on the SuperLink's machine (keep tls/server.key there only): one port, {port}, for",
        "# the SuperNodes, the CLI and the ServerApp; nothing is installed for a run (the App's",
        "# code is the installed secagg)",
    ]
    link = (
        f"flower-superlink --host 0.0.0.0 --port {port} --disable-runtime-dependency-installation"
    )
    if spec["tls"]:
        link += f" --ssl-ca-certfile {folder}/tls/ca.crt --ssl-certfile {folder}/tls/server.pem"
        link += f" --ssl-keyfile {folder}/tls/server.key"
    else:
        link += " --insecure"
    if spec["auth"]:
        link += " --enable-supernode-auth"
    lines += [link, ""]
    trust_line = f'root-certificates = "{folder}/tls/ca.crt"' if spec["tls"] else "insecure = true"
    lines += [
        "# the Flower CLI's connection, on the machine that submits runs",
        "cat >> ${FLWR_HOME:-~/.flwr}/config.toml <<EOF",
        "[superlink.secagg]",
        f'address = "{link_address}"',
        trust_line,
        "EOF",
    ]
    if spec["auth"]:
        lines += [f"flwr supernode register {folder}/auth/{c}.pub secagg" for c in spec["clients"]]
    lines += [
        "",
        "# on each client's machine, in a copy of its node folder: Flower's SuperNode, guarded",
        "# to run only the App pinned in node.json (never start it as plain flower-supernode).",
        f"# Each node has a Runtime API port of its own (--port, from {args.node_port} on), on",
        "# loopback, between the SuperNode and its ClientApp processes: nodes that share a",
        "# machine must not share one (another node's SuperNode would fail to start on it)",
    ]
    own_keys = spec.get("keys") == "nodes"
    if own_keys:
        lines += [
            "# (each node's folder is the one `secagg flower init` made its keys in; first",
            "# take in its bundle, a copy of this deployment's nodes/<client>/)",
        ]
    for k, cid in enumerate(spec["clients"]):
        node = (
            f"secagg flower node . --superlink {link_address} --port {args.node_port + k} {trust}"
        )
        if spec["auth"]:
            node += " --auth-supernode-private-key auth.key"
        if own_keys:
            lines.append(f"cd NODE_DIR_OF_{cid} && secagg flower join . BUNDLE_{cid} && {node}")
        else:
            lines.append(f"cd {cid} && {node}")
    lines += [
        "",
        "# submit the run (results on the SuperLink's machine, in the deployment's results/)",
        submit_command(folder),
        "",
        "# after a failed run, if no setting must change (a site fixed its data, a node",
        "# crashed): start again what stopped and submit the same line again; each node admits",
        "# the new run while its privacy ledger allows (a run that released nothing costs",
        "# nothing). If a setting must change: secagg flower prepare DIR --update --rounds ...",
        "# (it keeps the CA, the certificates and every key, and says which sites re-join)",
    ]
    print("\n".join(lines))
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
