"""Teacher-forced NLL per position: exact against a direct computation; CSV/PNG; evaluate_loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from musegen.checkpoint import save_checkpoint
from musegen.errors import CheckpointError, DataError
from musegen.metrics.loss import evaluate_loss, position_nll, summarize
from musegen.model import MusicPerformer, preset
from musegen.shards import Shards

from train_fixtures import prepare_pop909


@pytest.fixture(scope="module")
def pop(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:6], tmp_path_factory.mktemp("pop"))


def _ape_model(vocab_size):
    # APE and fixed features: no noise inside forward, so batching cannot change the result
    torch.manual_seed(0)
    return MusicPerformer(preset("tiny", vocab_size=vocab_size, pe="ape", redraw="fixed", dropout=0.0)).eval()


def test_position_nll_matches_one_piece_at_a_time(pop):
    shards = Shards(pop)
    pieces = [p[:n] for p, n in zip(shards.pieces("train")[:3], (50, 80, 30))]  # ragged: padding is exercised
    model = _ape_model(shards.tokenizer.vocab_size)
    sums, counts = position_nll(model, pieces, max_len=64, pad_id=shards.tokenizer.pad_id, batch_size=3)
    expected_sums, expected_counts = np.zeros(64), np.zeros(64)
    with torch.no_grad():
        for piece in pieces:
            ids = torch.from_numpy(piece[:65]).long()[None]
            nll = F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:], reduction="none").double().numpy()
            expected_sums[:len(nll)] += nll
            expected_counts[:len(nll)] += 1
    assert np.array_equal(counts, expected_counts)
    assert np.allclose(sums, expected_sums, rtol=1e-5, atol=1e-5)
    assert counts[0] == 3 and counts[40] == 2 and counts[60] == 1


def test_summary_splits_at_the_training_length():
    sums, counts = np.array([2.0, 4.0, 9.0, 3.0]), np.array([1, 2, 3, 1])
    s = summarize(sums, counts, train_len=2)
    assert s["within"] == pytest.approx(6 / 3) and s["extrapolation"] == pytest.approx(12 / 4)
    assert s["mean"] == pytest.approx(18 / 7) and s["tokens"] == 7
    assert summarize(sums, counts, train_len=4)["extrapolation"] is None


def test_evaluate_loss_writes_csv_and_png(pop, tmp_path):
    shards = Shards(pop)
    model = _ape_model(shards.tokenizer.vocab_size)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, model.config, shards.tokenizer, {"train_len": 32})
    result = evaluate_loss(ckpt, pop, max_len=96, split="validation", out_dir=tmp_path / "eval")
    assert result["split"] == "valid" and result["train_len"] == 32
    untrained = np.log(shards.tokenizer.vocab_size)
    assert abs(result["within"] - untrained) < 1.0 and abs(result["extrapolation"] - untrained) < 1.0
    rows = (tmp_path / "eval" / "nll_valid.csv").read_text().splitlines()
    assert rows[0] == "position,nll,count" and len(rows) == 97
    assert (tmp_path / "eval" / "nll_valid.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(DataError, match="no split"):
        evaluate_loss(ckpt, pop, max_len=8, split="test")


def test_evaluate_loss_refuses_another_tokenizer(pop, tmp_path):
    from musegen.tokenizers.groove import GrooveTokenizer

    tok = GrooveTokenizer()
    model = _ape_model(tok.vocab_size)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, model.config, tok, {"train_len": 32})
    with pytest.raises(CheckpointError, match="another tokenizer"):
        evaluate_loss(ckpt, pop, max_len=8)
