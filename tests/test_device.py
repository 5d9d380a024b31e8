"""``--device auto|cpu|cuda`` (library: ``device=``): resolution, refusals and CPU parity.

This machine may have no GPU: "CUDA is present" is mocked where resolution is the subject
(no tensor is moved to CUDA), and the tests that need CUDA absent skip where it is present.
"""

import json

import pytest
import torch

from privmtl._device import DEFAULT_DEVICE, check_device, resolve_device, to_device
from privmtl.cli import main
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.backend import fingerprint_base
from privmtl.federated.config import TrainConfig
from privmtl.federated.store import ClientStore
from privmtl.privacy.noise import make_noise_source

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")

RUN = ["pmtl", "--data", "synthetic", "--num-clients", "6", "--model", "logreg", "--rounds", "2",
       "--epsilon", "2", "--reproducible-noise", "--finetune", "none", "--quiet", "--json"]  # fmt: skip
KW = {
    "data": "synthetic",
    "num_clients": 6,
    "model": "logreg",
    "rounds": 2,
    "epsilon": 2.0,
    "noise_source": "seeded",
    "finetune": "none",
    "show_progress": False,
    "threads": 1,
}


def _fake_cuda(monkeypatch, count=1):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# ------------------------------------------------------------------------------ resolution
def test_default_is_auto():
    assert DEFAULT_DEVICE == "auto" and TrainConfig().device == "auto"


@NO_CUDA
def test_auto_is_the_cpu_without_cuda():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_is_cuda_where_cuda_is_present(monkeypatch):
    _fake_cuda(monkeypatch, count=2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")  # an explicit cpu stays the cpu


def test_a_gpu_that_is_not_there_is_refused(monkeypatch):
    _fake_cuda(monkeypatch, count=2)
    with pytest.raises(InvalidParameterError, match=r"'device'.*0 to 1.*'cuda:2'"):
        resolve_device("cuda:2")


@NO_CUDA
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_refused(name):
    with pytest.raises(InvalidParameterError, match=r"The 'device' parameter.*not available"):
        resolve_device(name)


@pytest.mark.parametrize("bad", ["tpu", "CUDA", "cuda:", "cuda:x", "", None, 0])
def test_bad_names_are_refused_naming_the_parameter(bad):
    with pytest.raises(InvalidParameterError, match=r"The 'device' parameter must be one of"):
        check_device(bad)
    with pytest.raises(InvalidParameterError, match="'device'"):
        TrainConfig(device=bad)


def test_device_is_not_part_of_the_checkpoint_fingerprint():
    a = fingerprint_base(TrainConfig(device="cpu"), "seeded", 10)
    b = fingerprint_base(TrainConfig(device="cuda:1"), "seeded", 10)
    assert a == b and "device" not in a


# ------------------------------------------------------------------------------ where tensors go
def test_noise_is_drawn_by_the_source_then_moved_to_the_device():
    """The draws come from the source's own CPU generator (the same numbers as on the CPU) and
    only then land on the template's device ("meta" stands in for a GPU here)."""
    cpu = make_noise_source("seeded", 3).normal_like({"w": torch.zeros(4)}, 1.0)
    moved = make_noise_source("seeded", 3).normal_like({"w": torch.zeros(4, device="meta")}, 1.0)
    assert moved["w"].device.type == "meta" and cpu["w"].device.type == "cpu"
    secure = make_noise_source("secure", 0).normal_like({"w": torch.zeros(4, device="meta")}, 1.0)
    assert secure["w"].device.type == "meta"


def test_store_moves_its_rows_and_keeps_a_cpu_state():
    store = ClientStore(5, {"personal": {"w": torch.zeros(3)}})
    store.scatter("personal", torch.tensor([1, 3]), {"w": torch.ones(2, 3)})
    assert store.to("cpu") is store and store.device == torch.device("cpu")
    state = store.state_dict()
    assert all(t.device.type == "cpu" for t in state["rows"]["personal"].values())
    assert store.gather("personal", torch.tensor([3, 0]))["w"].sum().item() == 3.0


def test_to_device_keeps_structure_and_copies_nothing_in_place():
    t = torch.ones(2)
    tree = {"a": [t, (t, 3)], "b": "x"}
    out = to_device(tree, "cpu")
    assert out["a"][0] is t and out["a"][1][0] is t and out["a"][1][1] == 3 and out["b"] == "x"


# ------------------------------------------------------------------------------ the run
def _numbers(out):
    """A result without its wall-time keys (everything else of a seeded run is fixed)."""
    return {k: v for k, v in out.items() if not any(w in k for w in ("seconds", "phases"))}


def test_library_run_on_cpu_reports_the_device_and_matches_the_default():
    on_cpu = run_pmtl(**KW, device="cpu")
    assert on_cpu["device"] == "cpu" and on_cpu["test_accuracy"] > 0
    if not torch.cuda.is_available():  # "auto" is the cpu here: the very same numbers
        assert _numbers(run_pmtl(**KW)) == _numbers(on_cpu)


def test_library_refuses_a_bad_device_before_any_work():
    with pytest.raises(InvalidParameterError, match=r"The 'device' parameter.*'tpu'"):
        run_pmtl(**{**KW, "data": "no-such-data"}, device="tpu")  # refused before the data


@NO_CUDA
def test_cli_cuda_without_cuda_exits_2_in_one_line(capsys):
    code = main([*RUN, "--device", "cuda"])
    cap = capsys.readouterr()
    assert code == 2 and cap.out == ""
    assert cap.err.startswith("privmtl: error:") and "--device" in cap.err
    assert cap.err.count("\n") == 1 and "Traceback" not in cap.err


def test_cli_bad_device_exits_2_in_one_line(capsys):
    code = main([*RUN, "--device", "tpu"])
    cap = capsys.readouterr()
    assert code == 2 and cap.out == ""
    assert "--device" in cap.err and "'tpu'" in cap.err and cap.err.count("\n") == 1


@NO_CUDA
def test_cli_device_cpu_gives_the_numbers_of_no_device(capsys):
    assert main([*RUN, "--device", "cpu"]) == 0
    with_cpu = json.loads(capsys.readouterr().out)
    assert main(RUN) == 0
    plain = json.loads(capsys.readouterr().out)
    assert with_cpu["device"] == plain["device"] == "cpu"
    assert _numbers(with_cpu) == _numbers(plain)


@pytest.mark.parametrize("finetune", ["auto", "ewc"])
def test_end_of_run_on_cpu_matches_the_default(finetune):
    """The end of run (``auto``'s local grids, an explicit method) runs on the run's device: on
    the CPU, the numbers of a run without the option."""
    kw = {**KW, "finetune": finetune}
    on_cpu = run_pmtl(**kw, device="cpu")
    assert on_cpu["finetune"] == finetune and on_cpu["device"] == "cpu"
    if not torch.cuda.is_available():
        assert _numbers(run_pmtl(**kw)) == _numbers(on_cpu)


def test_train_local_takes_a_device_and_returns_cpu_models():
    from privmtl.data.registry import load_federated
    from privmtl.federated.end_of_run.local import train_local
    from privmtl.federated.models import make_model

    ds = load_federated("synthetic", num_clients=5, seed=0)
    net = make_model("logreg", ds, 0)
    a = train_local(ds, net, epochs=(1,), lrs=(0.1,), device="cpu")
    b = train_local(ds, net, epochs=(1,), lrs=(0.1,))
    for n, p in a.personalized_params.items():
        assert p.device.type == "cpu" and torch.equal(p, b.personalized_params[n])
    with pytest.raises(InvalidParameterError, match="'device'"):
        train_local(ds, net, epochs=(1,), lrs=(0.1,), device="tpu")


def test_a_checkpoint_holds_cpu_tensors_and_resumes_under_another_device_name(tmp_path):
    """``device`` is not part of what a checkpoint must match: a run checkpointed with
    ``device="cpu"`` resumes with ``"auto"`` (on a GPU machine: on the GPU) and ends as the
    uninterrupted run does here."""
    from privmtl.data.registry import load_federated
    from privmtl.federated.models import make_model
    from privmtl.federated.trainer import Trainer

    ds = load_federated("synthetic", num_clients=8, seed=0)
    net = make_model("logreg", ds, 0)
    cfg = TrainConfig(rounds=3, clients_per_round=4, noise_std=0.1, clip=0.5, progress=False,
                      noise_source="seeded", threads=1, device="cpu")  # fmt: skip
    first = Trainer(ds, net, cfg, checkpoint_dir=tmp_path / "ck")
    first.step()
    first.save()
    state = first.state_dict()
    tensors = [state["curator"]["billboard"], state["clients"]["rows"]]
    assert all(t.device.type == "cpu" for d in tensors for r in d.values() for t in
               (r.values() if isinstance(r, dict) else [r]))  # fmt: skip
    del first
    again = Trainer(ds, net, TrainConfig(**{**cfg.to_dict(), "device": "auto"}),
                    checkpoint_dir=tmp_path / "ck", resume=True)  # fmt: skip
    assert again.round == 1
    whole = Trainer(ds, net, cfg).run()
    if not torch.cuda.is_available():
        resumed = again.run()
        assert resumed.test_accuracy == whole.test_accuracy


def test_sweep_refuses_a_bad_device_in_one_line_before_writing(capsys, tmp_path):
    out = tmp_path / "sweep"
    code = main(["pmtl-sweep", "--data", "synthetic", "--device", "tpu", "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 2 and "--device" in cap.err and cap.err.count("\n") == 1
    assert not out.exists()


def test_finetune_takes_a_device_and_returns_cpu_models():
    from privmtl.data.registry import load_federated
    from privmtl.federated.end_of_run.finetune import finetune
    from privmtl.federated.models import make_model

    ds = load_federated("synthetic", num_clients=5, seed=0)
    net = make_model("logreg", ds, 0)
    glob = {n: p.detach() for n, p in net.named_parameters()}
    a, acc_a = finetune(glob, ds, net, method="mr", start="global", device="cpu")
    b, acc_b = finetune(glob, ds, net, method="mr", start="global")
    assert acc_a == acc_b
    for n, p in a.items():
        assert p.device.type == "cpu" and torch.equal(p, b[n])
    with pytest.raises(InvalidParameterError, match="'device'"):
        finetune(glob, ds, net, start="global", device="tpu")


def test_the_gpu_speed_script_runs_on_the_cpu(tmp_path):
    """``benchmarks/gpu_speed.py`` measures every device present: here at least the CPU row."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_speed.py"
    spec = importlib.util.spec_from_file_location("gpu_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "speed"
    argv = ["--ms", "20", "--clients-per-round", "5", "--rounds", "2", "--out", str(out)]
    assert module.main(argv) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    devices = [row["device"] for row in doc["rows"]]
    assert devices[0] == "cpu" and ("cuda" in devices) == torch.cuda.is_available()
    row = doc["rows"][0]
    assert row["rounds_clients_per_second"] > 0 and row["end_clients_per_second"] > 0
    assert row["peak_memory_mb"] > 0 and row["m"] == 20
    assert "| cpu | logreg | 20 |" in out.with_suffix(".md").read_text()


def test_one_thread_per_worker_sets_one_thread_and_restores() -> None:
    from privmtl._device import one_thread_per_worker

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread_per_worker():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), one_thread_per_worker():
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2  # restored on errors too
    finally:
        torch.set_num_threads(old)


def test_the_end_of_run_trains_with_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated import MultinomialLogReg
    from privmtl.federated.end_of_run import finish as finish_module
    from privmtl.federated.end_of_run.local import train_local

    seen: list[int] = []
    real = finish_module._finish_block

    def spy(*args: object, **kw: object) -> object:
        seen.append(torch.get_num_threads())
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(finish_module, "_finish_block", spy)
    ds = make_synthetic_federated(n_clients=6, samples_per_client=8, random_state=0)
    model = MultinomialLogReg(ds.n_features, ds.n_classes)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        params = {
            n: p.detach().unsqueeze(0).repeat(6, *[1] * p.ndim) for n, p in model.named_parameters()
        }
        finish_module.finish_clients(
            "vanilla", ds, model, params, dict(model.named_parameters()), batch_size=4, seed=0,
            lr=0.1, lam=0.0,
        )  # fmt: skip
        assert seen == [1] and torch.get_num_threads() == 2
        train_local(ds, model, epochs=(1,), lrs=(0.1,))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


# ------------------------------------------------------------------------------ on a GPU
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a machine with a GPU)")


@CUDA
@pytest.mark.parametrize(
    "extra",
    [
        {"finetune": "none"},
        {"finetune": "auto"},
        {"finetune": "auto", "local_solver": "ridge"},
        {"method": "local-all", "finetune": "none"},
        {"finetune": "ewc"},
    ],
    ids=["none", "auto", "auto-ridge", "local-all", "ewc"],
)
def test_a_cuda_run_matches_the_cpu_run_up_to_rounding(extra):
    """On a GPU the run computes there and ends where the CPU run ends, up to the order of the
    floating-point operations: the same privacy statement, and test accuracy within a few
    examples of the CPU's (a seeded run; only rounding differs)."""
    kw = {**KW, "num_clients": 12, "rounds": 4, **extra}
    on_gpu = run_pmtl(**kw, device="cuda")
    on_cpu = run_pmtl(**kw, device="cpu")
    assert on_gpu["device"].startswith("cuda") and on_cpu["device"] == "cpu"
    for key in ("epsilon", "delta", "noise_multiplier", "relation", "sampling", "accountant"):
        if key in on_cpu:
            assert on_gpu[key] == on_cpu[key], key
    assert abs(on_gpu["test_accuracy"] - on_cpu["test_accuracy"]) <= 0.05


@CUDA
def test_cli_auto_uses_cuda_where_present(capsys):
    assert main(RUN) == 0
    assert json.loads(capsys.readouterr().out)["device"].startswith("cuda")
