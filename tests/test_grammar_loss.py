"""Training under the grammar (ModelConfig.loss_over = "grammar"): the ids allowed at each target
of real pieces, crops transposed with the piece before them, and the loss among the allowed ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import POP909

from musegen.data import Augmenter, CropDataset
from musegen.tokenizers.remi import RemiTokenizer
from musegen.tokenizers.song import SongTokenizer
from musegen.training.optim import next_token_nll

SONGS = [POP909 / name / f"{name}.mid" for name in ("001", "002", "003")]


@pytest.mark.parametrize("tokenizer", [RemiTokenizer(), SongTokenizer()], ids=["remi", "song"])
def test_every_real_target_is_allowed_and_a_crop_reads_the_rows_of_its_piece(tokenizer):
    grammar = tokenizer.grammar()
    for path in SONGS:
        ids = tokenizer.encode(path).ids[:1200]
        masks = grammar.allowed_after(ids, 0, len(ids) - 1)
        assert masks[np.arange(len(ids) - 1), ids[1:]].all()
        states = grammar.states(ids)
        for k in (0, 17, 500, len(ids) - 2):
            assert np.array_equal(masks[k], grammar.allowed(states[k + 1]))
        assert masks.sum(1).mean() < 0.5 * grammar.vocab_size  # the grammar rules most ids out
        assert np.array_equal(grammar.allowed_after(ids, 300, 200), masks[300:500])


def test_a_crop_transposed_with_its_piece_allows_each_of_its_targets():
    tokenizer = SongTokenizer()
    pieces = [tokenizer.encode(path).ids for path in SONGS]
    augmenter = Augmenter.for_tokenizer(tokenizer)  # transposition by up to 6 semitones
    data = CropDataset(pieces, 256, tokenizer.pad_id, seed=3, augmenter=augmenter, grammar=tokenizer.grammar())
    shifted = 0
    for position in range(24):
        ids, beats, allowed = data[(position, position % len(pieces))]
        targets = ids[1:].numpy()
        assert beats.numel() == 0 and allowed.shape == (256, tokenizer.vocab_size)
        assert allowed.numpy()[np.arange(256), targets].all()
        piece = pieces[position % len(pieces)]
        windows = np.lib.stride_tricks.sliding_window_view(piece, 257)
        shifted += not (windows == ids.numpy()).all(1).any()  # not a window of the piece as it is
    assert shifted > 12  # most crops were transposed, and their masks moved with them


def test_the_loss_under_the_grammar_is_the_nll_among_the_allowed_ids():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 12, generator=generator)
    targets = torch.randint(0, 10, (2, 5), generator=generator)
    allowed = torch.rand(2, 5, 10, generator=generator) < 0.4
    allowed.scatter_(-1, targets[..., None], True)  # every target is allowed, as in real data
    expected = 0.0
    for b in range(2):
        for n in range(5):
            p = logits[b, n, :10][allowed[b, n]].double().softmax(-1)
            expected -= float(torch.log(p[allowed[b, n, : targets[b, n]].sum()]))
    masked = next_token_nll(logits, targets, allowed=allowed)
    assert float(masked) == pytest.approx(expected, rel=1e-6)
    assert float(masked) < float(next_token_nll(logits, targets))  # the ids left out held mass
