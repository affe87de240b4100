"""The MIREX 2025 piano continuation task's JSON note lists: reading, MIDI, and `musegen sample`."""

from __future__ import annotations

import json

import miditoolkit
import pytest
import symusic
from tiny_models import tiny_checkpoint

from musegen import mirex
from musegen.cli import main
from musegen.errors import MusegenError
from musegen.music.notes import NoteTable, Track
from musegen.render import PROMPT_END_MARKER

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def task_prompt(song, bars: int = 5) -> list[dict[str, int]]:
    """The first `bars` bars of a real song as the task writes a prompt: notes in 16ths."""
    score = symusic.Score(str(song))
    notes = []
    for track in score.tracks:
        for n in track.notes:
            start = mirex.sixteenths(n.time, score.tpq)
            if start < 16 * bars:
                notes.append(
                    {
                        "start": start,
                        "pitch": int(n.pitch),
                        "duration": max(1, mirex.sixteenths(n.time + n.duration, score.tpq) - start),
                    }
                )
    return notes


def test_a_prompt_becomes_midi_with_the_same_notes(pop909_songs, tmp_path):
    notes = task_prompt(pop909_songs[0])
    (tmp_path / "p.json").write_text(json.dumps({"prompt": notes}))
    read = mirex.read_prompt(tmp_path / "p.json")
    assert sorted(read) == sorted(mirex.Note(**n) for n in notes)
    score = symusic.Score.from_midi(mirex.prompt_midi(read))
    assert score.tpq == 480 and [(t.numerator, t.denominator) for t in score.time_signatures] == [(4, 4)]
    assert [round(t.qpm) for t in score.tempos] == [mirex.TEMPO_BPM]
    back = sorted((n.time // 120, n.pitch, n.duration // 120) for t in score.tracks for n in t.notes)
    assert back == sorted((n["start"], n["pitch"], n["duration"]) for n in notes)
    assert {n.velocity for t in score.tracks for n in t.notes} == {mirex.VELOCITY}


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1, 2]", "invalid mirex prompt: (the whole file)"),
        ('{"generation": []}', "invalid mirex prompt: prompt: field required"),
        ('{"prompt": []}', "prompt: list should have at least 1 item"),
        ('{"prompt": [{"start": 0, "pitch": 60}]}', "prompt.0.duration: field required"),
        ('{"prompt": [{"start": 0.5, "pitch": 60, "duration": 2}]}', "prompt.0.start: input should be a valid integer"),
        (
            '{"prompt": [{"start": true, "pitch": 60, "duration": 2}]}',
            "prompt.0.start: input should be a valid integer",
        ),
        (
            '{"prompt": [{"start": 0, "pitch": 128, "duration": 2}]}',
            "prompt.0.pitch: input should be less than or equal to 127",
        ),
        ('{"prompt": [{"start": -1, "pitch": 60, "duration": 2}]}', "prompt.0.start: input should be greater than"),
        ('{"prompt": [{"start": 0, "pitch": 60, "duration": 0}]}', "prompt.0.duration: input should be greater than"),
        ('{"prompt": [{"start": 80000, "pitch": 60, "duration": 1}]}', "prompt.0: ends after 16th 80,000"),
        ('{"prompt": [{"start": 79999, "pitch": 60, "duration": 2}]}', "prompt.0: ends after 16th 80,000"),
        ("{'prompt': ", "not valid JSON"),
        ("[" * 100000, "not valid JSON"),
    ],
)
def test_a_bad_prompt_file_is_one_clear_line(tmp_path, content, message):
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(MusegenError) as err:
        mirex.read_prompt(tmp_path / "bad.json")
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


def test_generation_counts_16ths_from_the_prompts_origin():
    notes = piano([(0, 120, 60, 80), (1920, 2400, 62, 80), (59, 61, 64, 80)])
    assert mirex.generation(notes, 16) == [
        {"start": 16, "pitch": 60, "duration": 1},
        {"start": 16, "pitch": 64, "duration": 1},  # 59 ticks is nearer 0 than a 16th; a note lasts >= 1
        {"start": 32, "pitch": 62, "duration": 4},
    ]
    # an encoder that drops a blank pickup bar decodes the first note a bar early: the offset puts it back
    assert mirex.origin_offset([mirex.Note(18, 60, 2)], piano([(240, 480, 60, 80)])) == 16


def piano(rows: list[tuple[int, int, int, int]]) -> NoteTable:
    """One piano track at 480 ticks per beat, notes as (start, end, pitch, velocity)."""
    return NoteTable.of_tracks(480, [(Track(None, 0, False), rows)])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint("remi", tmp_path_factory.mktemp("ckpt"))


def test_sample_continues_a_task_prompt_into_a_task_generation(checkpoint, pop909_songs, tmp_path, capsys):
    """4 bars + pickup in, 12 bars out, as the task's JSON: the continuation's notes, starting
    from 16th 80, the same notes as the MIDI file's after its prompt-end marker."""
    notes = task_prompt(pop909_songs[2])
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "song.json").write_text(json.dumps({"prompt": notes}))
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "sample",
                "-c",
                str(checkpoint),
                "--prompt",
                str(tmp_path / "prompts" / "song.json"),
                "--bars",
                "12",
                "-n",
                "2",
                "--seed",
                "3",
                "-o",
                str(tmp_path / "out"),
            ]
        )
    assert exit_.value.code in (0, None), capsys.readouterr().err
    capsys.readouterr()
    summary = json.loads((tmp_path / "out" / "song" / "song.json").read_text())
    assert summary["prompt_bars"] == 5 and summary["stats"]["invalid"] == 0
    for record in summary["samples"]:
        generation = json.loads((tmp_path / "out" / "song" / record["json"]).read_text())["generation"]
        assert generation and set(generation[0]) == {"start", "pitch", "duration"}
        assert 80 <= min(n["start"] for n in generation) and max(n["start"] for n in generation) < 272
        midi = miditoolkit.MidiFile(str(tmp_path / "out" / "song" / record["midi"]))
        marker = next(m.time for m in midi.markers if m.text == PROMPT_END_MARKER)
        after = sorted(
            (mirex.sixteenths(n.start, 480), n.pitch)
            for inst in midi.instruments
            for n in inst.notes
            if n.start >= marker
        )
        assert sorted((n["start"], n["pitch"]) for n in generation) == after
    # continued in place: the set is a folder beside the prompt, which stays as it was
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "sample",
                "-c",
                str(checkpoint),
                "--prompt",
                str(tmp_path / "prompts" / "song.json"),
                "--bars",
                "1",
                "-o",
                str(tmp_path / "prompts"),
            ]
        )
    out = capsys.readouterr().out.strip().splitlines()
    assert exit_.value.code in (0, None) and out[-1] == f"written to {tmp_path / 'prompts' / 'song'}/"
    assert json.loads((tmp_path / "prompts" / "song.json").read_text()) == {"prompt": notes}
    assert (tmp_path / "prompts" / "song" / "song_000.json").is_file()
