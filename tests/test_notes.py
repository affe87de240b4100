"""The one note table: a file reads as miditoolkit (REMI's reference reader) reads it, and its
roles are `musegen.music.roles`' choice."""

import miditoolkit
import numpy as np
import pytest
from conftest import DATA

from musegen.music.midi import load_score
from musegen.music.notes import NoteTable, Track
from musegen.music.roles import merged_notes, read_trio

TUNES = sorted((DATA / "multitrack").glob("*.mid"))


@pytest.mark.parametrize("path", TUNES, ids=lambda p: p.stem)
def test_a_file_reads_as_miditoolkit_reads_it(path):
    read, midi = NoteTable.read(path), miditoolkit.MidiFile(path)
    notes = sorted((n.start, n.end, n.pitch, n.velocity) for inst in midi.instruments for n in inst.notes)
    assert sorted(zip(*(c.tolist() for c in (read.start, read.end, read.pitch, read.velocity)))) == notes
    opening = [qpm for tick, qpm in read.tempos if tick == 0][-1]  # the tempo in effect at tick 0
    assert opening == pytest.approx([t.tempo for t in midi.tempo_changes if t.time == 0][-1], rel=1e-6)


@pytest.mark.parametrize("path", TUNES, ids=lambda p: p.stem)
def test_roles_are_the_role_rules_choice(path):
    table = NoteTable.read(path)
    _, roles, _ = read_trio(path)
    for role, parts in (("bass", roles.bass), ("drums", roles.drums)):
        expected = merged_notes(parts)
        got = table.in_role(role)
        assert len(got) == len(expected) > 0
        assert sorted(got.pitch.tolist()) == sorted(expected[:, 2].tolist())
    flat = NoteTable.read(path, by_role=False)
    assert set(flat.role) == {"drums", "other"} and len(flat.in_role("drums")) == len(table.in_role("drums"))


def test_bars_and_selection_count_in_beats():
    tpq = 480
    notes = [(i * 2 * tpq, (i * 2 + 1) * tpq, 60 + i, 90) for i in range(6)]  # bars 0,0,1,1,2,2
    table = NoteTable.of_tracks(tpq, [(Track("Piano", 0, False, "other"), notes)])
    assert (table.first_bar(), table.last_onset_bar()) == (0, 2)
    assert table.onsets_in(1, 1).pitch.tolist() == [62, 63]
    assert table.beats(table.end).tolist() == [1, 3, 5, 7, 9, 11]
    assert len(NoteTable.empty(tpq)) == 0 and NoteTable.empty(tpq).first_bar() is None


@pytest.mark.parametrize("path", TUNES, ids=lambda p: p.stem)
def test_symusic_and_the_parts_reader_give_the_same_notes(path):
    from_score = NoteTable.from_score(load_score(path))
    read = NoteTable.read(path)
    order = lambda t: np.lexsort((t.velocity, t.pitch, t.end, t.start))
    for column in ("start", "end", "pitch", "velocity"):
        assert (getattr(read, column)[order(read)] == getattr(from_score, column)[order(from_score)]).all(), column
    assert from_score.tempos[0] == pytest.approx(read.tempos[0]) and from_score.tpq == read.tpq
    assert sorted(from_score.role) == sorted(read.role)


@pytest.mark.parametrize("path", TUNES, ids=lambda p: p.stem)
def test_writing_a_table_and_reading_it_back_gives_the_table(path, tmp_path):
    table = NoteTable.read(path)
    (tmp_path / "x.mid").write_bytes(table.midi_bytes())
    back = NoteTable.read(tmp_path / "x.mid")
    order = lambda t: np.lexsort((t.velocity, t.pitch, t.end, t.start, t.track))
    for column in ("start", "end", "pitch", "velocity", "track"):
        assert (getattr(table, column)[order(table)] == getattr(back, column)[order(back)]).all(), column
    described = lambda t: [(track.name or "", track.program, track.is_drum, track.role) for track in t.tracks]
    assert described(back) == described(table)
    assert back.time_signatures == (table.time_signatures or [(0, 4, 4)])  # the writer states MIDI's default
    assert [tick for tick, _ in back.tempos] == [tick for tick, _ in table.tempos]


def test_a_table_written_by_hand_keeps_its_tracks_in_order():
    piano, drums = Track("Piano", 0, False), Track("Drums", 0, True)
    table = NoteTable.of_tracks(
        480, [(piano, [(0, 480, 60, 80), (480, 960, 64, 70)]), (drums, [(0, 60, 36, 100)])], [(0, 96.0)], [(0, 4, 4)]
    )
    assert table.track.tolist() == [0, 0, 1] and table.start.tolist() == [0, 480, 0]
    midi = table.to_miditoolkit()
    assert [(i.name, i.is_drum, len(i.notes)) for i in midi.instruments] == [("Piano", False, 2), ("Drums", True, 1)]
    assert midi.tempo_changes[0].tempo == 96.0 and midi.max_tick == 960
