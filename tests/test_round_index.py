"""One round index in every file of a run folder: metrics.csv, traffic.csv and audit.jsonl
number training round k as k, and the set-up before the first round (key setup, enrolment)
as round 0, labelled ``stage`` "setup". Joining the files on ``round`` is exact: a round's
bytes in traffic.csv are metrics.csv's ``bytes_up``/``bytes_down`` of that round."""

import json

import pandas as pd
import pytest

import secagg
from secagg.server.audit import SETUP, AuditLog

KEY_SETUP = {"key_hello", "key_generate", "key_install"}


def _run(tmp_path, backend):
    out = tmp_path / backend
    result = secagg.run(
        task="tcga-brca",
        protocol="fedavg",
        backend=backend,
        rounds=2,
        local_steps=2,
        seeds=[3],
        out=out,
    )
    metrics = pd.read_csv(out / "metrics.csv")
    traffic = pd.read_csv(out / "traffic.csv")
    with open(out / "audit.jsonl") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    return result, metrics, traffic, records


@pytest.mark.parametrize("backend", ["ckks", "plain"])
def test_metrics_traffic_and_audit_share_one_round_index(tmp_path, backend):
    result, metrics, traffic, records = _run(tmp_path, backend)
    trained = set(metrics.loc[metrics["round"] >= 1, "round"])
    assert trained == {1, 2}
    messages = [r for r in records if r["event"] == "message" and r["run"] == "3"]
    assert {r["round"] for r in messages if r["stage"] != SETUP} == trained
    assert set(traffic.loc[traffic["stage"] != SETUP, "round"]) == trained

    # set-up: round 0, labelled, and nothing else is round 0
    setup = [r for r in messages if r["stage"] == SETUP]
    assert setup and {r["round"] for r in setup} == {0}
    assert all(r["round"] >= 1 for r in messages if r["stage"] != SETUP)
    phases = {r["phase"] for r in setup}
    assert phases == ({"enroll"} | KEY_SETUP if backend == "ckks" else {"enroll"})
    assert "train" not in phases
    in_traffic = traffic[traffic["round"] == 0]
    assert set(in_traffic["stage"]) == {SETUP} and set(in_traffic["phase"]) == phases
    # the protocol's own index is kept: training round k is protocol round k - 1
    assert all(r["protocol_round"] == r["round"] - 1 for r in messages if r["stage"] != SETUP)

    # bytes per round: traffic.csv's sums are metrics.csv's columns, exactly
    counted = traffic[(traffic["run"].astype(str) == "3") & (traffic["phase"] != "observe")]
    per_round = counted.pivot_table(
        index="round", columns="direction", values="bytes", aggfunc="sum", fill_value=0
    )
    rows = metrics[metrics["round"] >= 1].set_index("round")
    assert per_round.loc[sorted(trained), "up"].tolist() == rows["bytes_up"].tolist()
    assert per_round.loc[sorted(trained), "down"].tolist() == rows["bytes_down"].tolist()
    # ... and audit.jsonl's message bytes too
    for k in trained:
        up = sum(r["bytes"] for r in messages if r["round"] == k and r["direction"] == "received")
        assert up == rows.loc[k, "bytes_up"]

    # the in-memory tables are the files
    assert result.audit.records == records
    pd.testing.assert_frame_equal(
        result.traffic.reset_index(drop=True), traffic.astype({"run": str}), check_dtype=False
    )


def test_exclusions_and_aborts_use_the_same_index():
    audit = AuditLog()
    audit.run = "7"
    audit.begin_setup()
    audit.excluded(0, "key_hello", "client_1", ValueError("offline"))
    audit.aborted(0, "key_install", "no key")
    audit.begin_round()
    audit.excluded(1, "train", "client_2", ValueError("late"))
    audit.aborted(1, "train", "nobody left")
    summary = audit.summary()
    assert [(e["round"], e["stage"]) for e in summary["exclusions"]] == [(0, SETUP), (2, "round")]
    assert [(a["round"], a["stage"]) for a in summary["aborted_runs"]] == [(0, SETUP), (2, "round")]
    assert [r["protocol_round"] for r in audit.records] == [0, 0, 1, 1]


def test_a_protocols_initialisation_is_setup_and_a_pre_stage_numbers_its_own_rounds(tmp_path):
    """DEC: an autoencoder pre-stage (run "<seed>-<stage>", its own set-up and rounds 1, 2),
    then k-means before the first round: set-up of the main run, reveals included."""
    out = tmp_path / "dec"
    secagg.run(
        task="dec-breast-cancer-iid",
        protocol="dec",
        backend="plain",
        rounds=2,
        local_steps=5,
        batch_size=32,
        seeds=[0],
        protocol_options={"pretrain_rounds": 2, "kmeans_iters": 3, "restarts": 2},
        out=out,
    )
    with open(out / "audit.jsonl") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    metrics = pd.read_csv(out / "metrics.csv")
    traffic = pd.read_csv(out / "traffic.csv")
    main = [r for r in records if r["run"] == "0"]
    setup = {r["phase"] for r in main if r["event"] == "message" and r["stage"] == SETUP}
    assert {"embedding_moments", "kmeans_sums"} <= setup and "train" not in setup
    revealed = {(r["name"], r["round"], r["stage"]) for r in main if r["event"] == "reveal"}
    assert ("kmeans_sums", 0, SETUP) in revealed and ("global_update", 1, "round") in revealed
    assert all((r["round"] == 0) == (r["stage"] == SETUP) for r in records)

    (pre,) = {r["run"] for r in records} - {"0"}
    assert pre.startswith("0-")
    assert {r["round"] for r in records if r["run"] == pre and r["stage"] != SETUP} == {1, 2}

    counted = traffic[(traffic["run"].astype(str) == "0") & (traffic["phase"] != "observe")]
    per_round = counted[counted["round"] >= 1].groupby(["round", "direction"])["bytes"].sum()
    rows = metrics[metrics["round"] >= 1].set_index("round")
    assert per_round.unstack()["up"].tolist() == rows["bytes_up"].tolist()
    assert per_round.unstack()["down"].tolist() == rows["bytes_down"].tolist()


def test_resuming_a_folder_whose_audit_numbers_rounds_the_old_way_is_refused(tmp_path):
    from secagg.errors import ConfigError

    _run(tmp_path, "plain")
    audit = tmp_path / "plain" / "audit.jsonl"
    with open(audit) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    old = [{k: v for k, v in r.items() if k not in ("stage", "protocol_round")} for r in records]
    audit.write_text("".join(json.dumps(r) + "\n" for r in old))
    with pytest.raises(ConfigError, match="older secagg"):
        secagg.run(out=tmp_path / "plain", resume=True)
