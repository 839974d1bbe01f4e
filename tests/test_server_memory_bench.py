"""``benchmarks.server_memory`` end to end at a toy size: each backend's round is traced in a
server process of its own, and the report names the allocations that held the peak."""

import pandas as pd
import pytest

from benchmarks import server_memory


def test_every_backend_is_traced_and_its_peak_sites_reported(tmp_path):
    table = server_memory.main(["--params", "20000", "--clients", "3", "--out", str(tmp_path)])
    assert list(table["backend"]) == list(server_memory.BACKENDS)
    assert (table["peak_traced_MB"] > 0).all() and (table["server_peak_rss_MB"] > 0).all()
    # the traced peak holds at least the params, one float64 buffer (8 B a parameter)
    assert (table["bytes_per_param"] >= 8).all()
    sites = pd.read_csv(tmp_path / "server_memory_sites.csv")
    assert set(sites["backend"]) == set(server_memory.BACKENDS)
    assert sites["site"].str.contains(":").all()
    text = (tmp_path / "server_memory.md").read_text()
    assert "python -m benchmarks.server_memory" in text and "### threshold, whole" in text


def test_a_round_in_parts_is_traced_beside_the_round_whole(tmp_path):
    table = server_memory.main(
        ["--params", "20000", "--clients", "3", "--backends", "ckks", "--part-values", "0,5000"]
        + ["--out", str(tmp_path)]
    )
    assert list(table["part_values"]) == [0, 5000]
    assert "### ckks, parts of 5,000" in (tmp_path / "server_memory.md").read_text()
    with pytest.raises(SystemExit):  # a negative part size is refused before anything runs
        server_memory.main(["--part-values", "-1", "--out", str(tmp_path / "bad")])


def test_an_unknown_backend_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit):
        server_memory.main(["--backends", "plain,rsa", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
