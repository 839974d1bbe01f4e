"""One configuration of ``benchmarks.overhead``, run in a server process of its own.

    python -m benchmarks.rounds ARGS.pickle RESULT.pickle     (``overhead.run_config`` does)

The process imports what a server imports — the engine, the backends' server halves, the
protocols, the worker pool its clients run in — and nothing of the command line, pandas,
matplotlib or torch, so that its peak memory is the server's as it would run (a spawned
``multiprocessing`` child re-imports its parent's main module: run from ``secagg bench``, that
is the CLI, which imports torch, 700 MB of this build). Each row records which of those
modules the process held (``server_imports``, "-" for none). The clients' workloads live
here too (they pickle to the worker processes, which import torch when they train an MLP).
"""

from __future__ import annotations

import math
import pickle
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from secagg.backends import (
    Provision,
    make_client_backend,
    make_server_backend,
    provision,
    public_signers,
)
from secagg.dp import ClientDP
from secagg.parts import in_parts, part_bounds, part_lengths
from secagg.protocols import make_client_half, make_protocol
from secagg.protocols.optimizers import StepSchedule, make_optimizer
from secagg.protocols.pieces import FixedServerStep, piece
from secagg.server.audit import AuditLog
from secagg.server.engine import Server
from secagg.server.plan import RunPolicy, TrainingPlan
from secagg.simulation.workers import (
    WorkerPoolTransport,
    current_rss_bytes,
    peak_rss_bytes,
    reset_peak_rss,
)

MB = 1024**2
#: the FedAvg family's default CKKS preset (client-weighted, one data prime)
CKKS_PRESET = "lean"
#: modules a server does not need; ``server_imports`` lists those the process held
HEAVY = ("torch", "pandas", "matplotlib", "secagg.simulation.cli", "secagg.cli")


# ---- workloads: built inside the worker processes, so they must pickle -------------------
def mlp_width(n_params: int) -> int:
    """h such that an MLP 64-h-h-10 has about ``n_params`` parameters: h² + 76h + 10 = n."""
    return max(1, round((-76 + math.sqrt(76**2 - 4 * (10 - n_params))) / 2))


def mlp(width: int):
    from torch import nn

    return nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


class SyntheticTrainer:
    """Stands in for local training: a fresh pseudo-gradient of small values each round, at
    the cost of drawing it. Enough of LocalTrainer's interface for FedAvg-family rounds."""

    batch_size = 32

    def __init__(self, n_params: int, n_samples: int, seed: int):
        self.n_params = n_params
        self.data = range(n_samples)  # only its length is used: the reported n_samples
        self.rng = np.random.default_rng(seed)

    def train(self, w: np.ndarray, lr: float, steps: int, prox_mu: float = 0.0) -> np.ndarray:
        return self.rng.normal(0.0, 0.01, self.n_params)


def preset_option(backend: str, preset: str) -> dict[str, str]:
    """The preset as a backend option (plain takes none)."""
    return {"preset": preset} if backend in ("ckks", "threshold") else {}


@dataclass(frozen=True)
class Workload:
    """One configuration's clients (picklable: each worker builds its own share)."""

    kind: str  # "mlp" or "synthetic"
    n_params: int
    n_clients: int
    backend: str
    preset: str = CKKS_PRESET
    #: the protocol the engine runs: FedAdam (streaming, the clients weight on ``lean``) or
    #: LARC (weights chosen after the uploads: ``compact``)
    protocol: str = "fedadam"
    #: CKKS through the native extension (``secagg/ckks/native.py``); False: TenSEAL's binding
    #: alone (``SECAGG_NATIVE=off``), the before of the before-and-after
    native: bool = True
    #: clients make each upload's masks beside training (``secagg.secret.ckks_masks``); False:
    #: every upload encrypted afresh after training (``SECAGG_UPLOAD_MASKS=off``), the before
    masks: bool = True
    local_steps: int = 100
    batch_size: int = 32
    seed: int = 0
    #: the backend's other options, as (key, value) pairs (threshold's committee)
    extra_options: tuple[tuple[str, Any], ...] = ()
    #: move the model, the uploads and the releases in parts of this many values
    #: (``secagg.parts``); 0: whole
    part_values: int = 0
    #: every client's identity, the roster and the budgets, made once in the parent (each
    #: worker builds only its share of the clients, all with the one roster)
    provisions: dict[str, Provision] | None = field(default=None, compare=False, hash=False)
    #: what every client answers (``secagg.clients.policy``): the plan the server runs, as
    #: each client's own provisioning
    policy: Any = field(default=None, compare=False, hash=False)

    def backend_options(self) -> dict[str, Any]:
        """What the server half and every client half are built with."""
        return {**preset_option(self.backend, self.preset), **dict(self.extra_options)}

    def model_params(self) -> int:
        if self.kind == "synthetic":
            return self.n_params
        width = mlp_width(self.n_params)
        return width * width + 76 * width + 10

    def __call__(self, ids: list[str]) -> dict[str, Any]:
        from secagg.clients.runtime import Client

        options = self.backend_options()
        backends = {
            c: make_client_backend(
                self.backend, c, options, (self.provisions or {}).get(c, Provision())
            )
            for c in ids
        }
        clients = {}
        for cid in ids:
            k = int(cid.rsplit("_", 1)[1])
            if self.kind == "synthetic":
                trainer = SyntheticTrainer(self.n_params, 100, self.seed * 1000 + k)
            else:
                trainer = self._mlp_trainer(k)
            clients[cid] = Client(
                cid,
                trainer,
                backends[cid],
                policy=self.policy,
                protocol=make_client_half(self.protocol),
                seed=self.seed * 1000 + k + 500,
            )
        return clients

    def _mlp_trainer(self, k: int):
        import torch
        from sklearn.datasets import load_digits

        from secagg.clients.tasks.digits import cross_entropy
        from secagg.clients.tasks.tcga_brca import ClientData
        from secagg.clients.training import LocalTrainer

        digits = load_digits()
        order = np.random.default_rng(self.seed).permutation(len(digits.target))
        mine = order[k :: self.n_clients]  # IID: every client a 1/K slice of the samples
        data = ClientData(
            torch.from_numpy((digits.data[mine] / 16).astype(np.float32)),
            torch.from_numpy(digits.target[mine].astype(np.int64)),
        )
        torch.manual_seed(self.seed * 1000 + k)
        return LocalTrainer(
            mlp(mlp_width(self.n_params)),
            data,
            cross_entropy,
            self.batch_size,
            seed=self.seed * 1000 + k,
        )


# ---- one configuration -------------------------------------------------------------------
def initial_params(workload: Workload) -> np.ndarray:
    if workload.kind == "synthetic":
        return np.zeros(workload.n_params)
    import torch

    from secagg.clients.training import flat_params

    torch.manual_seed(workload.seed)
    return flat_params(mlp(mlp_width(workload.n_params)))


def bytes_by_message(records: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        if r["event"] == "message":
            key = f"bytes_{r['phase']}_{'up' if r['direction'] == 'received' else 'down'}"
            out[key] = out.get(key, 0) + r["bytes"]
    return out


def client_seconds(stats: list[dict]) -> dict[str, float]:
    """Seconds per component summed over every client of every worker."""
    total: dict[str, float] = {}
    for worker in stats:
        for seconds in worker["clients"].values():
            for key, value in seconds.items():
                total[key] = total.get(key, 0.0) + value
    return total


def seconds_by_client(stats: list[dict]) -> dict[str, dict[str, float]]:
    """Each client's seconds per component (its worker's record)."""
    return {cid: dict(seconds) for worker in stats for cid, seconds in worker["clients"].items()}


def folded_by(arrivals: list[float], fold_each: float) -> float:
    """When a server that folds uploads one at a time, in the order they arrive, has folded
    the last: upload i arrives at ``arrivals[i]`` seconds into the phase and takes
    ``fold_each`` seconds to load and add."""
    done = 0.0
    for t in sorted(arrivals):
        done = max(done, t) + fold_each
    return done


def deployment_seconds(
    wall: float,
    server: dict[str, float],
    clients: dict[str, dict[str, float]],
    *,
    streaming: bool = True,
) -> dict[str, float]:
    """A round as a deployment whose clients run in parallel, each on its own machine,
    would spend it (network time left out), from one in-process round: ``wall`` its wall
    time, ``server`` the engine's seconds (per phase asked: the time inside the exchange,
    waiting for the clients and decoding their replies ("receive"); per own step: load,
    aggregate, optimizer, a reveal it forms itself), ``clients`` each client's seconds
    this round ("phase:<name>" its whole answer to a request; "protect_offline" the masks
    it made on a thread beside training).

    - server work: the round's wall time less the time the server waited inside the
      exchanges (its replies' decoding, "receive", counted back in);
    - critical path, serial: the server's work plus, for each phase asked, the slowest
      client's answer (the others answer at the same time). Everything the server does
      counts as serial, after the last answer: an upper bound;
    - critical path, folded: the same, except that the training phase ends when the server
      has folded the last upload, each upload arriving when its client's answer ends (its
      measured answer time) and taking the round's mean load (and, ``streaming``, add)
      time: a deployment folds uploads while slower clients still train. Clients that all
      finish together leave it at the serial figure;
    - CPU: the server's work plus every client's answers and masks (busy seconds summed over
      all parties, what the round costs in machine time);
    - the serial path by stage: ``path_server_s`` (the server's work) and, per phase asked,
      ``path_<phase>_s`` (its slowest client's answer); they add up to the serial figure.
    """
    asked = {
        k[len("phase:") :]
        for c in clients.values()
        for k, v in c.items()
        if k.startswith("phase:") and v > 0
    }
    waited = sum(server.get(p, 0.0) for p in asked) - server.get("receive", 0.0)
    work = max(wall - waited, 0.0)
    stages = {p: max(c.get(f"phase:{p}", 0.0) for c in clients.values()) for p in sorted(asked)}
    slowest = sum(stages.values())
    busy = sum(v for c in clients.values() for k, v in c.items() if k.startswith("phase:")) + sum(
        c.get("protect_offline", 0.0) for c in clients.values()
    )
    arrivals = [c["phase:train"] for c in clients.values() if c.get("phase:train", 0.0) > 0]
    fold = server.get("load", 0.0) + (server.get("aggregate", 0.0) if streaming else 0.0)
    folded = work + slowest
    if arrivals and fold > 0:
        train = max(arrivals)
        folded += folded_by(arrivals, fold / len(arrivals)) - train - fold
    return {
        "server_work_s": work,
        "critical_path_s": folded,
        "critical_path_serial_s": work + slowest,
        "cpu_s": work + busy,
        "path_server_s": work,
        **{f"path_{p}_s": v for p, v in stages.items()},
    }


def value_floor(clients: dict[str, dict[str, float]]) -> dict[str, float]:
    """The round's value-dependent floor, what nothing can precompute because it needs the
    values: the slowest client's online protect (encode + add, its masks made ahead) and
    the slowest decryptor's opening (decrypt, flood, decode: ``opening_seconds``), which
    follow each other on the critical path. Zero on plain, which has neither."""
    protect = max((c.get("protect", 0.0) for c in clients.values()), default=0.0)
    opening = max((c.get("reveal_open", 0.0) for c in clients.values()), default=0.0)
    return {
        "floor_protect_s": protect,
        "floor_open_s": opening,
        "value_floor_s": protect + opening,
    }


def plan_policy(
    plan: TrainingPlan, protocol: Any, rounds: int, optimizer: dict[str, Any], part_values: int = 0
) -> Any:
    """Each client's own policy for the plan the benchmark's server runs."""
    from secagg.clients.policy import ClientPolicy

    caps = protocol.capabilities
    parts = in_parts(optimizer["dim"], part_values)
    return ClientPolicy(
        phases=frozenset({"enroll", "train", *(("model_part", "upload_part") if parts else ())}),
        rounds=rounds,
        plan=plan,
        scalar_budget=(rounds + 1) * len(caps.client_scalars),
        server_optimizer=optimizer,
        part_values=part_values if parts else 0,
    )


def measure_rounds(
    workload: Workload,
    initial: np.ndarray,
    rounds: int,
    workers: int,
    client_dp: bool,
    streaming: bool,
    label: str,
) -> list[dict[str, Any]]:
    """Run ``rounds`` rounds of one configuration; one measurement row per round."""
    ids = [f"client_{k}" for k in range(workload.n_clients)]
    dp = ClientDP(1.0, 1.0, len(ids)) if client_dp else None
    parts = part_bounds(initial.size, workload.part_values)
    if workload.backend != "plain":
        caps = make_protocol(workload.protocol).capabilities
        workload = replace(
            workload,
            provisions=provision(
                ids,
                rounds * caps.reveals_per_round * len(parts),
                part_lengths(initial.size, workload.part_values)
                if len(parts) > 1
                else initial.size,
                open_budget=rounds * caps.opens_per_round,  # LARC opens its Ĝ each round
                releases_per_upload={"reveal": 1, "open": caps.opens_per_round},
            ),
        )
    server_backend = make_server_backend(
        workload.backend,
        workload.backend_options(),
        public_signers(workload.provisions or {}),
    )
    protocol = make_protocol(workload.protocol)
    fixed = piece(protocol, FixedServerStep)
    step = (fixed.server_step(len(ids)) if fixed is not None else None) or (
        {"name": "adam", "lr": 0.01} if workload.protocol == "fedadam" else {"name": "sgd"}
    )
    plan = TrainingPlan(
        client_lr=StepSchedule.parse("0.05"), local_steps=workload.local_steps, client_dp=dp
    )
    workload = replace(
        workload,
        policy=plan_policy(
            plan, protocol, rounds, {**step, "dim": initial.size}, workload.part_values
        ),
    )
    rows = []
    with WorkerPoolTransport(workload, ids, workers) as transport:
        audit = AuditLog()
        server = Server(
            protocol,
            server_backend,
            make_optimizer({**step, "dim": initial.size}),
            transport,
            initial,
            plan=plan,
            policy=RunPolicy(streaming=streaming, part_values=workload.part_values),
            audit=audit,
        )
        start = time.perf_counter()
        server.setup(rounds)
        setup_seconds = time.perf_counter() - start
        setup_bytes = sum(r["bytes"] for r in audit.records if r["event"] == "message")
        first_stats = transport.stats()
        before = client_seconds(first_stats)
        before_each = seconds_by_client(first_stats)
        for rnd in range(rounds):
            transport.reset_peaks()
            first = len(audit.records)
            baseline = current_rss_bytes()
            reset_peak_rss()
            start = time.perf_counter()
            report = server.run_round(rnd)
            wall = time.perf_counter() - start
            server_peak = peak_rss_bytes()
            stats = transport.stats()
            after = client_seconds(stats)
            spent = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            before = after
            after_each = seconds_by_client(stats)
            spent_each = {
                c: {k: v - before_each.get(c, {}).get(k, 0.0) for k, v in seconds.items()}
                for c, seconds in after_each.items()
            }
            before_each = after_each
            row = {
                "label": label,
                # not asdict(workload): it would copy every client's provisioning first
                **{
                    k: v
                    for k, v in asdict(replace(workload, provisions=None)).items()
                    if k != "provisions"
                },
                "model_params": initial.size,
                "warm": rnd > 0,
                "workers": transport.workers,
                "client_dp": client_dp,
                "streaming": streaming and server.streaming,
                "streaming_asked": streaming,  # what --reuse matches (LARC runs unstreamed)
                "round": rnd,
                "clients_used": len(report.clients),
                "excluded": len(report.excluded),
                "wall_s": wall,
                "setup_s": setup_seconds,
                "setup_bytes": setup_bytes,
                **{f"server_{k}_s": v for k, v in report.seconds.items()},
                "clients_train_s": spent.get("train", 0.0),
                "clients_protect_s": spent.get("protect", 0.0),
                "clients_protect_offline_s": spent.get("protect_offline", 0.0),
                **deployment_seconds(
                    wall, dict(report.seconds), spent_each, streaming=streaming and server.streaming
                ),
                "clients_open_s": spent.get("open", 0.0),
                "decryptor_reveal_s": spent.get("phase:reveal", 0.0),
                **value_floor(spent_each),
                "clients_consent_s": spent.get("phase:consent", 0.0),
                # threshold: every holder's answer to a reveal (check the release and the
                # consents, open its sealed key shares, combine them into its one share of
                # the key sum), summed over holders
                "holders_share_s": spent.get("phase:decrypt_share", 0.0),
                "clients_envelope_s": spent.get("phase:train", 0.0)
                - spent.get("train", 0)
                - spent.get("protect", 0.0),
                **bytes_by_message(audit.records[first:]),
                "server_peak_rss_MB": server_peak / MB,
                # what a server would not import: checked, so the figure is the server's own
                "server_imports": ",".join(m for m in HEAVY if m in sys.modules) or "-",
                "server_rss_before_MB": baseline / MB,
                "worker_peak_rss_MB": max(s["peak_rss_bytes"] for s in stats) / MB,
            }
            rows.append(row)
    return rows


# ---- sweeps ------------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    """Read (workload, initial, rounds, workers, client_dp, streaming, label) from
    ``argv[0]``, write the rows (or ("failed", traceback)) to ``argv[1]``."""
    import traceback

    with open(argv[0], "rb") as f:
        args = pickle.load(f)
    try:
        result: tuple[str, Any] = ("ok", measure_rounds(*args))
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = ("failed", traceback.format_exc())
    with open(argv[1], "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
