"""Real multi-track MIDI that is not MMA (tests/data/multitrack: four Freedoom tunes, provenance in
SOURCE.md): the groove tokenizer finds bass, drums and accompaniment in files it was not made
for, and its tokens give those tracks' notes back on its grid."""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import DATA

from musegen.music.beats import round_half_even
from musegen.music.roles import BASS_PROGRAMS, merged_notes, read_trio
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_events import UNITS_PER_BEAT

FOLDER = DATA / "multitrack"
# file: (bass program, the accompaniment track the tokenizer keeps: its name, else its program)
EXPECTED = {
    "freedoom1_D_E1M6.mid": (34, "Electric Guitar (jazz)"),
    "freedoom1_D_E2M3.mid": (33, "Clean Guitar"),
    "freedoom2_D_IN_CIT.mid": (35, "dist"),
    "freedoom2_D_THEDA2.mid": (34, 29),
}


def test_every_file_is_listed_with_its_provenance_and_the_set_stays_small():
    files = sorted(p.name for p in FOLDER.glob("*.mid"))
    assert files == sorted(EXPECTED)
    source = (FOLDER / "SOURCE.md").read_text()
    assert all(name in source for name in files) and "BSD" in (FOLDER / "LICENSE").read_text() + source
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < 300_000


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_groove_tokenizer_finds_the_roles_and_keeps_their_notes(name):
    path = FOLDER / name
    tok = GrooveTokenizer()
    encoding = tok.encode(path)
    assert tok.grammar().first_violation(encoding.ids) is None
    parsed, roles, _ = read_trio(path)
    bass_program, other = EXPECTED[name]
    assert roles.layout == "inferred" and roles.bass[0].program == bass_program in BASS_PROGRAMS
    assert len(roles.drums) == 1 and roles.drums[0].is_drum
    kept = roles.busiest()[0]
    assert (kept.name if isinstance(other, str) else kept.program) == other
    assert len(roles.harmonic) >= 1 + (name != "freedoom1_D_E1M6.mid")  # a choice among several tracks
    midi = tok.decode(encoding.ids, encoding.meta).to_miditoolkit()  # the MIDI file as written
    assert [inst.name for inst in midi.instruments] == ["Bass", "Drums", "Other"]
    assert midi.instruments[0].program == bass_program
    unit = midi.ticks_per_beat // UNITS_PER_BEAT
    for inst, parts in zip(midi.instruments, (roles.bass, roles.drums, [kept])):
        source = merged_notes(parts)
        grid = np.stack(
            [round_half_even(UNITS_PER_BEAT * source[:, k], parsed.tpq) for k in (0, 1)] + [source[:, 2]], 1
        )
        decoded = np.array([(n.start // unit, n.end // unit, n.pitch) for n in inst.notes])
        zero = grid[:, 0] == grid[:, 1]  # a note shorter than half a grid step decodes one tick long
        grid[zero, 1] = grid[zero, 0]
        assert len(decoded) == len(source) > 100
        assert np.array_equal(np.unique(decoded, axis=0), np.unique(grid, axis=0)), inst.name
    assert np.array_equal(tok.encode(_dumped(midi)).ids, encoding.ids)  # read back as musegen's own layout


def _dumped(midi) -> bytes:
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()
