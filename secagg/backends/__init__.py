"""Aggregation backends, by name: ``plain`` (the baseline), ``ckks`` (SEAL through TenSEAL) and
``threshold`` (masks under one-time keys Shamir-shared t of n, ring arithmetic from SEAL).

``BACKENDS`` is the registry everything reads (the experiment driver, the CLI's choices and
option groups, the Flower node, the audit): each entry (:class:`BackendSpec`) says how to
build the server half and a client's half from the backend's own options
(:class:`~secagg.backends.base.BackendOption`), and holds every fact about the backend that
the rest of secagg asks — whether the server reads the uploads, its parameter sets and which
one a run gets by default, what a node can build once before any message. Nothing else
decides by a backend's name. :func:`register_backend` adds one from outside the package, as
do installed packages through the entry-point group ``secagg.backends``.

Server code imports ``secagg.backends.base`` and the server halves only; the client halves
(which hold keys: ``secagg.secret``) are imported inside the factories that build a client,
and this module imports nothing of ``secagg.secret`` at its top (``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from secagg.backends.base import BackendOption, ClientBackend, ServerBackend
from secagg.backends.coalition import PARTICIPATION
from secagg.errors import ConfigError


@dataclass(frozen=True)
class Provision:
    """What a client's backend half gets from its own configuration, never from the server
    (provisioned like NVFlare's and Flower's node keys; in simulation the driver plays the
    provisioning authority).

    Parameters:
        identity: this client's raw X25519 private key.
        roster: every client's raw X25519 public key, by client id.
        decryption_budget: how many aggregates the run will reveal at most (sizes flooding).
        reveal_length: the number of values every reveal returns (the model's size), or the
            numbers (the model's size and the protocol's other releases); None accepts any.
        open_budget: how many aggregates the client opens itself at most (LARC's Ĝ,
            RegAgg's centre, server-blind updates).
        signing_key: this client's raw Ed25519 private key (it signs consents to releases).
        signers: every client's raw Ed25519 public key, by client id (public: the server
            gets them too, to check consents before it relays them).
        releases_per_upload: how many releases of each kind ("reveal", "open") one upload
            may enter (the protocol's own, fixed by the driver).
    """

    identity: bytes | None = None
    roster: Mapping[str, bytes] = field(default_factory=dict)
    decryption_budget: int = 1
    reveal_length: int | tuple[int, ...] | None = None
    open_budget: int = 0
    signing_key: bytes | None = None
    signers: Mapping[str, bytes] = field(default_factory=dict)
    releases_per_upload: Mapping[str, int] = field(default_factory=lambda: {"reveal": 1, "open": 1})
    #: threshold: sealed shares a key holder gives at most (None: ``open_budget``); more
    #: when every client opens a different aggregate (Sequential's hops)
    share_budget: int | None = None
    #: the protocol's weights vary with the data every round (LARC's α): the run ledger
    #: then fixes the contributor set but not the weight rows (``coalition.RunLedger``)
    weights_vary: bool = False


@dataclass(frozen=True)
class Identity:
    """A client's long-term keys and the rosters, as provisioning hands them out once (a
    deployment writes them to the client's node; a simulation makes them per run).

    Parameters:
        client_id: whose keys these are.
        x25519_private: its raw X25519 private key (pairwise key wrapping).
        ed25519_private: its raw Ed25519 private key (signed consents and key links).
        roster: every client's raw X25519 public key, by client id.
        signers: every client's raw Ed25519 public key, by client id.
    """

    client_id: str
    x25519_private: bytes
    ed25519_private: bytes
    roster: Mapping[str, bytes]
    signers: Mapping[str, bytes]

    def provision(
        self,
        decryption_budget: int,
        reveal_length: int | tuple[int, ...] | None = None,
        open_budget: int = 0,
        releases_per_upload: Mapping[str, int] | None = None,
        share_budget: int | None = None,
        weights_vary: bool = False,
    ) -> Provision:
        """These keys with a run's budgets (``release_budgets`` of the run's configuration)."""
        return Provision(
            self.x25519_private,
            dict(self.roster),
            decryption_budget,
            reveal_length,
            open_budget,
            self.ed25519_private,
            dict(self.signers),
            dict(releases_per_upload or {"reveal": 1, "open": 1}),
            share_budget,
            weights_vary,
        )


def provision(
    client_ids: list[str],
    decryption_budget: int,
    reveal_length: int | tuple[int, ...] | None = None,
    open_budget: int = 0,
    releases_per_upload: Mapping[str, int] | None = None,
    share_budget: int | None = None,
    weights_vary: bool = False,
) -> dict[str, Provision]:
    """Fresh identities for ``client_ids`` (``secagg.secret.identities``), each with the
    same budgets."""
    from secagg.secret.identities import new_identities  # private keys: made for clients

    return {
        c: identity.provision(
            decryption_budget,
            reveal_length,
            open_budget,
            releases_per_upload,
            share_budget,
            weights_vary,
        )
        for c, identity in new_identities(client_ids).items()
    }


def public_signers(provisions: Mapping[str, Provision]) -> dict[str, bytes]:
    """The signers' roster as the server gets it (public keys only)."""
    return {c: p.signers[c] for c, p in provisions.items() if c in p.signers}


@dataclass(frozen=True)
class PresetFamily:
    """A backend's named parameter sets (its ``preset`` option) and the rule for the one a
    run gets when it names none: ``streaming`` (the clients apply weights fixed before the
    uploads; the server only adds) where the protocol plans its weights, the run streams and
    the protocol needs no precise sums, else ``default`` (weights chosen after the uploads).

    ``get``: a preset by name (its ``weighted_by_clients`` says whether the clients apply the
    weights)."""

    get: Callable[[str], Any]
    default: str
    streaming: str

    def for_run(self, *, streams: bool, precise_sums: bool) -> str:
        """The preset a run gets unless it names one."""
        return self.streaming if streams and not precise_sums else self.default


@dataclass(frozen=True)
class BackendSpec:
    """A registry entry: the backend's options, how to build each half from them, and what
    the rest of secagg needs to know about it."""

    name: str
    summary: str
    #: (options, the clients' public signing keys or None) -> the server half
    make_server: Callable[[dict[str, Any], Mapping[str, bytes] | None], ServerBackend]
    make_client: Callable[[str, dict[str, Any], Provision], ClientBackend]
    options: tuple[BackendOption, ...] = field(default_factory=tuple)
    #: checks across the resolved options (raises ConfigError)
    check: Callable[[dict[str, Any]], None] | None = None
    #: whether clients can open an aggregate themselves (LARC's Ĝ, RegAgg's centre,
    #: server-blind updates), besides revealing one to the server
    client_opens: bool = True
    #: whether the server reads each client's upload (``plain``): protocols that need the
    #: individual updates (robust aggregators) run only here, and client-level DP is
    #: accounted against each noised upload rather than the released sums. A backend that
    #: keeps uploads from the server has keys: its clients are provisioned with identities
    #: and signing keys (:attr:`keyed`)
    server_reads_uploads: bool = False
    #: its parameter sets, if it has a ``preset`` option (:class:`PresetFamily`)
    presets: PresetFamily | None = None
    #: public work a Flower node can do once, before any message, from the resolved options
    #: (ckks: SEAL's context and the native extension's parameters for the preset)
    warm: Callable[[dict[str, Any]], None] | None = None

    @property
    def keyed(self) -> bool:
        """Whether the clients hold keys (provisioning gives them identities and signers)."""
        return not self.server_reads_uploads

    def default_preset(self, *, streams: bool, precise_sums: bool) -> str | None:
        """The preset a run gets unless it names one (None: the backend has no presets)."""
        if self.presets is None:
            return None
        return self.presets.for_run(streams=streams, precise_sums=precise_sums)

    def check_run(self, run: Any, capabilities: Any) -> None:
        """Refuse a run this backend cannot carry (ConfigError, with what to do): one whose
        clients open aggregates themselves (the protocol's opens, or server-blind updates)
        where this backend's do not, and one that does not stream on a preset whose clients
        apply weights fixed before the uploads. ``run``: the run's configuration
        (``secagg.runspec.config.ExperimentConfig``); ``capabilities``: its protocol's."""
        if not self.client_opens and (capabilities.opens_per_round or run.server_blind):
            raise ConfigError(
                f"{run.protocol}{' server-blind' if run.server_blind else ''} needs clients "
                f"to open aggregates themselves, which backend {self.name} does not do yet; "
                "run it on ckks, or a protocol that only reveals (fedavg, fedadam, costwagg, ...)"
            )
        options = run.resolved_backend_options()
        streams = capabilities.streams and run.streaming
        preset = self.preset(options)
        if preset is not None and preset.weighted_by_clients and not streams:
            fitting = self.default_preset(streams=False, precise_sums=True)
            flag = next(o.flag for o in self.options if o.key == "preset")
            raise ConfigError(
                f"{self.name} preset {options['preset']!r} has the clients apply "
                f"weights fixed before the uploads (a streaming run); {run.protocol} "
                + ("weighs its uploads after they arrive" if run.streaming else "is not")
                + f": use --{flag} {fitting}"
            )

    def preset(self, options: Mapping[str, Any]) -> Any:
        """The preset the resolved ``options`` name (None: the backend has no presets)."""
        return None if self.presets is None else self.presets.get(options["preset"])

    def resolve(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options with defaults filled in, each checked (ConfigError otherwise)."""
        known = {o.key: o for o in self.options}
        unknown = set(options) - set(known)
        if unknown:
            raise ConfigError(
                f"backend {self.name!r} has no option(s) {sorted(unknown)}; "
                f"its options: {sorted(known) or 'none'}"
            )
        out = {}
        for key, opt in known.items():
            value = options.get(key, opt.default)
            if opt.type is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, opt.type) or isinstance(value, bool) != (opt.type is bool):
                raise ConfigError(
                    f"backend option {key} must be of type {opt.type.__name__}, got {value!r}"
                )
            if opt.choices is not None and value not in opt.choices:
                raise ConfigError(
                    f"backend option {key} must be one of {opt.choices}, got {value!r}"
                )
            out[key] = value
        if self.check is not None:
            self.check(out)
        return out


def _plain_server(options: dict[str, Any], signers: Mapping[str, bytes] | None) -> ServerBackend:
    from secagg.backends.plain import PlainServer

    return PlainServer()


def _plain_client(client_id: str, options: dict[str, Any], provision: Provision) -> ClientBackend:
    from secagg.backends.plain import PlainClient

    return PlainClient(options["dtype"])


def _ckks_server(options: dict[str, Any], signers: Mapping[str, bytes] | None) -> ServerBackend:
    from secagg.backends.ckks_server import CKKSServer
    from secagg.ckks.presets import get_preset

    preset = get_preset(options["preset"])
    return CKKSServer(preset, signers=signers, policy=server_policy(options, preset.max_weight))


def _ckks_client(client_id: str, options: dict[str, Any], provision: Provision) -> ClientBackend:
    from secagg.ckks.presets import get_preset
    from secagg.secret.ckks_client import CKKSClient  # holds the secret key

    if provision.identity is None or client_id not in provision.roster:
        raise ConfigError(f"{client_id} needs a provisioned identity and roster for ckks")
    return CKKSClient(client_id, get_preset(options["preset"]), provision, options)


def _ckks_presets(name: str) -> Any:
    from secagg.ckks.presets import get_preset

    return get_preset(name)


def _threshold_presets(name: str) -> Any:
    from secagg.threshold.params import get_preset

    return get_preset(name)


def _ckks_warm(options: dict[str, Any]) -> None:
    """SEAL's context for the preset and its fingerprint, and the native extension's
    parameters and seed expander: what the ckks halves build once per process
    (``functools.cache``). Public parameters only; no key exists yet."""
    from secagg.ckks import native
    from secagg.ckks.presets import get_preset
    from secagg.ckks.public import params_fingerprint

    preset = get_preset(options["preset"])
    params_fingerprint(preset)  # and make_context(preset)
    if native.public_module() is not None:
        native.seed_expander(preset.poly_modulus_degree, tuple(preset.coeff_bits))


def server_policy(options: dict[str, Any], max_weight: int):
    """The release policy the run's clients hold, as the server foresees it (its colluders
    are the backend's: none here, t − 1 once a threshold server knows its roster)."""
    from secagg.ckks.release import ReleasePolicy

    return ReleasePolicy(
        options["min_contributors"],
        options["min_weight_share"],
        None,
        options["max_weight_share"],
        max_weight=max_weight,
        participation=options.get("participation", "fixed"),
        groups=options.get("participation_groups", 0),
    )


def _check_flooding(options: dict[str, Any]) -> None:
    bits = options["flooding_bits"]
    if not (bits == 0 or 30 <= bits <= 128):
        raise ConfigError(
            f"flooding_bits must be 0 (flooding off: insecure, for measurements) or lie in "
            f"[30, 128] (30 is the design's floor), got {bits}"
        )
    _check_policy(options)


def _threshold_server(
    options: dict[str, Any], signers: Mapping[str, bytes] | None
) -> ServerBackend:
    from secagg.backends.threshold_server import ThresholdServer
    from secagg.threshold.params import get_preset

    preset = get_preset(options["preset"])
    return ThresholdServer(
        preset,
        signers=signers,
        t=options["threshold_t"],
        committee=options["committee"],
        policy=server_policy(options, preset.max_weight),
    )


def _threshold_client(
    client_id: str, options: dict[str, Any], provision: Provision
) -> ClientBackend:
    from secagg.secret.threshold_client import ThresholdClient  # holds a key share
    from secagg.threshold.params import get_preset

    if (
        provision.signing_key is None
        or provision.identity is None
        or client_id not in provision.signers
        or client_id not in provision.roster
    ):
        raise ConfigError(
            f"{client_id} needs a provisioned identity, signing key and rosters for threshold"
        )
    return ThresholdClient(client_id, get_preset(options["preset"]), provision, options)


def _release_policy_options() -> tuple[BackendOption, ...]:
    """The release policy both encrypted backends enforce (one flag each for both)."""
    return (
        BackendOption(
            "min_contributors",
            "min-contributors",
            int,
            2,
            "a client reveals or opens only sums of at least this many uploads",
        ),
        BackendOption(
            "min_weight_share",
            "min-weight-share",
            float,
            0.01,
            "a client reveals or opens only sums where every upload's weight is at "
            "least this fraction of the mean weight (refuses sums one upload dominates)",
        ),
        max_weight_share_option(0.5),
        BackendOption(
            "participation",
            "participation",
            str,
            "fixed",
            "who may contribute to the run's releases, counted over the whole run (a "
            "client's own rule): fixed, one contributor set for the run with weights "
            "within two directions over it (a client that does not answer pauses releases: "
            "rounds skipped, the run degraded), so a server that holds the model still and "
            "picks who drops out learns no individual update; groups, the roster dealt into "
            "--participation-groups groups by a public hash of the names, a release holding "
            "whole groups only (a group with a member missing sits the round out) and each "
            "group's weights within two directions over the run; per-round, any set the "
            "per-release rules pass (only with --client-dp, which then covers the run)",
            PARTICIPATION,
        ),
        BackendOption(
            "participation_groups",
            "participation-groups",
            int,
            0,
            "with --participation groups, how many groups the roster is dealt into (each must "
            "hold t - 1 + min_contributors clients on threshold, min_contributors on ckks); "
            "ignored otherwise",
        ),
    )


def max_weight_share_option(default: float) -> BackendOption:
    """The cap on one upload's share of a sum: the encrypted backends' clients consent only
    to sums within it (it keeps one upload from being most of what is released), so their
    server caps its weights to it; on ``plain`` it protects nothing and is off unless asked
    for (textbook FedAvg), which makes the cap's price measurable on the baseline."""
    return BackendOption(
        "max_weight_share",
        "max-weight-share",
        float,
        default,
        "no upload gets more than this fraction of a sum's total weight: the server caps "
        "the weights to it (the largest lowered, the rest keep their ratios; each round "
        "that the cap changes says so). On ckks and threshold the clients consent only to "
        "sums within it (0.5: the others together weigh at least as much as the largest); "
        "on plain it is off (1: textbook weights) unless set, to measure what the cap costs",
    )


def _check_policy(options: dict[str, Any]) -> None:
    if options["min_contributors"] < 1:
        raise ConfigError(f"min_contributors must be >= 1, got {options['min_contributors']}")
    if not 0.0 <= options["min_weight_share"] <= 1.0:
        raise ConfigError(f"min_weight_share must lie in [0, 1], got {options['min_weight_share']}")
    if not 0.0 < options["max_weight_share"] <= 1.0:
        raise ConfigError(f"max_weight_share must lie in (0, 1], got {options['max_weight_share']}")
    groups = options["participation_groups"]
    if (options["participation"] == "groups") != (groups != 0) or groups < 0 or groups == 1:
        raise ConfigError(
            "--participation groups takes --participation-groups G (at least 2 groups), and "
            f"only it does; got participation {options['participation']!r} with {groups} groups"
        )


def _check_threshold(options: dict[str, Any]) -> None:
    if options["threshold_t"] < 0:
        raise ConfigError(
            f"threshold_t must be 0 (a strict majority) or a count of holders, got "
            f"{options['threshold_t']}"
        )
    if options["committee"] < 0:
        raise ConfigError(
            f"committee must be 0 (every client of the roster holds key shares) or a count "
            f"of holders, got {options['committee']}"
        )
    _check_policy(options)


BACKENDS: dict[str, BackendSpec] = {
    "plain": BackendSpec(
        "plain",
        "float vectors; the server sees everything (baseline)",
        _plain_server,
        _plain_client,
        (
            BackendOption(
                "dtype",
                "plain-dtype",
                str,
                "float32",
                "the uploads' float type: float32 (what the torch model holds) or float64 "
                "(for protocols that need every digit, such as the exact Cox model's sums)",
                ("float32", "float64"),
            ),
            max_weight_share_option(1.0),
        ),
        server_reads_uploads=True,
    ),
    "ckks": BackendSpec(
        "ckks",
        "CKKS ciphertexts under one key the clients share (SEAL via TenSEAL)",
        _ckks_server,
        _ckks_client,
        (
            BackendOption(
                "preset",
                "ckks-preset",
                str,
                "compact",
                "parameter set: lean (N=4096, one 60-bit data prime: the clients apply "
                "their planned weights, the server only adds; 8 bytes per value, error "
                "~1e-4; the default for streaming protocols: fedavg, fedadam, autofedrl; "
                "not admm, which needs precise sums), compact (N=4096, 47+46+16 bits: "
                "weights chosen after the uploads; 14 bytes per value, error ~2e-8; the "
                "default otherwise) or wide (N=8192, 60+60+60 bits); all 128-bit secure "
                "(SEAL enforces it)",
                ("lean", "compact", "wide"),
            ),
            BackendOption(
                "flooding_bits",
                "flooding-bits",
                int,
                30,
                "security bits s of the noise flooding of revealed aggregates against key "
                "recovery (Micciancio-Walter's sense; the plain statistical distance is about "
                "2^-(s/2+4), 2^-19 at 30), at least 30 (0 turns flooding off and is insecure)",
            ),
            *_release_policy_options(),
        ),
        _check_flooding,
        presets=PresetFamily(_ckks_presets, default="compact", streaming="lean"),
        warm=_ckks_warm,
    ),
    "threshold": BackendSpec(
        "threshold",
        "masks under one-time keys Shamir-shared t of n among the clients (no single "
        "client can open anything)",
        _threshold_server,
        _threshold_client,
        (
            BackendOption(
                "preset",
                "threshold-preset",
                str,
                "wide",
                "parameter set: lean (N=4096, one 32-bit prime: the clients apply their "
                "planned weights, the server only adds; 4 bytes per value, error below 1e-6; the "
                "default for streaming protocols, as ckks's lean) or wide (N=4096, one 60-bit "
                "prime: weights chosen after the uploads; 8 bytes per value, error ~1e-10); "
                "both far inside the 128-bit bound for N=4096 (log q <= 109)",
                ("lean", "wide"),
            ),
            BackendOption(
                "threshold_t",
                "threshold-t",
                int,
                0,
                "how many key holders (the roster's clients, or its committee) must answer "
                "to open a sum; fewer learn nothing. 0: a strict majority (c//2 + 1 of c "
                "holders), so two disjoint holder sets can never both open; up to c - t "
                "holders may be offline. The "
                "clients hold every release to what t - 1 colluders could learn: a release "
                "lists at least t - 1 + min_contributors uploads, and protocols that weigh "
                "the same uploads twice (LARC, SimAgg) need a lower t (3 of 6) to keep "
                "their rounds",
            ),
            BackendOption(
                "committee",
                "threshold-committee",
                int,
                0,
                "how many of the roster's clients hold key shares (the committee; t is then "
                "counted among them): 0, every client (n shares an upload, n² a round); c > 0, "
                "c clients picked by a public hash of their names, so a round deals n·c "
                "shares and the server's work per client stays flat as n grows. t counts "
                "committee members, so a committee of 10 (t = 6) withstands 5 colluding "
                "clients where a roster of 1,000 withstands 500; t of the committee must be "
                "online",
            ),
            *_release_policy_options(),
        ),
        _check_threshold,
        presets=PresetFamily(_threshold_presets, default="wide", streaming="lean"),
    ),
}


def register_backend(spec: BackendSpec, *, replace: bool = False) -> None:
    """Make ``spec`` available as ``spec.name`` (CLI ``--backend`` and its option flags,
    configs, workers, Flower nodes). A name already taken is refused unless ``replace``."""
    if not isinstance(spec, BackendSpec):
        raise ConfigError(f"register_backend: {spec!r} is not a BackendSpec")
    name = spec.name
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"backend names are letters, digits, - and _; got {name!r}")
    if name in BACKENDS and not replace:
        raise ConfigError(f"backend {name!r} is already registered (pass replace=True)")
    if spec.presets is not None and "preset" not in {o.key for o in spec.options}:
        raise ConfigError(f"backend {name!r} has presets but no 'preset' option")
    BACKENDS[name] = spec


def load_backend_entry_points() -> None:
    """Register the backends installed packages declare (entry point group
    ``secagg.backends``: a :class:`BackendSpec`, or a callable returning one); once per
    process."""
    from secagg.plugins import BACKEND_GROUP, new_entry_points

    for point in new_entry_points(BACKEND_GROUP):
        if point.name not in BACKENDS:
            loaded = point.load()
            spec = loaded() if callable(loaded) and not isinstance(loaded, BackendSpec) else loaded
            if not isinstance(spec, BackendSpec):
                raise ConfigError(
                    f"entry point {point.name!r} ({point.value}) in group {BACKEND_GROUP!r} "
                    f"is not a BackendSpec (nor a callable returning one): {spec!r}"
                )
            register_backend(spec)


def backend_spec(name: str) -> BackendSpec:
    """The registered backend ``name`` (``BACKENDS``; an installed package\'s, by entry point,
    on the first lookup); a ConfigError naming the others."""
    if name not in BACKENDS:  # an installed package's backend (entry point)?
        load_backend_entry_points()
    if name not in BACKENDS:
        raise ConfigError(
            f"unknown backend {name!r}; available: {', '.join(BACKENDS)} (a backend of your "
            "own: register_backend in a module named with --import MODULE)"
        )
    return BACKENDS[name]


def resolve_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return backend_spec(name).resolve(options)


def make_server_backend(
    name: str, options: Mapping[str, Any], signers: Mapping[str, bytes] | None = None
) -> ServerBackend:
    """The server half; ``signers`` (the clients' public signing keys, from provisioning)
    lets it check consents before relaying them (the clients check them regardless). A
    server half that can read what its registry entry says it cannot (or the reverse) is
    refused: the run's checks and the audit rely on the entry."""
    spec = backend_spec(name)
    server = spec.make_server(resolve_options(name, options), signers)
    if bool(server.can_read) != spec.server_reads_uploads:
        raise ConfigError(
            f"backend {name!r}: its server half has can_read={server.can_read}, its registry "
            f"entry server_reads_uploads={spec.server_reads_uploads}; make them agree"
        )
    return server


def make_client_backend(
    name: str, client_id: str, options: Mapping[str, Any], provision: Provision
) -> ClientBackend:
    return backend_spec(name).make_client(client_id, resolve_options(name, options), provision)


__all__ = [
    "Identity",
    "Provision",
    "provision",
    "public_signers",
    "BACKENDS",
    "BackendOption",
    "BackendSpec",
    "PresetFamily",
    "register_backend",
    "load_backend_entry_points",
    "ClientBackend",
    "ServerBackend",
    "backend_spec",
    "make_client_backend",
    "make_server_backend",
    "resolve_options",
]


def make_backends(
    name: str,
    client_ids: list[str],
    *,
    decryption_budget: int = 8,
    open_budget: int = 8,
    reveal_length: int | tuple[int, ...] | None = None,
    weights_vary: bool = False,
    **options: Any,
) -> tuple[ServerBackend, dict[str, ClientBackend]]:
    """Both halves at once (tests, benchmarks): the server's and one per client, the clients
    provisioned with fresh identities and one roster (``weights_vary``: as for a protocol
    whose weights vary with the data, ``coalition.RunLedger``)."""
    provisions = (
        provision(
            client_ids, decryption_budget, reveal_length, open_budget, weights_vary=weights_vary
        )
        if backend_spec(name).keyed
        else {}
    )
    return (
        make_server_backend(name, options, public_signers(provisions)),
        {
            c: make_client_backend(name, c, options, provisions.get(c, Provision()))
            for c in client_ids
        },
    )


__all__ += ["make_backends"]
