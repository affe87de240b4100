"""The training data pipeline: crops, padding, step-keyed sampling, augmentation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import miditoolkit
import numpy as np
import pytest

from musegen.data import Augmenter, CropDataset, StepBatches, derive_seed
from musegen.errors import ConfigError, DataError, FormatError
from musegen.shards import Shards, resolve_split, write_shards
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_dur import GrooveDurTokenizer
from musegen.tokenizers.remi import RemiTokenizer
from musegen.training.settings import TrainConfig

MULTITRACK = Path(__file__).parent / "data" / "multitrack"


def _pieces(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 300, n) for n in lengths]


def test_crop_is_a_contiguous_window_and_padding_fills_short_pieces():
    pieces = _pieces([500, 10])
    data = CropDataset(pieces, length=64, pad_id=332, seed=1)
    for position in range(20):
        item = data[(position, 0)].numpy()
        assert item.shape == (65,)
        starts = [s for s in range(500 - 64) if np.array_equal(pieces[0][s : s + 65], item)]
        assert starts, "the crop must be a window of the piece"
    short = data[(0, 1)].numpy()
    assert np.array_equal(short[:10], pieces[1]) and np.all(short[10:] == 332)


def test_crops_depend_on_the_position_only():
    pieces = _pieces([1000])
    a = CropDataset(pieces, 32, 332, seed=5)
    b = CropDataset(pieces, 32, 332, seed=5)
    assert all(np.array_equal(a[(p, 0)], b[(p, 0)]) for p in range(10))
    starts = {
        int(
            np.flatnonzero(
                np.all(np.lib.stride_tricks.sliding_window_view(pieces[0], 33) == a[(p, 0)].numpy(), axis=1)
            )[0]
        )
        for p in range(30)
    }
    assert len(starts) > 20  # different positions crop different places
    assert CropDataset(pieces, 32, 332, crop="start")[(7, 0)].numpy().tolist() == pieces[0][:33].tolist()


def test_piece_sampling_visits_every_piece_once_per_epoch():
    batches = StepBatches([100] * 10, 16, micro=2, accumulation=1, seed=3)
    for epoch in range(3):
        seen = [batches.piece_at(epoch * 10 + i) for i in range(10)]
        assert sorted(seen) == list(range(10))
    assert [batches.piece_at(i) for i in range(10)] != [batches.piece_at(10 + i) for i in range(10)]


def test_length_sampling_follows_piece_lengths():
    lengths = [1000, 3000, 6000]
    batches = StepBatches(lengths, 10, micro=1, accumulation=1, sampling="length", seed=0)
    assert batches.epoch_size == 1000
    counts = Counter(batches.piece_at(p) for p in range(6000))
    shares = np.array([counts[i] for i in range(3)]) / 6000
    assert np.allclose(shares, [0.1, 0.3, 0.6], atol=0.02)


@pytest.mark.parametrize("world,micro", [(2, 2), (4, 1), (2, 1)])
def test_global_batch_is_the_same_for_any_number_of_processes(world, micro):
    lengths = [50 + i for i in range(13)]
    single = StepBatches(lengths, 8, micro=4, accumulation=1, seed=9)
    accumulation = 4 // (world * micro)
    ranks = [
        StepBatches(lengths, 8, micro=micro, accumulation=accumulation, rank=r, world=world, seed=9)
        for r in range(world)
    ]
    for step in range(8):
        expected = sorted(k for mb in single.step_batches(step) for k in mb)
        got = sorted(k for r in ranks for mb in r.step_batches(step) for k in mb)
        assert got == expected


def test_resumed_sampler_continues_the_stream():
    lengths = [40] * 7
    from_start = iter(StepBatches(lengths, 8, micro=2, accumulation=3, seed=1))
    stream = [next(from_start) for _ in range(3 * 10)]
    resumed = iter(StepBatches(lengths, 8, micro=2, accumulation=3, seed=1, start_step=4))
    assert [next(resumed) for _ in range(3 * 6)] == stream[3 * 4 :]


def test_bad_sampler_settings():
    with pytest.raises(DataError):
        StepBatches([], 8, 1, 1)
    with pytest.raises(ConfigError):
        StepBatches([10], 8, 1, 1, sampling="bogus")
    with pytest.raises(ConfigError):
        CropDataset([np.arange(5)], 4, 0, crop="middle")


def test_seeds_are_independent_streams():
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert 0 <= derive_seed(2**40, 5) < 2**63


def test_validation_split_spellings():
    assert resolve_split(["train", "validation"], "valid") == "validation"
    assert resolve_split(["train", "valid"], "validation") == "valid"
    assert resolve_split(["train", "test"], "valid") is None
    assert resolve_split(["train", "test"], "test") == "test"


# ---- shards that do not fit their tokenizer ------------------------------------------------------


def _shards_with(folder, pieces, tok=None):
    """A prepared folder holding `pieces` (lists of ids) as its train split."""
    write_shards(
        folder, tok or RemiTokenizer(), {"train": [(f"p{i}", np.asarray(p)) for i, p in enumerate(pieces)]}, {}
    )
    return folder


@pytest.mark.parametrize("bad_id", [333, 30000, -1])
def test_shard_ids_outside_the_vocabulary_are_refused_in_one_line(bad_id, tmp_path, pop909_songs):
    tok = RemiTokenizer()
    good = tok.encode(pop909_songs[0]).ids[:50].tolist()
    folder = _shards_with(tmp_path / "s", [good, good[:10] + [bad_id] + good[10:]])
    with pytest.raises(
        DataError, match=rf"token id {bad_id} \(piece 'p1'\) is outside the tokenizer's vocabulary 0..332"
    ):
        Shards(folder).pieces("train")


def test_float_shards_and_malformed_indexes_are_refused(tmp_path):
    import json

    folder = _shards_with(tmp_path / "s", [[1, 2, 3], [4, 5]])
    index = json.loads((folder / "index.json").read_text())
    npy = folder / index["splits"]["train"]["file"]
    np.save(npy, np.array([1, 2, np.nan, 4, 5]))  # what a NaN id would look like
    with pytest.raises(DataError, match="integer token ids, got float64"):
        Shards(folder).pieces("train")
    for name, (edit, error, words) in {
        "offsets as text": (lambda e: e.update(offsets=["0", "3"]), FormatError, r"splits.train.offsets.0"),
        "a path outside the folder": (lambda e: e.update(file="../elsewhere.npy"), FormatError, "splits.train.file"),
        "overlapping pieces": (lambda e: e.update(offsets=[0, 1]), FormatError, r"splits.train: offsets.1 is 1, not 3"),
        "fewer names than pieces": (lambda e: e.update(names=["a"]), FormatError, "1 names, 2 offsets and 2 lengths"),
        "another file of the folder": (lambda e: e.update(file="index.json"), FormatError, "splits.train.file"),
    }.items():
        broken = json.loads(json.dumps(index))
        edit(broken["splits"]["train"])
        (folder / "index.json").write_text(json.dumps(broken))
        with pytest.raises(error, match=words):
            Shards(folder).pieces("train")
    (folder / "index.json").write_text(json.dumps(index))
    npy.write_text("tokens, they said")
    with pytest.raises(DataError, match="not a .npy file of token ids"):
        Shards(folder).pieces("train")
    (folder / "index.json").write_text(json.dumps({**index, "tokenizer": "groove"}))
    with pytest.raises(DataError, match="made with the groove tokenizer, but tokenizer.json is remi"):
        Shards(folder)
    (folder / "index.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(FormatError, match="index.json: not valid JSON"):
        Shards(folder)
    (folder / "index.json").write_text(json.dumps(index))
    (folder / "tokenizer.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(FormatError, match="tokenizer.json: not valid JSON"):
        Shards(folder)


# ---- augmentation on real music -------------------------------------------------------------


@pytest.fixture(scope="module")
def remi_songs(pop909_songs):
    tok = RemiTokenizer()
    return tok, [tok.encode(p).ids.astype(np.int64) for p in pop909_songs[:4]]


def _remi_pitches(tok, ids):
    return np.array([tok.pitch_of[i] for i in ids if tok.pitch_of[i] >= 0])


def test_remi_transposition_is_an_exact_shift_within_range(remi_songs):
    tok, songs = remi_songs
    aug = Augmenter.for_tokenizer(tok)
    shifts = Counter()
    for k, song in enumerate(songs):
        for position in range(25):
            rng = np.random.default_rng(derive_seed(k, position))
            window = song[position * 50 : position * 50 + 400]
            out = aug.after_crop(window, rng)
            matches = [s for s in range(-6, 7) if np.array_equal(tok.transpose(window, s), out)]
            assert matches, "augmentation must be one of the tokenizer's transpositions"
            shift = matches[0]
            shifts[shift] += 1
            assert np.array_equal(tok.transpose(out, -shift), window)  # +k then -k is the identity
            assert np.array_equal(_remi_pitches(tok, out), _remi_pitches(tok, window) + shift)
    assert len(shifts) >= 10 and min(shifts) < 0 < max(shifts)


def test_remi_transposition_redraws_shifts_that_leave_the_range(remi_songs):
    tok, songs = remi_songs
    aug = Augmenter.for_tokenizer(tok)
    top = int(tok.vocab.index("Note_Pitch_105"))  # 2 semitones below the top of the range
    window = songs[0][:300].copy()
    window[np.flatnonzero(tok.pitch_of[window] >= 0)[0]] = top
    for seed in range(40):
        out = aug.after_crop(window, np.random.default_rng(seed))
        shift = int(_remi_pitches(tok, out)[0]) - 105
        assert shift <= 2 and tok.transpose(window, shift) is not None


def _groove_midi(bars=8):
    """Bass, drums and piano, one note per beat each, built in the test."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    bass = miditoolkit.Instrument(33, name="bass")
    drums = miditoolkit.Instrument(0, is_drum=True, name="drums")
    piano = miditoolkit.Instrument(0, name="piano")
    for beat in range(bars * 4):
        t = beat * 480
        bass.notes.append(miditoolkit.Note(90, 36 + beat % 5, t, t + 240))
        drums.notes.append(miditoolkit.Note(90, 36 if beat % 2 else 42, t, t + 60))
        piano.notes.append(miditoolkit.Note(80, 60 + beat % 7, t, t + 400))
    midi.instruments = [bass, drums, piano]
    return midi


def _encoded_trio(tmp_path_factory, tok):
    """(tok, ids) of `_groove_midi()` written to a file and encoded by `tok`."""
    path = tmp_path_factory.mktemp(tok.kind) / "trio.mid"
    _groove_midi().dump(str(path))
    return tok, tok.encode(path).ids.astype(np.int64)


@pytest.fixture(scope="module")
def groove_piece(tmp_path_factory):
    return _encoded_trio(tmp_path_factory, GrooveTokenizer())


def test_groove_augmentation_keeps_drums_keeps_a_track_and_stays_grammatical(groove_piece):
    tok, ids = groove_piece
    aug = Augmenter.for_tokenizer(tok)
    original = tok.notes(ids)
    grammar = tok.grammar()
    dropped_some, skipped_some = False, False
    for seed in range(40):
        rng = np.random.default_rng(seed)
        out = aug.after_crop(aug.before_crop(ids, rng), rng)
        assert grammar.first_violation(out) is None
        notes = tok.notes(out)
        tracks = set(notes[:, 0].tolist())
        assert tracks, "at least one track survives"
        dropped_some |= len(tracks) < 3
        skipped_some |= notes[:, 3].max() < original[:, 3].max()
        if 2 in tracks:  # drums are never transposed
            drum_pitches = set(notes[notes[:, 0] == 2, 1].tolist())
            assert drum_pitches <= {36, 42}
    assert dropped_some and skipped_some


@pytest.fixture(scope="module")
def groove_dur_piece(tmp_path_factory):
    return _encoded_trio(tmp_path_factory, GrooveDurTokenizer())


def test_map_drums_moves_only_drum_pitches_and_its_inverse_restores_the_ids():
    tok = GrooveDurTokenizer()
    ids = tok.encode(MULTITRACK / "freedoom1_D_E1M6.mid").ids.astype(np.int64)  # real drums, hits at one onset
    kit = np.arange(128)
    kit[35:82] = np.random.default_rng(0).permutation(np.arange(35, 82))
    moved = tok.map_drums(ids, kit)
    assert tok.grammar().first_violation(moved) is None
    before, after = tok.notes(ids), tok.notes(moved)
    expected = before.copy()
    drums = expected[:, 0] == 2
    assert drums.sum() > 100 and len(np.unique(before[drums, 2])) < drums.sum()  # some hits share an onset
    expected[drums, 1] = kit[expected[drums, 1]]
    order = np.lexsort((expected[:, 3], expected[:, 1], expected[:, 0], expected[:, 2]))
    assert np.array_equal(after, expected[order])
    assert not np.array_equal(moved, ids)
    assert np.array_equal(tok.map_drums(moved, np.argsort(kit)), ids)


def test_kit_shuffle_keeps_each_drums_rhythm_on_a_new_gm_key(groove_dur_piece):
    tok, ids = groove_dur_piece
    aug = Augmenter(tok, kit_shuffle=0.5)
    original = tok.notes(ids)
    kits, shuffled = set(), 0
    for seed in range(60):
        notes = tok.notes(aug.before_crop(ids, np.random.default_rng(seed)))
        assert np.array_equal(notes[notes[:, 0] != 2], original[original[:, 0] != 2])  # bass and piano untouched
        was, now = original[original[:, 0] == 2], notes[notes[:, 0] == 2]
        assert np.array_equal(was[:, 2:], now[:, 2:])  # the same hits at the same times
        pairs = set(zip(was[:, 1].tolist(), now[:, 1].tolist()))
        assert len(pairs) == 2 and len({b for _, b in pairs}) == 2  # one new key per old key, none shared
        assert all(35 <= b <= 81 for _, b in pairs)
        kits.add(tuple(sorted(pairs)))
        shuffled += pairs != {(36, 36), (42, 42)}
    assert 20 <= shuffled <= 40 and len(kits) > 15


def _bass(notes: np.ndarray) -> set[tuple[int, int]]:
    return {(p, o) for t, p, o, _ in notes.tolist() if t == 1}


def test_double_bass_strikes_a_second_bass_note_above_each_one_and_leaves_the_rest():
    tok = GrooveDurTokenizer()
    ids = tok.encode(MULTITRACK / "freedoom1_D_E1M6.mid").ids.astype(np.int64)  # a real bass line
    before = tok.notes(ids)
    single = _bass(before)
    assert len(single) > 100
    doubled = tok.double_bass(ids, 12)
    assert tok.grammar().first_violation(doubled) is None
    after = tok.notes(doubled)
    assert _bass(after) == single | {(p + 12, o) for p, o in single}
    assert np.array_equal(after[after[:, 0] != 1], before[before[:, 0] != 1])  # drums and other untouched
    lengths = {(p, o): off - o for t, p, o, off in after.tolist() if t == 1}
    held = [lengths[p + 12, o] == lengths[p, o] for p, o in single if (p + 12, o) not in single]
    assert np.mean(held) > 0.9  # held as long as the note it doubles (but where its slot's next note cuts it)


def test_bass_doubling_doubles_about_its_share_of_pieces_each_at_one_interval(groove_dur_piece):
    tok, ids = groove_dur_piece
    aug = Augmenter(tok, bass_doubling=0.5)
    original = tok.notes(ids)
    single = _bass(original)
    intervals = []
    for seed in range(40):
        notes = tok.notes(aug.before_crop(ids, np.random.default_rng(seed)))
        assert np.array_equal(notes[notes[:, 0] != 1], original[original[:, 0] != 1])
        added = _bass(notes) - single
        if added:
            steps = {p - q for p, o in added for q, o2 in single if o2 == o}
            assert len(steps) == 1 and len(added) == len(single)  # every bass note, at one interval
            intervals += steps
    assert 12 <= len(intervals) <= 28
    assert set(intervals) <= set(range(3, 13)) and len(set(intervals)) > 4


def test_kit_shuffle_is_refused_where_it_cannot_apply(remi_songs):
    tok, _ = remi_songs
    assert Augmenter.for_tokenizer(tok, kit_shuffle=0.0).kit_shuffle == 0.0
    with pytest.raises(ConfigError, match="kit_shuffle: the remi representation cannot do this augmentation"):
        Augmenter.for_tokenizer(tok, kit_shuffle=0.5)
    with pytest.raises(ConfigError, match="needs augment=true"):
        TrainConfig(kit_shuffle=0.5, augment=False)
    with pytest.raises(FormatError, match=r"kit_shuffle must be in 0..1"):
        TrainConfig(kit_shuffle=1.5)
    with pytest.raises(ConfigError, match="bass_doubling: the remi representation cannot do this augmentation"):
        Augmenter.for_tokenizer(tok, bass_doubling=0.5)
    with pytest.raises(ConfigError, match="needs augment=true"):
        TrainConfig(bass_doubling=0.5, augment=False)


def test_crops_of_a_model_of_beats_carry_each_tokens_onset_and_train_it():
    import torch
    from conftest import pop909_files

    from musegen.data import batch_inputs
    from musegen.model.config import preset
    from musegen.model.transformer import MusicPerformer

    tok = RemiTokenizer()
    song = tok.encode(pop909_files(1)[0]).ids
    short = song[: song.tolist().index(tok.bar_id, 200)]  # shorter than a crop: padded
    augmenter = Augmenter.for_tokenizer(tok)  # REMI's transposition: the onsets stay
    data = CropDataset([song, short], 256, tok.pad_id, seed=2, augmenter=augmenter, onsets=tok.onsets)
    ids, beats = data[(3, 0)]
    assert ids.shape == beats.shape == (257,) and beats.dtype == torch.float64
    assert beats[0] == 0 and (beats.diff() >= 0).all() and beats[-1] > 8  # several bars of the song
    where = np.flatnonzero(ids.numpy() == tok.bar_id)
    assert (np.diff(beats.numpy()[where]) == 4).all()  # from one bar line to the next: 4 beats
    ids, beats = CropDataset([short], 256, tok.pad_id, onsets=tok.onsets)[(4, 0)]
    n = len(short)
    assert (ids[n:] == tok.pad_id).all() and (beats[n:] == beats[n - 1]).all()
    assert torch.equal(beats[:n], torch.from_numpy(tok.onsets(short)))  # the whole short piece: crop at 0
    # a batch as the trainer reads it, into a model of beats, with a gradient
    batch = torch.utils.data.default_collate([data[(k, k % 2)] for k in range(3)])
    ids, beats, _ = batch_inputs(batch, torch.device("cpu"))
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size, positions="beats", window=8))
    model(ids[:, :-1], beats[:, :-1]).logsumexp(-1).mean().backward()
    assert model.spe.freqs.grad.abs().sum() > 0


def _mirrored_families() -> np.ndarray:
    """Each General MIDI family's 8 programs in reverse order: any two tracks of one family that
    share a cell trade places in it."""
    program = np.arange(128)
    return 8 * (program // 8) + 7 - program % 8


def test_map_programs_moves_every_track_with_its_notes_and_its_inverse_restores_the_ids():
    from musegen.tokenizers import tokenizer_from_dict

    tok = tokenizer_from_dict({"kind": "song"})
    ids = tok.encode(MULTITRACK / "freedoom1_D_E2M3.mid").ids.astype(np.int64)  # guitars 26, 30, 30; leads 80, 81
    programs = _mirrored_families()
    moved = tok.map_programs(ids, programs)
    assert tok.grammar().first_violation(moved) is None
    assert len(moved) == len(ids) and not np.array_equal(moved, ids)
    before, after = tok.decode(ids), tok.decode(moved)

    def notes(table, program_of=lambda p: p):
        rows = zip(table.start, table.end, table.pitch, table.velocity, table.track)
        tracks = table.tracks
        return sorted(
            (s, e, p, v, -1 if tracks[t].is_drum else program_of(tracks[t].program), tracks[t].name.endswith(" 2"))
            for s, e, p, v, t in (tuple(map(int, row)) for row in rows)
        )

    assert notes(after) == notes(before, lambda p: int(programs[p]))  # every note kept, on its new instrument
    assert {t.program for t in after.tracks if not t.is_drum} == {3, 29, 25, 38, 55, 87, 86}
    # renaming the tracks alone breaks the order of some cell's tracks: the notes had to move too
    track = tok.program_of[ids]
    renamed = ids.copy()
    slot, program = np.divmod(track[track > 0] - 1, 128)
    renamed[track > 0] = tok.program_ids[1 + slot * 128 + programs[program]]
    assert tok.grammar().first_violation(renamed) is not None
    assert np.array_equal(tok.map_programs(moved, np.argsort(programs)), ids)


def test_instrument_shuffle_keeps_each_track_in_its_family_and_its_drums(tmp_path):
    from musegen.tokenizers import tokenizer_from_dict

    tok = tokenizer_from_dict({"kind": "song"})
    ids = tok.encode(MULTITRACK / "freedoom2_D_IN_CIT.mid").ids.astype(np.int64)
    original = tok.decode(ids)
    aug = Augmenter.for_tokenizer(tok, instrument_shuffle=0.5)
    assert aug.max_shift == 6  # the representation's own augmentation stays
    kept = {t.program for t in original.tracks if not t.is_drum}
    seen, shuffled = set(), 0
    for seed in range(40):
        shuffled_ids = aug.before_crop(ids, np.random.default_rng(seed))
        assert tok.grammar().first_violation(shuffled_ids) is None
        table = tok.decode(shuffled_ids)
        programs = {t.program for t in table.tracks if not t.is_drum}
        assert sorted(p // 8 for p in programs) == sorted(p // 8 for p in kept)  # the same families
        assert len(table) == len(original) and np.array_equal(np.sort(table.pitch), np.sort(original.pitch))
        drums = [t for t in table.tracks if t.is_drum]
        assert len(drums) == sum(t.is_drum for t in original.tracks)
        shuffled += programs != kept
        seen |= programs
    assert 10 <= shuffled <= 30 and len(seen) > 2 * len(kept)


def test_instrument_shuffle_is_refused_where_it_cannot_apply(remi_songs):
    tok, _ = remi_songs
    with pytest.raises(ConfigError, match="instrument_shuffle: the remi representation cannot do this augmentation"):
        Augmenter.for_tokenizer(tok, instrument_shuffle=0.5)
    with pytest.raises(ConfigError, match="instrument_shuffle is an augmentation: it needs augment=true"):
        TrainConfig(instrument_shuffle=0.5, augment=False)
    with pytest.raises(FormatError, match=r"instrument_shuffle must be in 0..1"):
        TrainConfig(instrument_shuffle=-0.1)
