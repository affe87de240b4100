"""The mma-song corpus: MMA's grooves in their own meters and instruments, with POP909's melody
re-timed onto the piece's beats, on a trial corpus of one piece per meter."""

from __future__ import annotations

import io
import shutil
from collections import Counter

import mido
import numpy as np
import pytest
import symusic

from data_prep import mma_song as ms
from data_prep.mma_render import mma_text, render_mma
from data_prep.pop909 import annotations
from musegen.errors import DataError
from musegen.music.beats import synchronise
from musegen.music.midi import load_score, read_parts
from musegen.shards import Shards
from musegen.tokenizers.base import tokenizer_from_dict

pytestmark = pytest.mark.skipif(shutil.which("mma") is None, reason="the Debian package mma is not installed")

TOK = tokenizer_from_dict({"kind": "song"})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, pop909_dir):
    """One piece of each meter (the trial takes the grooves in turn from each meter)."""
    out = tmp_path_factory.mktemp("mma-song")
    meters = {meter.name for _, meter in ms.song_styles()}
    report = ms.prepare(out=out, source=pop909_dir, limit=len(meters), workers=1)
    return out, report, meters


def piece_of(out, meter: str, pop909_dir):
    """The trial's piece in `meter`: its MIDI path and plan."""
    style, m = next((s, m) for s, m in ms.by_meter(ms.song_styles()) if m.name == meter)
    return out / "midi" / f"{style.name}/0.mid", ms.plan_piece(style, m, 0, ms.song_charts(pop909_dir))


def test_the_library_has_grooves_in_every_meter_read_as_they_sound():
    meters = ms.library_meters()
    waltz, six_eight = meters[("stdlib/waltz", "waltz")], meters[("stdlib/68swing", "68swing")]
    assert (waltz.name, waltz.beats, waltz.quarters_per_beat) == ("3/4", 3, 1)
    assert (six_eight.name, six_eight.felt, six_eight.quarters_per_beat) == ("6/8", 2, 0.5)  # beats are eighths
    march = meters[("stdlib/68march", "68march")]  # two beats of a dotted quarter
    assert (march.name, march.beats, march.quarters_per_beat) == ("6/8", 2, 1.5)
    assert meters[("stdlib/ballad68", "ballad68")].name == "12/8"  # four dotted quarters
    assert meters[("stdlib/jazz-54", "jazz54")].name == "5/4"
    assert meters[("stdlib/vienesewaltz", "vienesewaltz")].name == "3/4"  # three beats, declared 4/4
    assert meters[("zoom/blues68", "68blus")].tabs == (0, 3)  # `Time 6/8`: chords at beats 1 and 4
    styles = Counter(m.name for _, m in ms.song_styles())
    assert styles["4/4"] > 700 and styles["3/4"] > 80 and styles["6/8"] > 20 and styles["5/4"] >= 4


def test_a_trial_has_one_piece_in_every_meter_split_by_family(corpus):
    out, report, meters = corpus
    assert report["skipped"] == 0 and set(report["meters"]) == meters
    simple = {m.name for _, m in ms.song_styles() if not m.compound}
    assert report["rendered"] == len(meters) and report["with_melody"] == len(simple) < len(meters)
    shards = Shards(out)
    pieces = [ids for split in shards.splits for ids in shards.pieces(split)]
    assert len(pieces) == len(meters)
    assert all(np.count_nonzero(ids == TOK.bar_id) == ms.BARS_PER_PIECE for ids in pieces)


def test_a_waltz_piece_is_in_three_with_its_grooves_instruments_and_a_melody(corpus, pop909_dir):
    out, _, _ = corpus
    path, piece = piece_of(out, "3/4", pop909_dir)
    enc = TOK.encode(path)
    assert Counter(TOK.meter_of_bars(enc.ids)) == {(3, 4): ms.BARS_PER_PIECE}
    # the instruments MMA plays the groove with, rendered here on their own
    alone = render_mma(mma_text(piece.style, [["C", "G", "C"]] * 4, seed=1))
    tracks = mido.MidiFile(file=io.BytesIO(alone)).tracks
    declared = {m.program for t in tracks for m in t if m.type == "program_change" and m.channel != 9}
    playing = {p.program for p in read_parts(alone).parts if not p.is_drum and len(p.notes)}
    programs = {TOK.programs[i][0] for i in TOK.program_of[enc.ids[TOK.program_of[enc.ids] >= 0]]}
    assert {-1, piece.lead} | playing <= programs <= {-1, piece.lead} | declared  # drums, MMA's voices, the lead
    assert len(playing) >= 3
    score = symusic.Score.from_file(path)
    assert len([t for t in score.tracks if not t.is_drum]) >= 3  # not a trio: every MMA track apart


def test_the_melody_falls_on_the_pieces_beats(corpus, pop909_dir):
    """Each melody note sits where the song's own beats put it: POP909 synchronised to its
    annotations (a beat 480 ticks) and moved to the piece's first beat, within a 16th."""
    out, _, _ = corpus
    path, piece = piece_of(out, "3/4", pop909_dir)
    score = symusic.Score.from_file(path)
    melody = next(t for t in score.tracks if t.name == "Melody")
    assert melody.program == piece.lead and len(melody.notes) > 20
    song = pop909_dir / piece.chart.song / f"{piece.chart.song}.mid"
    seconds, downbeat = annotations(song)
    synced = synchronise(load_score(song), seconds, downbeat, meters=True)
    ref = next(t for t in synced.tracks if t.name.upper() == "MELODY").notes.numpy()
    got = melody.notes.numpy()
    beats = got["time"] / score.ticks_per_quarter  # in the piece's beats
    # song beat i is at tick (i - first downbeat) x 480 + a whole number of beats that keeps every
    # note after tick 0: the one that places the piece's melody best
    offset = piece.start - np.argmax(downbeat)

    def placed(shift: int) -> int:
        at = (beats + offset + shift) * 480
        near = [np.abs(ref["time"][ref["pitch"] == p] - a).min(initial=10**9) for a, p in zip(at, got["pitch"])]
        return int(np.sum(np.array(near) <= 480 // 4))

    assert max(placed(shift) for shift in range(64)) == len(got["time"])


def test_a_six_eight_groove_renders_in_six_eight(tmp_path, pop909_dir):
    """68Swing counts six MMA beats to the bar, each an eighth: its MIDI is declared again in
    6/8 with ticks per quarter doubled, so every bar lasts three quarters and no note moves."""
    style, meter = next((s, m) for s, m in ms.song_styles() if s.name == "stdlib/68swing/68Swing")
    piece = ms.plan_piece(style, meter, 0, ms.song_charts(pop909_dir))
    dest = tmp_path / "piece.mid"
    song = pop909_dir / piece.chart.song / f"{piece.chart.song}.mid"
    assert ms._render_piece((piece, song, dest)) == (None, True)
    midi = mido.MidiFile(dest)
    signatures = {(m.numerator, m.denominator) for t in midi.tracks for m in t if m.type == "time_signature"}
    assert signatures == {(6, 8)} and midi.ticks_per_beat == 2 * 192
    tempo = next(m.tempo for t in midi.tracks for m in t if m.type == "set_tempo")
    assert mido.tempo2bpm(tempo) == pytest.approx(piece.tempo / 2, rel=1e-5)  # a quarter: two of MMA's beats
    enc = TOK.encode(dest)
    assert Counter(TOK.meter_of_bars(enc.ids)) == {(6, 8): ms.BARS_PER_PIECE}
    assert not [t for t in midi.tracks if t.name == "Melody"]  # a song's duple beat has no place in 6/8


def test_a_rerun_renders_nothing_again(corpus, pop909_dir, tmp_path):
    out, report, meters = corpus
    again = ms.prepare(out=out, source=pop909_dir, limit=len(meters), workers=1)
    assert again["rendered"] == 0 and again["tokens"] == report["tokens"]


def test_a_melody_note_on_the_windows_edge_belongs_to_the_bar_it_rounds_to(tmp_path):
    """Beats every half second; the window is beats 2..10. A note a hair before beat 2 starts the
    piece, one a hair before beat 10 is the next bar's; a note held past beat 10 ends there."""
    score = symusic.Score(480)
    track = symusic.Track("MELODY", 0, False)
    for beat, length, pitch in ((1.99, 1, 60), (4, 8, 62), (9.995, 1, 64)):
        track.notes.append(symusic.Note(round(beat * 480), length * 480, pitch, 80))
    score.tracks.append(track)
    score.tempos.append(symusic.Tempo(0, 120.0))  # a beat every half second
    song = tmp_path / "song.mid"
    score.dump_midi(str(song))
    rows = ms.song_melody(song, np.arange(16) * 0.5, start=2, beats=8)
    assert rows[:, 2].tolist() == [60, 62]
    assert rows[:, 0].tolist() == pytest.approx([0, 2], abs=1e-3)
    assert rows[1, 1] == 8  # held past the window: ends with it


def test_a_restruck_note_ends_the_one_sounding():
    track = mido.MidiTrack(
        [
            mido.Message("note_on", note=60, velocity=90, time=0),
            mido.Message("note_on", note=60, velocity=90, time=100),
            mido.Message("note_off", note=60, time=50),
            mido.Message("note_off", note=60, time=50),
        ]
    )
    midi = mido.MidiFile()
    midi.tracks.append(ms.ended_restrikes(track))
    buffer = io.BytesIO()
    midi.save(file=buffer)
    notes = symusic.Score.from_midi(buffer.getvalue()).tracks[0].notes
    assert [(n.time, n.end) for n in notes] == [(0, 100), (100, 150)]


def test_only_the_song_tokenizer_applies(tmp_path, pop909_dir):
    with pytest.raises(DataError, match="only --tokenizer song"):
        ms.prepare(out=tmp_path, source=pop909_dir, limit=1, tokenizer="remi")
