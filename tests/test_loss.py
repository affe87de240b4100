"""Teacher-forced NLL per position and per token type: exact against direct computations and counts
worked out by hand; CSV/PNG/Markdown; evaluate_loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from train_fixtures import prepare_pop909

from musegen.checkpoint import save_checkpoint
from musegen.errors import CheckpointError, DataError
from musegen.evaluation.run_loss import evaluate_loss
from musegen.metrics.loss import position_sums, summarize, token_nll
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.shards import Shards


@pytest.fixture(scope="module")
def pop(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:6], tmp_path_factory.mktemp("pop"))


def _ape_model(vocab_size):
    # APE and fixed features: no noise inside forward, so batching cannot change the result
    torch.manual_seed(0)
    return MusicPerformer(preset("tiny", vocab_size=vocab_size, pe="ape", redraw="fixed", dropout=0.0)).eval()


def test_position_sums_match_one_piece_at_a_time(pop):
    shards = Shards(pop)
    pieces = [p[:n] for p, n in zip(shards.pieces("train")[:3], (50, 80, 30))]  # ragged: padding is exercised
    model = _ape_model(shards.tokenizer.vocab_size)
    per_piece = token_nll(model, pieces, max_len=64, pad_id=shards.tokenizer.pad_id, batch_size=3)
    sums, counts = position_sums(per_piece, 64)
    expected_sums, expected_counts = np.zeros(64), np.zeros(64)
    with torch.no_grad():
        for piece in pieces:
            ids = torch.from_numpy(piece[:65]).long()[None]
            nll = F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:], reduction="none").double().numpy()
            expected_sums[: len(nll)] += nll
            expected_counts[: len(nll)] += 1
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


# ---------------------------------------------------------------- NLL per token type


def test_every_id_but_pad_has_a_type_named_by_its_tokenizer():
    from musegen.tokenizers.groove import GrooveTokenizer
    from musegen.tokenizers.remi import RemiTokenizer

    for tok in (RemiTokenizer(), GrooveTokenizer()):
        types = tok.token_type_ids()
        names = list(tok.token_types)
        assert np.flatnonzero(types < 0).tolist() == [tok.pad_id]
        for i, name in enumerate(tok.vocab[:-1]):
            assert name.startswith(tok.token_types[names[types[i]]])
        assert tok.position_type in names
    remi = RemiTokenizer()
    assert np.count_nonzero(remi.token_type_ids() == names_index(remi, "Beat")) == remi.positions_per_bar


def names_index(tok, name):
    return list(tok.token_types).index(name)


def remi_ids(tok, events):
    return np.array([tok.vocab.index(e) for e in events], dtype=np.int64)


NOTE = ["Note_Pitch_60", "Note_Velocity_60", "Note_Duration_120"]
NOTE2 = ["Note_Pitch_62", "Note_Velocity_60", "Note_Duration_120"]
# a piece opens with a Chord (often Chord_N_N) and a Tempo at Beat_0, as the Pop1K7 pipeline writes it
TRAIN_PIECE = (
    ["Bar_None", "Beat_0", "Chord_N_N", "Tempo_119"]
    + NOTE
    + ["Beat_8"]
    + NOTE2
    + ["Bar_None", "Beat_0"]
    + NOTE
    + ["Beat_8"]
    + NOTE2
    + ["Bar_None", "EOS_None"]
)
TEST_PIECE = ["Bar_None", "Beat_0", "Chord_N_N", "Tempo_119"] + NOTE + ["Beat_4"] + NOTE2 + ["Bar_None", "EOS_None"]


def test_position_tokens_are_conditioned_on_the_previous_position_in_their_bar():
    from musegen.metrics.loss import BAR_START, token_contexts
    from musegen.tokenizers.groove import GrooveTokenizer
    from musegen.tokenizers.groove_events import NOTE_OFF, note_on_id, serialize, shift_id
    from musegen.tokenizers.remi import RemiTokenizer

    tok = RemiTokenizer()
    ids = remi_ids(tok, TRAIN_PIECE)
    ctx = token_contexts(tok, ids)
    beats = [i for i, e in enumerate(TRAIN_PIECE) if e.startswith("Beat")]
    assert ctx[beats].tolist() == [BAR_START, ids[1], BAR_START, ids[beats[2]]]
    others = [i for i in range(1, len(ids)) if i not in beats]
    assert ctx[others].tolist() == ids[np.array(others) - 1].tolist()

    groove = GrooveTokenizer()
    ids = serialize(np.array([[1, 40, 0, 12], [1, 40, 12, 60]]))  # a bass note over the bar line
    # a time shift names tick t of the beat b beats ahead: (1, 0) to beat 1, then (2, 0) twice to beat 5
    assert ids.tolist() == [
        793,
        note_on_id(1, 40),
        shift_id(1, 0),
        NOTE_OFF + 40,
        note_on_id(1, 40),
        shift_id(2, 0),
        shift_id(2, 0),
        NOTE_OFF + 40,
        792,
    ]
    ctx = token_contexts(groove, ids)
    assert ctx[[2, 5, 6]].tolist() == [BAR_START, shift_id(1, 0), BAR_START]  # 6 reaches bar 1


def test_baselines_match_counts_worked_out_by_hand():
    from musegen.metrics.loss import TypeBaselines, uniform_allowed_nll
    from musegen.tokenizers.remi import RemiTokenizer

    tok = RemiTokenizer()
    baselines = TypeBaselines(tok, [remi_ids(tok, TRAIN_PIECE)])
    ids = remi_ids(tok, TEST_PIECE)
    unigram, conditional = baselines.nll(ids)
    # Beat: 4 seen (Beat_0 twice, Beat_8 twice) among 16 ids; Beat_0 twice at a bar start
    p_beat0, p_beat4 = 3 / 20, 1 / 20
    assert unigram[0] == pytest.approx(-np.log(p_beat0))  # target 1 is Beat_0
    assert conditional[0] == pytest.approx(-np.log((2 + p_beat0) / (2 + 1)))
    assert unigram[6] == pytest.approx(-np.log(p_beat4))  # target 7 is Beat_4, never seen after Beat_0
    assert conditional[6] == pytest.approx(-np.log((0 + p_beat4) / (2 + 1)))
    # Note_Pitch_60 after Tempo_119: seen once of the 4 pitches (86 ids); once of 1 after that Tempo
    p60 = (2 + 1) / (4 + 86)
    assert unigram[3] == pytest.approx(-np.log(p60))
    assert conditional[3] == pytest.approx(-np.log((1 + p60) / (1 + 1)))
    # uniform over what the grammar allows: the piece opens at Beat_0 with one of the 133 chords, then
    # 54 tempos, 86 pitches, 24 velocities, 17 durations; the 15 beats after beat 0; a lone Bar
    allowed = uniform_allowed_nll(tok, ids)
    assert np.exp(allowed).round().astype(int).tolist() == [1, 133, 54, 86, 24, 17, 15, 86, 24, 17, 1, 1]


def test_model_nll_given_the_type_matches_a_direct_computation(pop):
    from musegen.metrics.loss import token_nll

    shards = Shards(pop)
    tok = shards.tokenizer
    pieces = [p[:n] for p, n in zip(shards.pieces("train")[:2], (40, 25))]
    model = _ape_model(tok.vocab_size)
    type_of = tok.token_type_ids()
    scored = token_nll(model, pieces, max_len=32, pad_id=tok.pad_id, batch_size=2, type_of=type_of)
    with torch.no_grad():
        for piece, (nll, given) in zip(pieces, scored):
            ids = torch.from_numpy(piece[:33]).long()
            logp = model(ids[None, :-1])[0].log_softmax(-1).double()
            target = ids[1:]
            expected = -logp[torch.arange(len(target)), target]
            mass = torch.stack(
                [
                    logp[t, torch.from_numpy(np.flatnonzero(type_of == type_of[target[t]]))].logsumexp(0)
                    for t in range(len(target))
                ]
            )
            assert np.allclose(nll, expected.numpy(), atol=1e-4)
            assert np.allclose(given, (expected + mass).numpy(), atol=1e-4)
            assert (given <= nll + 1e-6).all()


def test_evaluate_loss_writes_the_per_type_table(pop, tmp_path):
    shards = Shards(pop)
    model = _ape_model(shards.tokenizer.vocab_size)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, model.config, shards.tokenizer, {"train_len": 32})
    result = evaluate_loss(ckpt, pop, max_len=256, split="validation", out_dir=tmp_path / "eval")
    rows = {r["type"]: r for r in result["types"]}
    assert rows["all"]["tokens"] == result["tokens"] == sum(r["tokens"] for t, r in rows.items() if t != "all")
    assert rows["all"]["model"] == pytest.approx(result["mean"])
    # real POP909 rhythm: the next beat given the current one beats the beat frequencies and a uniform guess
    assert rows["Beat"]["conditional"] < min(rows["Beat"]["unigram"], rows["Beat"]["uniform_allowed"])
    table = (tmp_path / "eval" / "token_types_valid.md").read_text()
    assert table.startswith("| type | tokens | share | model | model_given_type |") and "| Beat |" in table
    assert (tmp_path / "eval" / "token_types_valid.csv").read_text().splitlines()[0].startswith("type,tokens")
