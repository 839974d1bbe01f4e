"""Pieces (secagg.protocols.pieces): a protocol has the behaviours it subclasses and no other,
and a two-phase run is built only from a second phase whose pieces it composes, so a
combination that could not run is refused when it is configured, not in round 1."""

from __future__ import annotations

import pytest

import secagg.protocols  # noqa: F401  (registers the built-in protocols)
from secagg.errors import ConfigError
from secagg.protocols.pieces import (
    PIECES,
    ClientEvaluation,
    Convergence,
    ExtraReleases,
    FederatedInitialisation,
    FixedServerStep,
    PreStage,
    ValidationFeedback,
    piece,
    pieces_of,
    pre_stage_of,
)
from secagg.protocols.registry import PROTOCOLS, make_protocol
from secagg.protocols.twophase import COMPOSED_PIECES
from secagg.simulation.cli import main

EXPECTED = {
    "admm": {FixedServerStep, Convergence},
    "coxph": {Convergence, ExtraReleases},
    "dec": {PreStage, FederatedInitialisation, ExtraReleases},
    "ensemble": {ClientEvaluation, ExtraReleases},
    "xgboost": {ExtraReleases},
    "feddisco": {PreStage},
    "autofedrl": {ValidationFeedback},
}
SECOND_PHASES = sorted(set(PROTOCOLS) - {"rolepro", "fedavg"})


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_each_protocol_has_exactly_its_pieces(name):
    protocol = make_protocol(name)
    assert set(pieces_of(protocol)) == EXPECTED.get(name, set())
    for kind in PIECES:
        assert (piece(protocol, kind) is not None) == (kind in EXPECTED.get(name, set()))


@pytest.mark.parametrize("then", SECOND_PHASES)
def test_two_phase_is_built_only_from_a_second_phase_whose_pieces_it_composes(then):
    foreign = set(pieces_of(make_protocol(then))) - set(COMPOSED_PIECES)
    if foreign:
        with pytest.raises(ConfigError, match=f"cannot run '{then}' as its second phase"):
            make_protocol("rolepro", then=then)
        return
    composed = make_protocol("rolepro", then=then)
    # the run has exactly the second phase's pieces, each answered by that phase
    assert set(pieces_of(composed)) == set(pieces_of(composed.then))
    for kind in pieces_of(composed):
        assert piece(composed, kind) is composed.then


def test_both_outcomes_occur():
    refused = [t for t in SECOND_PHASES if set(pieces_of(make_protocol(t))) - set(COMPOSED_PIECES)]
    assert {"coxph", "xgboost", "admm", "dec", "ensemble"} <= set(refused)
    assert pre_stage_of(make_protocol("rolepro", then="feddisco")) == "beta-vae"
    assert piece(make_protocol("rolepro", then="autofedrl"), ValidationFeedback) is not None
    assert pre_stage_of(make_protocol("rolepro", then="regagg")) is None


def test_a_two_phase_run_whose_second_phase_cannot_run_there_is_refused_at_configuration(
    tmp_path, monkeypatch, capsys
):
    # it used to pass validation on ckks and abort in round 1: every client refused a
    # release of a length that was never provisioned
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--protocol", "rolepro", "--protocol-option", "then=coxph"]
    assert main([*argv, "--task", "coxph-tcga-balanced", "--backend", "ckks", "--show-config"]) == 2
    err = capsys.readouterr().err
    assert "cannot run 'coxph' as its second phase" in err and "ExtraReleases" in err
    assert not list(tmp_path.iterdir())  # nothing written
