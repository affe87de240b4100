"""The groove tokenizer against the reference pipeline's own output (tests/data/golden/groove_spe:
31 Groove2Groove-layout files encoded by aliutkus/spe's groove code through MusPy 0.3.0)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import GOLDEN

from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_events import END, START, TIME_SHIFT, serialize, token_times

FOLDER = GOLDEN / "groove_spe"
CASES = sorted(p for p in FOLDER.glob("*.json") if p.name != "vocab.json")
TOK = GrooveTokenizer()


def musegen_name(event: str) -> str:
    """The reference's event name in musegen's naming: note_on(2,36) -> NoteOn_2_36, eos -> End."""
    call = re.fullmatch(r"(note_on|note_off|time_shift)\((\d+),(\d+)\)", event)
    if call:
        kind = {"note_on": "NoteOn", "note_off": "NoteOff", "time_shift": "TimeShift"}[call[1]]
        return f"{kind}_{call[2]}_{call[3]}"
    return {"eos": "End", "bos": "Start"}[event]


def load(case):
    return json.loads(case.read_text())


def test_the_golden_set_is_complete():
    assert len(CASES) == 31
    kinds = {c.stem.split("_")[0].rstrip("0123456789") for c in CASES}
    assert kinds == {"mma", "random"}


def test_vocabulary_names_the_same_events():
    reference = json.loads((FOLDER / "vocab.json").read_text())
    assert len(reference) == 794 == TOK.vocab_size - 1
    assert [musegen_name(e) for e in reference] == TOK.vocab[:794]
    assert reference[END] == "eos" and reference[START] == "bos"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_encoding_reproduces_the_reference_ids(case):
    golden = load(case)
    ids = TOK.encode(FOLDER / golden["file"]).ids
    assert ids.tolist() == golden["ids"]
    assert [TOK.vocab[i] for i in golden["ids"]] == [musegen_name(e) for e in golden["events"]]


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_decoding_gives_back_the_reference_notes(case):
    golden = load(case)
    assert TOK.notes(golden["ids"]).tolist() == golden["notes"]


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_grammar_accepts_the_reference_sequence_and_decode_re_encodes_it(case):
    golden = load(case)
    assert TOK.grammar().first_violation(golden["ids"]) is None
    notes = np.array(golden["notes"]).reshape(-1, 4)
    again = TOK.encode(TOK.decode(golden["ids"]).midi_bytes()).ids
    assert TOK.notes(again).tolist() == golden["notes"]  # the decoded file holds the same notes
    assert again.tolist() == serialize(notes).tolist()  # in canonical order (ties by track)


def test_the_golden_files_exercise_what_the_encoder_must_get_right():
    """Triplets, human timing, zero-length notes, same-pitch overlaps and long silences occur,
    and most shifts restate or move to a tick inside the current beat."""
    notes = np.concatenate([np.array(load(c)["notes"]).reshape(-1, 4) for c in CASES])
    assert ((notes[:, 2] % 12) % 4 == 0).mean() < 0.95 and (notes[:, 2] % 12 == 4).any()  # thirds of a beat
    assert (notes[:, 3] == notes[:, 2]).sum() > 100  # zero-length notes
    ids = np.concatenate([load(c)["ids"] for c in CASES])
    shifts = ids[(ids >= TIME_SHIFT) & (ids < END)] - TIME_SHIFT
    assert (shifts == 23).any() and (shifts < 11).mean() > 0.5  # (2, 0) chains; (0, t) dominate
    overlaps = 0
    for case in CASES:
        rows = np.array(load(case)["notes"]).reshape(-1, 4)
        for track, pitch in {(t, p) for t, p, _, _ in rows.tolist()}:
            same = rows[(rows[:, 0] == track) & (rows[:, 1] == pitch)]
            overlaps += int((same[1:, 2] < same[:-1, 3]).sum())
    assert overlaps > 0
    longest = max(int(np.diff(token_times(np.array(load(c)["ids"]))).max()) for c in CASES)
    assert longest >= 24
