"""The song representation: every track with its program, each bar's meter, tempos; compared with
MidiTok's REMI (programs, time signatures, tempos) on real files, and round trips on real files
and on MIDI built here with meter changes."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import symusic

from musegen.errors import MidiError
from musegen.music.beats import synchronise
from musegen.music.notes import NoteTable, Track
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.song_vocab import METERS, TEMPOS

REPO = Path(__file__).resolve().parents[1]
MULTITRACK = sorted((REPO / "tests" / "data" / "multitrack").glob("*.mid"))
PROMPTS = sorted((REPO / "checkpoints" / "prompts").glob("*.mid"))
TPQ = 480
U = TPQ // 12  # ticks per unit


@pytest.fixture(scope="module")
def song():
    return tokenizer_from_dict({"kind": "song"})


def names(tok, ids) -> list[str]:
    return [tok.vocab[int(i)] for i in ids]


def song_events(tok, ids):
    """Each bar's meter, and every note as (bar, position in 12ths of a quarter, program, pitch,
    duration in 12ths of a quarter)."""
    bars, notes = [], Counter()
    for name in names(tok, ids):
        kind, _, value = name.partition("_")
        if kind == "Bar":
            bars.append(None)
        elif kind == "TimeSig":
            bars[-1] = tuple(map(int, value.split("/")))
        elif kind == "Position":
            position = int(value)
        elif kind == "Program":
            program = int(value.split(".")[0])
        elif kind in ("Pitch", "Drum"):
            pitch = int(value)
        elif kind == "Duration":
            notes[(len(bars) - 1, position, program, pitch, min(int(value), 96))] += 1
    return bars, notes


def miditok_events(tokens):
    """The same from MidiTok's REMI tokens, whose positions and durations count in the meter's
    beat (an 8th in x/8) at 12 per beat."""
    bars, notes = [], Counter()
    per_quarter = Fraction(12)
    for token in tokens:
        kind, _, value = token.partition("_")
        if kind == "Bar":
            bars.append(None)
        elif kind == "TimeSig":
            numerator, denominator = map(int, value.split("/"))
            bars[-1] = (numerator, denominator)
            per_quarter = Fraction(12 * denominator, 4)
        elif kind == "Position":
            position = Fraction(int(value)) * 12 / per_quarter
        elif kind == "Program":
            program = int(value)
        elif kind in ("Pitch", "PitchDrum"):
            pitch = int(value)
        elif kind == "Duration":
            beats, steps, resolution = map(int, value.split("."))
            length = (beats + Fraction(steps, resolution)) * 12 * 12 / per_quarter
            notes[(len(bars) - 1, position, program, pitch, min(length, 96))] += 1
    return bars, notes


def synchronised_pop909(path: Path) -> bytes:
    beats = np.loadtxt(path.parent / "beat_midi.txt", ndmin=2)
    return synchronise(symusic.Score(str(path)), beats[:, 0], beats[:, 2] == 1, meters=True).dumps_midi()


def built(tracks, time_signatures, tempos=((0, 120.0),)) -> bytes:
    return NoteTable.of_tracks(TPQ, tracks, list(tempos), list(time_signatures)).midi_bytes()


# ---- MidiTok ------------------------------------------------------------------------------------


def test_the_tokens_agree_with_miditok_remi_note_for_note_on_real_files(song, pop909_songs, tmp_path):
    """Bars, meters, positions, programs and pitches are MidiTok's; a duration differs only where
    this tokenizer keeps the longest of unison notes or ends a note where its pitch starts again
    (counted in its report), which MidiTok leaves as they are."""
    miditok = pytest.importorskip("miditok")
    config = miditok.TokenizerConfig(
        use_programs=True,
        one_token_stream_for_programs=True,
        use_time_signatures=True,
        use_tempos=True,
        beat_res={(0, 8): 12},
        remove_duplicated_notes=True,
        time_signature_range={4: list(range(1, 9)), 8: list(range(1, 17)), 2: list(range(1, 5))},
    )
    remi = miditok.REMI(config)
    files = [*MULTITRACK, *PROMPTS]
    for song_file in pop909_songs[:3]:  # re-timed to their annotated beats, in their own meters
        files.append(tmp_path / f"{song_file.stem}.mid")
        files[-1].write_bytes(synchronised_pop909(song_file))
    compared = 0
    for path in files:
        encoding = song.encode(path)
        bars, notes = song_events(song, encoding.ids)
        their_bars, theirs = miditok_events(remi.encode(symusic.Score(str(path))).tokens)
        lead = min(key[0] for key in theirs)  # MidiTok keeps the empty bars before the first note
        theirs = Counter({(key[0] - lead, *key[1:]): n for key, n in theirs.items()})
        assert their_bars[lead : lead + len(bars)] == bars, path.name
        # MidiTok merges the tracks of one program, keeping one of their notes that coincide
        onsets, their_onsets = Counter(), Counter()
        for key, n in notes.items():
            onsets[key[:4]] += n
        for key, n in theirs.items():
            their_onsets[key[:4]] += n
        assert set(onsets) == set(their_onsets) and all(n == 1 for n in their_onsets.values()), path.name
        single = {key for key, n in onsets.items() if n == 1}
        ours = Counter({key: n for key, n in notes.items() if key[:4] in single})
        differing = sum((ours - theirs).values())
        assert differing <= encoding.report["notes_cut"] + encoding.report["notes_merged"], path.name
        compared += sum(ours.values())
    assert compared > 15_000


# ---- round trips ----------------------------------------------------------------------------------


def quantised(piece: NoteTable, origin: int = 0) -> Counter:
    """(onset, pitch, program, drum) of each note on the 12-per-quarter grid, halves up."""
    to_units = lambda ticks: (24 * ticks + piece.tpq) // (2 * piece.tpq)  # noqa: E731
    programs = np.array([-1 if t.is_drum else t.program for t in piece.tracks])
    rows = zip(to_units(piece.start).tolist(), piece.pitch.tolist(), programs[piece.track].tolist())
    return Counter((onset - origin, pitch, program) for onset, pitch, program in rows)


@pytest.mark.parametrize("path", MULTITRACK + PROMPTS, ids=lambda p: p.name)
def test_real_files_keep_every_note_bar_meter_and_tempo(song, path):
    encoding = song.encode(path)
    piece = song.decode(encoding.ids)
    assert list(song.encode(piece.midi_bytes()).ids) == list(encoding.ids)  # canonical
    source = NoteTable.read(path, by_role=False)
    drums = np.array([t.is_drum for t in source.tracks])
    in_range = drums[source.track] | ((source.pitch >= 21) & (source.pitch <= 108))
    if drums.any():
        in_range &= ~drums[source.track] | ((source.pitch >= 27) & (source.pitch <= 87))
    first_bar = int(np.min(source.start)) * 12 // source.tpq // 48 * 48  # these files are in 4/4
    expected = quantised(source.select(in_range), first_bar)
    got = quantised(piece)
    assert +(expected - got) == Counter() or sum((expected - got).values()) <= encoding.report["notes_merged"]
    assert set(got) <= set(expected)
    # the bars and meter: every decoded time signature is the file's
    assert {(n, d) for _, n, d in piece.time_signatures} == {(n, d) for _, n, d in source.time_signatures} | (
        set() if source.time_signatures else {(4, 4)}
    )
    # the tempo in effect at the first note, within the grid's half step (0.73%)
    tempo_at = [q for t, q in source.tempos if t <= source.start.min()]
    if tempo_at:
        assert abs(piece.tempos[0][1] / tempo_at[-1] - 1) < 0.0073


def test_meter_changes_triplets_and_tempos_are_kept_exactly(song):
    """4/4, a lone 2/4 bar, 3/4, two bars of 6/8, 5/4, 12/8, 2/2: every bar line where the file
    has it, triplets and 16ths on the grid, each tempo change at its cell."""
    meters = [(4, 4), (2, 4), (3, 4), (6, 8), (6, 8), (5, 4), (12, 8), (2, 2)]
    starts = np.cumsum([0] + [n * 4 * TPQ // d for n, d in meters])
    signatures = [(int(s), n, d) for s, (n, d) in zip(starts, meters)]
    piano, bass, drums = [], [], []
    for bar, (start, (n, d)) in enumerate(zip(starts, meters)):
        beat = 4 * TPQ // d
        for k in range(n):
            t = int(start) + k * beat
            drums.append((t, t + U * 3, 36 if k == 0 else 42, 100))
            bass.append((t, t + beat - U, 40 + bar, 90))
        for k in range(3):  # a triplet of 8ths on the first beat
            t = int(start) + k * 4 * U
            piano.append((t, t + 4 * U, 60 + k + bar, 70))
        piano.append((int(start) + 3 * TPQ // 2 + 3 * U, int(start) + 3 * TPQ // 2 + 6 * U, 72, 60))  # a 16th
    tempos = [(0, 96.0), (int(starts[2]), 132.0), (int(starts[5]) + TPQ, 70.0)]
    tracks = [(Track("piano", 0, False), piano), (Track("bass", 33, False), bass), (Track("kit", 0, True), drums)]
    data = built(tracks, signatures, tempos)
    encoding = song.encode(data)
    assert encoding.report["bars"] == len(meters) and encoding.report["notes_cut"] == 0
    piece = song.decode(encoding.ids)
    assert piece.time_signatures == [(s * 1, n, d) for s, n, d in signatures if (n, d) != (6, 8) or s == starts[3]]
    assert [t for t, _ in piece.tempos] == [t for t, _ in tempos]
    assert all(abs(q / want - 1) < 0.0073 for (_, q), (_, want) in zip(piece.tempos, tempos))
    source = NoteTable.read(data, by_role=False)
    rows = lambda p: sorted(  # noqa: E731
        (s, e, pitch, -1 if p.tracks[t].is_drum else p.tracks[t].program)
        for s, e, pitch, t in zip(p.start.tolist(), p.end.tolist(), p.pitch.tolist(), p.track.tolist())
    )
    assert rows(piece) == rows(source)
    bar_lines = np.flatnonzero(encoding.ids == song.bar_id)
    assert [song.vocab[int(encoding.ids[i + 1])] for i in bar_lines] == [f"TimeSig_{n}/{d}" for n, d in meters]


def test_tracks_of_one_instrument_decode_as_numbered_tracks(song):
    sections = [(Track(None, 48, False), [(k * TPQ, (k + 1) * TPQ, pitch, 80) for k in range(4)]) for pitch in (72, 48)]
    piece = song.decode(song.encode(built(sections, [(0, 4, 4)])).ids)
    assert [(t.name, t.program) for t in piece.tracks] == [("String Ensemble 1", 48), ("String Ensemble 1 (2)", 48)]


def test_a_meter_or_a_cut_bar_off_the_8th_grid_is_refused_naming_the_bar(song):
    notes = [(k * TPQ, k * TPQ + TPQ, 60, 80) for k in range(12)]
    odd = built([(Track("p", 0, False), notes)], [(0, 4, 4), (4 * TPQ, 5, 16)])
    with pytest.raises(MidiError, match=r"^<bytes>: bar 2 is in 5/16, a meter the song tokens do not have"):
        song.encode(odd)
    cut = built([(Track("p", 0, False), notes)], [(0, 4, 4), (4 * TPQ, 4, 4), (4 * TPQ + 5 * TPQ // 4, 3, 4)])
    with pytest.raises(MidiError, match=r"^<bytes>: bar 2 is cut to 1\.25 beats by the next time signature"):
        song.encode(cut)
    lone = built([(Track("p", 0, False), notes)], [(0, 4, 4), (4 * TPQ, 2, 4), (6 * TPQ, 4, 4)])
    meters = [n for n in names(song, song.encode(lone).ids) if n.startswith("TimeSig")]
    assert meters == ["TimeSig_4/4", "TimeSig_2/4", "TimeSig_4/4", "TimeSig_4/4"]  # the lone 2/4 bar, exactly


def test_pop909_songs_in_their_annotated_meters(song, pop909_songs):
    """POP909 re-timed with its annotated bar lengths: songs with 2-, 3-, 5- or 6-beat bars keep
    them as bars of their own."""
    seen = Counter()
    for path in pop909_songs:
        encoding = song.encode(synchronised_pop909(path))
        beats = np.loadtxt(path.parent / "beat_midi.txt", ndmin=2)
        annotated = Counter(np.diff(np.flatnonzero(beats[:, 2] == 1)).tolist())
        written = Counter(n for n, d in song.meter_of_bars(encoding.ids))
        # every annotated bar length the song's notes reach is written as a bar of that many beats
        assert set(written) - {1, 2, 3} <= set(annotated) | {4}
        seen.update(written)
    assert seen[4] > 1000 and len(seen) >= 3


# ---- what a sampler may write -------------------------------------------------------------------


def test_the_sampler_keeps_the_meter_the_band_and_the_bar(song, tmp_path):
    grammar = song.grammar()
    waltz = built(
        [
            (Track("bass", 32, False), [(k * 3 * TPQ, k * 3 * TPQ + TPQ, 40, 90) for k in range(4)]),
            (Track("piano", 0, False), [(k * TPQ, k * TPQ + TPQ, 64, 70) for k in range(12) if k % 3]),
        ],
        [(0, 3, 4)],
    )
    ids = list(song.encode(waltz).ids[:-1])  # without End
    state = grammar.states(ids)[-1]
    assert grammar.sampling_mask(state)[song.end_id]  # after a note the piece may end
    bar = grammar.step(state, song.bar_id)
    meters = np.flatnonzero(grammar.sampling_mask(bar))
    assert names(song, meters) == ["TimeSig_3/4"]  # the meter goes on
    assert grammar.allowed(bar)[song.meter_ids].all()  # (the data may change it)
    in_bar = grammar.step(bar, song.meter_ids[METERS.index((3, 4))])
    allowed = names(song, np.flatnonzero(grammar.sampling_mask(in_bar)))
    assert allowed == [f"Position_{u}" for u in range(36)]  # no onset past the 3/4 bar, no empty bar
    cell = grammar.step(in_bar, song.position_ids[0])
    programs = [n for n in names(song, np.flatnonzero(grammar.sampling_mask(cell))) if n.startswith("Program")]
    assert programs == ["Program_0", "Program_32"]  # the band goes on
    assert grammar.allowed(cell)[song.program_ids].sum() > 100  # (the data may bring in anyone)
    tempo = grammar.step(cell, song.tempo_ids[10])
    assert not grammar.sampling_mask(tempo)[song.position_ids].any()  # a Tempo has notes after it
    assert len(TEMPOS) == len(song.tempo_token_ids())
    assert song.vocab[song.tempo_token(96)] == "Tempo_96.63"


@pytest.mark.parametrize(
    "meters, held",
    [
        ([(4, 4), (4, 4), (2, 4)], (4, 4)),  # a lone 2-beat bar closing a phrase: back to 4/4
        ([(4, 4), (3, 4), (3, 4)], (3, 4)),  # a change that has held for two bars is the meter
        ([(1, 4), (3, 4), (3, 4), (6, 4)], (3, 4)),  # a pickup, then 3/4, then one bar of 6/4
        ([(4, 4), (2, 4)], (2, 4)),  # no two bars alike yet: the last bar's
        ([(6, 8)], (6, 8)),
    ],
)
def test_the_sampler_keeps_the_meter_of_the_last_two_bars_alike(song, meters, held):
    """After a prompt whose bars are in `meters` (a note on each beat), the only TimeSig the
    sampler may write, bar after bar."""
    grammar = song.grammar()
    starts = np.cumsum([0] + [n * 4 * TPQ // d for n, d in meters])
    notes = [(int(t), int(t) + TPQ // 2, 60, 80) for a, b in zip(starts, starts[1:]) for t in range(a, b, TPQ // 2)]
    piece = built([(Track("piano", 0, False), notes)], [(int(s), n, d) for s, (n, d) in zip(starts, meters)])
    state = grammar.states(list(song.encode(piece).ids[:-1]))[-1]
    for _ in range(2):  # the meter it holds does not move as it writes its own bars
        state = grammar.step(state, song.bar_id)
        assert names(song, np.flatnonzero(grammar.sampling_mask(state))) == [f"TimeSig_{held[0]}/{held[1]}"]
        while True:  # a bar of one note: the first token the sampler may write, then the bar line
            allowed = np.flatnonzero(grammar.sampling_mask(state))
            if song.bar_id in allowed:
                break
            state = grammar.step(state, int(allowed[0]))


def test_onsets_count_beats_through_meter_changes(song):
    """A model whose positions are beats reads each token's onset: bars as long as their meter."""
    meters = [(3, 4), (6, 8), (5, 4)]
    starts = np.cumsum([0] + [n * 4 * TPQ // d for n, d in meters])
    notes = [(int(s) + TPQ // 3, int(s) + TPQ, 60, 80) for s in starts[:-1]]  # an 8th-triplet in
    ids = song.encode(built([(Track("p", 0, False), notes)], [(int(s), n, d) for s, (n, d) in zip(starts, meters)])).ids
    onsets = song.onsets(ids)
    assert len(onsets) == len(ids) and (np.diff(onsets) >= 0).all()
    at_notes = onsets[np.flatnonzero(song.pitch_of[ids] >= 0)]
    np.testing.assert_allclose(at_notes, starts[:-1] / TPQ + 1 / 3)  # 0 + 1/3, 3 + 1/3, 6 + 1/3 beats
    np.testing.assert_allclose(onsets[ids == song.bar_id], starts[:-1] / TPQ)
