"""Issue 44's hostile inputs, input side: each fault the red team found, built in the test, and the
bound or the exact encoding that answers it."""

from __future__ import annotations

import json
import tracemalloc

import miditoolkit
import numpy as np
import pytest
from test_groove import dump as midi_bytes
from tiny_models import tiny_model

from musegen import mirex, schemas
from musegen.errors import MidiError, MusegenError
from musegen.generation.loop import generate
from musegen.generation.outputs import write_samples
from musegen.generation.prompt import Prompt, load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.constants import MAX_BARS, MAX_PROMPT_BARS
from musegen.music.midi import MAX_MIDI_BYTES, MAX_TEMPOS
from musegen.music.notes import NoteTable, Track
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.remi import RemiTokenizer

REMI = RemiTokenizer()

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def one_line(err: pytest.ExceptionInfo) -> str:
    assert len(str(err.value).splitlines()) == 1, str(err.value)
    return str(err.value)


# ---- fault 10: a prompt of 10,000 bars ----------------------------------------------------------------


def ten_thousand_bars() -> bytes:
    """The red team's MIREX prompt as MIDI: notes at 16ths 0 and 159,999, the first and last cell
    of a piece of MAX_BARS bars."""
    return mirex.prompt_midi([mirex.Note(0, 60, 1), mirex.Note(16 * MAX_BARS - 1, 62, 1)])


def test_nothing_follows_eos_in_the_last_bar_a_piece_may_have():
    ids = REMI.encode(ten_thousand_bars()).ids.tolist()
    grammar = REMI.grammar()
    assert REMI.bar_starts(ids)[-1] == len(ids) - 2  # the closing Bar opens bar MAX_BARS: only EOS may come
    assert not grammar.allowed(grammar.states(ids)[-1]).any()


def test_a_prompt_at_the_bar_limit_is_closed_not_stepped_past_its_end():
    model, tok = tiny_model("remi")
    ids = tok.encode(ten_thousand_bars()).ids[:-1]  # open before EOS, as a prompt of bare ids
    samples, stats = generate(model, tok, Prompt(ids), SampleSettings(length=4, seed=0), progress=False)
    assert stats["invalid"] == 0 and samples[0].ids[-1] == tok.eos_id and samples[0].new_tokens == 1


def test_a_prompt_longer_than_the_bound_is_refused_in_one_line_naming_it():
    with pytest.raises(MidiError) as err:
        load_prompt(REMI, ten_thousand_bars())
    assert f"the prompt has {MAX_BARS:,} bars" in one_line(err) and f"{MAX_PROMPT_BARS:,}" in str(err.value)
    # cut to the bound by --prompt-bars, it is continued
    assert load_prompt(REMI, ten_thousand_bars(), bars=MAX_PROMPT_BARS).bars == MAX_PROMPT_BARS


# ---- fault 13: a MIREX prompt note at 16th 159,999 ----------------------------------------------------


def test_a_mirex_prompt_ends_where_its_continuation_still_fits(tmp_path):
    path = tmp_path / "late.json"
    path.write_text(json.dumps({"prompt": [{"start": 16 * MAX_BARS - 1, "pitch": 60, "duration": 1}]}))
    with pytest.raises(MusegenError) as err:
        mirex.read_prompt(path)
    assert "prompt.0: ends after 16th 80,000 (5,000 bars, the longest prompt)" in one_line(err)


def test_the_origin_offset_is_added_before_the_bound():
    """A continuation decoded at the end of a piece, from a prompt whose origin lies late: every
    note the writer keeps lies inside the format's bounds."""
    bar = 480 * 4
    late = [
        (bar * MAX_PROMPT_BARS, bar * (MAX_PROMPT_BARS + 2), 60, 80),  # held past the end: cut
        (0, 480, 62, 80),
        (bar * (MAX_BARS - 1), bar * MAX_BARS, 64, 80),  # past the end: left out
    ]
    piano = NoteTable.of_tracks(480, [(Track(None, 0, False), late)])
    notes = mirex.generation(piano, mirex.MIREX_PROMPT_MAX_TIME - 16)
    schemas.check({"generation": notes}, mirex.MIREX_GENERATION, "test")
    assert [n["pitch"] for n in notes] == [62, 60]
    assert notes[-1]["start"] + notes[-1]["duration"] == mirex.MIREX_MAX_TIME


def test_every_written_mirex_json_validates(tmp_path):
    """The latest prompt the schema takes, continued: the JSON written reads back through the schema."""
    path = tmp_path / "late.json"
    last = mirex.MIREX_PROMPT_MAX_TIME - 1
    notes = [{"start": 0, "pitch": 60, "duration": 1}, {"start": last, "pitch": 62, "duration": 1}]
    path.write_text(json.dumps({"prompt": notes}))
    model, tok = tiny_model("remi")
    prompt = load_prompt(tok, path)
    samples, _ = generate(model, tok, prompt, SampleSettings(bars=2, seed=0, num_samples=2), progress=False)
    for record in write_samples(samples, tok, prompt, tmp_path / "out", "late"):
        written = schemas.read(tmp_path / "out" / record["json"], mirex.MIREX_GENERATION)
        assert all(n.start > last for n in written.generation)


# ---- fault 9: more copies of a note in one cell than decoding can keep in order ---------------------


def tracks_of_one_note(n: int, pitch: int = 60) -> bytes:
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    for k in range(n):
        piano = miditoolkit.Instrument(0, name=f"Piano {k}")
        piano.notes.append(miditoolkit.Note(60 + k % 5, pitch, 0, 960 if k == n - 1 else 480))  # the last is longest
        midi.instruments.append(piano)
    return midi_bytes(midi)


@pytest.mark.parametrize("tok", [REMI, RemiTokenizer(beat_resolution=8, max_duration=32, chords=False)])
@pytest.mark.parametrize(
    "source",
    [
        lambda: tracks_of_one_note(61),
        lambda: tracks_of_one_note(1000),
        lambda: mirex.prompt_midi([mirex.Note(0, 60, 4)] * 1000),
        # rising pitches a tick apart: no copies, but more rises in the cell than decoding keeps in order
        lambda: mirex_rising(),
    ],
    ids=["61 tracks", "1,000 tracks", "1,000 MIREX copies", "rising"],
)
def test_a_crowded_cell_encodes_to_ids_the_grammar_accepts(tok, source):
    enc = tok.encode(source())
    assert tok.grammar().first_violation(enc.ids) is None
    assert np.array_equal(tok.encode(tok.decode(enc.ids).midi_bytes()).ids, enc.ids)


def mirex_rising() -> bytes:
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    midi.instruments.append(miditoolkit.Instrument(0))
    midi.instruments[0].notes = [miditoolkit.Note(64, 40 + k, k, 480) for k in range(61)]
    return midi_bytes(midi)


def test_copies_in_a_crowded_cell_become_one_note_the_longest_and_counted():
    enc = REMI.encode(tracks_of_one_note(61))
    names = [REMI.vocab[i] for i in enc.ids]
    assert names.count("Note_Pitch_60") == 1 and enc.report["crowded_notes_merged"] == 60
    assert names[names.index("Note_Pitch_60") + 2] == "Note_Duration_960"  # the longest copy
    # a cell within the bound keeps every copy, as the Pop1K7 pipeline writes them
    enc = REMI.encode(tracks_of_one_note(3))
    assert [REMI.vocab[i] for i in enc.ids].count("Note_Pitch_60") == 3 and enc.report["crowded_notes_merged"] == 0


# ---- fault 6: millions of tempo changes ----------------------------------------------------------------


def tempo_track_midi(changes: int) -> bytes:
    """A piano note, a drum hit and a bass note, and `changes` tempo changes one tick apart
    (alternating 100 and 200 bpm): 7 bytes each, so 16 MiB holds 2.4 million."""
    events = b"\x01\xff\x51\x03\x04\x93\xe0\x01\xff\x51\x03\x02\x49\xf0" * (changes // 2)
    notes = b"".join(  # a beat each, on channels 1, 10 and 2
        bytes([0, 0x90 + c, p, 0x40, 0x83, 0x60, 0x80 + c, p, 0]) for c, p in ((0, 60), (9, 36), (1, 36))
    )
    tracks = [events + b"\x00\xff\x2f\x00", notes + b"\x00\xff\x2f\x00"]
    head = b"MThd" + (6).to_bytes(4, "big") + b"\x00\x01\x00\x02\x01\xe0"
    return head + b"".join(b"MTrk" + len(t).to_bytes(4, "big") + t for t in tracks)


def test_the_tempo_quantiser_needs_memory_in_proportion_to_the_tempos():
    bpm = np.random.default_rng(0).uniform(20, 300, 1_000_000)
    tracemalloc.start()
    try:
        REMI.tempo_bins(bpm)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * bpm.nbytes  # a tempos x 65 matrix was 65 x 8 bytes a tempo, twice over
    nearest = lambda values, x: np.argmin(np.abs(values[None, :] - x[:, None]), axis=1)  # noqa: E731  (as it was)
    grid, some = np.arange(32, 225, 3), np.r_[bpm[:1000], np.arange(20, 300, 0.5)]  # halves: ties go down
    assert np.array_equal(REMI.tempo_bins(some), nearest(np.array(REMI.tempos), grid[nearest(grid, some)]))


@pytest.mark.parametrize("kind, changes", [("remi", 2_300_000), ("groove", MAX_TEMPOS + 2)])  # groove-dur: as groove
def test_millions_of_tempo_changes_are_refused_before_they_are_walked(kind, changes):
    """Counted on the parsed file, before a reader makes an object of each (REMI took 3.5 GB)."""
    data = tempo_track_midi(changes)
    assert len(data) < MAX_MIDI_BYTES
    with pytest.raises(MidiError) as err:
        tokenizer_from_dict({"kind": kind}).encode(data)
    assert f"{changes:,} tempo changes, more than a file may have ({MAX_TEMPOS:,}" in one_line(err)


def test_many_tempo_changes_within_the_bound_encode_each_in_its_cell():
    """20,000 tempo changes, one per 16th, alternating: REMI writes each in its cell, binned."""
    rows = [(0, 480, 60, 80), (120 * 19_999, 120 * 20_000, 62, 80)]
    tempos = [(120 * k, 90.0 if k % 2 == 0 else 150.0) for k in range(20_000)]
    data = NoteTable.of_tracks(480, [(Track("Piano", 0, False), rows)], tempos, [(0, 4, 4)]).midi_bytes()
    names = [REMI.vocab[i] for i in REMI.encode(data).ids]
    slow, fast = (REMI.vocab[REMI.tempo_ids[b]] for b in REMI.tempo_bins([90.0, 150.0]))
    assert [n for n in names if n.startswith("Tempo_")] == [slow, fast] * 10_000
    assert MAX_TEMPOS < 20_000 * 8 + 1  # one per 16th of the longest piece


# ---- fault 8: one 2/4 bar inside 4/4 -----------------------------------------------------------------

KINDS = ("remi", "groove", "groove-dur")


def trio_in(signatures, beats: int = 32) -> bytes:
    """Bass, drums and piano, a note each on every beat, under `signatures` ((numerator,
    denominator, beat), ...)."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    for name, program, drum, pitch in (("Bass", 33, False, 40), ("Drums", 0, True, 36), ("Piano", 0, False, 64)):
        track = miditoolkit.Instrument(program, is_drum=drum, name=name)
        track.notes = [miditoolkit.Note(80, pitch + b % 3, 480 * b, 480 * b + 400) for b in range(beats)]
        midi.instruments.append(track)
    midi.time_signature_changes = [miditoolkit.TimeSignature(n, d, 480 * beat) for n, d, beat in signatures]
    return midi_bytes(midi)


LONE = ((4, 4, 0), (2, 4, 16), (4, 4, 18))  # bar 5 is the only 2/4 bar


@pytest.mark.parametrize("kind", KINDS)
def test_a_lone_2_4_bar_is_refused_in_one_line_naming_it(kind):
    tok = tokenizer_from_dict({"kind": kind})
    with pytest.raises(MidiError) as err:
        tok.encode(trio_in(LONE))
    assert "bar 5 is in 2/4 and ends off the 4/4 bar lines (at tick 8640)" in one_line(err)
    with pytest.raises(MidiError, match="bar 5 is in 2/4"):  # as a prompt: never cut mid-bar, 2 beats off
        load_prompt(tok, trio_in(LONE))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "signatures",
    [
        ((4, 4, 0), (2, 4, 16), (4, 4, 20)),  # a pair of 2/4 bars is one 4/4 bar
        ((2, 4, 0),),  # 2/4 throughout, in pairs
        ((4, 4, 0), (2, 4, 28)),  # 2/4 to the end: the last bar is half empty
        ((4, 4, 0), (2, 4, 40), (4, 4, 42)),  # after the music
    ],
    ids=["pair", "all 2/4", "to the end", "after the music"],
)
def test_2_4_bars_that_make_4_4_bars_encode_every_note_on_its_beat(kind, signatures):
    tok = tokenizer_from_dict({"kind": kind})
    onsets = sorted(set(tok.decode(tok.encode(trio_in(signatures)).ids).start.tolist()))
    assert onsets == [480 * b for b in range(32)]


def test_a_pickup_is_exact_for_remi_and_refused_by_the_groove_tokenizers():
    """REMI puts a pickup at the end of its first bar; the groove tokens count bars from tick 0."""
    pickup = ((1, 4, 0), (4, 4, 1))
    onsets = sorted(set(REMI.decode(REMI.encode(trio_in(pickup)).ids).start.tolist()))
    assert onsets == [480 * (b + 3) for b in range(32)]  # three beats of silence before the pickup
    for kind in KINDS[1:]:
        with pytest.raises(MidiError, match="bar 1 is in 1/4 and ends off the 4/4 bar lines"):
            tokenizer_from_dict({"kind": kind}).encode(trio_in(pickup))
