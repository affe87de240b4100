"""Speed paths keep the maths: the single-token RNN update and the hand-derived backward of the
chunked kernel at its default chunk size, and the sampler's thread setting."""

import numpy as np
import pytest
import torch

from musegen.errors import ConfigError
from musegen.generation.loop import generate
from musegen.generation.prompt import Prompt
from musegen.generation.resources import DEFAULT_CPU_THREADS
from musegen.generation.settings import SampleSettings
from musegen.model.attention import CHUNK, chunked_kernel
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.tokenizers import tokenizer_from_dict


def paper_like(T, seed=0, dtype=torch.float32):
    """Positive features of the paper's widths (M = 128, head width 64), 8 heads."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(1, 8, T, 128, generator=g, dtype=dtype)
    k = torch.rand(1, 8, T, 128, generator=g, dtype=dtype)
    v = torch.randn(1, 8, T, 64, generator=g, dtype=dtype)
    return q, k, v


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_rnn_steps_equal_the_parallel_kernel():
    q, k, v = paper_like(3 * CHUNK + 5)
    num, den, (S, z) = chunked_kernel(q, k, v)
    state, nums, dens = None, [], []
    for t in range(q.shape[2]):
        n_t, d_t, state = chunked_kernel(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        nums.append(n_t)
        dens.append(d_t)
    assert rel(torch.cat(nums, 2), num) < 1e-5 and rel(torch.cat(dens, 2), den) < 1e-5
    assert rel(state[0], S) < 1e-5 and rel(state[1], z) < 1e-5
    y_rnn = torch.cat(nums, 2) / (torch.cat(dens, 2)[..., None] + 1e-6)
    assert rel(y_rnn, num / (den[..., None] + 1e-6)) < 1e-5


def test_hand_backward_equals_autograd_of_the_naive_form():
    """Default chunk, a length that needs padding, a starting state, gradients into the new state."""
    T = 2 * CHUNK + 7
    q, k, v = paper_like(T, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    S0, z0 = (
        torch.randn(1, 8, 128, 64, generator=g, dtype=torch.float64),
        torch.rand(1, 8, 128, generator=g, dtype=torch.float64),
    )
    weights = [
        torch.randn(1, 8, T, 64, generator=g, dtype=torch.float64),
        torch.randn(1, 8, T, generator=g, dtype=torch.float64),
        torch.randn(1, 8, 128, 64, generator=g, dtype=torch.float64),
        torch.randn(1, 8, 128, generator=g, dtype=torch.float64),
    ]

    def loss(outputs):
        return sum((o * w).sum() for o, w in zip(outputs, weights))

    def naive(q, k, v, S0, z0):
        scores = (q @ k.transpose(-1, -2)).tril()
        num, den = scores @ v + q @ S0, scores.sum(-1) + (q * z0[:, :, None]).sum(-1)
        return num, den, S0 + k.transpose(-1, -2) @ v, z0 + k.sum(2)

    def grads(fn):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, S0, z0)]
        loss(fn(*leaves)).backward()
        return [x.grad for x in leaves]

    def ours(q, k, v, S0, z0):
        num, den, (S1, z1) = chunked_kernel(q, k, v, (S0, z0))
        return num, den, S1, z1

    for got, want in zip(grads(ours), grads(naive)):
        assert rel(got, want) < 1e-10


def test_sampler_uses_its_thread_setting_and_restores_the_callers():
    tok = tokenizer_from_dict({"kind": "remi"})
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
    seen, open_session = [], model.session

    def recording_session(*args, **kwargs):  # each step notes the threads it ran with
        session = open_session(*args, **kwargs)
        step = session.step
        session.step = lambda *args: (seen.append(torch.get_num_threads()), step(*args))[1]
        return session

    model.session = recording_session
    outside = torch.get_num_threads()
    torch.set_num_threads(3)  # the caller's setting, unlike both the default and the override
    try:
        empty = Prompt(np.zeros(0, dtype=np.int64))
        generate(model, tok, empty, SampleSettings(length=8, seed=0), progress=False)
        assert set(seen) == {DEFAULT_CPU_THREADS} and torch.get_num_threads() == 3
        seen.clear()
        generate(model, tok, empty, SampleSettings(length=8, seed=0), progress=False, threads=2)
        assert set(seen) == {2} and torch.get_num_threads() == 3
        with pytest.raises(ConfigError, match="--threads"):
            generate(model, tok, empty, SampleSettings(length=8, seed=0), progress=False, threads=0)
    finally:
        torch.set_num_threads(outside)
