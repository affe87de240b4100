"""The C kernels (musegen/model/native.py): built here, the same bits as their PyTorch versions."""

import ctypes
import shutil

import pytest
import torch
from tiny_models import onsets

from musegen.device import cpu_flags
from musegen.model import c_step, dropout, native, torch_step
from musegen.model.config import preset
from musegen.model.dropout import _HASH_BLOCK, Dropout
from musegen.model.transformer import BF16, STEP_C, MusicPerformer

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def eager(monkeypatch):
    """Within this context, as on a machine where no kernel builds."""
    monkeypatch.setattr(dropout.native, "library", lambda name: None)


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
    x[: len(special)] = special
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


# --- step.c: the bf16 single-token step ---------------------------------------------------------
NATIVE_STEP = c_step.step_kernels(torch.device("cpu"))


@pytest.fixture(params=["native", "portable"])
def step_kernel(request, monkeypatch):
    """step.c built for this CPU (where it has AVX512-BF16), and its portable build, which runs
    on any CPU (its bf16 products emulated in plain C); the bf16 step runs the one given."""
    library = NATIVE_STEP if request.param == "native" else c_step.step_library(portable=True)
    if library is None:
        pytest.skip(
            "step.c's native build needs AVX512-BF16 and a C compiler"
            if request.param == "native"
            else "needs a C compiler"
        )
    monkeypatch.setattr(c_step, "step_kernels", lambda device: library)
    return library


@pytest.mark.skipif(
    shutil.which("cc") is None or "avx512_bf16" not in cpu_flags(),
    reason="needs a C compiler and a CPU with AVX512-BF16",
)
def test_the_step_kernel_builds_where_the_cpu_computes_bf16():
    assert NATIVE_STEP is not None and NATIVE_STEP.step_interface(b"NATIVE_BF16") == 1


@needs_compiler
def test_without_avx512_bf16_step_c_builds_portable_and_the_step_stays_in_pytorch(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "FLAG_SETS", (["-O3"],))  # the baseline instruction set of the compiler's target
    monkeypatch.setattr(native, "library", native.library.__wrapped__)  # built anew, with these flags
    assert c_step.step_library().step_interface(b"NATIVE_BF16") == 0
    assert c_step.step_kernels(torch.device("cpu")) is None  # emulated bf16 is no faster than PyTorch


@needs_compiler
def test_the_interface_python_assumes_is_checked_when_step_c_loads(monkeypatch):
    library = c_step.step_library(portable=True)
    assert len(c_step.interface()) > 30
    assert all(library.step_interface(name.encode()) == value for name, value in c_step.interface().items())
    assert library.step_interface(b"no such name") == -1
    built = c_step.header()
    monkeypatch.setattr(c_step, "header", lambda: built)  # the library as built, Python's side changed:
    monkeypatch.setattr(c_step, "TILE", (8, 16))
    with pytest.raises(RuntimeError, match="disagree on their interface: COLUMNS: C 32, Python 16"):
        c_step.step_library(portable=True)
    monkeypatch.setattr(c_step, "TILE", (8, 32))

    class NormWithoutEps(ctypes.Structure):  # a struct whose ctypes side lost a field
        _fields_ = [("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p)]

    monkeypatch.setitem(c_step.CTYPES, "norm", NormWithoutEps)
    with pytest.raises(RuntimeError, match="sizeof norm: C 24, Python 16"):
        c_step.step_library(portable=True)


@needs_compiler
def test_step_c_is_built_from_the_interface_python_declares(monkeypatch):
    """A declaration changed in c_step.py is what the library is built with: one place to change."""
    monkeypatch.setattr(c_step, "TILE", (8, 16))
    library = c_step.step_library(portable=True)
    assert library.step_interface(b"COLUMNS") == 16
    assert library.step_interface(b"FEATURE_ELU") == 2 and library.step_interface(b"ACTIVATION_GELU") == 1


@pytest.mark.skipif(NATIVE_STEP is None, reason="compares with the native build: needs AVX512-BF16")
@pytest.mark.parametrize(
    "variant",
    [dict(pe="sine", gated=True), dict(pe="conv", attention="relu", norm="pre", activation="gelu")],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
def test_the_portable_build_computes_the_native_builds_bits(monkeypatch, variant):
    """The emulated bf16 dot product adds each pair's products in VDPBF16PS's order, and the
    other operations follow their instructions: whole steps give the same logits, bit for bit."""
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", dropout=0.0, **variant)).eval()
    tokens = torch.randint(0, 333, (3, 20), generator=torch.Generator().manual_seed(1))

    def logits(library):
        monkeypatch.setattr(c_step, "step_kernels", lambda device: library)
        session = model.session(3, STEP_C, seed=5)
        return torch.stack([session.step(tokens[:, t]) for t in range(tokens.shape[1])], dim=1)

    assert torch.equal(logits(NATIVE_STEP), logits(c_step.step_library(portable=True)))


@pytest.mark.parametrize("batch", [1, 2, 3, 8])  # one sequence, a pair, a pair and one, four pairs
@pytest.mark.parametrize("n_out, n_in", [(13, 40), (1544, 512), (512, 2048), (7, 5)])
def test_linear_bf16_is_the_bf16_product_summed_in_fp32(step_kernel, batch, n_out, n_in):
    """Weights and inputs rounded to bf16, products summed in fp32 (to fp32 rounding, against a
    float64 sum), the fp32 bias and residual added; odd sizes are padded, not read past."""
    generator = torch.Generator().manual_seed(n_out + n_in + batch)
    weight, bias = torch.randn(n_out, n_in, generator=generator), torch.randn(n_out, generator=generator)
    x, residual = torch.randn(batch, n_in, generator=generator) * 3, torch.randn(batch, n_out, generator=generator)
    linear = torch_step.Linear(weight, bias, torch.bfloat16, kernels=step_kernel)
    rounded_x, rounded_w = x.bfloat16().double(), weight.bfloat16().double()
    expected = rounded_x @ rounded_w.T + bias.double()
    scale = (rounded_x.abs() @ rounded_w.abs().T).max()
    added = torch.empty(batch, n_out)  # the residual, as layer_step adds it while it writes
    assert (
        step_kernel.linear_bf16(
            linear.weight.data_ptr(),
            linear.bias.data_ptr(),
            x.data_ptr(),
            residual.data_ptr(),
            added.data_ptr(),
            batch,
            n_out,
            n_in,
        )
        == 0
    )
    for y, want in ((linear(x), expected), (added, expected + residual.double())):
        assert y.dtype == torch.float32 and y.shape == (batch, n_out)
        assert (y.double() - want).abs().max() <= 1e-6 * scale


def attention_inputs(model, batch: int, magnitude: float, seed: int = 0):
    """A session's step with random projections (values followed by their constant 1), SPE codes
    of position 9 (at random onsets, one per sequence, when the positions are beats) and a random
    positive state (a window's ring buffers random too), as a layer's attention sees them."""
    generator = torch.Generator().manual_seed(seed)
    noise, weights = model.draw_noise(generator), torch_step.PreparedWeights(model)
    step = torch_step.RecurrentStep(model, batch, noise, torch.bfloat16, weights)
    H, D = step.H, step.D
    projected = torch.randn(batch, 2 * H * D + H * (D + 1), generator=generator) * magnitude
    projected[:, 2 * H * D :].view(batch, H, D + 1)[..., D] = 1
    for state in step.sums + [t for ring in step.rings for t in ring]:
        state.copy_(torch.rand(state.shape, generator=generator) * 3)
    beats = torch.rand(batch, generator=generator, dtype=torch.float64) * 40
    return step, projected, step._codes(9, beats if model.config.positions == "beats" else None)


@pytest.mark.parametrize(
    "variant",
    [
        dict(pe="sine", gated=True),
        dict(pe="sine", gated=False),
        dict(pe="conv", gated=True),
        dict(pe="none"),
        dict(pe="sine", attention="elu"),
        dict(pe="conv", attention="relu"),
        dict(pe="sine", gated=True, positions="beats"),
        dict(pe="sine", gated=True, window=4),  # the 10th token: the ring is full, a key leaves it
        dict(pe="sine", gated=False, window=16, positions="beats"),  # the ring is still filling
        dict(pe="none", window=4),
    ],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
@pytest.mark.parametrize("batch", [1, 5])  # one row, and a group of four plus one (step.c's matmul)
@pytest.mark.parametrize("magnitude", [1.0, 30.0])  # exponents far into exp's under- and overflow
def test_the_attention_kernel_computes_the_pytorch_attention(step_kernel, variant, batch, magnitude):
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", **variant)).eval()
    step, projected, codes = attention_inputs(model, batch, magnitude)
    states = [[sums, *ring] for sums, ring in zip(step.sums, step.rings or [()] * len(step.sums))]
    before = [[t.clone() for t in layer] for layer in states]
    out = torch.empty(batch, step.H * step.D)
    status = step_kernel.linear_attention_step(
        ctypes.addressof(step.c_layers.layers[1]),
        ctypes.addressof(step.c_layers.shape),
        projected.data_ptr(),
        None if codes is None else codes.data_ptr(),
        9,
        out.data_ptr(),
    )
    assert status == 0
    kernel_states = [t.clone() for t in states[1]]
    for t, kept in zip(states[1], before[1]):
        t.copy_(kept)
    expected = step._attend(1, projected, codes, 9)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5 * expected.abs().max().item())
    for kernel_state, state in zip(kernel_states, states[1]):  # the sums, and a window's keys and values
        torch.testing.assert_close(kernel_state, state, rtol=2e-5, atol=2e-5 * state.abs().max().item())
    for i, (layer, kept) in enumerate(zip(states, before)):
        assert i == 1 or all(torch.equal(a, b) for a, b in zip(layer, kept))  # other layers untouched


@pytest.mark.parametrize(
    "variant",
    [
        dict(pe="ape"),
        dict(pe="sine", gated=True),
        dict(pe="conv", gated=False),
        dict(pe="sine", activation="gelu"),
        dict(pe="none", norm="pre"),
        dict(pe="conv", attention="relu", norm="pre", activation="gelu"),
        dict(pe="sine", attention="elu"),
        dict(pe="sine", gated=True, window=4, positions="beats"),
        dict(pe="ape", window=16, positions="beats"),
    ],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
@pytest.mark.parametrize("batch", [1, 3])
def test_kernel_steps_follow_the_pytorch_steps(step_kernel, monkeypatch, variant, batch):
    """Whole bf16 steps (norms, products, activation, attention, residuals, pre- and post-norm)
    through step.c and through PyTorch: the same logits to well within bf16's tolerance (the
    kernel keeps its products' outputs in fp32, PyTorch rounds them to bf16)."""
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", dropout=0.0, **variant)).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    tokens = torch.randint(0, 333, (batch, 40), generator=torch.Generator().manual_seed(1))
    beats = onsets(tokens) if model.config.positions == "beats" else None

    def logits(path):
        session = model.session(batch, path, seed=5)
        at = [None if beats is None else beats[:, t] for t in range(tokens.shape[1])]
        return torch.stack([session.step(tokens[:, t], at[t]) for t in range(tokens.shape[1])], dim=1)

    kernel, pytorch = logits(STEP_C), logits(BF16)
    assert (kernel - pytorch).abs().max() <= 2e-3 * pytorch.abs().max()
