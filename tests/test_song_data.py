"""The song corpora: music21's scores with music21's own bar lines, and Freedoom's WAD music."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from data_prep import freedoom, music21_song
from data_prep.scores import parse
from musegen.errors import DataError
from musegen.shards import Shards
from musegen.tokenizers.song_vocab import UNITS_PER_BEAT, bar_units

MULTITRACK = Path(__file__).parent / "data" / "multitrack"
PIECES = {  # a string quartet in 3/4, a jig in 6/8 and a hornpipe in 2/2, both with a pickup
    "mozart/k80/movement3.mxl": None,
    "ryansMammoth/BanishMisfortune.abc": None,
    "ryansMammoth/AcrobatsHornpipe.abc": None,
}


def _music21_source(tmp_path: Path) -> Path:
    """A folder laid out as music21's corpus, holding only PIECES."""
    from music21 import corpus

    root = Path(corpus.__file__).parent
    source = tmp_path / "corpus"
    for relative in PIECES:
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).symlink_to(root / relative)
    return source


def _pieces(shards: Shards) -> dict[str, np.ndarray]:
    return {name: ids for split in shards.splits for name, ids in zip(shards.names(split), shards.pieces(split))}


def test_music21_song_keeps_parts_programs_and_music21s_bar_lines(tmp_path):
    from music21 import converter

    source = _music21_source(tmp_path)
    report = music21_song.prepare(tmp_path / "out", source=source, limit=3, workers=1)
    assert report["encoded"] == 3 and report["skipped"] == 0
    assert report["collections"] == {"mozart": 1, "ryansMammoth": 2}
    assert {"3/4", "6/8", "2/2"} <= set(report["meters"])
    shards = Shards(tmp_path / "out")
    tok, pieces = shards.tokenizer, _pieces(shards)

    # the quartet: violins, viola, cello, each its own track
    quartet = pieces["mozart/k80/movement3.mxl"]
    programs = sorted(tok.programs[tok.program_of[i]] for i in set(quartet.tolist()) if tok.program_of[i] >= 0)
    assert programs == [(40, 0), (40, 1), (41, 0), (42, 0)]

    # every bar line where music21 puts a measure, the pickups bars of their own length
    for name in ("ryansMammoth/BanishMisfortune.abc", "ryansMammoth/AcrobatsHornpipe.abc"):
        measures = list(converter.parse(str(source / name)).parts[0].getElementsByClass("Measure"))
        meters = tok.meter_of_bars(pieces[name])
        starts = np.cumsum([0] + [bar_units(n, d) for n, d in meters])[:-1]
        assert starts.tolist() == [round(m.offset * UNITS_PER_BEAT) for m in measures], name
        pickup = measures[0].quarterLength
        assert pickup < measures[1].quarterLength and bar_units(*meters[0]) == pickup * UNITS_PER_BEAT, name
    assert tok.meter_of_bars(pieces["ryansMammoth/BanishMisfortune.abc"])[:2] == [(1, 8), (6, 8)]

    # a rerun reads the MIDI files already written instead of converting the scores again
    cached = tmp_path / "out" / "midi" / "mozart" / "k80" / "movement3.mxl.mid"
    cached.write_bytes((tmp_path / "out" / "midi" / "ryansMammoth" / "AcrobatsHornpipe.abc.mid").read_bytes())
    music21_song.prepare(tmp_path / "out", source=source, limit=3, workers=1)
    again = _pieces(Shards(tmp_path / "out"))
    assert np.array_equal(again["mozart/k80/movement3.mxl"], pieces["ryansMammoth/AcrobatsHornpipe.abc"])


def test_music21_song_splits_tunes_of_a_file_and_merges_voices_of_one_piece(tmp_path):
    """A folk-tune file gives a piece per tune; a file whose tunes share a title (Josquin's
    voices) is one piece of several parts."""
    (tmp_path / "tunes.abc").write_text(
        "X:1\nT:One\nM:3/4\nL:1/4\nK:C\nCDE|FGA|\n\nX:2\nT:Two\nM:6/8\nL:1/8\nK:G\nGAB cde|\n", encoding="latin-1"
    )
    (tmp_path / "voices.abc").write_text(
        "X:1\nT:Song\nT:Cantus\nM:4/4\nL:1/4\nK:C\nc d e f|\n\nX:2\nT:Song\nT:Bassus\nM:4/4\nL:1/4\nK:C\nC D E F|\n"
    )
    assert music21_song.tunes(tmp_path / "tunes.abc") == [1, 2]
    assert music21_song.tunes(tmp_path / "voices.abc") == [None]
    assert parse(tmp_path / "tunes.abc", 2).recurse().getElementsByClass("TimeSignature")[0].ratioString == "6/8"
    voices = parse(tmp_path / "voices.abc")
    assert [[p.nameWithOctave for p in part.pitches] for part in voices.parts] == [
        ["C5", "D5", "E5", "F5"],
        ["C4", "D4", "E4", "F4"],
    ]


def _wad(path: Path, lumps: list[tuple[str, bytes]]) -> Path:
    """A PWAD file holding `lumps`."""
    body, entries, offset = b"", b"", 12
    for name, data in lumps:
        entries += struct.pack("<ii8s", offset + len(body), len(data), name.encode())
        body += data
    path.write_bytes(struct.pack("<4sii", b"PWAD", len(lumps), 12 + len(body)) + body + entries)
    return path


def test_freedoom_reads_the_midi_lumps_of_a_wad_and_skips_mus_ones(tmp_path):
    song = (MULTITRACK / "freedoom1_D_E1M6.mid").read_bytes()
    wad = _wad(
        tmp_path / "mini.wad",
        [("MAP01", b"level"), ("D_RUNNIN", song), ("D_MUSIC", b"MUS\x1a" + bytes(20)), ("D_AGAIN", song)],
    )
    report = freedoom.prepare(tmp_path / "out", source=wad, workers=1)
    assert report["pieces"] == {"train": 0, "test": 1} and report["encoded"] == 1
    reasons = {entry["name"]: entry["reason"] for entry in report["skipped_files"]}
    assert "not a Standard MIDI File" in reasons["mini_D_MUSIC"] and "the same tune" in reasons["mini_D_AGAIN"]
    assert (tmp_path / "out" / "midi" / "mini_D_RUNNIN.mid").read_bytes() == song
    assert Shards(tmp_path / "out").names("test") == ["mini_D_RUNNIN"]
    (tmp_path / "bad.wad").write_bytes(b"ZWAD" + bytes(8))
    with pytest.raises(DataError, match="not a WAD file"):
        freedoom.wad_lumps(tmp_path / "bad.wad")


@pytest.mark.skipif(
    not (freedoom.WADS / "freedoom2.wad").is_file(), reason="Debian's freedoom package is not installed"
)
def test_freedoom_package_holds_the_committed_multitrack_files(tmp_path):
    wads = sorted(freedoom.WADS.glob("*.wad"))
    lumps = {f"{wad.stem}_{name}": data for wad in wads for name, data in freedoom.wad_lumps(wad)}
    for file in sorted(MULTITRACK.glob("*.mid")):
        digest = hashlib.sha256(lumps[file.stem]).hexdigest()
        assert digest == hashlib.sha256(file.read_bytes()).hexdigest(), file.name
    report = freedoom.prepare(tmp_path / "out", workers=1, limit=3)
    assert report["pieces"] == {"train": 0, "test": 3}
    for name in Shards(tmp_path / "out").names("test"):
        assert (tmp_path / "out" / "midi" / f"{name}.mid").read_bytes() == lumps[name]
    assert report["meters"] and sum(report["tracks"].values()) == report["pieces"]["test"]
