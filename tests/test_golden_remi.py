"""REMI against the Pop1K7 pipeline's own output on POP909 (tests/data/golden/README.md).

The default suite compares the songs whose MIDI the repository carries; `slow` compares all
215 songs of ../shared/golden. Both also check that the grammar accepts every golden sequence
and that it survives decode -> MIDI -> encode unchanged.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import symusic
from conftest import FULL_GOLDEN, GOLDEN, POP909

from musegen.music.chords import QUALITIES, ROOT_NAMES, detect_chords
from musegen.music.midi import read_midi
from musegen.tokenizers.remi import RemiTokenizer

TOK = RemiTokenizer()
INDEX = {name: i for i, name in enumerate(TOK.vocab)}


def golden(folder: Path) -> dict[str, list[str]]:
    path = folder / "remi_pop1k7" / "pop909_events.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"no golden REMI encodings at {path} (set MUSEGEN_GOLDEN)")
    with gzip.open(path, "rt") as f:
        return {d["song"]: d["events"] for d in map(json.loads, f)}


def as_the_reference_reads_it(path: Path) -> symusic.Score | Path:
    """The file as the Pop1K7 pipeline sees it. The pipeline assumes 480 ticks per beat: it reads
    any file's ticks as if they were, and its analyzer writes the chord of beat i (chorder's beats
    of the file's own resolution) as a marker at tick 480 i. POP909 has six files at 960 ticks
    per beat; musegen reads them in beats, so for those the reference's reading is rebuilt here:
    the same ticks at 480 per beat, with those markers (which `encode` takes as the chords)."""
    score, length = read_midi(path)
    if score.tpq == 480:
        return path
    notes = [t.notes.numpy() for t in score.tracks]
    start = np.concatenate([n["time"] for n in notes]).astype(np.int64)
    end = start + np.concatenate([n["duration"] for n in notes])
    labels = detect_chords(start, end, np.concatenate([n["pitch"] for n in notes]), score.tpq, max_tick=length)
    view = score.copy()
    view.ticks_per_quarter = 480
    before = None
    for beat, (root, quality, bass) in enumerate(zip(labels.root, labels.quality, labels.bass)):
        text = (
            f"{ROOT_NAMES[root]}_{QUALITIES[quality]}_{ROOT_NAMES[bass]}" if min(root, quality, bass) >= 0 else "N_N_N"
        )
        if text != before:  # the analyzer writes a marker where the label changes
            view.markers.append(symusic.TextMeta(480 * beat, text))
            before = text
    return view


def compare(events: dict[str, list[str]], songs: Path) -> list[str]:
    """The songs whose encoding differs from the golden one, with where they first differ."""
    differ = []
    for song, expected in events.items():
        got = [TOK.vocab[i] for i in TOK.encode(as_the_reference_reads_it(songs / song / f"{song}.mid")).ids]
        if got != expected:
            k = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            differ.append(
                f"{song}: token {k}: {got[max(k - 3, 0) : k + 3]} instead of {expected[max(k - 3, 0) : k + 3]}"
            )
    return differ


def check_grammar_and_round_trip(events: dict[str, list[str]]) -> None:
    grammar = TOK.grammar()
    for song, names in events.items():
        ids = [INDEX[n] for n in names]
        assert grammar.first_violation(ids) is None, song
        assert TOK.encode(TOK.decode(ids).midi_bytes()).ids.tolist() == ids, song


def test_the_in_repo_golden_songs_encode_token_for_token():
    events = golden(GOLDEN)
    assert len(events) == 9 and all((POP909 / s / f"{s}.mid").is_file() for s in events)
    assert compare(events, POP909) == []


def test_the_grammar_accepts_the_golden_songs_and_they_survive_a_midi_round_trip():
    events = golden(GOLDEN)
    check_grammar_and_round_trip(events)
    # the patterns the old grammar refused are all there: it is a real test of the grammar
    seen = {
        "repeated chord": 0,
        "repeated tempo": 0,
        "pitch going down": 0,
        "pitch going up": 0,
        "one pitch twice in a cell": 0,
    }
    for names in events.values():
        chord = tempo = None
        cell: list[str] = []
        for name in names + ["Bar_None"]:
            if name.startswith("Chord_"):
                seen["repeated chord"] += name == chord
                chord = name
            elif name.startswith("Tempo_"):
                seen["repeated tempo"] += name == tempo
                tempo = name
            elif name.startswith("Note_Pitch_"):
                cell.append(name)
            elif name.startswith(("Beat_", "Bar_")):
                pitches = [int(p.rsplit("_", 1)[1]) for p in cell]
                seen["pitch going down"] += any(b < a for a, b in zip(pitches, pitches[1:]))
                seen["pitch going up"] += any(b > a for a, b in zip(pitches, pitches[1:]))
                seen["one pitch twice in a cell"] += len(set(pitches)) < len(pitches)
                cell = []
    assert min(seen.values()) >= 10, seen


@pytest.mark.slow
def test_all_215_golden_songs_encode_token_for_token(full_pop909):
    events = golden(FULL_GOLDEN)
    assert len(events) == 215
    differ = compare(events, full_pop909)
    print(f"REMI golden: {len(events) - len(differ)} of {len(events)} songs identical")
    assert differ == [], "\n".join(differ[:10])


@pytest.mark.slow
def test_the_grammar_accepts_all_golden_songs_and_they_survive_a_midi_round_trip():
    check_grammar_and_round_trip(golden(FULL_GOLDEN))
