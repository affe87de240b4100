"""The decoder: recurrent generation equals the parallel pass, presets, devices, autocast."""

import math

import pytest
import torch
from tiny_models import onsets
from torch import nn
from torch.nn import functional as F

from musegen.errors import ConfigError
from musegen.model import c_step
from musegen.model.attention import EPS, fast_transformers_available
from musegen.model.config import preset
from musegen.model.dropout import _HASH_BLOCK, Dropout, random_words
from musegen.model.features import FEATURE_MAPS, FeatureMap
from musegen.model.torch_step import PreparedWeights
from musegen.model.transformer import BF16, FP32, STEP_C, MusicPerformer, StreamState

TRAIN_LEN = 16  # "training length" of the tiny models; streaming runs 3x past it
# bf16 inference (weights and matrix products in bf16, sums and logits in fp32) against the fp32
# parallel pass: the largest logit difference, as a fraction of the largest logit. Measured
# 1.5e-4 to 9e-4 on these models; docs/performance.md gives the paper-size figure.
BF16_LOGIT_TOLERANCE = 5e-3


def tiny(**overrides):
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", dropout=0.0, **overrides)).eval()
    # The default init gives near-constant logits; a wider head makes the comparison meaningful.
    nn.init.normal_(model.head.weight, std=0.5)
    return model


def ids(batch=2, length=3 * TRAIN_LEN, seed=1):
    return torch.randint(0, 333, (batch, length), generator=torch.Generator().manual_seed(seed))


VARIANTS = [
    dict(pe="ape"),
    dict(pe="none"),
    dict(pe="sine", gated=True),
    dict(pe="sine", gated=False),
    dict(pe="conv", gated=True),
    dict(pe="conv", gated=False),
    dict(pe="sine", attention="elu"),
    dict(pe="conv", attention="relu", norm="pre", activation="gelu"),
]


def three_ways(model, tokens, path=FP32, seed=7, beats=None):
    """The logits of `tokens` (at onsets `beats` [B, T] when the positions are beats) in one
    parallel block, token by token, and a 21-token block then token by token, each in a fresh
    session on `path` with the same noise."""
    at = [None if beats is None else beats[:, t] for t in range(tokens.shape[1])]
    parallel = model.session(2, path, seed=seed).step(tokens, beats)
    session = model.session(2, path, seed=seed)
    recurrent = torch.stack([session.step(tokens[:, t], at[t]) for t in range(tokens.shape[1])], dim=1)
    session = model.session(2, path, seed=seed)
    first = session.step(tokens[:, :21], None if beats is None else beats[:, :21])
    rest = [session.step(tokens[:, t], at[t])[:, None] for t in range(21, tokens.shape[1])]
    return parallel, recurrent, torch.cat([first] + rest, dim=1)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_recurrent_steps_equal_parallel_pass(variant):
    parallel, recurrent, mixed = three_ways(tiny(**variant), ids())
    assert parallel.std(dim=1).mean() > 0.1  # logits really vary along the sequence
    assert (recurrent - parallel).abs().max() <= 1e-4
    assert (mixed - parallel).abs().max() <= 1e-4


@pytest.mark.parametrize("window", [0, 4, 16])
@pytest.mark.parametrize("positions", ["tokens", "beats"])
@pytest.mark.parametrize("pe", [dict(pe="sine", gated=True), dict(pe="sine", gated=False), dict(pe="ape")], ids=str)
def test_beats_and_windows_step_as_the_parallel_pass(pe, positions, window):
    """Onsets off any token grid and an exact window (16: wider than the 21-token block, so the
    block's state hands a half-filled ring on) agree in the parallel pass, the step and a mix."""
    model = tiny(**pe, positions=positions, window=window)
    tokens = ids()
    beats = onsets(tokens) if positions == "beats" else None
    parallel, recurrent, mixed = three_ways(model, tokens, beats=beats)
    assert parallel.std(dim=1).mean() > 0.1
    assert (recurrent - parallel).abs().max() <= 1e-4
    assert (mixed - parallel).abs().max() <= 1e-4
    if window:  # the window changes what the model computes
        assert (parallel - three_ways(tiny(**pe, positions=positions), tokens, beats=beats)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("pe", ["sine", "ape"])
def test_beats_at_the_token_indices_are_the_token_positions(pe):
    tokens = ids()
    at_indices = torch.arange(tokens.shape[1], dtype=torch.float64).expand(tokens.shape)
    by_beats = tiny(pe=pe, positions="beats").session(2, seed=3).step(tokens, at_indices)
    by_tokens = tiny(pe=pe).session(2, seed=3).step(tokens)
    assert (by_beats - by_tokens).abs().max() <= 1e-4


@pytest.mark.parametrize("pe", ["sine", "ape"])
def test_positions_per_beat_scales_the_onsets_everywhere(pe):
    """A model of 4 positions a beat reads onsets b as a model of 1 a beat reads 4 b: in the
    parallel pass, the step and a mix (the step.c path takes the codes the step makes)."""
    tokens = ids()
    beats = onsets(tokens)
    scaled = three_ways(tiny(pe=pe, positions="beats", positions_per_beat=4.0), tokens, beats=beats)
    by_hand = three_ways(tiny(pe=pe, positions="beats"), tokens, beats=4 * beats)
    for a, b in zip(scaled, by_hand):
        assert (a - b).abs().max() <= 1e-4
    unscaled = three_ways(tiny(pe=pe, positions="beats"), tokens, beats=beats)[0]
    assert (scaled[0] - unscaled).abs().max() > 1e-3


def test_a_model_of_beats_needs_its_onsets_and_a_model_of_tokens_takes_none():
    tokens = ids()
    with pytest.raises(ValueError, match="onset"):
        tiny(positions="beats").session(2).step(tokens)
    with pytest.raises(ValueError, match="no beats"):
        tiny().session(2).step(tokens[:, 0], onsets(tokens)[:, 0])
    with pytest.raises(ValueError, match="shape"):
        tiny(positions="beats").session(2).step(tokens, onsets(tokens)[:, :5])


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(pe="conv", positions="beats"), "convSPE"),
        (dict(pe="none", positions="beats"), "positions 'beats'"),
        (dict(positions="bars"), "positions must be"),
        (dict(attention="elu", window=4), "window needs attention 'performer'"),
        (dict(positions_per_beat=4.0), "positions_per_beat needs positions 'beats'"),
        (dict(positions="beats", positions_per_beat=0.0), "positions_per_beat"),
    ],
)
def test_positions_and_window_settings_are_checked(settings, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **settings)


@pytest.mark.parametrize("window", [0, 16])
def test_the_step_state_keeps_its_size_over_thousands_of_tokens(window):
    """Single steps past the window (its ring wrapped twice), a parallel block to 8192 tokens,
    single steps again: the step's state and the snapshot's tensors keep their bytes."""
    model = tiny(positions="beats", window=window)
    session = model.session(1, seed=0)
    tokens = ids(1, 8192 + 40)
    beats = onsets(tokens)

    def steps(first, last):
        for t in range(first, last):
            session.step(tokens[:, t], beats[:, t])
        snapshot = sum(t.nbytes for state in session.get_state().layers for t in state)
        return session.state_bytes, snapshot

    early = steps(0, 40)
    session.step(tokens[:, 40:8192], beats[:, 40:8192])
    assert steps(8192, 8232) == early and early[0] > 0


@pytest.fixture
def softplus_features():
    """A feature map declared as one class, as a new one would be in features.py."""

    class Softplus(FeatureMap):
        kind = "softplus"

        def forward(self, x, is_query, constants=None):
            return F.softplus(x)

    yield Softplus
    del FEATURE_MAPS[Softplus.kind]


@pytest.mark.parametrize("pe", ["sine", "none"])
def test_a_feature_map_is_one_class_and_both_forms_run_it(softplus_features, pe):
    """Registered, it is a setting of the config, runs in the parallel pass and in the
    recurrent step (the PyTorch one: it declares no step.c kernel), and they agree."""
    model = tiny(attention="softplus", pe=pe)
    assert isinstance(model.layers[0].attention.features, softplus_features)
    parallel, recurrent, mixed = three_ways(model, ids())
    assert parallel.std(dim=1).mean() > 0.1
    assert (recurrent - parallel).abs().max() <= 1e-4 and (mixed - parallel).abs().max() <= 1e-4
    assert STEP_C not in model.step_paths()
    session = model.session(2, STEP_C, seed=1)  # asked for step.c all the same: PyTorch's bf16 step
    assert session.fast is not None and session.fast.kernels is None
    assert session.step(ids()[:, 0]).isfinite().all()


@pytest.fixture(params=[STEP_C, BF16])
def bf16_step(request):
    """The path of the bf16 single-token step as step.c runs it (where it builds) and as PyTorch runs it."""
    if request.param == STEP_C and c_step.step_kernels(torch.device("cpu")) is None:
        pytest.skip("step.c does not build here (it needs AVX512-BF16 and a C compiler)")
    return request.param


@pytest.mark.parametrize(
    "variant", VARIANTS + [dict(pe="sine", attention="softmax")], ids=lambda v: "-".join(str(x) for x in v.values())
)
def test_bf16_inference_stays_within_its_tolerance_of_the_fp32_parallel_pass(variant, bf16_step):
    model, tokens = tiny(**variant), ids()
    reference, _, _ = three_ways(model, tokens)
    bound = BF16_LOGIT_TOLERANCE * reference.abs().max()
    for logits in three_ways(model, tokens, bf16_step):
        assert logits.dtype == torch.float32
        assert 0 < (logits - reference).abs().max() <= bound  # bf16 really ran, and stayed close


@pytest.mark.parametrize("pe", ["sine", "conv"])
@pytest.mark.parametrize("path", [FP32, BF16])
def test_streaming_noise_is_what_step_uses(pe, path):
    """Steps follow whatever noise the session holds: a seed-7 session given a seed-8 session's
    starting state (its noise) continues exactly as the seed-8 session, token by token and in
    blocks, and not as seed 7 does."""
    model, tokens = tiny(pe=pe), ids()

    def run(session_seed, start=None):
        session = model.session(2, path, seed=session_seed)
        if start is not None:
            session.set_state(start)
        return torch.cat(
            [session.step(tokens[:, :5])] + [session.step(tokens[:, t])[:, None] for t in range(5, tokens.shape[1])],
            dim=1,
        )

    start8 = model.session(2, path, seed=8).get_state()
    a, b, swapped = run(7), run(8), run(7, start8)
    assert (a - b).abs().max() > 1e-2
    assert torch.equal(swapped, b)
    assert torch.equal(run(7), a)  # and a seed always draws the same noise


@pytest.mark.parametrize(
    "variant",
    [
        dict(pe="sine"),
        dict(pe="conv", attention="elu"),
        dict(pe="none", attention="aaren"),
        dict(pe="ape", attention="relative"),
    ],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
def test_a_snapshot_continues_the_same_way_every_time(variant):
    model, tokens = tiny(**variant), ids()
    session = model.session(2, seed=3)
    session.step(tokens[:, :10])
    snapshot = session.get_state()
    first = [session.step(tokens[:, t]) for t in range(10, 20)]
    assert session.position == 20 and snapshot.position == 10
    session.set_state(snapshot)
    assert session.position == 10
    again = [session.step(tokens[:, t]) for t in range(10, 20)]
    with pytest.raises(ValueError, match="batch size"):
        session.set_state(StreamState(3, snapshot.position, snapshot.noise, snapshot.layers))
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    other = model.session(2, seed=99)  # another session takes the snapshot, noise included
    other.set_state(snapshot)
    assert torch.equal(other.step(tokens[:, 10]), first[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: what autocast hands it
def test_cpu_dropout_drops_at_its_rate_and_scales_what_it_keeps(dtype):
    torch.manual_seed(0)
    dropout = Dropout(0.1)
    x = torch.ones(400, 1000, dtype=dtype, requires_grad=True)
    y = dropout(x)
    assert y.dtype == dtype
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 0.003  # 400k draws: 0.1 +- 3 sigma
    scale = torch.tensor(2**16 / (2**16 - round(0.1 * 2**16)), dtype=dtype)
    assert torch.equal(y[kept], scale.expand(int(kept.sum())))
    assert abs(y.float().mean().item() - 1) < 0.005  # unbiased
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the same mask and scale backwards
    torch.manual_seed(0)
    assert torch.equal(dropout(x), y)  # the seed decides the mask
    assert torch.equal(dropout.eval()(x), x)


def splitmix64(counter: int, seed: int) -> int:
    """SplitMix64's output for `counter` from `seed`, in Python's exact integers (the paper's
    algorithm as written: state seed + counter * golden ratio, then the mixing function)."""
    z = (seed + counter * 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_dropout_words_are_splitmix64_across_hash_blocks_and_follow_the_seed():
    torch.manual_seed(7)
    seed = int(torch.empty((), dtype=torch.int64).random_())  # what random_words draws first
    torch.manual_seed(7)
    n = _HASH_BLOCK + 1000  # the second block is a short one
    words = random_words(n)
    for counter in [0, 1, 2, 999, _HASH_BLOCK - 1, _HASH_BLOCK, n - 1]:
        assert int(words[counter]) % 2**64 == splitmix64(counter, seed % 2**64)
    torch.manual_seed(7)
    assert torch.equal(random_words(n), words)
    assert not torch.equal(random_words(n), words)  # the next call draws another seed
    bits = torch.stack([(words >> b) & 1 for b in range(64)]).float().mean(1)
    assert bits.sub(0.5).abs().max() < 0.005  # every bit fair: 263k words, 5 sigma


@pytest.mark.parametrize("ape_input", ["musegen", "reference"])
def test_ape_input_decides_whether_dropout_reaches_the_positions(ape_input):
    """With token embeddings zeroed, the first layer's input is the dropped-out sum: positions
    dropped with the tokens (musegen), or the bare sinusoids (reference: added after dropout)."""
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", pe="ape", ape_input=ape_input, dropout=0.5)).train()
    if ape_input == "reference":
        assert abs(model.embedding.weight.std().item() - 0.01) < 0.002  # the reference's init
    nn.init.zeros_(model.embedding.weight)
    seen = []
    model.layers[0].register_forward_hook(lambda module, args, out: seen.append(args[0].detach()))
    model(ids(length=40))
    positions = model.position_encoding(torch.arange(40)).expand_as(seen[0])
    if ape_input == "reference":
        assert torch.equal(seen[0], positions)
    else:
        dropped = seen[0] == 0
        assert 0.4 < dropped[positions != 0].float().mean().item() < 0.6
        assert torch.allclose(seen[0][~dropped], 2 * positions[~dropped])


@pytest.mark.parametrize("attention", ["performer", "softmax"])
@pytest.mark.parametrize("pe", ["sine", "conv"])
@pytest.mark.parametrize("gated", [True, False])
def test_bf16_training_gradients_follow_fp32(pe, gated, attention):
    """One training update's gradients under bf16 autocast (SPE and attention products in bf16,
    sums in fp32) point where the fp32 ones do, for every parameter, SPE's included."""
    torch.manual_seed(0)
    model = MusicPerformer(
        preset("small", n_layers=2, pe=pe, gated=gated, dropout=0.0, redraw="fixed", attention=attention)
    ).train()
    tokens = ids(batch=4, length=257)

    def gradients(bf16: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        torch.manual_seed(1)  # the same SPE and gate noise both times
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), tokens[:, 1:]).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    exact, fast = gradients(False), gradients(True)
    assert exact.keys() == fast.keys() and any(".spe" in name or "spe." in name for name in exact)
    for name, g in exact.items():
        if g.norm() == 0:
            continue
        cosine = torch.nn.functional.cosine_similarity(g.flatten(), fast[name].flatten(), dim=0)
        assert cosine > 0.99 and 0.9 < fast[name].norm() / g.norm() < 1.1, (name, float(cosine))


def test_a_float64_model_mixes_sine_spe_codes_and_attends_in_float64():
    """The reference formulas in float64 (Liutkus et al.): Qbar_d(t) = s sum_k lambda_dk
    (cos(2 pi f_dk t + theta_dk) Z_d[2k] + sin(...) Z_d[2k+1]), Kbar without theta, gated as
    sqrt(1 - g) Qbar + sqrt(g) eps; qhat = q @ Qbar per position; then causal linear attention
    with relu features. Codes or activations rounded to fp32 anywhere would miss by about 1e-7."""
    model = tiny(pe="sine", gated=True, attention="relu").double()
    noise = model.draw_noise(torch.Generator().manual_seed(3))
    model.draw_noise = lambda: noise  # the forward's fresh draw is this one
    attention, seen = model.layers[0].attention, {}
    attention.spe_filter.register_forward_hook(lambda _, inputs, outputs: seen.update(mix=(inputs, outputs)))
    attention.register_forward_hook(lambda _, inputs, output: seen.update(layer=(inputs[0], output[0])))
    tokens = ids()
    with torch.no_grad():
        model(tokens)
        (q, k, _, eps), (qhat, khat) = seen["mix"]
        spe, T = model.spe, tokens.shape[1]
        angles = 2 * math.pi * (torch.sigmoid(spe.freqs) / 2)[:, :, None] * torch.arange(T).double()[:, None]
        gains, z = F.softplus(spe.gains), noise.spe.double()

        def code(angle):  # [H, D, T, K] -> [H, T, D, R]
            terms = angle.cos()[..., None] * z[:, :, None, 0::2] + angle.sin()[..., None] * z[:, :, None, 1::2]
            return (gains[:, :, None, :, None] * terms).sum(3).transpose(1, 2) * spe.code_scale

        g = torch.sigmoid(attention.spe_filter.gate)
        gated = [
            (1 - g).sqrt()[:, None, :, None] * code(a) + (g.sqrt()[..., None] * eps)[:, None]
            for a in (angles + spe.offsets[:, :, None], angles)
        ]
        want_q, want_k = (torch.einsum("bhtd,htdr->bhtr", x, c) for x, c in zip((q, k), gated))
        assert qhat.dtype == torch.float64
        assert (qhat - want_q).abs().max() <= 1e-10 * want_q.abs().max()
        assert (khat - want_k).abs().max() <= 1e-10 * want_k.abs().max()

        x, y = seen["layer"]
        v = attention.split(attention.qkv(x))[2]
        scores = (F.relu(want_q) @ F.relu(want_k).transpose(-1, -2)).tril()
        heads = (scores @ v) / (scores.sum(-1, keepdim=True) + EPS)
        want_y = attention.out(heads.transpose(1, 2).reshape(*x.shape[:2], -1))
        assert (y - want_y).abs().max() <= 1e-10 * want_y.abs().max()


def test_a_session_takes_a_known_path_and_its_own_model_s_weights():
    model = tiny()
    with pytest.raises(ValueError, match="step path"):
        model.session(2, "auto")
    with pytest.raises(ValueError, match="another model"):
        model.session(2, weights=PreparedWeights(tiny()))
    assert model.session(2).path == FP32 and not model.session(2).bf16


def test_softmax_baseline_streams_with_a_cache():
    model, tokens = tiny(attention="softmax", pe="sine"), ids()
    parallel = model.session(2, seed=3).step(tokens)
    session = model.session(2, seed=3)
    recurrent = torch.stack([session.step(tokens[:, t]) for t in range(tokens.shape[1])], dim=1)
    assert (recurrent - parallel).abs().max() <= 1e-4


@pytest.mark.parametrize(
    "variant",
    [
        dict(pe="ape"),
        dict(pe="sine"),
        dict(pe="conv"),
        dict(positions="beats", window=8),
        dict(pe="ape", positions="beats"),
    ],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
def test_forward_is_causal(variant):
    """Changing token 20 and every onset from it on leaves the logits before it as they were, in a
    session and in the training pass: a model of beats reads no onset ahead of its token (the
    GPU runs of positions in beats with a window learnt so much faster that this was checked)."""
    model, tokens = tiny(**variant), ids(length=30)
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 333
    beats = onsets(tokens) if variant.get("positions") == "beats" else None
    moved = None if beats is None else torch.cat([beats[:, :20], beats[:, 20:] + 0.75], dim=1)
    # Same noise for both passes so only the tokens and onsets differ.
    a = model.session(2, seed=1).step(tokens, beats)
    b = model.session(2, seed=1).step(changed, moved)
    assert torch.allclose(a[:, :20], b[:, :20], atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:], atol=1e-3)
    torch.manual_seed(2)
    trained = model(tokens, beats)
    torch.manual_seed(2)
    assert torch.allclose(trained[:, :20], model(changed, moved)[:, :20], atol=1e-5)


def test_recurrent_state_does_not_grow():
    model = tiny(pe="conv")
    session = model.session(1, seed=0)
    session.step(ids(1, 10))
    sizes = [sum(t.numel() for t in state) for state in session.get_state().layers]
    for t in range(40):
        session.step(torch.tensor([t]))
    assert [sum(t.numel() for t in state) for state in session.get_state().layers] == sizes
    assert session.position == 50


def test_step_needs_the_right_batch():
    session = tiny().session(2)
    with pytest.raises(ValueError):
        session.step(torch.tensor([1, 2, 3]))


def test_training_forward_draws_fresh_noise_and_backpropagates():
    model = tiny(pe="sine")
    model.train()
    tokens = ids()
    logits = model(tokens)
    assert logits.shape == (2, 3 * TRAIN_LEN, 333)
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 333), tokens[:, 1:].reshape(-1))
    loss.backward()
    spe_grads = [p.grad for p in model.spe.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in spe_grads)
    assert model.layers[0].attention.spe_filter.gate.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "policy,steps,expected",
    [
        ("fixed", range(1, 10), 0),
        ("every:3", range(1, 10), 3),
        ("prob:1.0", range(1, 4), 3),
        ("prob:0.0", range(1, 9), 0),
    ],
)
def test_redraw_policy(policy, steps, expected):
    model = tiny(redraw=policy)
    features = model.layers[0].attention.features
    redraws, last = 0, features.projection.clone()
    for step in steps:
        model.on_train_step(step)
        if not torch.equal(last, features.projection):
            redraws, last = redraws + 1, features.projection.clone()
    assert redraws == expected


@pytest.mark.parametrize("bad", ["sometimes", "prob:2", "every:0", "every:x", "fixed:3"])
def test_bad_redraw_policy_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        preset("tiny", redraw=bad)


def test_bf16_autocast_forward_and_backward():
    model, tokens = tiny(pe="conv"), ids()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    logits.float().sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model.session(2, seed=0).step(tokens[:, 0]).float()).all()


@pytest.mark.skipif(not fast_transformers_available(), reason="fast-transformers not installed")
def test_fast_transformers_kernel_gives_the_same_model_output():
    tokens = ids()
    outputs = []
    for kernel in ("torch", "fast-transformers"):
        model = tiny(pe="sine", kernel=kernel)
        outputs.append(model.session(2, seed=4).step(tokens))
    assert (outputs[0] - outputs[1]).abs().max() <= 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "variant",
    [dict(pe="sine"), dict(pe="ape", norm="pre", activation="gelu"), dict(pe="none", attention="elu")],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
def test_cuda_graph_steps_equal_the_parallel_pass_and_follow_set_state(variant):
    """On CUDA single-token steps replay one captured graph: fp32 equals the parallel pass,
    bf16 stays within its tolerance, and a snapshot of another session (other noise, other
    sums) is followed after the graph was captured."""
    model, tokens = tiny(**variant).to("cuda"), ids().to("cuda")
    reference, recurrent, mixed = three_ways(model, tokens)
    assert (recurrent - reference).abs().max() <= 1e-4 and (mixed - reference).abs().max() <= 1e-4
    for logits in three_ways(model, tokens, BF16):
        assert (logits - reference).abs().max() <= BF16_LOGIT_TOLERANCE * reference.abs().max()
    session = model.session(2, seed=8)
    session.step(tokens[:, :9])
    other = session.get_state()
    expected = [session.step(tokens[:, t]) for t in range(9, 14)]
    session = model.session(2, seed=7)
    for t in range(5):
        session.step(tokens[:, t])  # the graph is captured here
    session.set_state(other)
    got = [session.step(tokens[:, t]) for t in range(9, 14)]
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(got, expected))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "variant",
    [
        dict(positions="beats"),  # per-sequence codes through the captured graph
        dict(window=4),
        dict(positions="beats", window=16, gated=False),
        dict(pe="ape", positions="beats", window=4),
    ],
    ids=lambda v: "-".join(str(x) for x in v.values()),
)
def test_cuda_steps_of_beats_and_windows_equal_the_parallel_pass(variant):
    model, tokens = tiny(**variant).to("cuda"), ids().to("cuda")
    beats = onsets(tokens).to("cuda") if model.config.positions == "beats" else None
    reference, recurrent, mixed = three_ways(model, tokens, beats=beats)
    assert (recurrent - reference).abs().max() <= 1e-4 and (mixed - reference).abs().max() <= 1e-4
    for logits in three_ways(model, tokens, BF16, beats=beats):
        assert (logits - reference).abs().max() <= BF16_LOGIT_TOLERANCE * reference.abs().max()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(tokens, beats).float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pe", ["sine", "conv"])
def test_cuda_recurrent_equals_parallel(pe):
    model, tokens = tiny(pe=pe).to("cuda"), ids().to("cuda")
    parallel = model.session(2, seed=7).step(tokens)
    session = model.session(2, seed=7)
    recurrent = torch.stack([session.step(tokens[:, t]) for t in range(tokens.shape[1])], dim=1)
    assert (recurrent - parallel).abs().max() <= 1e-4
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(tokens).float().sum().backward()


@pytest.mark.parametrize("pe", ["sine", "conv"])
def test_a_backward_pass_inside_bf16_autocast_runs(pe):
    """A backward called inside the autocast block (as the CUDA test above does) once cast the
    linear attention's backward products to bf16 beside fp32 operands: 'Input dtypes must be the
    same' on CPU and CUDA alike."""
    model, tokens = tiny(pe=pe), ids()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens).float().sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_paper_pop_preset_size_and_training_pass():
    torch.manual_seed(0)
    model = MusicPerformer(preset("paper-pop"))
    assert abs(model.num_parameters() - 80e6) <= 0.05 * 80e6
    tokens = ids(1, 24)
    logits = model(tokens)
    nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:]).backward()
    assert model.head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("attention, grows", [("performer", False), ("aaren", False), ("relative", True)])
def test_state_bytes_is_constant_for_recurrent_attention_and_grows_for_a_cache(attention, grows):
    torch.manual_seed(0)
    pe = "sine" if attention == "performer" else "none"
    model = MusicPerformer(preset("tiny", vocab_size=40, attention=attention, pe=pe)).eval()
    sizes = []
    session = model.session(2, seed=0)
    for t in range(48):
        session.step(torch.randint(0, 40, (2,)))
        if t in (15, 47):
            sizes.append(session.state_bytes)
    assert sizes[0] > 0
    assert (sizes[1] == 3 * sizes[0]) if grows else (sizes[1] == sizes[0])


def test_positions_and_window_travel_with_a_checkpoint_and_older_ones_read_as_tokens(tmp_path):
    from musegen.checkpoint import load_checkpoint, read_checkpoint_config, save_checkpoint
    from musegen.tokenizers import tokenizer_from_dict

    config, _ = read_checkpoint_config("pop")  # written before either setting existed
    assert (config.positions, config.window) == ("tokens", 0)
    model = tiny(positions="beats", window=4)
    save_checkpoint(tmp_path / "m", model, model.config, tokenizer_from_dict({"kind": "remi"}))
    loaded = load_checkpoint(tmp_path / "m")[0]
    assert (loaded.config.positions, loaded.config.window) == ("beats", 4)
    tokens = ids()
    beats = onsets(tokens)
    assert torch.equal(loaded.session(2, seed=1).step(tokens, beats), model.session(2, seed=1).step(tokens, beats))
