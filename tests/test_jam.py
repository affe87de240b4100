"""`musegen jam` in virtual time: fake MIDI ports and a clock that stands still while the model
samples, so every note the model sends is due at the time its onset names, and the shipped models
answer, hand back and accompany as a player would hear them."""

from __future__ import annotations

import sys

import mido
import numpy as np
import pytest

from musegen.checkpoint import load_checkpoint
from musegen.cli import main
from musegen.generation.jam import DRUM_CHANNEL, Jam
from musegen.generation.live import TPQ, Live, LiveNote
from musegen.generation.settings import SampleSettings
from musegen.music.notes import NoteTable, Track

BPM = 100
BAR = 2.4  # seconds of a 4/4 bar at 100 BPM
BEAT = BAR / 4
START = BAR  # the player's first bar line: one bar of count-in from 0
TICK = 60 / (BPM * TPQ)


def line(bar: int) -> float:
    return START + bar * BAR


class VirtualTime:
    """A clock that moves only when the jam sleeps, and wakes it when the player plays, as a port's
    callback would; KeyboardInterrupt at `interrupt_at`, as Ctrl-C."""

    def __init__(self, played: list[tuple[float, mido.Message]], interrupt_at: float | None = None):
        self.now = 0.0
        self.played = sorted(played, key=lambda p: p[0])
        self.interrupt_at = interrupt_at

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        wake = self.now + seconds
        if self.played and self.played[0][0] < wake:
            wake = max(self.played[0][0], self.now)
        if self.interrupt_at is not None and wake >= self.interrupt_at:
            self.now = self.interrupt_at
            raise KeyboardInterrupt
        self.now = wake


class FakeInput:
    name = "fake keyboard"

    def __init__(self, time: VirtualTime):
        self.time = time

    def iter_pending(self):
        while self.time.played and self.time.played[0][0] <= self.time.now:
            yield self.time.played.pop(0)[1]


class FakeOutput:
    name = "fake synthesizer"

    def __init__(self, time: VirtualTime):
        self.time, self.sent = time, []

    def send(self, message: mido.Message) -> None:
        self.sent.append((self.time.now, message))

    def note_ons(self, drums: bool = False) -> list[tuple[float, mido.Message]]:
        """The model's note-ons (the click's and drums' on channel 10 only if `drums`)."""
        return [
            (t, m)
            for t, m in self.sent
            if m.type == "note_on" and m.velocity > 0 and (m.channel == DRUM_CHANNEL) == drums
        ]


class LaggingWorker:
    """A worker thread whose every job takes `latency` seconds of virtual time: a job is done (and
    its notes are there) once the clock has passed the time it ends, one after another."""

    def __init__(self, time: VirtualTime, latency: float):
        self.time, self.latency, self.jobs, self.free_at = time, latency, [], 0.0

    def submit(self, job) -> None:
        self.free_at = max(self.time.now, self.free_at) + self.latency
        self.jobs.append((self.free_at, job))

    def check(self) -> None:
        while self.jobs and self.jobs[0][0] <= self.time.now:
            self.jobs.pop(0)[1]()


def phrase(bars: int, start: float = START, pitches=(60, 62, 64, 65, 67, 69, 71, 72)) -> list:
    """Quarter notes of a C major scale from `start`, each held for 0.5 s (five sixths of a beat)."""
    notes = []
    for k in range(4 * bars):
        on = start + k * BEAT
        pitch = pitches[k % len(pitches)]
        notes += [
            (on, mido.Message("note_on", note=pitch, velocity=80)),
            (on + 0.5, mido.Message("note_off", note=pitch)),
        ]
    return notes


@pytest.fixture(scope="module")
def pop():
    model, tokenizer, _, _ = load_checkpoint("checkpoints/pop")
    return model, tokenizer


@pytest.fixture(scope="module")
def song():
    model, tokenizer, _, _ = load_checkpoint("checkpoints/song")
    return model, tokenizer


def jam_of(
    loaded, played, interrupt_at=None, backing=(), backing_bars=0, program=0, latency=None, **options
) -> tuple[Jam, FakeOutput]:
    model, tokenizer = loaded
    settings = SampleSettings(precision="fp32", seed=7)
    live = Live(model, tokenizer, settings, bpm=BPM, program=program, backing=list(backing), backing_bars=backing_bars)
    time = VirtualTime(played, interrupt_at)
    out = FakeOutput(time)
    if latency is not None:
        options["worker"] = LaggingWorker(time, latency)
    return Jam(live, FakeInput(time), out, time.clock, time.sleep, **options), out


def model_onsets(jam: Jam, start: float = START) -> list[float]:
    """When each note the model sent was due: its onset in the piece's ticks, on the jam's clock
    (`start`: when the player's first bar began)."""
    return [start + (n.start - jam.first_bar * jam.live.bar_ticks) * TICK for n in jam.model_notes]


def test_the_answer_begins_at_the_bar_line_after_the_silent_bar_and_every_note_sounds_at_its_time(pop, tmp_path):
    jam, out = jam_of(pop, phrase(2), bars=6)
    jam.run(save=tmp_path / "jam.mid")
    sent = out.note_ons()
    assert sent, "the model answered nothing"
    times = [t for t, _ in sent]
    # bars 0-1 played, bar 2 silent: the answer is bars 3 and 4 (as long as the phrase), then silence
    assert min(times) >= line(3) - 1e-9 and max(times) < line(5)
    assert any(t >= line(4) for t in times), "the answer has only one bar"
    assert times == pytest.approx(model_onsets(jam), abs=1e-9)
    assert [m.note for _, m in sent] == [n.pitch for n in jam.model_notes]
    assert times[0] == pytest.approx(line(3), abs=1e-9)  # pop's answers open on the bar's first beat
    # the click: every beat from the count-in on, the bar's first beat high
    clicks = out.note_ons(drums=True)
    assert [t for t, _ in clicks] == pytest.approx([k * BEAT for k in range(4 * 7)], abs=1e-9)
    assert [m.note for _, m in clicks][:5] == [76, 77, 77, 77, 76]
    # every note the model started, it ended
    offs = [(m.channel, m.note) for _, m in out.sent if m.type == "note_off"]
    assert sorted((m.channel, m.note) for _, m in out.sent if m.type == "note_on") == sorted(offs)

    saved = NoteTable.read(tmp_path / "jam.mid", by_role=False)
    scale = TPQ / saved.tpq
    names = [t.name for t in saved.tracks]
    player = saved.select(saved.track == names.index("player"))
    assert (player.start * scale).tolist() == [k * TPQ for k in range(8)]  # as played, to the tick
    assert ((player.end - player.start) * scale).tolist() == [400] * 8  # 0.5 s at 100 BPM
    model = saved.select(saved.track == names.index("model"))
    order = np.lexsort((model.pitch, model.start))
    sent_notes = sorted((n.start, n.pitch) for n in jam.model_notes)
    assert list(zip((model.start[order] * scale).tolist(), model.pitch[order].tolist())) == sent_notes


def test_notes_the_model_draws_late_sound_at_once_unless_they_are_over(pop):
    latency = 0.5  # each job: closing the silent bar, then drawing the answer's first bar
    jam, out = jam_of(pop, phrase(2), latency=latency, bars=6)
    jam.run()
    sent = out.note_ons()
    arrival = sent[0][0]  # the first bar's notes, seen at the loop's next read after the worker is done
    assert line(3) + 2 * latency <= arrival < line(3) + 2 * latency + 0.002
    drawn = [n for n in jam.live.notes if n.start >= 3 * jam.live.bar_ticks]  # the answer, as the engine has it
    heard = [n for n in drawn if START + n.end * TICK > arrival]
    assert len(heard) < len(drawn), "no note of the answer was over before it arrived: nothing to leave out"
    assert sorted(jam.model_notes, key=LiveNote.row) == sorted(heard, key=LiveNote.row)
    assert [t for t, _ in sent] == pytest.approx([max(START + n.start * TICK, arrival) for n in heard], abs=1e-9)


def test_echo_sends_the_player_on_to_the_output_as_their_instrument(pop):
    jam, out = jam_of(pop, phrase(1), program=24, echo=True, click=False, bars=1)
    jam.run()
    assert out.sent[0][1] == mido.Message("program_change", channel=0, program=24)
    echoed = [(t, m.type, m.note) for t, m in out.sent[1:] if m.channel != DRUM_CHANNEL]  # the count-in clicks
    assert echoed == [(t, m.type, m.note) for t, m in phrase(1)]
    assert all(m.channel == 0 for _, m in out.sent if m.channel != DRUM_CHANNEL)


def test_playing_during_an_answer_drops_it_from_the_next_bar_line_and_the_next_phrase_is_answered(pop):
    # a four-bar phrase, bar 4 silent: a four-bar answer from bar 5
    whole, _ = jam_of(pop, phrase(4), bars=9)
    whole.run()
    whole_onsets = model_onsets(whole)
    assert max(whole_onsets) >= line(7), "the answer left bars 7-8 empty: nothing to hand back"
    # the same, but the player comes back in bar 6: the answer stops at bar 7's line
    back = phrase(4) + [(line(6) + 0.3, mido.Message("note_on", note=67, velocity=90))]
    back += [(line(6) + 0.9, mido.Message("note_off", note=67))]
    cut, out = jam_of(pop, back, bars=9)
    cut.run()
    onsets = model_onsets(cut)
    before = [(t, n.pitch) for t, n in zip(whole_onsets, whole.model_notes) if t < line(7)]
    assert [(t, n.pitch) for t, n in zip(onsets, cut.model_notes) if t < line(7)] == before
    assert not [t for t in onsets if line(7) <= t < line(8)]
    # nor has the model heard it: the bar it drew ahead was taken back, and bar 7 stayed silent
    heard = [START + (n.start - cut.first_bar * cut.live.bar_ticks) * TICK for n in cut.live.notes]
    assert not [t for t in heard if line(7) <= t < line(8)]
    # that phrase (bar 6) ended with a silent bar 7: the model answers it from bar 8
    assert [t for t in onsets if t >= line(8)], "the second phrase was not answered"
    assert [t for t, _ in out.note_ons()] == pytest.approx(onsets, abs=1e-9)


def test_ctrl_c_still_ends_every_note_and_saves_the_jam(pop, tmp_path):
    interrupt = line(3) + 1.0  # during the answer
    jam, out = jam_of(pop, phrase(2), interrupt_at=interrupt)
    with pytest.raises(KeyboardInterrupt):
        jam.run(save=tmp_path / "jam.mid")
    assert jam.model_notes and all(t <= interrupt for t in model_onsets(jam))
    ons = sorted((m.channel, m.note) for _, m in out.sent if m.type == "note_on")
    assert ons == sorted((m.channel, m.note) for _, m in out.sent if m.type == "note_off")
    saved = NoteTable.read(tmp_path / "jam.mid", by_role=False)
    assert [t.name for t in saved.tracks] == ["player", "model"]
    assert np.bincount(saved.track).tolist() == [8, len(jam.model_notes)]


def band() -> tuple[list, int]:
    """Two bars of a band, built here: bass (GM 33) on the roots, piano (0) chords, drums."""
    from musegen.generation.jam import backing_from

    bar = 4 * TPQ
    bass = [(b * bar + k * TPQ, b * bar + k * TPQ + 400, root, 90) for b, root in enumerate((36, 41)) for k in range(4)]
    piano = [(b * bar, b * bar + bar, p + (5 if b else 0), 70) for b in range(2) for p in (60, 64, 67)]
    drums = [(k * TPQ, k * TPQ + 60, 36 if k % 2 == 0 else 38, 100) for k in range(8)]
    drums += [(k * TPQ // 2, k * TPQ // 2 + 60, 42, 70) for k in range(16)]
    table = NoteTable.of_tracks(
        TPQ,
        [(Track("bass", 33, False), bass), (Track("piano", 0, False), piano), (Track("drums", 0, True), drums)],
        [(0, float(BPM))],
        [(0, 4, 4)],
    )
    return backing_from(NoteTable.read(table.midi_bytes(), by_role=False), (4, 4))


def test_accompaniment_plays_the_other_instruments_under_the_player(song):
    backing, bars = band()
    assert bars == 2
    played = phrase(2, start=0.0)  # no count-in: the player's first bar, the piece's third, begins at once
    jam, out = jam_of(
        song, played, backing=backing, backing_bars=bars, mode="accompany", click=False, count_in=0, bars=2
    )
    jam.run()
    assert jam.model_notes, "no accompaniment"
    assert all(n.drum or n.program != 0 for n in jam.model_notes)  # never the player's piano
    programs = {m.channel: m.program for _, m in out.sent if m.type == "program_change"}
    assert 0 not in programs.values()
    sent = out.note_ons() + out.note_ons(drums=True)
    assert all(m.channel == DRUM_CHANNEL or m.channel in programs for _, m in sent)
    assert sorted(t for t, _ in sent) == pytest.approx(sorted(model_onsets(jam, start=0.0)), abs=1e-9)
    assert all(0 <= t < 2 * BAR for t, _ in sent)


def test_accompaniment_without_a_band_is_refused_in_one_line(song):
    with pytest.raises(
        Exception, match="--mode accompany: an accompaniment goes on with the piece's other instruments"
    ):
        jam_of(song, [], mode="accompany")


# --- the command line ------------------------------------------------------------------------------
def run_cli(args: list[str], capsys) -> tuple[int, list[str], str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.err.strip().splitlines(), captured.out


def test_help_names_the_options(capsys):
    code, _, out = run_cli(["jam", "--help"], capsys)
    assert code == 0
    for flag in ("--list-ports", "--mode", "--answer-bars", "--count-in", "--save", "--temperature", "--seed"):
        assert flag in out, flag
    assert "--length" not in out and "--num-samples" not in out


def test_without_a_port_backend_the_command_says_how_to_get_one(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "rtmidi", None)  # as where python-rtmidi is not installed
    monkeypatch.setitem(sys.modules, "mido.backends.rtmidi", None)
    monkeypatch.setattr(mido, "backend", mido.Backend("mido.backends.rtmidi"))
    code, err, _ = run_cli(["jam", "--list-ports"], capsys)
    assert code != 0 and len(err) == 1 and "pip install 'musegen[jam]'" in err[0], err


@pytest.mark.parametrize(
    "args, says",
    [
        (["-m", "no_such_model"], "no_such_model"),
        (["--meter", "3/4"], "--meter 3/4: the remi tokens cannot play in 3/4"),
        (["--meter", "2/4"], "--meter 2/4: the remi tokens cannot play in 2/4 (they join its bars"),
        (["--meter", "four"], "--meter must be"),
        (["--bpm", "0"], "--bpm must be within 1..1000"),
        (["--program", "128"], "--program must be within 0..127"),
        (["--save", "no/such/folder/jam.mid"], "no folder"),
    ],
)
def test_bad_input_is_one_line_before_any_port_is_opened(args, says, capsys, monkeypatch):
    monkeypatch.setenv("MUSEGEN_PRECISION", "fp32")
    code, err, _ = run_cli(["jam", *args], capsys)
    assert code != 0 and len(err) == 1 and says in err[0], err
    assert "port" not in err[0]


def test_the_command_takes_the_prompts_tempo_and_meter_and_saves_the_jam(tmp_path, capsys, monkeypatch):
    from musegen.generation import jam as jamming

    monkeypatch.setenv("MUSEGEN_PRECISION", "fp32")
    waltz = NoteTable.of_tracks(
        TPQ,
        [(Track("bass", 33, False), [(0, 400, 43, 90), (3 * TPQ, 3 * TPQ + 400, 38, 90)])],
        [(0, 240.0)],
        [(0, 3, 4)],
    )
    (tmp_path / "waltz.mid").write_bytes(waltz.midi_bytes())
    time = VirtualTime([])  # a player who plays nothing, on ports of the test's own
    monkeypatch.setattr(jamming, "open_ports", lambda i, o: (FakeInput(time), FakeOutput(time)))
    args = ["jam", "-m", "song", "--prompt", tmp_path / "waltz.mid", "--mode", "accompany", "--bars", "1"]
    code, err, out = run_cli([str(a) for a in [*args, "--count-in", "0", "--save", tmp_path / "jam.mid"]], capsys)
    assert code == 0, err
    assert "accompany with song at 240 BPM in 3/4" in out and f"written to {tmp_path / 'jam.mid'}" in out
    saved = NoteTable.read(tmp_path / "jam.mid", by_role=False)
    assert saved.time_signatures == [(0, 3, 4)] and saved.tempos[0][1] == pytest.approx(240)
    assert not [k for k, t in enumerate(saved.tracks) if t.name == "player" and (saved.track == k).any()]
