"""Numerical safety of the linear attention: bounded features, finite attention and recurrent
state over 16k tokens, extreme inputs (long silences, dense chords, huge activations), bf16
autocast on CPU and fp16 autocast on CUDA (skipped without a GPU)."""

from __future__ import annotations

import math
import tempfile

import miditoolkit
import numpy as np
import pytest
import torch

from musegen.model.attention import causal_linear_attention, chunked_kernel
from musegen.model.config import preset
from musegen.model.features import Favor
from musegen.model.transformer import FP32, STEP_C, MusicPerformer
from musegen.tokenizers import tokenizer_from_dict

LONG = 16384
SCALES = (1e-6, 1.0, 1e3, 1e6)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def key_feature_bound(fm: Favor) -> float:
    """max over x of w.x' - |x'|^2/2 is |w|^2/2, so every key feature is at most
    exp(max_j |w_j|^2 / 2) / sqrt(M), whatever the input: no overflow is possible."""
    return math.exp(float((fm.projection**2).sum(0).max()) / 2) / math.sqrt(fm.n_features)


@pytest.mark.parametrize("scale", SCALES)
def test_performer_features_are_bounded_for_any_input(scale):
    torch.manual_seed(0)
    fm = Favor(16, 32)
    x = torch.randn(4, 2, 512, 16, dtype=torch.float64) * scale
    x[0, 0, :8] = 0.0  # and exact zeros
    keys, queries = fm(x.float(), is_query=False), fm(x.float(), is_query=True)
    assert torch.isfinite(keys).all() and torch.isfinite(queries).all()
    assert (keys >= 0).all() and keys.max() <= key_feature_bound(fm) * (1 + 1e-5)
    assert queries.max() <= 1 + 1e-6  # the row max is subtracted before exp
    assert (queries.amax(-1) > 0).all()  # ... and so every query keeps at least one live feature
    # the bound is tight: the maximising input x' = w reaches it
    w = fm.projection[:, fm.projection.pow(2).sum(0).argmax()]
    best = fm((w / math.sqrt(fm.temperature))[None], is_query=False).max()
    assert float(best) == pytest.approx(key_feature_bound(fm), rel=1e-4)


@pytest.mark.parametrize("scale", SCALES)
def test_attention_over_16k_positions_is_finite_and_a_convex_mix_of_values(scale):
    torch.manual_seed(1)
    fm = Favor(16, 32)
    q, k = (torch.randn(1, 2, LONG, 16) * scale for _ in range(2))
    v = torch.randn(1, 2, LONG, 8)
    y, (S, z) = causal_linear_attention(fm(q, True), fm(k, False), v)
    assert torch.isfinite(y).all() and torch.isfinite(S).all() and torch.isfinite(z).all()
    # where the denominator is well above the guard eps, y is an average of earlier values
    num, den, _ = chunked_kernel(fm(q, True), fm(k, False), v)
    live = den > 1e-3
    running_max = v.abs().amax(-1).cummax(dim=2).values
    assert (y.abs().amax(-1)[live] <= running_max[live] * (1 + 1e-4)).all()


def test_bf16_denominators_do_not_overflow_at_16k_worst_case_keys():
    """Every key at the feature bound, every query feature at 1: the largest denominator any
    input can produce at 16k positions stays far inside bf16's range (~3.4e38), but not fp16's."""
    torch.manual_seed(2)
    fm = Favor(16, 32)
    bound = key_feature_bound(fm)
    q = torch.ones(1, 1, LONG, 32)
    k = torch.full((1, 1, LONG, 32), bound)
    v = torch.randn(1, 1, LONG, 8)
    expected = 32 * bound * LONG  # the exact worst-case denominator at the last position
    assert torch.finfo(torch.float16).max < expected < torch.finfo(torch.bfloat16).max / 1e20
    _, den32, _ = chunked_kernel(q, k, v)
    assert float(den32[0, 0, -1]) == pytest.approx(expected, rel=1e-4)
    num, den, (S, z) = chunked_kernel(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert torch.isfinite(den).all() and torch.isfinite(num).all() and torch.isfinite(z).all()
    # No overflow, but bf16 prefix sums stagnate once the running sum dwarfs each chunk's share
    # (8 mantissa bits): the reason the model keeps the attention core in fp32 under autocast.
    print(f"\nbf16 worst-case denominator at {LONG}: {float(den[0, 0, -1]):.3g} (exact {expected:.3g})")


def tiny(vocab: int, seed: int = 0, qkv_gain: float = 1.0) -> MusicPerformer:
    torch.manual_seed(seed)
    model = MusicPerformer(preset("tiny", vocab_size=vocab, dropout=0.0)).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.qkv.weight.mul_(qkv_gain)  # gain > 1: activations far beyond a trained model's
    return model


def check_states(session, previous_z: list | None) -> list:
    """Every layer's recurrent state is finite; z (a sum of positive features) never shrinks."""
    zs = []
    for i, (S, z) in enumerate(session.get_state().layers):
        assert torch.isfinite(S).all() and torch.isfinite(z).all(), f"layer {i}"
        assert (z >= 0).all()
        if previous_z is not None:
            assert (z >= previous_z[i] * (1 - 1e-5)).all()
        zs.append(z.clone())
    return zs


def stream(model: MusicPerformer, ids: np.ndarray, path: str = FP32, chunk: int = 2048, steps: int = 64) -> None:
    """Ingest all but the last `steps` ids in parallel chunks, then one recurrent step at a time,
    checking the logits and the state after each call."""
    ids_t = torch.as_tensor(ids, dtype=torch.long)[None]
    zs = None
    with torch.inference_mode():
        session = model.session(1, path, seed=0)
        head = len(ids) - steps
        for t0 in range(0, head, chunk):
            logits = session.step(ids_t[:, t0 : min(t0 + chunk, head)])
            assert torch.isfinite(logits).all(), f"chunk at {t0}"
            zs = check_states(session, zs)
        for t in range(head, len(ids)):
            assert torch.isfinite(session.step(ids_t[:, t])).all(), f"step {t}"
            zs = check_states(session, zs)
        assert session.position == len(ids)


def remi_extremes() -> dict[str, np.ndarray]:
    tok = tokenizer_from_dict({"kind": "remi"})
    ids = {name: i for i, name in enumerate(tok.vocab)}
    chord = [ids["Beat_0"]] + [
        ids[n] for p in range(22, 108) for n in (f"Note_Pitch_{p}", "Note_Velocity_86", "Note_Duration_1920")
    ]
    return {
        "silence: 16k empty bars": np.full(LONG, ids["Bar_None"]),
        "dense chords: every pitch at once, bar after bar": np.resize([ids["Bar_None"]] + chord, LONG),
    }


def groove_extremes() -> np.ndarray:
    """A real encoding: a trio bar, 3,000 bars of silence, then 3-track chords of 40 notes."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    tracks = [miditoolkit.Instrument(33), miditoolkit.Instrument(0, is_drum=True), miditoolkit.Instrument(0)]
    for i, inst in enumerate(tracks):
        inst.notes.append(miditoolkit.Note(90, 40 + i, 0, 240))
    start = 3000 * 4 * 480
    for bar in range(20):
        t = start + bar * 1920
        for i, inst in enumerate(tracks):
            inst.notes += [miditoolkit.Note(100, p, t, t + 960) for p in range(30 + i, 110, 2)]
    midi.instruments += tracks
    with tempfile.NamedTemporaryFile(suffix=".mid") as f:
        midi.dump(f.name)
        return tokenizer_from_dict({"kind": "groove"}).encode(f.name).ids


@pytest.mark.parametrize("gain", [1.0, 30.0])
@pytest.mark.parametrize("path", [FP32, STEP_C])  # STEP_C: PyTorch's bf16 step where step.c does not run
def test_recurrent_state_stays_finite_over_16k_silent_and_dense_tokens(gain, path):
    for name, ids in remi_extremes().items():
        stream(tiny(333, qkv_gain=gain), ids, path)


def test_groove_silence_and_dense_chords_stay_finite():
    ids = groove_extremes()
    assert len(ids) > 6000  # the silence is really there
    stream(tiny(795, qkv_gain=30.0), ids)


def test_parallel_forward_at_16k_is_finite_and_bf16_autocast_stays_close():
    model = tiny(333, qkv_gain=10.0)
    ids = torch.as_tensor(remi_extremes()["dense chords: every pitch at once, bar after bar"])[None]
    with torch.no_grad():
        torch.manual_seed(5)
        full = model(ids)
        torch.manual_seed(5)  # the same SPE and gate noise
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(ids)
    assert torch.isfinite(full).all() and torch.isfinite(half).all()
    p, q = full.float().softmax(-1), half.float().softmax(-1)
    assert (p - q).abs().sum(-1).max() < 0.1  # total variation of the next-token distributions


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
)
def test_fp16_autocast_at_16k_is_finite(device):
    """fp16's range ends at 65,504: the linear attention's running sums passed it at position
    6,592 of this silence (NaN from there on, first seen on an H200) until its products were
    kept in fp32 under fp16 autocast."""
    model = tiny(333, qkv_gain=10.0).to(device)
    ids = torch.as_tensor(remi_extremes()["silence: 16k empty bars"], device=device)[None]
    with torch.no_grad():
        torch.manual_seed(5)
        full = model(ids)
        torch.manual_seed(5)
        with torch.autocast(device, dtype=torch.float16):
            half = model(ids)
    assert torch.isfinite(half).all()
    assert (full.softmax(-1) - half.float().softmax(-1)).abs().sum(-1).max() < 0.1


@pytest.mark.slow
def test_16k_single_token_recurrent_steps():
    """The sampler's own mode for the whole length: 16,384 one-token steps."""
    stream(tiny(333, qkv_gain=30.0), remi_extremes()["dense chords: every pitch at once, bar after bar"], steps=LONG)
