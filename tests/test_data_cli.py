"""`musegen data show --json` and `musegen data export`: the whole encoding as JSON, and prepared
shards decoded back to MIDI files that encode to the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from train_fixtures import prepare_pop909

from musegen.cli import main
from musegen.io import NAME_MAX, TEMP_NAME_EXTRA
from musegen.shard_midi import export_midi, piece_stem
from musegen.shards import Shards, write_shards
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.remi import RemiTokenizer

PROMPTS = Path(__file__).resolve().parents[1] / "checkpoints" / "prompts"


def run(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.fixture(scope="module")
def pop(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:6], tmp_path_factory.mktemp("pop"))


@pytest.mark.parametrize("kind", ["remi", "groove"])
def test_show_json_is_the_whole_encoding(kind, pop909_songs, capsys):
    song = pop909_songs[0] if kind == "remi" else PROMPTS / "groove_rock.mid"
    tok = RemiTokenizer() if kind == "remi" else GrooveTokenizer()
    code, out, _ = run(["data", "show", song, "--tokenizer", kind, "--json"], capsys)
    assert code == 0
    shown = json.loads(out)
    encoding = tok.encode(song)
    assert shown["ids"] == encoding.ids.tolist() and shown["tokens"] == len(encoding.ids)
    assert shown["events"] == [tok.vocab[i] for i in encoding.ids]
    assert shown["report"] == json.loads(json.dumps(encoding.report))
    assert shown["tokenizer"] == {"kind": kind, "settings": json.loads(json.dumps(tok.settings()))}


def test_show_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    (tmp_path / "x.mid").write_bytes(b"not midi")
    code, out, err = run(["data", "show", tmp_path / "x.mid", "--json"], capsys)
    assert code != 0 and not out and err.strip().count("\n") == 0 and "not a MIDI file" in err


def test_export_writes_one_midi_per_piece_that_encodes_back_to_its_tokens(pop, tmp_path, capsys):
    shards = Shards(pop)
    out = tmp_path / "midi"
    code, printed, _ = run(["data", "export", pop, "--split", "train", "--out", out], capsys)
    names = shards.names("train")
    assert code == 0 and f"{len(names)} written" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.mid" for n in names)
    for name, ids in zip(names, shards.pieces("train")):
        assert np.array_equal(shards.tokenizer.encode(out / f"{name}.mid").ids, ids)


def test_export_never_overwrites_and_resumes(pop, tmp_path):
    out = tmp_path / "midi"
    names = Shards(pop).names("train")
    out.mkdir()
    (out / f"{names[0]}.mid").write_bytes(b"mine")  # someone's own file with a piece's name
    (out / "notes.txt").write_text("keep")
    first = export_midi(pop, "train", out, progress=False)
    assert first["written"] == len(names) - 1 and first["existing"] == 1
    assert (out / f"{names[0]}.mid").read_bytes() == b"mine" and (out / "notes.txt").read_text() == "keep"
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = export_midi(pop, "train", out, progress=False)
    assert again["written"] == 0 and again["existing"] == len(names)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_export_skips_and_lists_undecodable_pieces(tmp_path, capsys):
    tok = RemiTokenizer()
    good = tok.encode(PROMPTS / "pop_progression.mid").ids
    broken = np.array([tok.vocab.index("Note_Pitch_60")] * 3)  # a note before any Bar: no REMI layout
    write_shards(tmp_path / "data", tok, {"train": [("songs/good.mid", good), ("bad", broken)]}, {})
    code, printed, _ = run(["data", "export", tmp_path / "data", "--out", tmp_path / "midi"], capsys)
    assert code == 0 and "1 written" in printed and "1 skipped" in printed and "skipped bad: cannot decode" in printed
    written = [p.relative_to(tmp_path / "midi").as_posix() for p in (tmp_path / "midi").rglob("*.mid")]
    assert written == ["songs/good.mid"]
    code, _, err = run(["data", "export", tmp_path / "data", "--split", "test", "--out", tmp_path / "m"], capsys)
    assert code != 0 and err.strip().count("\n") == 0 and "no split 'test'" in err


def test_export_skips_a_piece_whose_name_no_file_system_takes(tmp_path, capsys):
    """A name part of 1,000 characters (a shard index may hold one) is skipped with the reason,
    the other pieces are written, and the limit is exactly what atomic writes can take."""
    tok = RemiTokenizer()
    ids = tok.encode(PROMPTS / "pop_progression.mid").ids
    longest = "a" * (NAME_MAX - TEMP_NAME_EXTRA - len(".mid"))
    pieces = [("x" * 1000 + "/song", ids), ("songs/" + "b" * 1000, ids), (longest, ids), ("ok", ids)]
    write_shards(tmp_path / "data", tok, {"train": pieces}, {})
    code, printed, _ = run(["data", "export", tmp_path / "data", "--out", tmp_path / "midi"], capsys)
    assert code == 0 and "2 written" in printed and "2 skipped" in printed and "longer than a file name" in printed
    assert sorted(p.name for p in (tmp_path / "midi").iterdir()) == sorted([longest + ".mid", "ok.mid"])


def test_piece_names_become_safe_relative_file_names():
    assert piece_stem("001") == "001" and piece_stem("funk/3") == "funk/3"
    assert piece_stem("songs/a.mid") == "songs/a" and piece_stem("../../etc/x") == "etc/x"
    assert piece_stem("/abs/y.MIDI") == "abs/y" and piece_stem("") == "piece"
