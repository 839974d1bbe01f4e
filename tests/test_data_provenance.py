"""A task can say where its data comes from (``Task.sources``); a run records each source's
path, size and SHA-256, and what changed between a record and now is named."""

from types import SimpleNamespace

from secagg.clients.tasks import get_task
from secagg.simulation.provenance import changed_data, data_provenance, describe_path


def test_a_folder_and_a_file_are_described_by_their_bytes(tmp_path):
    (tmp_path / "a.csv").write_text("x,label\n1,0\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.csv").write_text("x,label\n2,1\n")
    folder, file = describe_path(tmp_path), describe_path(tmp_path / "a.csv")
    assert folder["files"] == 2 and folder["bytes"] == 24 and len(folder["sha256"]) == 64
    assert file["bytes"] == 12 and "files" not in file
    assert describe_path(tmp_path / "gone")["missing"] is True
    (tmp_path / "sub" / "b.csv").write_text("x,label\n2,0\n")  # one cell changed
    assert describe_path(tmp_path)["sha256"] != folder["sha256"]


def test_what_changed_between_a_record_and_now_is_named(tmp_path):
    site = tmp_path / "site_0.csv"
    site.write_text("x,label\n1,0\n")
    task = SimpleNamespace(sources=lambda: {"sites": tmp_path})
    then = data_provenance(task)
    assert changed_data(then, data_provenance(task)) == []
    site.write_text("x,label\n1,1\n")
    (changed,) = changed_data(then, data_provenance(task))
    assert changed.startswith("sites: ") and "then" in changed and "now" in changed
    assert changed_data(then, None) == ["sites: not declared now"]
    assert data_provenance(SimpleNamespace(sources=None)) is None


def test_the_default_task_declares_its_files():
    recorded = data_provenance(get_task("tcga-brca"))
    assert set(recorded) == {"brca.csv", "train_test_split.csv"}
    assert all(r["bytes"] > 0 and len(r["sha256"]) == 64 for r in recorded.values())


def test_a_run_records_its_data_and_resume_refuses_data_that_changed(tmp_path, monkeypatch):
    """The run's config.json names each source's digest; after a seed finished, the data
    changes, and ``--resume`` of that folder is refused, naming the source."""
    import json

    import pytest

    import secagg
    from secagg.clients.tasks import TASKS, Task
    from secagg.errors import ConfigError
    from secagg.runspec.config import ExperimentConfig

    data = tmp_path / "data.csv"
    data.write_text("anything the task reads\n")
    base = get_task("tcga-brca")
    sourced = Task(**{**base.__dict__, "name": "tcga-sourced", "sources": lambda: {"data": data}})
    monkeypatch.setitem(TASKS, "tcga-sourced", sourced)  # removed again after the test
    out = tmp_path / "run"
    config = ExperimentConfig(task="tcga-sourced", rounds=1, local_steps=1, seeds=[1, 2])
    secagg.run(config.validate(), out=out)
    recorded = json.loads((out / "config.json").read_text())["provenance"]["data"]
    assert recorded["data"]["sha256"] == describe_path(data)["sha256"]
    state = json.loads((out / "run.json").read_text())
    state["status"], state["finished"] = "interrupted", {"1": state["finished"]["1"]}
    (out / "run.json").write_text(json.dumps(state))  # as if stopped after seed 1
    data.write_text("other data\n")
    with pytest.raises(ConfigError, match=r"the task's data changed .*data: "):
        secagg.run(out=out, resume=True)
