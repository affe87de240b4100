"""precision "auto" follows timings, not CPU flags: with the timings of two kinds of machine faked,
it picks the faster path for training and for the step; the choice is cached per machine and
shape, forced or re-timed by MUSEGEN_PRECISION, and reaches the trainer and the sampler's JSON."""

import json

import pytest
import torch

from musegen import precision
from musegen.device import cpu_name
from musegen.errors import ConfigError
from musegen.generation.precision import step_choice
from musegen.model import c_step
from musegen.model.config import preset
from musegen.model.torch_step import PreparedWeights
from musegen.model.transformer import STEP_C, MusicPerformer
from musegen.training import precision as train_precision

CPU = torch.device("cpu")
# Median seconds per candidate, as measured. "intel": the Xeon (family 6 model 207,
# AVX512-BF16 listed, no AMX), small preset at 4 x 512 (6,706 and 4,695 tokens/s) and the
# paper-pop step (PyTorch's bf16 step was not measured there: put between the two). "zen4": this
# repository's machine (AMD EPYC family 25 model 17), docs/performance.md.
KINDS = {
    "intel": {
        "train": {"fp32": 2048 / 6706, "bf16": 2048 / 4695},
        1: {"fp32": 15.5e-3, "bf16": 12.0e-3, "bf16-step.c": 8.1e-3},
        8: {"fp32": 30.4e-3, "bf16": 40.0e-3, "bf16-step.c": 36.6e-3},
    },
    "zen4": {
        "train": {"fp32": 0.560, "bf16": 0.208},
        1: {"fp32": 20.46e-3, "bf16": 9.74e-3, "bf16-step.c": 5.55e-3},
        8: {"fp32": 38.11e-3, "bf16": 16.16e-3, "bf16-step.c": 10.62e-3},
    },
}


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A CPU with bf16 arithmetic listed and a step kernel, a fresh cache, and `measure` faked:
    set `timings` to the candidates' seconds; `offered` records the candidates asked for."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(precision.ENV, raising=False)
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    fake = type("Machine", (), {"timings": {}, "offered": []})()

    def measure(candidates, rounds, budget):
        fake.offered.append(sorted(candidates))
        return {name: fake.timings[name] for name in candidates}

    monkeypatch.setattr(precision, "measure", measure)
    return fake


def tiny():
    torch.manual_seed(0)
    return MusicPerformer(preset("tiny", dropout=0.0)).eval()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch, length", [(4, 512), (8, 512), (4, 2048), (8, 2048)])
def test_training_auto_is_the_faster_fixed_precision(machine, kind, batch, length):
    machine.timings = KINDS[kind]["train"]
    config = preset("tiny")
    choice = train_precision.training_choice("auto", config, batch, length, CPU, quiet=True)
    assert machine.offered == [["bf16", "fp32"]]
    assert choice.seconds[choice.path] <= 1.05 * min(machine.timings.values())
    assert choice.path == {"intel": "fp32", "zen4": "bf16"}[kind]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [1, 8])
def test_the_step_auto_is_the_fastest_path_and_the_session_runs_it(machine, monkeypatch, kind, batch):
    library = c_step.step_kernels(CPU) or c_step.step_library(portable=True)  # any CPU: its portable build
    if library is None:
        pytest.skip("step.c does not build here (no C compiler)")
    monkeypatch.setattr(c_step, "step_kernels", lambda device: library)
    machine.timings = KINDS[kind][batch]
    model = tiny()
    choice = step_choice("auto", model, batch)
    session = model.session(batch, choice.path, seed=1)
    session.step(torch.zeros(batch, dtype=torch.long))
    fast = session.fast
    assert machine.offered == [["bf16", "bf16-step.c", "fp32"]]
    assert choice.seconds[choice.path] <= 1.05 * min(machine.timings.values())
    assert choice.path == {("intel", 1): "bf16-step.c", ("intel", 8): "fp32"}.get((kind, batch), "bf16-step.c")
    assert fast.dtype == (torch.float32 if choice.path == "fp32" else torch.bfloat16)
    assert (fast.kernels is not None) == (choice.path == STEP_C)


def test_a_choice_is_timed_once_then_cached_forced_or_timed_again(machine, monkeypatch, tmp_path, capsys):
    machine.timings = KINDS["intel"]["train"]
    config = preset("tiny")
    first = train_precision.training_choice("auto", config, 4, 512, CPU)
    assert first.reason == "timed now" and "precision auto: fp32" in capsys.readouterr().err
    cached = train_precision.training_choice("auto", config, 4, 512, CPU)
    assert cached.path == "fp32" and "cached" in cached.reason and len(machine.offered) == 1
    stored = json.loads(precision.cache_file().read_text())
    assert precision.cache_file().parent == tmp_path / "musegen"
    ((key, entry),) = stored.items()
    assert cpu_name() in key and "batch 4 x 512" in key and entry["path"] == "fp32"
    train_precision.training_choice("auto", config, 8, 512, CPU)  # another shape: timed again
    assert len(machine.offered) == 2

    monkeypatch.setenv(precision.ENV, "bf16")
    forced = train_precision.training_choice("auto", config, 4, 512, CPU)
    assert forced.path == "bf16" and forced.reason == "MUSEGEN_PRECISION=bf16" and len(machine.offered) == 2
    assert train_precision.training_choice("fp32", config, 4, 512, CPU).path == "fp32"  # asked for beats the variable
    machine.timings = KINDS["zen4"]["train"]  # a new CPU under the same cache entry: re-timed on request
    monkeypatch.setenv(precision.ENV, "measure")
    assert train_precision.training_choice("auto", config, 4, 512, CPU).path == "bf16" and len(machine.offered) == 3
    monkeypatch.delenv(precision.ENV)
    assert train_precision.training_choice("auto", config, 4, 512, CPU).path == "bf16"  # the new timing was kept


def test_a_bad_variable_or_precision_is_a_config_error_and_a_broken_cache_is_timed_again(machine, monkeypatch):
    machine.timings = KINDS["zen4"]["train"]
    monkeypatch.setenv(precision.ENV, "fast")
    with pytest.raises(ConfigError, match="MUSEGEN_PRECISION must be one of fp32, bf16, measure"):
        train_precision.training_choice("auto", preset("tiny"), 4, 512, CPU)
    monkeypatch.delenv(precision.ENV)
    with pytest.raises(ConfigError, match="precision must be one of"):
        train_precision.training_choice("fp8", preset("tiny"), 4, 512, CPU)
    precision.cache_file().parent.mkdir(parents=True)
    precision.cache_file().write_text("{not json")
    assert train_precision.training_choice("auto", preset("tiny"), 4, 512, CPU).path == "bf16"
    assert json.loads(precision.cache_file().read_text())  # rewritten whole


def test_without_bf16_arithmetic_nothing_is_timed(machine, monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    choice = train_precision.training_choice("auto", preset("tiny"), 4, 512, CPU)
    assert choice.path == "fp32" and "no bf16" in choice.reason and machine.offered == []


def test_real_timings_leave_the_run_as_it_was(monkeypatch, tmp_path):
    """Timed for real (tiny model): every candidate gets a time, the global random state and the
    model's weights are untouched, and nothing is left on the model (the candidates' prepared
    weights were their own); the caller's prepared weights serve its sessions until a weight changes."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(precision.ENV, raising=False)
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    choice = train_precision.training_choice("auto", preset("tiny"), 2, 32, CPU, quiet=True)
    assert set(choice.seconds) == {"fp32", "bf16"} and all(s > 0 for s in choice.seconds.values())
    assert torch.equal(torch.get_rng_state(), before)
    model = tiny()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = dict(vars(model))
    torch.manual_seed(5)
    step = step_choice("auto", model, 2, quiet=True)
    assert torch.equal(torch.get_rng_state(), before)
    assert {"fp32", "bf16"} <= set(step.seconds) and step.path in step.seconds
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert vars(model) == attributes
    assert step_choice("auto", model, 2).path == step.path  # cached: nothing timed
    prepared = PreparedWeights(model)
    first, second = (model.session(2, step.path, weights=prepared) for _ in range(2))
    assert first.fast.weights is second.fast.weights
    with torch.no_grad():
        model.head.bias.add_(1.0)
    assert model.session(2, step.path, weights=prepared).fast.weights is not first.fast.weights
