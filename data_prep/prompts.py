"""Make the example prompts shipped in checkpoints/prompts/, from code and music21's corpus.

    python -m data_prep.prompts [--out checkpoints/prompts]

Nothing is copied from any dataset: the pop and groove prompts are written note by note here,
and the chorale comes from the Bach corpus bundled in the music21 wheel.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from musegen.io import write_bytes
from musegen.music.constants import TICKS_PER_BEAT as TPQ
from musegen.music.notes import NoteTable, Track

# I - V - vi - IV in C major: (bass root, chord pitches) per bar.
POP_PROGRESSION = [(48, [60, 64, 67]), (43, [59, 62, 67]), (45, [60, 64, 69]), (41, [60, 65, 69])]
# One melody line over the four bars: (beat offset from the start, pitch, length in beats).
POP_MELODY = [
    (0, 76, 1),
    (1, 74, 0.5),
    (1.5, 72, 0.5),
    (2, 74, 2),
    (4, 74, 1),
    (5, 71, 1),
    (6, 67, 2),
    (8, 72, 1),
    (9, 71, 0.5),
    (9.5, 69, 0.5),
    (10, 72, 2),
    (12, 69, 1),
    (13, 72, 1),
    (14, 77, 2),
]


def _table(tempo: float, tracks: list[tuple[Track, list[tuple[int, int, int, int]]]]) -> NoteTable:
    return NoteTable.of_tracks(TPQ, tracks, [(0, float(tempo))], [(0, 4, 4)])


def _note(pitch: int, beat: float, beats: float, velocity: int = 80) -> tuple[int, int, int, int]:
    """(start, end, pitch, velocity) in ticks."""
    start = int(round(beat * TPQ))
    return start, start + int(round(beats * TPQ)), pitch, velocity


def pop_prompt() -> NoteTable:
    """Four bars of piano: a I-V-vi-IV progression with a simple melody, 96 bpm."""
    piano = []
    for bar, (bass, chord) in enumerate(POP_PROGRESSION):
        piano.append(_note(bass, 4 * bar, 4, 70))
        for beat in (0, 2):  # the chord struck on beats 1 and 3
            piano += [_note(p, 4 * bar + beat, 2, 64) for p in chord]
    piano += [_note(p, b, d, 84) for b, p, d in POP_MELODY]
    return _table(96, [(Track("PIANO", 0, False), piano)])


def groove_prompt() -> NoteTable:
    """Two bars of a straight rock groove: bass, drums and piano comping, 110 bpm."""
    bass, drums, piano = [], [], []
    for bar, (root, chord) in enumerate(POP_PROGRESSION[:2]):
        start = 4 * bar
        bass += [_note(root - 12, start + b, 0.5, 90) for b in (0, 1.5, 2, 3)]
        piano += [_note(p, start + b, 0.5, 70) for b in (0.5, 1.5, 2.5, 3.5) for p in chord]
        drums += [_note(36, start + b, 0.25, 100) for b in (0, 2, 2.5)]  # kick
        drums += [_note(38, start + b, 0.25, 100) for b in (1, 3)]  # snare
        drums += [_note(42, start + b / 2, 0.25, 70) for b in range(8)]  # closed hi-hat
    return _table(
        110, [(Track("Bass", 33, False), bass), (Track("Drums", 0, True), drums), (Track("Piano", 0, False), piano)]
    )


def chorale_prompt(work: str = "bach/bwv66.6") -> NoteTable:
    """A 4/4 Bach chorale from music21's bundled corpus, its four voices merged onto one piano."""
    import music21

    score = music21.corpus.parse(work)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chorale.mid"
        score.write("midi", fp=str(path))
        source = NoteTable.read(path, by_role=False)
    scale = TPQ / source.tpq
    columns = (source.start, source.end, source.pitch, source.velocity)
    notes = [
        (int(start * scale), int(end * scale), pitch, velocity)
        for start, end, pitch, velocity in zip(*(c.tolist() for c in columns))
    ]
    notes.sort(key=lambda n: (n[0], n[2]))
    return _table(source.tempos[0][1] if source.tempos else 80, [(Track("PIANO", 0, False), notes)])


PROMPTS = {"pop_progression.mid": pop_prompt, "groove_rock.mid": groove_prompt, "bach_chorale.mid": chorale_prompt}


def write_prompts(out: Path) -> list[Path]:
    written = []
    for name, make in PROMPTS.items():
        write_bytes(out / name, make().midi_bytes())
        written.append(out / name)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "checkpoints" / "prompts")
    for path in write_prompts(parser.parse_args().out):
        print(path)
