"""The one note table: the same piece read from a file or from a miditoolkit object gives the same
table, and its roles are `musegen.music.roles`' choice."""

import miditoolkit
import numpy as np
import pytest
from conftest import DATA

from musegen.music.notes import NoteTable
from musegen.music.roles import merged_notes, read_trio

TUNES = sorted((DATA / "multitrack").glob("*.mid"))


@pytest.mark.parametrize("path", TUNES, ids=lambda p: p.stem)
def test_a_file_and_its_miditoolkit_object_give_the_same_table(path):
    read, parsed = NoteTable.read(path), NoteTable.from_miditoolkit(miditoolkit.MidiFile(path))
    order = lambda t: np.lexsort((t.pitch, t.end, t.start))
    for column in ("start", "end", "pitch", "velocity"):
        assert (getattr(read, column)[order(read)] == getattr(parsed, column)[order(parsed)]).all(), column
    assert sorted(read.role) == sorted(parsed.role)
    opening = lambda t: [qpm for tick, qpm in t.tempos if tick == 0][-1]  # the tempo in effect at tick 0
    assert opening(read) == pytest.approx(opening(parsed), rel=1e-6)


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
    midi = miditoolkit.MidiFile()
    piano = miditoolkit.Instrument(0, name="Piano")
    tpq = midi.ticks_per_beat
    piano.notes = [miditoolkit.Note(90, 60 + i, i * 2 * tpq, (i * 2 + 1) * tpq) for i in range(6)]  # bars 0,0,1,1,2,2
    midi.instruments.append(piano)
    table = NoteTable.from_miditoolkit(midi, by_role=False)
    assert (table.first_bar(), table.last_onset_bar()) == (0, 2)
    assert table.onsets_in(1, 1).pitch.tolist() == [62, 63]
    assert table.beats(table.end).tolist() == [1, 3, 5, 7, 9, 11]
    assert len(NoteTable.empty(tpq)) == 0 and NoteTable.empty(tpq).first_bar() is None
