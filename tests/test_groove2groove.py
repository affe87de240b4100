"""Groove2Groove download-and-convert, on a miniature archive built here and served by file://."""

from __future__ import annotations

import hashlib
import tarfile

import miditoolkit
import pytest

from data_prep import groove2groove as g2g
from musegen.errors import DataError
from musegen.io import read_json
from musegen.shards import Shards
from musegen.tokenizers.groove import GrooveTokenizer

TPQ = 96
BAR = 4 * TPQ


def band_midi(path, numerator=4, bass_pitch=40):
    """A Band-in-a-Box-like file: sticks count-in on bars 0-1, then 4 bars of drums, bass (on a
    guitar program: the role comes from the track name), piano."""
    bar = numerator * TPQ
    midi = miditoolkit.MidiFile(ticks_per_beat=TPQ)
    midi.time_signature_changes = [miditoolkit.TimeSignature(numerator, 4, 0)]
    drums = miditoolkit.Instrument(0, is_drum=True, name="BB Drums")
    drums.notes = [miditoolkit.Note(80, 37, b * TPQ, b * TPQ + 10) for b in range(2 * numerator)]
    drums.notes += [miditoolkit.Note(90, 36, 2 * bar + b * TPQ, 2 * bar + b * TPQ + 10) for b in range(4 * numerator)]
    bass = miditoolkit.Instrument(26, name="BB Bass")
    bass.notes = [miditoolkit.Note(90, bass_pitch, 2 * bar + k * bar, 3 * bar + k * bar) for k in range(4)]
    piano = miditoolkit.Instrument(0, name="BB Piano")
    piano.notes = [
        miditoolkit.Note(70, p, 2 * bar + k * bar, 2 * bar + k * bar + TPQ) for k in range(4) for p in (60, 64)
    ]
    midi.instruments = [drums, bass, piano]
    path.parent.mkdir(parents=True, exist_ok=True)
    midi.dump(str(path))


@pytest.fixture()
def archive(tmp_path, monkeypatch):
    root = tmp_path / "build" / g2g.ROOT_NAME
    layout = {
        "train": ["c1.rock_a", "c1.rock_b", "c2.rock_a", "c2.rock_b", "c3.waltz_a"],
        "val": ["c4.funk_a", "c5.funk_a"],
        "test": ["c6.bossa_b", "c7.bossa_b"],
        "itest": ["c6.rock_a"],
    }
    for part, stems in layout.items():
        for k, stem in enumerate(stems):
            for version in ("fixed", "raw"):
                band_midi(
                    root / "midi" / part / version / f"{stem}.mid",
                    numerator=3 if "waltz" in stem else 4,
                    bass_pitch=36 + k,
                )
    path = tmp_path / "served" / g2g.ARCHIVE
    path.parent.mkdir()
    with tarfile.open(path, "w:gz") as tf:
        tf.add(root, arcname=g2g.ROOT_NAME)
    monkeypatch.setattr(g2g, "ARCHIVE_URL", path.as_uri())
    monkeypatch.setattr(g2g, "ARCHIVE_MD5", hashlib.md5(path.read_bytes()).hexdigest())
    return path


def test_download_verify_extract_encode(tmp_path, archive):
    out = tmp_path / "out"
    report = g2g.prepare(out=out, source=tmp_path / "raw", download=True, workers=2)
    assert (tmp_path / "raw" / g2g.ARCHIVE).is_file()
    assert report["pieces"] == {"train": 4, "validation": 2, "test": 2}
    assert report["skipped"] == 1 and "3/4" in report["skipped_files"][0]["reason"]  # the waltz
    styles = read_json(out / "styles.json")["styles"]
    assert styles == {"train": ["rock_a", "rock_b", "waltz_a"], "validation": ["funk_a"], "test": ["bossa_b"]}

    tok = GrooveTokenizer()
    shards = Shards(out)
    for name, ids in zip(shards.names("train"), shards.pieces("train")):
        notes = tok.notes(ids)
        assert 37 not in notes[notes[:, 0] == 2][:, 1], "the count-in is gone"
        assert set(notes[notes[:, 0] == 1][:, 1]) <= set(range(36, 41)), "the bass found by its name"
        assert notes[:, 2].min() == 0 and notes[:, 3].max() == 4 * 48  # 4 bars from time 0
        assert len(tok.bar_starts(ids)) == 4
        assert tok.grammar().first_violation(ids) is None

    # a second run finds the extracted data and needs no download
    again = g2g.prepare(out=tmp_path / "out2", source=tmp_path / "raw", download=False, workers=1, limit=1)
    assert again["pieces"] == {"train": 1, "validation": 1, "test": 1}


def test_checksum_mismatch_is_refused(tmp_path, archive, monkeypatch):
    monkeypatch.setattr(g2g, "ARCHIVE_MD5", "0" * 32)
    with pytest.raises(DataError, match="md5 mismatch"):
        g2g.prepare(out=tmp_path / "out", source=tmp_path / "raw", download=True)
    assert not (tmp_path / "raw" / g2g.ARCHIVE).exists()


def test_missing_data_without_download_is_one_line(tmp_path):
    with pytest.raises(DataError, match="--download") as err:
        g2g.prepare(out=tmp_path / "out", source=tmp_path / "nothing")
    assert "\n" not in str(err.value)


def test_style_names():
    assert g2g.style_of(g2g.Path("maj500.BOSSA_a.mid")) == "BOSSA_a"
    with pytest.raises(DataError):
        g2g.style_of(g2g.Path("nochart.mid"))
