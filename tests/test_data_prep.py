"""Data preparation: downloads, archives, and the corpora that feed the REMI tokenizer."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import symusic
from conftest import pop909_files

from data_prep import chorales, common, pop1k7
from data_prep.download import extract, fetch, zenodo_file
from musegen.errors import DataError
from musegen.music.beats import synchronise
from musegen.shards import Shards
from musegen.tokenizers.remi import RemiTokenizer

# ---------------------------------------------------------------- download / extract


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_verifies_checksum_and_writes_atomically(tmp_path):
    payload = b"musegen" * 1000
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    dest = tmp_path / "out" / "copy.bin"
    fetch(src.as_uri(), dest, sha256=_sha256(payload), md5=hashlib.md5(payload).hexdigest(), progress=False)
    assert dest.read_bytes() == payload

    bad = tmp_path / "bad.bin"
    with pytest.raises(DataError, match="sha256 mismatch"):
        fetch(src.as_uri(), bad, sha256="0" * 64, progress=False)
    assert not bad.exists()
    assert not list(tmp_path.glob(".bad.bin.*"))  # no temporary left behind


def test_fetch_reuses_a_verified_file_and_reports_network_failure(tmp_path):
    dest = tmp_path / "have.bin"
    dest.write_bytes(b"already here")
    # the URL does not exist: a matching local file must be reused without touching it
    fetch((tmp_path / "missing").as_uri(), dest, sha256=_sha256(b"already here"), progress=False)
    with pytest.raises(DataError, match="download failed"):
        fetch((tmp_path / "missing").as_uri(), tmp_path / "x.bin", progress=False)
    with pytest.raises(DataError, match="download failed"):
        fetch("http://127.0.0.1:9/nothing", tmp_path / "y.bin", progress=False)  # port 9: refused


def test_fetch_over_local_http(tmp_path):
    import http.server
    import threading
    from functools import partial

    (tmp_path / "f.txt").write_bytes(b"hello over http")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/f.txt"
        out = fetch(url, tmp_path / "got.txt", sha256=_sha256(b"hello over http"), progress=False)
        assert out.read_bytes() == b"hello over http"
        with pytest.raises(DataError, match="download failed"):
            fetch(url.replace("f.txt", "nope.txt"), tmp_path / "nope.txt", progress=False)
    finally:
        server.shutdown()
        server.server_close()


def test_extract_zip_and_tar(tmp_path):
    zpath = tmp_path / "a.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("top/song.mid", b"MThd")
    assert (extract(zpath, tmp_path / "z") / "top" / "song.mid").read_bytes() == b"MThd"

    tpath = tmp_path / "a.tar.gz"
    with tarfile.open(tpath, "w:gz") as tf:
        info = tarfile.TarInfo("dir/x.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    assert (extract(tpath, tmp_path / "t") / "dir" / "x.txt").read_bytes() == b"abc"


def test_extract_refuses_escaping_members(tmp_path):
    zpath = tmp_path / "evil.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("../escaped.txt", b"x")
    with pytest.raises(DataError, match="outside"):
        extract(zpath, tmp_path / "z")
    assert not (tmp_path / "escaped.txt").exists()

    tpath = tmp_path / "evil.tar"
    with tarfile.open(tpath, "w") as tf:
        link = tarfile.TarInfo("link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tf.addfile(link)
    with pytest.raises(DataError, match="link"):
        extract(tpath, tmp_path / "t")

    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not an archive")
    with pytest.raises(DataError, match="not a zip or tar"):
        extract(junk, tmp_path / "j")


def test_zenodo_file_reads_url_and_md5_from_the_records_api(tmp_path):
    import json

    api = tmp_path / "api"
    api.mkdir()
    (api / "4782721").write_text(
        json.dumps(
            {
                "files": [
                    {
                        "key": "remi_dataset.tar.gz",
                        "checksum": "md5:abc123",
                        "links": {"self": "https://zenodo.org/api/records/4782721/files/remi_dataset.tar.gz/content"},
                    }
                ]
            }
        )
    )
    url, md5 = zenodo_file(4782721, "remi_dataset.tar.gz", api=api.as_uri())
    assert md5 == "abc123" and url.endswith("remi_dataset.tar.gz/content")
    with pytest.raises(DataError, match="has no file"):
        zenodo_file(4782721, "other.zip", api=api.as_uri())
    with pytest.raises(DataError, match="metadata unavailable"):
        zenodo_file(1, "x", api=api.as_uri())


# ---------------------------------------------------------------- corpora


def run_cli(*args, timeout=300):
    proc = subprocess.run(
        [sys.executable, "-m", "musegen", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_prepare_pop909_cli_writes_readable_shards(pop909_dir, tmp_path):
    out = tmp_path / "pop909"
    code, stdout, stderr = run_cli("data", "prepare", "pop909", "--source", pop909_dir, "--limit", "40", "--out", out)
    assert code == 0, stderr
    shards = Shards(out)
    names = shards.names("train") + shards.names("validation")
    songs = pop909_files(40)
    triple = [p.stem for p in songs if _downbeat_every(p.parent / "beat_midi.txt") == 3]
    assert triple  # song 034 is in 3/4 (its MIDI says 1/4)
    assert sorted(names + triple) == [p.stem for p in songs]
    reasons = [e["reason"] for e in shards.index["report"]["skipped_files"]]
    assert len(reasons) == len(triple) and all("annotated bars of 6 beats" in r for r in reasons)
    assert 0 < len(shards.names("validation")) < 10  # about 5%, split by song
    piece = shards.pieces("train")[0]
    assert shards.tokenizer.kind == "remi" and shards.tokenizer.grammar().first_violation(piece) is None
    # each song was synchronised to its annotated beats before encoding
    song = pop909_dir / names[0] / f"{names[0]}.mid"
    beats = np.loadtxt(song.parent / "beat_midi.txt")
    expected = shards.tokenizer.encode(synchronise(symusic.Score(str(song)), beats[:, 0], beats[:, 2] == 1)).ids
    assert np.array_equal(piece, expected) and not np.array_equal(piece, shards.tokenizer.encode(song).ids)
    assert f"files: {len(songs)}  encoded: {len(songs) - len(triple)}  skipped: {len(triple)}" in stdout


def test_prepare_pop909_song_keeps_the_triple_meter_songs_and_the_three_tracks(pop909_dir, tmp_path):
    out = tmp_path / "pop909-song"
    code, stdout, stderr = run_cli(
        "data", "prepare", "pop909-song", "--source", pop909_dir, "--limit", "40", "--out", out
    )
    assert code == 0, stderr
    shards = Shards(out)
    assert shards.tokenizer.kind == "song"
    names = shards.names("train") + shards.names("validation")
    songs = pop909_files(40)
    assert sorted(names) == [p.stem for p in songs]  # none refused for its meter
    triple = next(p for p in songs if _downbeat_every(p.parent / "beat_midi.txt") == 3)
    split = "train" if triple.stem in shards.names("train") else "validation"
    piece = shards.pieces(split)[shards.names(split).index(triple.stem)]
    meters = Counter(shards.tokenizer.meter_of_bars(piece))
    assert meters.most_common(1)[0][0] in ((3, 4), (6, 4))  # its annotated bars, not 4/4
    tracks = {shards.tokenizer.vocab[t] for t in piece if shards.tokenizer.vocab[t].startswith("Program")}
    assert tracks == {"Program_0", "Program_0.1", "Program_0.2"}  # melody, bridge and piano apart


def _downbeat_every(beat_file: Path) -> int:
    """Beats per downbeat in a POP909 beat annotation (second column flags downbeats)."""
    rows = [line.split() for line in beat_file.read_text().splitlines() if line.strip()]
    return round(len(rows) / sum(float(r[1]) for r in rows))


def test_prepare_midi_folder_skips_and_counts_bad_files(pop909_songs, tmp_path):
    from test_remi import make_midi

    folder = tmp_path / "mixed"
    folder.mkdir()
    for song in pop909_songs[:3]:
        shutil.copy(song, folder / song.name)
    (folder / "corrupt.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")
    (folder / "empty.mid").write_bytes(b"")
    make_midi(folder, [], name="noteless.mid")
    make_midi(folder, [(0, 480, 60, 64)], time_signatures=((3, 4, 0),), name="waltz.mid")
    make_midi(folder, [(0, 480, 36, 100)], drum=True, name="drums.mid")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("data", "prepare", "midi", "--source", folder, "--out", out, "--workers", "2")
    assert code == 0, stderr
    assert "files: 8  encoded: 3  skipped: 5" in stdout
    report = Shards(out).index["report"]
    reasons = {Path(e["name"]).stem: e["reason"] for e in report["skipped_files"]}
    assert set(reasons) == {"corrupt", "empty", "noteless", "waltz", "drums"}
    assert "corrupt MIDI" in reasons["corrupt"] and "time signature 3/4" in reasons["waltz"]
    assert all("\n" not in r for r in reasons.values())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source", "{empty}"], "no MIDI files found"),
        (["--source", "{missing}"], "no such folder"),
        ([], "needs --source"),
        (["--source", "{empty}", "--tokenizer", "abc"], "unknown tokenizer"),
    ],
)
def test_prepare_midi_bad_sources_fail_in_one_line(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not MIDI")
    args = [a.format(empty=tmp_path / "empty", missing=tmp_path / "missing") for a in args]
    code, stdout, stderr = run_cli("data", "prepare", "midi", *args, "--out", tmp_path / "out")
    lines = stderr.strip().splitlines()
    assert code != 0 and len(lines) == 1 and message in lines[0], stderr
    assert not (tmp_path / "out" / "index.json").exists()


def test_prepare_chorales_from_music21(tmp_path):
    from music21 import corpus

    report = chorales.prepare(tmp_path / "ch", limit=4, workers=2)
    shards = Shards(tmp_path / "ch")
    assert report["files"] == 4 and report["encoded"] + report["skipped"] == 4 and report["encoded"] >= 3
    tok = shards.tokenizer
    name = shards.names("train")[0]
    ids = shards.pieces("train")[0]
    score = corpus.parse(str(next(p for p in chorales.chorale_paths() if p.stem == name))).stripTies()
    # every note of every voice, also where two voices sing the same pitch at once
    n_notes = sum(len(n.pitches) for part in score.parts for n in part.flatten().notes)
    assert sum(1 for i in ids if tok.pitch_of[i] >= 0) == n_notes
    # the pickup is padded so the first full bar starts on a REMI Bar
    pickup = float(score.parts[0].getElementsByClass("Measure")[0].paddingLeft or 0)
    piece = tok.decode(ids)
    assert piece.start.min() == round(pickup * piece.tpq)


def _events_of(tok, ids):
    """Pop1K7-style event dicts for ids (`Note_Pitch_60` -> name Note_Pitch, value 60)."""
    events = []
    for i in ids:
        name = tok.vocab[i]
        for family in ("Note_Pitch", "Note_Velocity", "Note_Duration", "Bar", "Beat", "Chord", "Tempo", "EOS"):
            if name.startswith(family + "_"):
                value = name[len(family) + 1 :]
                events.append(
                    {"name": family, "value": None if value == "None" else (int(value) if value.isdigit() else value)}
                )
                break
    return events


def test_prepare_pop1k7_stores_the_reference_pieces_unchanged(tmp_path):
    """Pieces the Pop1K7 pipeline wrote (the golden POP909 encodings) load token for token."""
    import gzip
    import json
    import pickle

    from conftest import GOLDEN

    tok = RemiTokenizer()
    index = {name: i for i, name in enumerate(tok.vocab)}
    pieces = tmp_path / "build" / "remi_dataset"
    pieces.mkdir(parents=True)
    originals = {}
    with gzip.open(GOLDEN / "remi_pop1k7" / "pop909_events.jsonl.gz", "rt") as f:
        for line in list(f)[:4]:
            song = json.loads(line)
            ids = np.array([index[n] for n in song["events"]])
            originals[song["song"]] = ids
            (pieces / f"{song['song']}.pkl").write_bytes(pickle.dumps((tok.bar_starts(ids), _events_of(tok, ids))))
    (pieces / "9000.pkl").write_bytes(
        pickle.dumps(([0], [{"name": "Bar", "value": None}, {"name": "Whistle", "value": 3}]))
    )
    (pieces / "9001.pkl").write_bytes(pickle.dumps(([0], _events_of(tok, originals["001"][::-1]))))
    marker = tmp_path / "pwned"
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."  # a pickle that runs a command
    (pieces / "9002.pkl").write_bytes(evil)
    archive = tmp_path / "remi_dataset.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(pieces, arcname="remi_dataset")

    report = pop1k7.prepare(tmp_path / "out", source=archive)
    assert not marker.exists()
    assert report["encoded"] == 4 and report["skipped"] == 3
    reasons = {e["name"]: e["reason"] for e in report["skipped_files"]}
    assert "unknown event 'Whistle_3'" in reasons["9000"]
    assert "not a REMI piece musegen writes" in reasons["9001"] and "refusing to load" in reasons["9002"]
    shards = Shards(tmp_path / "out")
    got = dict(
        zip(shards.names("train") + shards.names("validation"), shards.pieces("train") + shards.pieces("validation"))
    )
    assert set(got) == set(originals) and all(np.array_equal(got[k], originals[k]) for k in originals)
    with pytest.raises(DataError, match="needs --source"):
        pop1k7.prepare(tmp_path / "o2")


def test_every_corpus_is_prepared_by_the_one_shared_prepare():
    """Each registered corpus is a Corpus under its CLI name, prepared by Corpus.prepare itself."""
    from data_prep import CORPORA, corpus_prepare
    from data_prep.common import Corpus

    for name in CORPORA:
        prepare = corpus_prepare(name)
        assert isinstance(prepare.__self__, Corpus) and prepare.__self__.name == name
        assert prepare.__func__ is Corpus.prepare


def test_merge_joins_corpora_of_one_tokenizer_and_refuses_two(pop909_dir, tmp_path):
    songs, games, piano = tmp_path / "pop909-song", tmp_path / "games", tmp_path / "piano"
    multitrack = Path(__file__).parent / "data" / "multitrack"
    for args in (
        ("pop909-song", "--source", pop909_dir, "--limit", "6", "--out", songs),
        ("midi", "--tokenizer", "song", "--source", multitrack, "--out", games),
        ("midi", "--source", multitrack, "--out", piano),
    ):
        code, _, stderr = run_cli("data", "prepare", *args, "--workers", "1")
        assert code == 0, stderr
    code, stdout, stderr = run_cli("data", "merge", songs, games, "--out", tmp_path / "both")
    assert code == 0, stderr
    both, parts = Shards(tmp_path / "both"), [Shards(songs), Shards(games)]
    for split in both.splits:
        expected = [
            (f"{p.folder.name}/{n}", ids)
            for p in parts
            if split in p.splits
            for n, ids in zip(p.names(split), p.pieces(split))
        ]
        assert both.names(split) == [name for name, _ in expected]
        assert all(np.array_equal(a, b) for a, (_, b) in zip(both.pieces(split), expected))
    assert set(both.index["report"]["merged"]) == {"pop909-song", "games"}
    assert "shards written to" in stdout
    # a held-out set left out by name: every other piece stays, in order
    held_out = both.names(both.splits[0])[0]
    code, _, stderr = run_cli(
        "data", "merge", songs, games, "--out", tmp_path / "kept", "--exclude", held_out, "--exclude", "games/*"
    )
    assert code == 0, stderr
    kept = Shards(tmp_path / "kept")
    for split in both.splits:
        wanted = [n for n in both.names(split) if n != held_out and not n.startswith("games/")]
        assert (kept.names(split) if split in kept.splits else []) == wanted  # an emptied split is not written
    games_pieces = sum(len(Shards(games).names(split)) for split in Shards(games).splits)
    assert kept.index["report"]["excluded"] == {held_out: 1, "games/*": games_pieces}
    code, _, stderr = run_cli("data", "merge", songs, piano, "--out", tmp_path / "mixed")
    assert code != 0 and stderr.strip().splitlines()[-1].startswith("error: ") and "another tokenizer (remi)" in stderr
    assert not (tmp_path / "mixed").exists()


class PoolBrokenAtTheThirdSubmit:
    """A stand-in for the worker pool that encodes each item at once, in this process; its third
    submit finds the pool broken, as when a worker dies between two waits before any of its futures
    has failed (what made a killed worker an internal error once in a while)."""

    submits = 0

    def __init__(self, workers, mp_context=None, initializer=None, initargs=()):
        initializer(*initargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, item):
        type(self).submits += 1
        if type(self).submits == 3:
            raise common.BrokenProcessPool("a worker died")
        future = common.Future()
        future.set_result(fn(item))
        return future


@pytest.mark.parametrize("workers", [1, 2])  # with nothing in flight then, and with two
def test_a_pool_found_broken_at_submit_goes_on_without_losing_a_file(workers, monkeypatch):
    monkeypatch.setattr(common, "ProcessPoolExecutor", PoolBrokenAtTheThirdSubmit)
    monkeypatch.setattr(PoolBrokenAtTheThirdSubmit, "submits", 0)
    monkeypatch.setattr(common, "_worker_tokenizer", None)  # the stand-in sets them in this process
    monkeypatch.setattr(common, "_worker_encode", common.encode_file)
    songs = pop909_files(4)
    items = [common.Item(p.stem, p, p.stem) for p in songs]
    encoded, skipped = common.encode_items(RemiTokenizer(), items, workers=workers)
    assert [item.name for item, _, _ in encoded] == [p.stem for p in songs] and skipped == []
    assert PoolBrokenAtTheThirdSubmit.submits == 5  # the third item submitted again
    for (_, ids, _), song in zip(encoded, songs):
        assert np.array_equal(ids, RemiTokenizer().encode(song).ids)
