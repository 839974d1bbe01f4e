"""``benchmarks.many_clients`` end to end at toy sizes: every backend's rounds run, the
per-client figures are the server's work over the clients, and the report says whether
each backend stayed flat."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import many_clients


def test_the_report_divides_the_servers_work_by_the_clients(tmp_path):
    table = many_clients.main(
        ["--clients", "3,6", "--params", "1000", "--rounds", "2", "--threshold-up-to", "3",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert list(zip(table["backend"], table["n_clients"])) == [
        ("plain", 3), ("plain", 6), ("ckks", 3), ("ckks", 6), ("threshold", 3),
    ]  # fmt: skip
    rounds = pd.read_csv(tmp_path / "many_clients_rounds.csv")
    assert len(rounds) == 2 * len(table) and rounds["warm"].sum() == len(table)
    ckks6 = rounds[(rounds["backend"] == "ckks") & (rounds["n_clients"] == 6) & rounds["warm"]]
    row = table[(table["backend"] == "ckks") & (table["n_clients"] == 6)].iloc[0]
    assert row["server_ms_per_client"] == pytest.approx(1e3 * ckks6["server_work_s"].median() / 6)
    text = (tmp_path / "many_clients.md").read_text()
    assert "- plain: " in text and "- ckks: " in text
    assert "- threshold" not in text  # one count only: no growth to state
    assert "| threshold | 3 |" in text


def test_bad_counts_are_refused_with_what_to_give(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        many_clients.main(["--clients", "1,x", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "client counts, such as 100,300,1000" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written
