"""benchmarks.protocol_parity writes where its recorded command says: benchmarks/results."""

from benchmarks import protocol_parity


def test_the_default_output_is_the_results_folder(tmp_path, monkeypatch):
    """Its command carries no --out: the files must land in the results folder, not in a
    folder named after the reference page's glob (``RESULTS``) in the working directory."""
    row = {
        "protocol": "fedavg",
        "task": "t",
        "preset": "lean",
        "max_abs_param_gap": 0.0,
        "max_abs_metric_gap": 0.0,
        "aborted": False,
    }
    monkeypatch.setattr(protocol_parity, "side_by_side", lambda *args: dict(row))
    monkeypatch.setattr(protocol_parity, "RESULTS_FOLDER", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    protocol_parity.main(["--protocols", "fedavg"])
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "protocol_parity_threshold.csv",
        "protocol_parity_threshold.md",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
