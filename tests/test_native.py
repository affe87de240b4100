"""The C kernels (musegen/model/native.py): built here, the same bits as their PyTorch versions."""

import shutil

import pytest
import torch

from musegen.model import native, transformer
from musegen.model.transformer import _HASH_BLOCK, Dropout

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def eager(monkeypatch):
    """Within this context, as on a machine where no kernel builds."""
    monkeypatch.setattr(transformer.native, "library", lambda name: None)


@needs_compiler
def test_the_dropout_kernel_builds_and_loads_with_the_systems_compiler():
    assert native.library("dropout") is not None


def test_without_a_compiler_there_is_no_kernel_and_nothing_is_left_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    assert native.library.__wrapped__("dropout") is None
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_a_compiler_that_fails_leaves_no_half_built_library(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # exits 1 whatever it is asked
    assert native.library.__wrapped__("dropout") is None
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_musegen_native_0_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv("MUSEGEN_NATIVE", "0")
    assert native.library.__wrapped__("dropout") is None


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# a partial last word and block; past the eager path's first hash block
@pytest.mark.parametrize("n", [1, 7, 4097, 4 * _HASH_BLOCK + 5])
def test_the_dropout_kernel_gives_the_eager_bits_forward_and_backward(monkeypatch, dtype, n):
    x = torch.randn(n, dtype=dtype)
    special = torch.tensor([float("nan"), float("inf"), -0.0])[:n]  # through the product as in torch
    x[:len(special)] = special
    x.requires_grad_(True)
    grad = torch.randn(n, dtype=dtype)
    dropout = Dropout(0.3)

    def run():
        torch.manual_seed(11)
        y = dropout(x)
        (dx,) = torch.autograd.grad(y, x, grad)
        return y, dx

    native_y, native_dx = run()
    with monkeypatch.context() as patch:
        eager(patch)
        eager_y, eager_dx = run()
    torch.testing.assert_close(native_y, eager_y, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(native_dx, eager_dx)
    kept = (native_y != 0)[3:].float().mean().item()
    assert n < 4000 or abs(kept - 0.7) < 0.02


@needs_compiler
def test_the_kernels_dropout_saves_nothing_for_its_backward():
    x = torch.randn(64, 1024, requires_grad=True)
    y = Dropout(0.1)(x)
    assert type(y.grad_fn).__name__ == "_NativeDropoutBackward"
    assert not y.grad_fn.saved_tensors


@needs_compiler
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # torch's own, on compiling
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_compile_runs_the_cpu_dropout_as_it_is(dtype):
    """Inside a compiled function the dropout (a ctypes call) runs between graphs: the same bits
    as eager for the same seed, forward and backward."""
    dropout = Dropout(0.3)
    x = torch.randn(4, 300, dtype=dtype, requires_grad=True)

    def block(x):
        return dropout(x * 2) + 1

    results = []
    for run in (block, torch.compile(block)):
        torch.manual_seed(3)
        y = run(x)
        results.append((y, torch.autograd.grad(y.sum(), x)[0]))
    (eager_y, eager_dx), (compiled_y, compiled_dx) = results
    assert torch.equal(compiled_y, eager_y) and torch.equal(compiled_dx, eager_dx)
    assert (eager_y == 1).float().mean() > 0.2  # it did drop
