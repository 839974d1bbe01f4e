"""A task's metric keeps its name in every output: the pooled columns are aliases of it, not
replacements (``test_auc`` beside ``test_pooled`` for a metric named ``auc``)."""

from types import SimpleNamespace

import pandas as pd
import pytest

from secagg.runspec.evaluation import with_metric_name

SCORES = {"train_pooled": 0.7, "train_loss": 0.5, "test_pooled": 0.6, "test_loss": 0.9}


def task(name, extras=()):
    return SimpleNamespace(metric_name=name, metrics=dict.fromkeys(extras))


def test_the_metric_is_also_under_its_own_name():
    out = with_metric_name(task("auc"), SCORES)
    assert out["test_auc"] == out["test_pooled"] == 0.6
    assert out["train_auc"] == out["train_pooled"] == 0.7
    assert SCORES == {"train_pooled": 0.7, "train_loss": 0.5, "test_pooled": 0.6, "test_loss": 0.9}


def test_an_extra_metric_or_a_reserved_column_keeps_its_own_value():
    assert with_metric_name(task("auc", extras=("auc",)), SCORES) == SCORES
    assert with_metric_name(task("loss"), SCORES) == SCORES  # would shadow test_loss
    assert with_metric_name(task("pooled"), SCORES) == SCORES


def test_a_run_writes_the_metric_under_its_name_in_metrics_csv_and_the_records(tmp_path):
    """tcga-brca's metric is ``c_index``: metrics.csv and each RoundRecord carry
    ``test_c_index``, equal to ``test_pooled``, so ``record.metrics["test_c_index"]``
    works as the tutorial's callback reads its own metric."""
    import secagg
    from secagg.runspec.config import ExperimentConfig

    seen = []
    config = ExperimentConfig(rounds=1, local_steps=1, seeds=[1]).validate()
    secagg.run(config, out=tmp_path / "run", on_round=lambda r: seen.append(r))
    table = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert (table["test_c_index"] == table["test_pooled"]).all()
    # the CSV keeps 15 significant digits
    assert [r.metrics["test_c_index"] for r in seen] == pytest.approx(
        table["test_c_index"].tolist()
    )
