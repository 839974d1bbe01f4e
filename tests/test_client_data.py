"""Client data that is not whole tensors (a Dataset, or one loaded lazily per client), the
device setting, and a task's extra metrics.

The Dataset-backed and lazy clients hold the same TCGA-BRCA samples as the tensor ones, so
everything computed from them must agree bit for bit: a difference in order, dtype or
batching shows as a different pseudo-gradient or score.
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from secagg.clients.privacy import make_private
from secagg.clients.tasks import TASKS, ClientData, FederatedData, get_task
from secagg.clients.tasks.tcga_brca import c_index, random_client_splits
from secagg.clients.training import (
    LocalTrainer,
    flat_params,
    model_outputs,
    resolve_device,
    set_flat_params,
)
from secagg.errors import ConfigError
from secagg.runspec.evaluation import evaluate
from secagg.simulation.experiment import (
    ClientFactory,
    ExperimentConfig,
    hold_out_validation,
    run_experiment,
)

TCGA = get_task("tcga-brca")


@functools.cache
def tcga() -> FederatedData:
    return TCGA.load()


class Rows(Dataset):
    """(x[i], y[i]) as numpy rows: a Dataset whose items the collate has to convert."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x.numpy(), y.numpy()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


#: (set, client) of every lazy load in this process, in order
LOADS: list[tuple[str, int]] = []


def load_part(which: str, k: int) -> Dataset:
    """Client k's TCGA-BRCA train or test samples as a Dataset (a lazy client's loader)."""
    LOADS.append((which, k))
    part = getattr(tcga(), which)[k]
    return Rows(part.x, part.y)


def load_lazy_tcga() -> FederatedData:
    """TCGA-BRCA with every client's sets loaded lazily, sizes declared up front."""
    data = tcga()
    return FederatedData(
        "tcga-brca[lazy]",
        [
            ClientData.lazy(functools.partial(load_part, "train", k), length=len(p))
            for k, p in enumerate(data.train)
        ],
        [
            ClientData.lazy(functools.partial(load_part, "test", k), length=len(p))
            for k, p in enumerate(data.test or [])
        ],
    )


def as_dataset(part: ClientData) -> ClientData:
    return ClientData.from_dataset(Rows(part.x, part.y))


def trainer(part: ClientData, **kwargs) -> LocalTrainer:
    return LocalTrainer(TCGA.make_model(), part, TCGA.loss, 8, seed=3, **kwargs)


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    """Equal scores, NaN (a client set where the metric is undefined) equal to NaN."""
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])) for k in a
    )


def rounds(t, w: np.ndarray, n: int = 4, steps: int = 7) -> list[np.ndarray]:
    """n rounds of local training from w (7 steps of 8: epochs end mid-round)."""
    out = []
    for _ in range(n):
        g = t.train(w, 0.05, steps)
        out.append(g)
        w = w + g
    return out


# ---- the interface ---------------------------------------------------------------------------
def test_a_dataset_client_reads_the_same_samples_as_a_tensor_client():
    part = tcga().train[0]
    ds = as_dataset(part)
    assert len(ds) == len(part) and not ds.is_tensor and part.is_tensor
    idx = np.array([5, 0, 17, 5])
    for got, want in zip(ds.batch(idx), part.batch(idx)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    batches = list(ds.batches(50))
    assert [len(x) for x, _ in batches] == [50] * (len(part) // 50) + [len(part) % 50]
    assert torch.equal(torch.cat([x for x, _ in batches]), part.x)
    sub = ds.subset(idx)
    assert not sub.is_tensor and torch.equal(sub.x, part.x[idx]) and torch.equal(sub.y, part.y[idx])
    mixed = ClientData.concat([ds, tcga().train[1]])
    assert torch.equal(mixed.x, torch.cat([part.x, tcga().train[1].x]))
    assert torch.equal(mixed.y, torch.cat([part.y, tcga().train[1].y]))


def test_whole_tensors_are_materialised_once_and_kept():
    LOADS.clear()
    lazy = load_lazy_tcga().train[2]
    assert len(lazy) == len(tcga().train[2]) and LOADS == []  # the declared length
    assert torch.equal(lazy.x, tcga().train[2].x) and torch.equal(lazy.y, tcga().train[2].y)
    assert lazy.x is lazy.x and LOADS == [("train", 2)]


def test_a_lazy_client_pickles_its_loader_not_its_samples():
    LOADS.clear()
    lazy = ClientData.lazy(functools.partial(load_part, "train", 1))
    lazy.x  # noqa: B018 (loads and materialises)
    blob = pickle.dumps(lazy)
    assert len(blob) < 2000  # the partial, not 200 × 41 floats
    copy = pickle.loads(blob)
    assert LOADS == [("train", 1)]
    assert torch.equal(copy.x, lazy.x) and LOADS == [("train", 1), ("train", 1)]


def test_bad_datasets_are_config_errors():
    with pytest.raises(ConfigError, match="map-style Dataset"):
        ClientData.from_dataset([1, 2, 3].__iter__())
    with pytest.raises(ConfigError, match="zero-argument callable"):
        ClientData.lazy(Rows(torch.zeros(2, 1), torch.zeros(2, 1)))  # the Dataset, not a loader
    wrong = ClientData.lazy(functools.partial(load_part, "train", 0), length=3)
    with pytest.raises(ConfigError, match="declared with 3 samples"):
        wrong.batch([0])
    singles = ClientData.from_dataset(torch.utils.data.TensorDataset(torch.zeros(4, 2)))
    with pytest.raises(ConfigError, match=r"\(x, y\) pairs"):
        singles.batch([0, 1])


# ---- training ---------------------------------------------------------------------------------
def test_dataset_and_lazy_clients_train_bit_for_bit_as_tensor_clients():
    w = flat_params(TCGA.make_model())
    want = rounds(trainer(tcga().train[0]), w)
    for part in (as_dataset(tcga().train[0]), load_lazy_tcga().train[0]):
        got = rounds(trainer(part), w)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert not np.array_equal(want[0], want[1])  # the rounds differ: the order matters


def test_loss_at_and_predict_on_a_dataset_client():
    part = tcga().train[3]
    w = flat_params(TCGA.make_model()) + 0.01
    plain, ds = trainer(part), trainer(as_dataset(part))
    # float32 sums: their order may follow torch's threads, which earlier tests can change
    assert ds.loss_at(w) == pytest.approx(plain.loss_at(w), rel=1e-6)
    val = as_dataset(tcga().test[3])
    assert ds.loss_at(w, data=val) == pytest.approx(plain.loss_at(w, data=tcga().test[3]), rel=1e-6)
    assert np.array_equal(ds.predict(w, part.x.numpy()), plain.predict(w, part.x.numpy()))


def test_dp_sgd_on_a_dataset_client_matches_the_tensor_client():
    w = flat_params(TCGA.make_model())

    def private(part):
        return make_private(
            trainer(part), max_grad_norm=1.0, total_steps=20, noise_multiplier=1.0, seed=5
        )

    want = rounds(private(tcga().train[1]), w, n=3)
    dp = private(as_dataset(tcga().train[1]))
    got = rounds(dp, w, n=3)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert 0 < dp.epsilon(1e-5) < np.inf
    lazy = private(load_lazy_tcga().train[1])
    assert np.array_equal(rounds(lazy, w, n=1)[0], want[0])


# ---- splits -----------------------------------------------------------------------------------
def test_hold_out_and_client_splits_keep_the_kind_and_the_samples():
    LOADS.clear()
    lazy = load_lazy_tcga()
    for split in (
        lambda d: hold_out_validation(d, 0.2),
        lambda d: (random_client_splits(d, 4), None),
    ):
        want, want_val = split(tcga())
        got, got_val = split(lazy)
        assert LOADS == []  # declared lengths: the parts stay lazy until used
        assert [len(p) for p in got.train] == [len(p) for p in want.train]
        assert torch.equal(got.train[4].x, want.train[4].x)
        assert torch.equal(got.train[4].y, want.train[4].y)
        assert isinstance(got_val, type(want_val))
        if want_val is not None:
            assert torch.equal(got_val[0].x, want_val[0].x)
        LOADS.clear()
        ds, _ = split(replace(tcga(), train=[as_dataset(p) for p in tcga().train]))
        assert not ds.train[5].is_tensor and torch.equal(ds.train[5].y, want.train[5].y)


@pytest.fixture
def lazy_task(monkeypatch):
    """TCGA-BRCA loaded lazily, registered as a task for this test only."""
    # what register_task does, undone after the test (the registry is process-wide)
    monkeypatch.setitem(
        TASKS, "tcga-lazy-test", replace(TCGA, name="tcga-lazy-test", load=load_lazy_tcga)
    )
    return "tcga-lazy-test"


def test_a_factory_building_one_client_loads_only_its_partition(lazy_task):
    config = ExperimentConfig(
        task=lazy_task,
        protocol="fedavg",
        backend="plain",
        rounds=1,
        seeds=[1],
        local_steps=3,
        validation_split=0.2,
    )
    LOADS.clear()
    client = ClientFactory(config, 1)(["client_2"])["client_2"]
    assert set(LOADS) <= {("train", 2)}
    client.trainer.train(flat_params(TCGA.make_model()), 0.1, 3)
    assert set(LOADS) == {("train", 2)}


def test_a_lazy_task_runs_as_the_tensor_task(lazy_task):
    config = ExperimentConfig(
        task="tcga-brca", protocol="fedavg", backend="plain", rounds=2, seeds=[1], local_steps=5
    )
    want = run_experiment(config).metrics
    got = run_experiment(replace(config, task=lazy_task)).metrics
    cols = [c for c in want.columns if c.startswith(("test_", "train_"))]
    assert cols and got[cols].equals(want[cols])


# ---- evaluation ---------------------------------------------------------------------------------
def mean_score(truth: np.ndarray, scores: np.ndarray) -> float:
    return float(np.mean(scores))


def undefined(truth: np.ndarray, scores: np.ndarray) -> float:
    raise ZeroDivisionError


def test_extra_metrics_are_scored_on_the_pooled_sets():
    task = replace(TCGA, metrics={"mean_risk": mean_score, "never": undefined})
    data = tcga()
    w = flat_params(TCGA.make_model()) + 0.02
    out = evaluate(task, data, w)
    model = TCGA.make_model()
    set_flat_params(model, w)
    with torch.no_grad():
        test = model(ClientData.concat(data.test).x).numpy()
        train = model(ClientData.concat(data.train).x).numpy()
    assert out["test_mean_risk"] == float(np.mean(test))
    assert out["train_mean_risk"] == float(np.mean(train))
    assert out["test_mean_risk"] != out["train_mean_risk"]
    assert np.isnan(out["test_never"]) and np.isnan(out["train_never"])
    assert out["test_pooled"] == c_index(ClientData.concat(data.test).y, test)
    assert not any(k.startswith("test_client_") and "mean" in k for k in out)
    plain = evaluate(TCGA, data, w)
    assert same({k: v for k, v in out.items() if k in plain}, plain)
    assert set(out) - set(plain) == {
        "test_mean_risk",
        "train_mean_risk",
        "test_never",
        "train_never",
    }


def test_a_coordinator_scores_only_the_test_set_it_holds_and_reads_no_sites_part():
    """``held_by_coordinator``: the pooled test set is scored as the experimenter scores it
    in simulation; the sites' parts are not held (no train_* or per-client columns), are
    never loaded, and any read of one is refused, naming whose it is."""
    from secagg.clients.tasks.tcga_brca import held_by_coordinator
    from secagg.errors import DataNotHeld
    from secagg.runspec.provisioning import seed_data

    task = replace(TCGA, metrics={"mean_risk": mean_score})
    full = replace(tcga(), pooled_test=ClientData.concat(tcga().test))
    opened: list[int] = []

    def site(k: int) -> Dataset:
        opened.append(k)
        return full.train[k].dataset

    declared = replace(full, train=[ClientData.lazy(functools.partial(site, k)) for k in range(6)])
    held = held_by_coordinator(declared, 6)
    w = flat_params(TCGA.make_model()) + 0.02
    everything = evaluate(task, full, w)
    out = evaluate(task, held, w)
    # the same pooled test set: the simulation's scores of it, and nothing else
    shown = ("test_pooled", "test_c_index", "test_loss", "test_mean_risk")
    assert out == {k: everything[k] for k in shown}
    assert held.n_clients == 6 and held.test is None and not held.holds_training_data
    config = ExperimentConfig(task="tcga-brca", validation_split=0.2)
    assert seed_data(config, 3, held)[0] is held  # nothing to split where nothing is held
    assert opened == []
    part = held.train[4]
    assert not part.held and not part.subset([0, 1]).held
    for read in (len, lambda p: p.x, lambda p: p.batch([0])):
        with pytest.raises(DataNotHeld, match="client_4's data is not held here"):
            read(part)
    assert opened == [] and declared.holds_training_data and full.holds_training_data
    assert pickle.loads(pickle.dumps(part)).held is False


def test_extra_metrics_score_an_ensembles_predictions():
    task = replace(TCGA, metrics={"mean_risk": mean_score})
    data = replace(tcga(), pooled_test=tcga().test[0])
    predictions = np.linspace(-1, 1, len(data.pooled_test))
    out = evaluate(task, data, np.zeros(40), predictions)
    assert out["test_mean_risk"] == float(np.mean(predictions.astype(np.float32)))


def test_an_ensembles_predictions_on_a_set_without_events_score_nan():
    """A test set with no admissible pair (no event: a small centre held out in a
    cross-validation) has no c-index: NaN, as for a model's outputs, not a crash that ends
    the run (lifelines raises ZeroDivisionError)."""
    part = tcga().test[0]
    censored = ClientData(part.x, torch.stack([torch.zeros(len(part)), part.y[:, 1]], 1))
    data = replace(tcga(), pooled_test=censored)
    predictions = np.linspace(-1, 1, len(censored))
    out = evaluate(TCGA, data, np.zeros(40), predictions)
    assert np.isnan(out["test_pooled"]) and np.isfinite(out["test_loss"])


def test_batched_and_dataset_evaluation_equal_whole_tensor_evaluation():
    data = tcga()
    w = flat_params(TCGA.make_model()) - 0.03
    want = evaluate(TCGA, data, w)
    # as before this change: one forward pass over each whole set
    model = TCGA.make_model()
    set_flat_params(model, w)
    with torch.no_grad():
        train = ClientData.concat(data.train)
        assert want["train_loss"] == float(TCGA.loss(model(train.x), train.y))
        assert want["train_pooled"] == TCGA.metric(train.y.numpy(), model(train.x).numpy())
    ds = replace(
        data,
        train=[as_dataset(p) for p in data.train],
        test=[as_dataset(p) for p in data.test or []],
    )
    assert same(evaluate(TCGA, ds, w), want)
    small = evaluate(TCGA, ds, w, batch_size=37)  # 37-sample passes: equal to float rounding
    assert small.keys() == want.keys()
    assert all(small[k] == pytest.approx(want[k], rel=1e-6, nan_ok=True) for k in want)


def test_model_outputs_concatenate_in_order():
    model = torch.nn.Linear(39, 1)
    part = tcga().train[0]
    with torch.no_grad():
        whole = model(part.x)
    out, y = model_outputs(model, as_dataset(part), batch_size=16)
    assert torch.allclose(out, whole, atol=1e-6) and torch.equal(y, part.y)


# ---- devices ----------------------------------------------------------------------------------
def test_device_names_resolve(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match="--device cpu"):
            resolve_device(name)
    with pytest.raises(ConfigError, match="cpu, cuda, cuda:N or auto"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="--device cpu"):
        trainer(tcga().train[0], device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="1 CUDA GPU"):
        resolve_device("cuda:1")


def test_a_run_on_a_missing_gpu_stops_with_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = ExperimentConfig(
        task="tcga-brca", protocol="fedavg", backend="plain", rounds=1, seeds=[1], device="cuda"
    )
    with pytest.raises(ConfigError, match="--device cpu"):
        ClientFactory(config, 1)(["client_0"])


def test_cpu_given_explicitly_is_the_default():
    w = flat_params(TCGA.make_model())
    want = rounds(trainer(tcga().train[2]), w, n=2)
    got = rounds(trainer(tcga().train[2], device="cpu"), w, n=2)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    explicit = trainer(tcga().train[2], device=torch.device("cpu"))
    assert explicit.loss_at(w) == trainer(tcga().train[2]).loss_at(w)
    assert same(evaluate(TCGA, tcga(), w, device=torch.device("cpu")), evaluate(TCGA, tcga(), w))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_on_a_gpu_agrees_with_the_cpu():
    w = flat_params(TCGA.make_model())
    for part in (tcga().train[0], as_dataset(tcga().train[0])):
        cpu = rounds(trainer(part), w, n=3)
        gpu_trainer = trainer(part, device="cuda")
        gpu = rounds(gpu_trainer, w, n=3)
        assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(gpu, cpu))
        assert gpu_trainer.loss_at(w) == pytest.approx(trainer(part).loss_at(w), rel=1e-5)
    want = evaluate(TCGA, tcga(), w + cpu[-1])
    got = evaluate(TCGA, tcga(), w + cpu[-1], device=torch.device("cuda"))
    assert all(got[k] == pytest.approx(want[k], rel=1e-4, nan_ok=True) for k in want)
    dp_cpu = make_private(
        trainer(tcga().train[1]), max_grad_norm=1.0, total_steps=9, noise_multiplier=1e-9, seed=2
    )
    dp_gpu = make_private(
        trainer(tcga().train[1], device="cuda"),
        max_grad_norm=1.0,
        total_steps=9,
        noise_multiplier=1e-9,
        seed=2,
    )
    assert np.allclose(rounds(dp_gpu, w, n=1)[0], rounds(dp_cpu, w, n=1)[0], atol=1e-5)
    state = dp_gpu.state_dict()
    dp_gpu.load_state_dict(state)
