"""The other attention families (relative, synthesizer, aaren): exact against naive versions, the
recurrent form against the parallel one, causality, config checks, and train -> sample ->
evaluate -> inspect through the command line."""

from __future__ import annotations

import math

import miditoolkit
import numpy as np
import pytest
import torch
from train_fixtures import prepare_pop909

from musegen.cli import main
from musegen.errors import ConfigError
from musegen.generation.loop import generate
from musegen.generation.prompt import Prompt
from musegen.generation.settings import SampleSettings
from musegen.metrics import attention as att
from musegen.model.config import SYNTHESIZER_VARIANTS, ModelConfig, preset
from musegen.model.families import Aaren, RelativeAttention, Synthesizer, prefix_scan
from musegen.model.transformer import MusicPerformer, SelfAttention
from musegen.tokenizers import tokenizer_from_dict
from musegen.training.settings import build_config
from musegen.training.trainer import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, D = 2, 8  # heads, head width of the module-level tests
MIXTURE = "+".join(SYNTHESIZER_VARIANTS)  # every variant at once


def family_config(attention: str, **overrides) -> ModelConfig:
    return preset(
        "tiny", vocab_size=30, attention=attention, pe="none", dropout=0.0, d_model=H * D, n_heads=H, **overrides
    )


def randn(*shape, generator):
    return torch.randn(*shape, generator=generator)


def chunks_then_steps(run, T: int, cut: int):
    """Outputs of `run(t0, t1, state)` over [0, cut) in one block, then one position at a time."""
    out, state = run(0, cut, None)
    outs = [out]
    for t in range(cut, T):
        out, state = run(t, t + 1, state)
        outs.append(out)
    return torch.cat(outs, dim=2)


# --- relative attention -------------------------------------------------------------------------


def naive_relative(q, k, v, key_emb, value_emb, max_distance, scale):
    """Shaw et al. directly: a [T, S, D] tensor of relative embeddings, O(T S D)."""
    T, S = q.shape[2], k.shape[2]
    past = S - T
    distance = (past + torch.arange(T)[:, None] - torch.arange(S)[None, :]).clamp(0, max_distance)  # [T, S]
    a_k = key_emb[:, distance]  # [H, T, S, D]
    logits = (torch.einsum("bhtd,bhsd->bhts", q, k) + torch.einsum("bhtd,htsd->bhts", q, a_k)) * scale
    future = torch.arange(S)[None, :] > past + torch.arange(T)[:, None]
    p = logits.masked_fill(future, -math.inf).softmax(-1)
    out = p @ v
    if value_emb is not None:
        out = out + torch.einsum("bhts,htsd->bhtd", p, value_emb[:, distance])
    return out


@pytest.mark.parametrize("values", [False, True])
@pytest.mark.parametrize("T,S", [(5, 5), (13, 13), (17, 17), (3, 13), (1, 20)])
def test_relative_skewing_equals_the_naive_computation(values, T, S):
    """Odd lengths, below (5) and above (13, 17) the clip distance 8, and queries after a cache."""
    g = torch.Generator().manual_seed(T * 100 + S)
    family = RelativeAttention(family_config("relative", max_relative_distance=8, relative_values=values))
    with torch.no_grad():  # embeddings as large as the keys, so the relative part counts
        for p in family.parameters():
            p.copy_(randn(*p.shape, generator=g))
    q, k, v = randn(2, H, T, D, generator=g), randn(2, H, S, D, generator=g), randn(2, H, S, D, generator=g)
    cache = (k[:, :, : S - T], v[:, :, : S - T]) if S > T else None
    got, _ = family(q, k[:, :, S - T :], v[:, :, S - T :], cache)
    expected = naive_relative(q, k, v, family.key_embedding, family.value_embedding, 8, family.scale)
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("values", [False, True])
def test_relative_cached_steps_equal_the_parallel_forward(values):
    g = torch.Generator().manual_seed(1)
    family = RelativeAttention(family_config("relative", max_relative_distance=4, relative_values=values))
    T = 15
    q, k, v = (randn(1, H, T, D, generator=g) for _ in range(3))
    parallel, _ = family(q, k, v, None)
    stepped = chunks_then_steps(lambda a, b, s: family(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], s), T, 6)
    assert (parallel - stepped).abs().max() <= 1e-5


def streamed_logits(model: MusicPerformer, ids: torch.Tensor, cut: int) -> torch.Tensor:
    """Logits of `ids` through a streaming session: the first `cut` tokens in one block, then one by one."""
    session = model.session(ids.shape[0], seed=0)
    first = session.step(ids[:, :cut])
    return torch.cat([first] + [session.step(ids[:, t])[:, None] for t in range(cut, ids.shape[1])], dim=1)


@pytest.mark.parametrize(
    "attention,extra",
    [
        ("relative", {"max_relative_distance": 6}),
        ("relative", {"max_relative_distance": 6, "relative_values": True, "pe": "ape"}),
        ("aaren", {}),
        ("aaren", {"pe": "ape"}),
        ("synthesizer", {"max_len": 32, "synthesizer": MIXTURE}),
        ("synthesizer", {"max_len": 32, "synthesizer": "random", "pe": "ape"}),
    ],
)
def test_model_streaming_steps_equal_the_parallel_forward(attention, extra):
    torch.manual_seed(0)
    model = MusicPerformer(
        preset("tiny", vocab_size=30, attention=attention, dropout=0.0, **{"pe": "none", **extra})
    ).eval()
    ids = torch.randint(0, 30, (2, 21))
    with torch.no_grad():
        parallel = model(ids)
    assert (parallel - streamed_logits(model, ids, 8)).abs().max() <= 1e-4


# --- Aaren --------------------------------------------------------------------------------------


def naive_prefix_attention(scores, v):
    """Softmax attention of every prefix, one prefix at a time."""
    return torch.stack(
        [scores[..., : t + 1].softmax(-1)[..., None, :] @ v[..., : t + 1, :] for t in range(scores.shape[-1])], dim=2
    )[..., 0, :]


@pytest.mark.parametrize("magnitude", [1.0, 50.0, 1e4])  # exp(50 x N(0, 1)) overflows fp32
@pytest.mark.parametrize("T", [1, 7, 16, 37])
def test_aaren_scan_equals_prefix_softmax_even_for_huge_scores(T, magnitude):
    g = torch.Generator().manual_seed(T)
    scores, v = randn(2, H, T, generator=g) * magnitude, randn(2, H, T, D, generator=g)
    m, u, w = prefix_scan(scores, v)
    got = w / u[..., None]
    assert torch.isfinite(got).all()
    assert (got - naive_prefix_attention(scores.double(), v.double())).abs().max() <= 1e-5


def test_aaren_scan_gradient_equals_the_naive_one():
    """m is taken without gradient: the output's gradient must not notice."""
    g = torch.Generator().manual_seed(0)
    scores = (randn(1, H, 11, generator=g) * 3).requires_grad_()
    v = randn(1, H, 11, D, generator=g).requires_grad_()
    weights = randn(1, H, 11, D, generator=g)
    m, u, w = prefix_scan(scores, v)
    ((w / u[..., None]) * weights).sum().backward()
    got = scores.grad.clone(), v.grad.clone()
    scores.grad = v.grad = None
    (naive_prefix_attention(scores, v) * weights).sum().backward()
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(got, (scores.grad, v.grad)))


def test_aaren_recurrent_steps_equal_the_parallel_form():
    g = torch.Generator().manual_seed(2)
    family = Aaren(family_config("aaren"))
    with torch.no_grad():
        family.query.copy_(randn(H, D, generator=g) * 5)  # peaked attention: the rescaling is exercised
    T = 19
    k, v = randn(1, H, T, D, generator=g), randn(1, H, T, D, generator=g)
    parallel, (m, u, w) = family(None, k, v, None)
    stepped = chunks_then_steps(lambda a, b, s: family(None, k[:, :, a:b], v[:, :, a:b], s), T, 5)
    assert (parallel - stepped).abs().max() <= 1e-5
    assert m.shape == u.shape == (1, H) and w.shape == (1, H, D)  # the state does not grow


# --- Synthesizer --------------------------------------------------------------------------------


@pytest.mark.parametrize("variants", list(SYNTHESIZER_VARIANTS) + ["dense+dot", "random+dot", MIXTURE])
def test_synthesizer_leaks_no_future_token(variants):
    torch.manual_seed(0)
    layer = SelfAttention(family_config("synthesizer", max_len=16, synthesizer=variants))
    T = 9
    x = torch.randn(1, T, H * D, requires_grad=True)
    y, _ = layer(x, None, None, None, 0)
    for t in range(T):
        (grad,) = torch.autograd.grad(y[:, t].sum(), x, retain_graph=True)
        assert torch.all(grad[:, t + 1 :] == 0), (variants, t)
        assert grad[:, : t + 1].abs().sum() > 0


@pytest.mark.parametrize("variants", list(SYNTHESIZER_VARIANTS))
def test_synthesizer_cached_steps_equal_the_forward(variants):
    torch.manual_seed(0)
    family = Synthesizer(family_config("synthesizer", max_len=16, synthesizer=variants))
    T = 13
    q, k, v = (torch.randn(1, H, T, D) for _ in range(3))
    q, k = (x if name in family.inputs else None for x, name in ((q, "q"), (k, "k")))

    def run(a, b, state):
        return family(*(None if x is None else x[:, :, a:b] for x in (q, k, v)), state)

    parallel, _ = family(q, k, v, None)
    assert (parallel - chunks_then_steps(run, T, 4)).abs().max() <= 1e-5


def test_synthesizer_projects_only_what_it_uses_and_fixed_logits_are_not_trained():
    assert Synthesizer(family_config("synthesizer", synthesizer="random", max_len=8)).inputs == ("v",)
    assert Synthesizer(family_config("synthesizer", synthesizer="dense", max_len=8)).inputs == ("q", "v")
    assert Synthesizer(family_config("synthesizer", synthesizer="random+dot", max_len=8)).inputs == ("q", "k", "v")
    fixed = Synthesizer(family_config("synthesizer", synthesizer="random-fixed", max_len=8))
    assert not list(fixed.parameters()) and "random_fixed" in fixed.state_dict()
    assert Aaren(family_config("aaren")).inputs == ("k", "v")


def test_synthesizer_past_max_len_is_a_clear_error():
    model = MusicPerformer(family_config("synthesizer", max_len=12)).eval()
    model(torch.zeros(1, 12, dtype=torch.long))  # up to max_len is fine
    with pytest.raises(ConfigError, match="max_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    session = model.session(1)
    with pytest.raises(ConfigError, match="max_len=12"):
        session.step(torch.zeros(1, 10, dtype=torch.long))
        for _ in range(3):
            session.step(torch.zeros(1, dtype=torch.long))
    cfg = build_config(
        "tiny", "d", "o", sets=["model.attention=synthesizer", "model.pe=none", "model.max_len=32", "seq_len=64"]
    )
    with pytest.raises(ConfigError, match="seq_len of 64 tokens is longer"):
        train(cfg)


def test_sampling_a_synthesizer_ends_at_max_len():
    """Up to max_len: samples that are still finishing a note there stop, counted as unfinished;
    past it (a longer --length, or --bars that are not reached by then): the clear error."""
    tok = tokenizer_from_dict({"kind": "remi"})
    torch.manual_seed(0)
    model = MusicPerformer(
        preset("tiny", vocab_size=tok.vocab_size, attention="synthesizer", pe="none", max_len=40)
    ).eval()
    start = Prompt(np.zeros(0, dtype=np.int64))
    for seed in range(4):
        samples, stats = generate(model, tok, start, SampleSettings(length=39, seed=seed, num_samples=3))
        assert stats["grammar_violations"] == 0 and all(s.new_tokens <= 40 for s in samples)
    for settings in (SampleSettings(length=40, seed=0), SampleSettings(bars=100, seed=0)):
        with pytest.raises(ConfigError, match="max_len=40"):
            generate(model, tok, start, settings)


# --- configuration ------------------------------------------------------------------------------


def test_config_refuses_combinations_that_make_no_sense():
    for attention in ("relative", "synthesizer", "aaren"):
        for pe in ("sine", "conv"):
            with pytest.raises(ConfigError, match="takes pe 'none' or 'ape'"):
                preset("tiny", attention=attention, pe=pe)
        with pytest.raises(ConfigError, match="linear-attention kernel"):
            preset("tiny", attention=attention, pe="none", kernel="fast-transformers")
    with pytest.raises(ConfigError, match="relative_values needs"):
        preset("tiny", relative_values=True)
    for spec in ("dense+dense", "attention", "", "dense+"):
        with pytest.raises(ConfigError, match="synthesizer must be"):
            preset("tiny", synthesizer=spec)
    with pytest.raises(ConfigError, match="greater than or equal to 1"):
        preset("tiny", attention="relative", pe="none", max_relative_distance=0)


def test_settings_that_must_agree_can_be_given_in_any_order_and_old_configs_load():
    for sets in (["model.attention=aaren", "model.pe=none"], ["model.pe=none", "model.attention=aaren"]):
        assert build_config("tiny", "d", "o", sets=sets).model.attention == "aaren"
    old = {
        k: v
        for k, v in ModelConfig().to_dict().items()
        if k not in ("max_relative_distance", "relative_values", "synthesizer", "synthesizer_rank", "max_len")
    }
    assert ModelConfig.from_dict(old) == ModelConfig()


def test_captured_logits_reproduce_each_family_layer():
    """What inspect draws (softmax of the captured logits) is what the layer mixes."""
    for attention, extra in (
        ("relative", {"max_relative_distance": 5}),
        ("aaren", {}),
        ("synthesizer", {"max_len": 24, "synthesizer": MIXTURE}),
    ):
        torch.manual_seed(0)
        model = MusicPerformer(
            preset("tiny", vocab_size=30, attention=attention, pe="none", dropout=0.0, **extra)
        ).eval()
        ids = torch.randint(0, 30, (1, 20))
        layer = model.layers[1].attention
        seen = {}
        handle = layer.out.register_forward_hook(lambda m, a, o: seen.__setitem__("mixed", a[0]))
        got = att.capture_scored(model, ids, [1])[1]
        handle.remove()
        mixed = att.causal_attention_map(att.layer_logits(layer, got)) @ got["v"]
        assert torch.allclose(mixed.transpose(1, 2).reshape(1, 20, -1), seen["mixed"], atol=1e-5), attention


# --- through the command line -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pop_small(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:4], tmp_path_factory.mktemp("pop-families"))


def cli(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_.value.code or 0, captured.out, captured.err


FAMILY_SETS = {
    "relative": ["model.attention=relative", "model.relative_values=true", "model.max_relative_distance=16"],
    "synthesizer": ["model.attention=synthesizer", "model.synthesizer=dense+dot", "model.max_len=64"],
    "aaren": ["model.attention=aaren", "model.pe=ape"],
}


@pytest.mark.parametrize("family", list(FAMILY_SETS))
def test_train_sample_evaluate_and_inspect_each_family(family, pop_small, tmp_path, capsys):
    sets = [
        "model.pe=none",
        *FAMILY_SETS[family],
        "seq_len=32",
        "batch_size=2",
        "steps=3",
        "workers=0",
        "valid_every=0",
        "ckpt_every=3",
        "warmup=1",
    ]
    run = tmp_path / "run"
    code, _, err = cli(
        ["train", "--data", pop_small, "--out", run, "--preset", "tiny", *[a for s in sets for a in ("--set", s)]],
        capsys,
    )
    assert code == 0, err
    checkpoint = run / "checkpoints" / "step-00000003"

    code, out, err = cli(
        ["sample", "-c", checkpoint, "-o", tmp_path / "samples", "--length", "40", "-n", "2", "--seed", "0"], capsys
    )
    assert code == 0 and "invalid samples: 0" in out, err
    midis = sorted((tmp_path / "samples" / "sample").glob("*.mid"))  # (a run without a prompt: its set `sample/`)
    assert len(midis) == 2 and all(miditoolkit.MidiFile(str(p)).instruments for p in midis)

    code, out, err = cli(["evaluate", "loss", "-c", checkpoint, "--data", pop_small, "--max-len", "48"], capsys)
    assert code == 0 and "extrapolation:" in out, err

    code, out, err = cli(["inspect", "-c", checkpoint, "-o", tmp_path / "inspect", "--length", "40"], capsys)
    assert code == 0 and "note: no positional templates" in out, err
    assert (tmp_path / "inspect" / "attention_maps.png").is_file()

    if family == "synthesizer":  # past max_len: one line, a ConfigError's exit 2, no traceback
        code, _, err = cli(["sample", "-c", checkpoint, "-o", tmp_path / "long", "--length", "80"], capsys)
        assert code == 2 and err.count("\n") == 1 and "max_len=64" in err
        code, _, err = cli(["evaluate", "loss", "-c", checkpoint, "--data", pop_small, "--max-len", "100"], capsys)
        assert code == 2 and err.count("\n") == 1 and "max_len=64" in err
