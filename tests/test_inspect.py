"""musegen inspect: probe and sparsity maths on constructed cases, templates from codes, the job and CLI."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from train_fixtures import prepare_pop909

from musegen.checkpoint import save_checkpoint
from musegen.cli import main
from musegen.inspect import inspect_checkpoint, shown_layers
from musegen.metrics import attention as att
from musegen.model.config import preset
from musegen.model.spe import ConvSPE, SineSPE, SPEFilter
from musegen.model.transformer import MusicPerformer


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: a thread pool only thrashes here
    yield
    torch.set_num_threads(threads)


def relative_scores(kernel: torch.Tensor) -> torch.Tensor:
    """s[m, n] = kernel[m - n] for m >= n (the causal half is all the probes read)."""
    T = len(kernel)
    lag = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0)
    return kernel[lag]


# --- probes on constructed attention -------------------------------------------------------


def test_a_purely_relative_kernel_is_perfectly_translation_invariant():
    torch.manual_seed(0)
    kernel = torch.rand(128)  # arbitrary, not monotone
    view = att.lag_view(relative_scores(kernel), range(64, 128), 32)
    assert att.translation_invariance(view).item() == pytest.approx(1.0, abs=1e-12)
    # the same values depending on absolute positions are not
    absolute = torch.rand(128)[:, None] + torch.rand(128)[None, :]
    assert att.translation_invariance(att.lag_view(absolute, range(64, 128), 32)).item() < 0.5
    # a relative kernel plus small absolute noise: the score falls with the noise's share of variance
    noisy = att.lag_view(relative_scores(kernel) + 0.1 * torch.rand(128, 128), range(64, 128), 32)
    assert 0.8 < att.translation_invariance(noisy).item() < 1.0


def test_translation_invariance_is_the_variance_share_explained_by_offset():
    a = torch.tensor([[1.0, 4.0], [3.0, 2.0]])  # column means 2, 3; grand mean 2.5
    within = (1 + 1) + (1 + 1)
    total = 1.5**2 + 1.5**2 + 0.5**2 + 0.5**2
    assert att.translation_invariance(a).item() == pytest.approx(1 - within / total)
    assert att.translation_invariance(torch.full((4, 5), 3.0)).item() == 1.0  # constant: trivially invariant


def test_a_kernel_decreasing_with_distance_is_perfectly_monotone():
    for kernel in (torch.exp(-torch.arange(64.0) / 10), 1 / (1 + torch.arange(64.0)), -(torch.arange(64.0) ** 2)):
        view = att.lag_view(relative_scores(kernel), range(40, 64), 40)
        assert att.monotonicity(view).item() == pytest.approx(1.0)
    increasing = att.lag_view(relative_scores(torch.arange(64.0)), range(40, 64), 40)
    assert att.monotonicity(increasing).item() == pytest.approx(-1.0)
    periodic = att.lag_view(relative_scores(torch.cos(torch.arange(64.0) * 2 * math.pi / 8)), range(40, 64), 40)
    assert abs(att.monotonicity(periodic).item()) < 0.5


def test_spearman_matches_pearson_of_average_ranks_with_ties():
    x = torch.tensor([1.0, 2.0, 2.0, 5.0, 3.0])
    y = torch.tensor([10.0, 8.0, 9.0, 1.0, 1.0])
    rx = torch.tensor([0.0, 1.5, 1.5, 4.0, 3.0])
    ry = torch.tensor([4.0, 2.0, 3.0, 0.5, 0.5])
    expected = torch.corrcoef(torch.stack([rx, ry]))[0, 1]
    assert att.spearman(x, y).item() == pytest.approx(expected.item())
    assert math.isnan(att.spearman(x, torch.ones(5)).item())


def test_lag_view_reads_diagonals_and_rejects_short_prefixes():
    scores = torch.arange(36.0).view(6, 6)
    view = att.lag_view(scores, [3, 5], 3)
    assert view.tolist() == [[scores[3, 3], scores[3, 2], scores[3, 1]], [scores[5, 5], scores[5, 4], scores[5, 3]]]
    with pytest.raises(ValueError):
        att.lag_view(scores, [1], 3)


# --- sparsity ------------------------------------------------------------------------------


def test_sparsity_of_one_hot_is_minimal_and_of_constant_is_one():
    n = 50
    one_hot = torch.zeros(n)
    one_hot[7] = 3.0
    assert att.sparsity(one_hot).item() == pytest.approx(1 / math.sqrt(n))
    assert att.sparsity(torch.full((n,), 0.2)).item() == pytest.approx(1.0)
    assert att.sparsity(-torch.full((n,), 2.0)).item() == pytest.approx(1.0)
    torch.manual_seed(0)
    others = torch.randn(2000, n) * torch.rand(2000, 1) ** 4  # dense and heavy-tailed vectors
    others[:, : n // 2] *= torch.rand(2000, 1) < 0.5
    s = att.sparsity(others)
    assert (s >= 1 / math.sqrt(n) - 1e-12).all() and (s <= 1 + 1e-12).all()
    assert att.sparsity(5 * others[:3]).allclose(s[:3])  # scale-free


def test_causal_row_sparsity_equals_sparsity_of_each_normalised_row():
    torch.manual_seed(1)
    logits = torch.randn(2, 9, 9) * 3
    rows = att.causal_row_sparsity(logits)
    for h in range(2):
        for t in range(1, 9):
            expected = att.sparsity(torch.softmax(logits[h, t, : t + 1], -1))
            assert rows[h, t - 1].item() == pytest.approx(expected.item())
    maps = att.causal_attention_map(logits)
    assert torch.allclose(maps.sum(-1), torch.ones(2, 9)) and (maps.triu(1) == 0).all()


# --- templates from codes ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sine", "conv"])
def test_templates_from_codes_converge_to_the_gated_kernel(kind):
    torch.manual_seed(0)
    H, D, R, T = 2, 3, 8192, 24
    spe = SineSPE(H, D, R, 4) if kind == "sine" else ConvSPE(H, D, R, 8)
    gate = SPEFilter(H, D, R, gated=True)
    pairs = [(0, 0), (1, 2)]
    with torch.no_grad():
        codes = gate.gated_codes(spe.codes(spe.draw_noise(), 0, T), gate.draw_noise())
        estimated = att.diagonal_means(att.code_templates(spe.code_scale, codes, pairs), 12)
        g = torch.sigmoid(gate.gate)[[0, 1], [0, 2], None]
        kernel = spe.kernel(torch.arange(12.0))[[0, 1], [0, 2]]
    expected = (1 - g) * kernel + g
    # The estimate's error shrinks like 1/sqrt(R): ~0.02 of the kernel's scale at R = 8192.
    assert (estimated - expected).abs().max() < 0.08 * expected.abs().max()


def test_strongest_features_and_gates():
    at_zero = torch.tensor([[0.1, -3.0, 2.0], [5.0, 0.0, 1.0]])
    assert att.strongest_features(at_zero, 2) == [(0, 1), (0, 2), (1, 0), (1, 2)]
    model = MusicPerformer(preset("tiny", vocab_size=20))
    gates = att.gate_values(model)
    assert gates.shape == (2, 2, 32) and ((gates > 0) & (gates < 1)).all()
    assert att.gate_values(MusicPerformer(preset("tiny", vocab_size=20, pe="ape"))) is None


# --- probes on real models -----------------------------------------------------------------


def _probe(pe: str, R: int) -> dict:
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=40, pe=pe, spe_realizations=R, gated=False, dropout=0.0)).eval()
    with torch.no_grad():
        model.layers[0].attention.qkv.weight.mul_(20)  # untrained weights score almost flat attention
    return att.probe_first_layer(model, 5, 96, {"within": range(32, 64), "beyond": range(64, 96)}, 32)


def test_sine_spe_first_layer_is_translation_invariant_on_identical_tokens_and_ape_is_not():
    spe, ape = _probe("sine", 1024), _probe("ape", 16)
    for region in ("within", "beyond"):
        assert spe[region]["translation_invariance"].min() > 0.5  # relative up to the codes' 1/sqrt(R) noise
        assert ape[region]["translation_invariance"].max() < 0.3  # absolute positions in the queries and keys


def test_captured_scores_reproduce_the_layer_output():
    """Softmax attention over the captured q-hat, k-hat, times v, is exactly what the layer mixes."""
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=30, attention="softmax", dropout=0.0)).eval()
    ids = torch.randint(0, 30, (1, 20))
    attention = model.layers[0].attention
    seen = {}
    handles = [
        attention.qkv.register_forward_hook(lambda m, a, o: seen.__setitem__("qkv", o)),
        attention.out.register_forward_hook(lambda m, a, o: seen.__setitem__("mixed", a[0])),
    ]
    got = att.capture_scored(model, ids, [0], seed=3)[0]
    for handle in handles:
        handle.remove()
    v = seen["qkv"].view(1, 20, 3, 2, 32)[:, :, 2].transpose(1, 2)  # [B, H, T, head_dim]
    mixed = att.causal_attention_map(att.attention_logits(attention, got["q"], got["k"])) @ v
    assert torch.allclose(mixed.transpose(1, 2).reshape(1, 20, -1), seen["mixed"], atol=1e-5)
    assert got["codes"] is not None and got["eps"].shape == (2, 32, 16)


# --- the job and the command ---------------------------------------------------------------


def test_shown_layers():
    assert shown_layers(24) == [0, 2, 12, 23]
    assert shown_layers(4) == [0, 2, 3]
    assert shown_layers(2) == [0, 1]
    assert shown_layers(1) == [0]


@pytest.fixture(scope="module")
def tiny_checkpoint(pop909_songs, tmp_path_factory):
    data = prepare_pop909(pop909_songs[:6], tmp_path_factory.mktemp("shards"))
    from musegen.shards import Shards

    tokenizer = Shards(data).tokenizer
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tokenizer.vocab_size, pe="conv", dropout=0.0))
    folder = save_checkpoint(tmp_path_factory.mktemp("ckpt"), model, model.config, tokenizer, {"train_len": 32})
    return folder, data


def test_inspect_writes_every_figure_and_a_summary(tiny_checkpoint, tmp_path):
    folder, data = tiny_checkpoint
    result = inspect_checkpoint(folder, tmp_path, data=data, pieces=1)
    assert result["length"] == 48 and result["sparsity_source"] == "1 valid piece"
    for name in ("templates", "gates", "attention_maps", "probes", "sparsity"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    sparsity = [r for r in rows if r["section"] == "sparsity"]
    assert len(sparsity) == 2 * 2  # layers x heads
    assert all(1 / math.sqrt(32) <= float(r["value"]) <= 1 for r in sparsity)
    probes = {(r["quantity"], r["detail"]) for r in rows if r["section"] == "probe"}
    assert ("best_head_translation_invariance", "beyond") in probes and ("monotonicity", "within") in probes
    assert len([r for r in rows if r["section"] == "gate"]) == 2 * 2
    assert set(result["best_heads"]) == {
        f"{q}_{r}" for q in ("translation_invariance", "monotonicity") for r in ("within", "beyond")
    }


def test_inspect_of_an_ape_model_lists_only_what_it_wrote(tiny_checkpoint, tmp_path):
    _, data = tiny_checkpoint
    from musegen.shards import Shards

    model = MusicPerformer(preset("tiny", vocab_size=Shards(data).tokenizer.vocab_size, pe="ape"))
    folder = save_checkpoint(tmp_path / "ape", model, model.config, Shards(data).tokenizer, {"train_len": 16})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "templates.png").write_bytes(b"from an earlier run")
    result = inspect_checkpoint(folder, tmp_path / "out", length=20)
    assert result["files"] == ["attention_maps.png", "probes.png", "sparsity.png", "summary.csv"]
    assert result["sparsity_source"] == "the generated sequence" and set(result["best_heads"]) == {
        "translation_invariance_within",
        "monotonicity_within",
        "translation_invariance_beyond",
        "monotonicity_beyond",
    }


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_.value.code or 0, captured.out, captured.err


def test_cli_inspect_and_its_errors(tiny_checkpoint, tmp_path, capsys):
    folder, data = tiny_checkpoint
    code, out, _ = run_cli(["inspect", "-c", folder, "-o", tmp_path / "a", "--length", "40"], capsys)
    assert code == 0 and "best head for translation invariance within" in out
    assert (tmp_path / "a" / "attention_maps.png").is_file()

    code, _, err = run_cli(["inspect", "-c", tmp_path / "missing", "-o", tmp_path / "b"], capsys)
    assert code == 1 and err.count("\n") == 1 and "checkpoint folder not found" in err
    code, _, err = run_cli(["inspect", "-c", folder, "-o", tmp_path / "b", "--data", tmp_path / "nodata"], capsys)
    assert code == 1 and "data folder not found" in err and not (tmp_path / "b").exists()
    code, _, err = run_cli(["inspect", "-c", folder, "-o", tmp_path / "b", "--data", data, "--split", "test"], capsys)
    assert code == 1 and "no split 'test'" in err

    model = MusicPerformer(preset("tiny", vocab_size=333, pe="ape"))
    from musegen.tokenizers.remi import RemiTokenizer

    no_meta = save_checkpoint(tmp_path / "no-meta", model, model.config, RemiTokenizer())
    code, _, err = run_cli(["inspect", "-c", no_meta, "-o", tmp_path / "c"], capsys)
    assert code == 2 and "--train-len" in err


def test_nll_comparison_reads_evaluate_loss_csvs(tmp_path):
    import numpy as np

    from musegen.metrics.report import plot_position_nll, write_position_nll

    sums, counts = np.array([2.0, 4.0, 0.0, 9.0, 3.0]), np.array([1, 2, 0, 3, 1])  # position 2: no token
    files = write_position_nll(tmp_path, "nll_valid", sums, counts, train_len=2)
    summary = plot_position_nll({"m": files["csv"]}, 2, tmp_path / "curves.png", smooth=2)
    assert summary["m"]["within"] == pytest.approx((2 + 2) / 2)  # per-position means, positions 0 and 1
    assert summary["m"]["beyond"] == pytest.approx((3 + 3) / 2)  # positions 3 and 4; 2 is empty
    assert (tmp_path / "curves.png").stat().st_size > 0
