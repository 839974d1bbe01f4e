"""The audit: every message the server sent or received, and what it learned in plaintext.

One record per message: run, round, phase, direction, peer, and per field its name, kind,
bytes and — for plaintext scalars — the value itself. Reveals (aggregates the server reads)
and exclusions (with the reason) are records too. Byte accounting is derived from the same
records, so the bytes reported are the bytes audited.

``summary()`` states what the server learned in plaintext: every received non-ciphertext
field and every revealed aggregate, counted by name, the items the protocol did not declare,
and ``individual_updates_revealed`` — true when any client's own update arrived readable — and
which learned items differential privacy covers (``dp_protected_items``) and which it does
not (``not_dp_protected_items``: data-derived items learned without DP noise).

Round numbers are the user's, the same as ``metrics.csv``'s: every record's ``round`` is
k ≥ 1 for training round k (the traffic that made metrics round k), and 0 for the set-up
before the first training round (the backend's key setup, the enrolment, a protocol's
initialisation such as DEC's k-means), whose records also say ``"stage": "setup"``
(``"round"`` otherwise). ``protocol_round`` is the protocol's own index, the one envelopes,
consents and error messages carry (training round k is protocol round k − 1; set-up is
protocol round 0). The engine says when set-up begins and each round starts
(:meth:`AuditLog.begin_setup`, :meth:`AuditLog.begin_round`); records made without it (an
exchange driven by hand) count as training rounds. A pre-stage (run ``"<seed>-<stage>"``:
FedDisco's β-VAE, DEC's autoencoder) is a run of its own: its set-up is its round 0 and its
rounds are numbered 1, 2, ... within the pre-stage, independently of the seed's main run.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from secagg import wire
from secagg.wire import Envelope

ENVELOPE = "<envelope>"  # pseudo-field: framing and header bytes of a message
KIND_LABEL = {
    wire.CIPHERTEXT: "ciphertext",
    wire.SCALAR: "plaintext scalar",
    wire.VECTOR: "plaintext vector",
    wire.CONFIG: "plaintext config",
}

#: the ``stage`` of records before the first training round (key setup, enrolment,
#: the protocol's initialisation): their ``round`` is 0
SETUP = "setup"
#: the ``stage`` of a training round's records (``round`` k ≥ 1)
ROUND = "round"


class AuditLog:
    def __init__(self, update_fields: Iterable[str] = ("pseudo_gradient",)):
        #: fields that carry one client's own model update
        self.update_fields = set(update_fields)
        self.records: list[dict[str, Any]] = []
        self.run: str = "0"
        self.declared: set[str] = set()
        #: items covered by differential privacy in this run (the engine fills it)
        self.dp_protected: set[str] = set()
        #: each item in ``dp_protected``: the mechanism that covers it, and how far
        self.dp_coverage: dict[str, str] = {}
        #: key-setup and receipt items: protocol machinery, derived from no client data
        self.infrastructure: set[str] = set()
        #: who can decrypt what the clients upload (``ServerBackend.who_can_decrypt``, set
        #: by the engine)
        self.who_can_decrypt: str = "unknown"
        #: SETUP from the engine's set-up until its first round starts, ROUND otherwise
        self.stage: str = ROUND
        #: the protocol's weights vary with the data every round (the run view counts its
        #: uploads per model, as the clients do; set by the engine)
        self.weights_vary = False

    def dp_protect(self, item: str, mechanism: str) -> None:
        """``item`` is covered by differential privacy, as ``mechanism`` says (several
        mechanisms on one item are listed together)."""
        self.dp_protected.add(item)
        known = self.dp_coverage.get(item)
        if known is None:
            self.dp_coverage[item] = mechanism
        elif mechanism not in known:
            self.dp_coverage[item] = f"{known}; {mechanism}"

    # ---- round numbers ------------------------------------------------------------------
    def begin_setup(self) -> None:
        """What follows, until :meth:`begin_round`, is set-up: round 0 (an abort of the
        set-up, recorded after it stopped, too)."""
        self.stage = SETUP

    def begin_round(self) -> None:
        """What follows is a training round: protocol round r is round r + 1."""
        self.stage = ROUND

    def round_number(self, protocol_round: int) -> int:
        """The user's round of a record made at ``protocol_round`` (the engine's index)
        now: 0 in set-up, ``protocol_round + 1`` in a training round. A negative (unknown)
        round stays as it is."""
        if self.stage == SETUP:
            return 0
        return protocol_round + 1 if protocol_round >= 0 else protocol_round

    def _where(self, protocol_round: int) -> dict[str, Any]:
        return {
            "run": self.run,
            "round": self.round_number(protocol_round),
            "stage": self.stage,
            "protocol_round": protocol_round,
        }

    # ---- recording ----------------------------------------------------------------------
    def message(self, direction: str, env: Envelope, total_bytes: int, peer: str) -> None:
        fields = []
        for name, f in env.fields.items():
            item: dict[str, Any] = {"name": name, "kind": KIND_LABEL[f.kind], "bytes": f.nbytes}
            if f.kind == wire.SCALAR:
                item["value"] = env.scalar(name)
            fields.append(item)
        header = total_bytes - sum(f.nbytes for f in env.fields.values())
        fields.append({"name": ENVELOPE, "kind": "framing", "bytes": header})
        self.records.append(
            {
                "event": "message",
                **self._where(env.round),
                "phase": env.phase,
                "direction": direction,
                "peer": peer,
                "bytes": total_bytes,
                "fields": fields,
            }
        )

    def undecodable(
        self, round_number: int, phase: str, peer: str, nbytes: int, reason: str
    ) -> None:
        self.records.append(
            {
                "event": "message",
                **self._where(round_number),
                "phase": phase,
                "direction": "received",
                "peer": peer,
                "bytes": nbytes,
                "fields": [{"name": ENVELOPE, "kind": "undecodable", "bytes": nbytes}],
                "error": reason,
            }
        )

    def reveal(self, round_number: int, phase: str, name: str, length: int, by: str) -> None:
        self.records.append(
            {
                "event": "reveal",
                **self._where(round_number),
                "phase": phase,
                "name": name,
                "kind": "plaintext vector",
                "length": length,
                "by": by,
            }
        )

    def opened(self, round_number: int, name: str) -> None:
        """An aggregate sent to the clients for them to open (they learn it, not the
        server: LARC's Ĝ, RegAgg's centre, server-blind updates)."""
        self.records.append({"event": "opened", **self._where(round_number), "name": name})

    def aborted(self, round_number: int, phase: str, reason: str) -> None:
        """A round that ended with no usable client (the run of ``self.run`` stopped)."""
        self.records.append(
            {
                "event": "aborted",
                **self._where(round_number),
                "phase": phase,
                "reason": reason,
            }
        )

    def excluded(self, round_number: int, phase: str, peer: str, error: Exception) -> None:
        self.records.append(
            {
                "event": "excluded",
                **self._where(round_number),
                "phase": phase,
                "peer": peer,
                "error": type(error).__name__,
                "reason": str(error),
            }
        )

    def capped(
        self, round_number: int, peer: str, asked: float, used: float, max_share: float
    ) -> None:
        """The run's cap on one upload's share of a sum (``max_weight_share``) changed
        ``peer``'s share from ``asked`` to ``used``: not the weight the algorithm chose."""
        self.records.append(
            {
                "event": "capped",
                **self._where(round_number),
                "peer": peer,
                "asked_share": asked,
                "used_share": used,
                "max_weight_share": max_share,
            }
        )

    def released(
        self,
        round_number: int,
        d: Any,
        stream: str,
        epoch: int,
        rules: dict[str, Any],
    ) -> None:
        """A release every contributor consented to (``d``, a release descriptor): its
        integer weights by client, the stream its uploads are (field and length), the
        epoch of the model they were made from and the clients' rules (colluders,
        ``min_honest``, ``min_share``, participation), for the run view."""
        self.records.append(
            {
                "event": "released",
                **self._where(round_number),
                "kind": d.kind,
                "name": d.name,
                "stream": stream,
                "epoch": epoch,
                "weights": dict(d.weights),
                "rules": dict(rules),
            }
        )

    def absent(self, round_number: int, peer: str, reason: str) -> None:
        """A client of the run that was not asked this round: it left the run (``reason``)."""
        self.records.append(
            {"event": "absent", **self._where(round_number), "peer": peer, "reason": reason}
        )

    # ---- views --------------------------------------------------------------------------
    def rounds_missed(self) -> list[dict[str, Any]]:
        """Per run and client, every training round it was not in: excluded in some phase
        of the round (its upload not in the update, or the round skipped on it) or absent
        (out of the run). One row per (run, client), with the rounds in order."""
        missed: dict[tuple[str, str], set[int]] = defaultdict(set)
        for r in self.records:
            if r["event"] in ("excluded", "absent") and r.get("stage", ROUND) == ROUND:
                missed[(r["run"], r["peer"])].add(r["round"])
        return [
            {"run": run, "peer": peer, "rounds": sorted(rounds)}
            for (run, peer), rounds in sorted(missed.items())
        ]

    def run_view(self) -> dict[str, Any]:
        """What a coalition can form from every release of each run (``secagg.backends.
        coalition``), counted as the clients count it: a client's uploads of one stream as
        one vector over the run (per model where the protocol's weights vary with the data,
        ``weights_vary``; per round under per-round participation). ``weakest_share``: the
        least, over the runs' combinations, of the (colluders + min_honest)-th largest term
        over the largest; per client, the least over the releases it entered; the guarantee
        the run had ("run" or "per-round", and why)."""
        from secagg.backends.coalition import run_weakest_share

        streams: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        per_round = by_groups = False
        for r in self.records:
            if r["event"] != "released":
                continue
            rules = r["rules"]
            key: tuple = (r["run"], r["stream"])
            if rules["participation"] == "per-round":
                key, per_round = (*key, "round", r["round"]), True
            elif self.weights_vary:
                key = (*key, "epoch", r["epoch"])
            dealt = rules.get("groups") or {}
            if rules["participation"] == "groups" and dealt:
                by_groups = True  # each whole group's columns are their own rows
                for g in sorted(set(dealt.values())):
                    weights = {c: k for c, k in r["weights"].items() if dealt.get(c) == g}
                    streams[(*key, "group", g)].append({**r, "weights": weights})
                continue
            streams[key].append(r)
        if not streams:
            return {"releases": 0}
        weakest: float = 1.0
        clients: dict[str, float] = {}
        for rows in streams.values():
            rules = rows[0]["rules"]
            share = run_weakest_share(
                [r["weights"] for r in rows], rules["colluders"], rules["min_honest"]
            )
            weakest = min(weakest, share)
            for client in {c for r in rows for c in r["weights"]}:
                clients[client] = min(clients.get(client, 1.0), share)
        guarantee = (
            "per-round (participation per-round: client DP covers the run)"
            if per_round
            else "per-round (the protocol's weights vary with the data: client DP covers the run)"
            if self.weights_vary
            else "run (whole groups, each group's weights within two directions)"
            if by_groups
            else "run (one contributor set, weights within two directions)"
        )
        some = next(iter(streams.values()))[0]["rules"]
        return {
            "releases": sum(1 for r in self.records if r["event"] == "released"),
            "participation": some["participation"],
            "guarantee": guarantee,
            "min_honest": some["min_honest"],
            "min_share": some["min_share"],
            "weakest_share": weakest,
            "weakest_share_by_client": dict(sorted(clients.items())),
        }

    def traffic(self) -> list[dict[str, Any]]:
        """One row per (message, field): the byte-accounting view of the audit, with the
        records' ``round`` and ``stage`` (set-up is round 0, training round k is k)."""
        rows = []
        for r in self.records:
            if r["event"] != "message":
                continue
            for f in r["fields"]:
                rows.append(
                    {
                        "run": r["run"],
                        "round": r["round"],
                        "stage": r.get("stage", ROUND),
                        "phase": r["phase"],
                        "direction": "up" if r["direction"] == "received" else "down",
                        "peer": r["peer"],
                        "field": f["name"],
                        "kind": f["kind"],
                        "bytes": f["bytes"],
                    }
                )
        return rows

    def summary(self) -> dict[str, Any]:
        learned: dict[str, Counter] = defaultdict(Counter)
        sent: dict[str, Counter] = defaultdict(Counter)
        individual = False
        excluded, aborted = [], []
        opened: Counter = Counter()
        for r in self.records:
            if r["event"] == "opened":
                opened[r["name"]] += 1
            elif r["event"] == "aborted":
                aborted.append({k: r.get(k) for k in ("run", "round", "stage", "phase", "reason")})
            elif r["event"] == "reveal":
                learned[r["name"]]["revealed aggregate (plaintext vector)"] += 1
            elif r["event"] == "excluded":
                excluded.append(
                    {k: r.get(k) for k in ("run", "round", "stage", "phase", "peer", "reason")}
                )
            elif r["event"] == "message":
                for f in r["fields"]:
                    if f["name"] == ENVELOPE or f["kind"] == "ciphertext":
                        continue
                    if r["direction"] == "received":
                        learned[f["name"]][f["kind"]] += 1
                        individual |= f["name"] in self.update_fields
                    else:
                        sent[f["name"]][f["kind"]] += 1
        runs = sorted({r["run"] for r in self.records})
        run_view = self.run_view()
        # an individual update reached the server readable, or some combination of the
        # run's releases leaves fewer than min_honest honest terms (counted as the clients
        # count: the run view)
        # (where the clients accept one-upload releases, --min-contributors 1, nothing is
        # promised and nothing counted: Sequential's hand-over)
        isolating = run_view.get("min_honest", 1) >= 2 and run_view.get(
            "weakest_share", 1.0
        ) < run_view.get("min_share", 0.0)
        return {
            "runs": len(runs),
            "individual_updates_revealed": individual or isolating,
            "run_view": run_view,
            "learned_in_plaintext": {k: dict(v) for k, v in sorted(learned.items())},
            "declared_plaintext_items": sorted(self.declared),
            "undeclared_plaintext_items": sorted(set(learned) - self.declared),
            "dp_protected_items": sorted(set(learned) & self.dp_protected),
            # by which mechanism, and what it does not cover
            "dp_coverage": {
                item: self.dp_coverage.get(item, "")
                for item in sorted(set(learned) & self.dp_protected)
            },
            # derived from client data and learned without DP noise
            "not_dp_protected_items": sorted(
                set(learned) - self.dp_protected - self.infrastructure
            ),
            "sent_in_plaintext": {k: dict(v) for k, v in sorted(sent.items())},
            "ciphertext_fields_received": sorted(
                {
                    f["name"]
                    for r in self.records
                    if r["event"] == "message" and r["direction"] == "received"
                    for f in r["fields"]
                    if f["kind"] == "ciphertext"
                }
            ),
            "exclusions": excluded,
            "rounds_missed": self.rounds_missed(),
            # where the run's cap changed a client's weight from what the algorithm chose
            "weights_capped": [
                {
                    k: r[k]
                    for k in ("run", "round", "peer", "asked_share", "used_share")
                    + ("max_weight_share",)
                }
                for r in self.records
                if r["event"] == "capped"
            ],
            "aborted_runs": aborted,
            # what the clients learn that the server does not, and who can decrypt at all
            "opened_by_clients": dict(sorted(opened.items())),
            "who_can_decrypt": self.who_can_decrypt,
        }

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "audit.jsonl", "w") as fh:
            for r in self.records:
                fh.write(json.dumps(r) + "\n")
        (folder / "audit_summary.json").write_text(json.dumps(self.summary(), indent=2) + "\n")
