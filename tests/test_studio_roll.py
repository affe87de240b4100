"""The studio's piano roll in a real browser (Debian's headless Chromium, as test_studio_browser.py
drives it): a lane per track in its instrument's colour with a legend, bar lines where the meter
puts them, a window that opens on the seam and zooms and scrolls, one sample at a time, and
messages in the page's words. Each test leaves a screenshot of the page in its tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import miditoolkit
import pretty_midi
import pytest
from conftest import POP909
from test_studio import EXAMPLE, POP, ROOT, serving
from test_studio_browser import choose, fill, open_page, prompt_named, pytestmark, wait_for  # noqa: F401

from musegen.studio.models import Models
from musegen.studio.server import create_app

SONG = ROOT / "checkpoints" / "song"
MULTITRACK = ROOT / "tests" / "data" / "multitrack"


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """The studio with the pop and the song model, served."""
    with serving(create_app(tmp_path_factory.mktemp("out"), Models([POP, SONG]))) as base:
        yield base


def roll(browser, key: str):
    return json.loads(browser.execute_script("return document.getElementById('roll').dataset[arguments[0]]", key))


def text(browser, id_: str) -> str:
    return browser.execute_script("return document.getElementById(arguments[0]).textContent", id_)


def load(browser, base: str, model: str, path: Path) -> None:
    """A fresh page with `model` chosen and `path` as its prompt, drawn."""
    from selenium.webdriver.common.by import By

    open_page(browser, base)
    choose(browser, "model", model)
    browser.find_element(By.ID, "file").send_keys(str(path))
    prompt_named(browser, path.name, 120)


def generate(browser, fields: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By

    fill(browser, fields)
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: text(browser, "status").startswith("done"), 300)


def built_midi(path: Path, meters: list[tuple[int, int, int]], bars: int) -> Path:
    """A piano melody, a bass and a kick on every beat over `bars` bars in `meters` [(bar, numerator,
    denominator)], as a MIDI file at `path`; a bar's beats are quarters (x/4) or dotted quarters (x/8)."""
    tpq, tick, lines = 480, 0, []
    changes = dict((bar, (n, d)) for bar, n, d in meters)
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    piano, bass, drums = miditoolkit.Instrument(0), miditoolkit.Instrument(33), miditoolkit.Instrument(0, is_drum=True)
    meter = changes[0]
    for bar in range(bars):
        if bar in changes:
            meter = changes[bar]
            midi.time_signature_changes.append(miditoolkit.TimeSignature(*meter, tick))
        lines.append(tick)
        beat = tpq if meter[1] == 4 else 3 * tpq // 2
        length = meter[0] * 4 * tpq // meter[1]
        for k, start in enumerate(range(tick, tick + length, beat)):
            piano.notes.append(miditoolkit.Note(90, 67 + (bar + k) % 7, start, start + beat))
            drums.notes.append(miditoolkit.Note(100, 36 if k == 0 else 42, start, start + 60))
        bass.notes.append(miditoolkit.Note(90, 36 + bar % 5, tick, tick + length))
        tick += length
    midi.instruments = [piano, bass, drums]
    midi.dump(str(path))
    return path


def test_a_lane_per_track_in_its_familys_colour_named_in_the_legend(browser, studio, tmp_path):
    colours = []
    for name in ("freedoom1_D_E1M6.mid", "freedoom2_D_IN_CIT.mid"):
        load(browser, studio, "song", MULTITRACK / name)
        midi = miditoolkit.MidiFile(str(MULTITRACK / name))
        played = {
            "Drums" if i.is_drum else pretty_midi.program_to_instrument_name(i.program)
            for i in midi.instruments
            if i.notes
        }
        lanes = roll(browser, "lanes")
        assert {lane["name"] for lane in lanes} == played  # every instrument of the file, by its General MIDI name
        legend = [item.text for item in browser.find_elements("css selector", "#legend .instrument")]
        assert legend == [lane["name"] for lane in lanes]
        assert len({lane["color"] for lane in lanes}) == len(lanes)  # told apart by colour

        # the drums: the last lane, below every pitched one, a row per drum sound the prompt uses
        notes = browser.execute_script("return state.view.promptNotes")
        drums, pitched = lanes[-1], lanes[:-1]
        assert drums["name"] == "Drums" and drums["drum"] and not any(lane["drum"] for lane in pitched)
        assert drums["pitches"] == sorted({n[2] for n in notes if n[4]})
        assert drums["top"] >= max(lane["bottom"] for lane in pitched)
        assert drums["notes"] == sum(1 for n in notes if n[4])
        for above, below in zip(lanes, lanes[1:]):
            assert above["bottom"] <= below["top"]  # lanes never overlap
        colours.append({lane["program"] // 8: lane["color"] for lane in pitched})
        browser.save_screenshot(str(tmp_path / f"{name}.png"))
    # a family keeps its colour from piece to piece: the basses (programs 34, 35), the first guitars
    (bass_family, guitar_family) = 4, 3
    assert colours[0][bass_family] == colours[1][bass_family] and colours[0][guitar_family] != colours[0][bass_family]


def bar_steps(browser) -> list[int]:
    lines = roll(browser, "barLines")
    return [b - a for a, b in zip(lines, lines[1:])]


def test_tracks_of_one_instrument_are_numbered_in_the_lanes_and_the_legend(browser, studio, tmp_path):
    """Two string sections: two lanes of one name would not say which is which; the number is in
    brackets because many General MIDI names end in a number of their own."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    for pitch in (72, 48):
        strings = miditoolkit.Instrument(48)
        strings.notes = [miditoolkit.Note(80, pitch + k % 3, 480 * k, 480 * k + 480) for k in range(16)]
        midi.instruments.append(strings)
    path = tmp_path / "two_string_sections.mid"
    midi.dump(str(path))
    load(browser, studio, "song", path)
    names = [lane["name"] for lane in roll(browser, "lanes")]
    assert names == ["String Ensemble 1 (1)", "String Ensemble 1 (2)"]
    assert [item.text for item in browser.find_elements("css selector", "#legend .instrument")] == names
    browser.save_screenshot(str(tmp_path / "strings.png"))


def test_bar_lines_fall_where_the_meter_puts_them(browser, studio, tmp_path):
    beat = 480  # the song tokens' ticks per beat, as the page draws them
    waltz = built_midi(tmp_path / "waltz.mid", [(0, 3, 4)], 4)  # 4 bars: the roll opens on its first
    load(browser, studio, "song", waltz)
    assert browser.execute_script("return state.view.ticksPerBeat") == beat
    assert roll(browser, "barLines")[0] == 0 and set(bar_steps(browser)) == {3 * beat}

    # 4/4 for two bars, then 6/8 (two dotted quarters a bar): the bar lines change with the meter
    changing = built_midi(tmp_path / "changing.mid", [(0, 4, 4), (2, 6, 8)], 4)
    load(browser, studio, "song", changing)
    assert bar_steps(browser)[:2] == [4 * beat, 4 * beat] and set(bar_steps(browser)[2:]) == {3 * beat}

    # the waltz continued: its continuation's bars are 3/4 too, two of them past the prompt's 4
    load(browser, studio, "song", waltz)
    generate(browser, {"bars": "2", "samples": "1", "seed": "4"})
    lines = roll(browser, "barLines")
    seam = browser.execute_script("return state.view.promptEnd")
    assert set(bar_steps(browser)) == {3 * beat} and lines[:6] == [k * 3 * beat for k in range(6)]
    assert 3 * 3 * beat < seam <= lines[4]  # the prompt's 4 bars, then the continuation's 2
    browser.save_screenshot(str(tmp_path / "waltz.png"))


def test_the_roll_opens_on_the_seam_then_zooms_and_scrolls(browser, studio, tmp_path):
    from selenium.webdriver.common.by import By

    load(browser, studio, "song", POP909 / "001" / "001.mid")  # 144 bars of 2/4
    seam, end = browser.execute_script("return [state.view.promptEnd, state.view.total]")
    starts = browser.execute_script("return barStarts(state.view.meters, state.view.ticksPerBeat, arguments[0])", end)
    seam_bar = sum(1 for t in starts if t < seam)  # the bar the prompt ends in
    shown = lambda: (float(roll(browser, "from")), float(roll(browser, "to")))  # noqa: E731
    assert shown() == (starts[seam_bar - 4], end)  # the prompt's last 4 bars, then the rest
    browser.save_screenshot(str(tmp_path / "seam.png"))

    click = lambda id_: browser.find_element(By.ID, id_).click()  # noqa: E731
    from_, to = shown()
    click("zoom-in")
    assert shown()[1] - shown()[0] == pytest.approx((to - from_) / 2)
    zoomed = shown()
    click("scroll-left")
    assert shown()[0] < zoomed[0] and shown()[1] - shown()[0] == pytest.approx(zoomed[1] - zoomed[0])
    wheel = "document.getElementById('roll').dispatchEvent(new WheelEvent('wheel', arguments[0]))"
    before = shown()
    browser.execute_script(wheel, {"deltaY": 300, "ctrlKey": True, "clientX": 300, "bubbles": True, "cancelable": True})
    assert shown()[1] - shown()[0] > before[1] - before[0]  # Ctrl + wheel down: zoomed out
    for _ in range(8):
        click("zoom-out")
    assert shown() == (0, end)  # the whole piece, at most
    labels = roll(browser, "barLabels")  # 144 bars: every k-th numbered, none touching the next
    numbers = [n for n, _, _ in labels]
    assert numbers[0] == 1 and len(numbers) < 60 and len({b - a for a, b in zip(numbers, numbers[1:])}) == 1
    for (_, x, width), (_, next_x, _) in zip(labels, labels[1:]):
        assert x + width < next_x
    browser.save_screenshot(str(tmp_path / "whole.png"))
    click("seam")
    assert shown() == (starts[seam_bar - 4], end)


def test_the_large_roll_shows_one_sample_at_a_time(browser, studio, tmp_path):
    from selenium.webdriver.common.by import By

    open_page(browser, studio)
    choose(browser, "example", EXAMPLE)
    prompt_named(browser, EXAMPLE)
    generate(browser, {"bars": "2", "samples": "3", "seed": "6"})
    samples = browser.execute_script("return state.view.samples.map((s) => s.notes.length)")
    assert len(samples) == 3
    drawn = lambda: sum(lane["notes"] for lane in roll(browser, "lanes"))  # noqa: E731
    assert roll(browser, "sample") == 0 and drawn() == samples[0]
    assert text(browser, "legend").startswith("Sample 1 of 3:")
    browser.find_elements(By.CSS_SELECTOR, "#ab button")[2].click()
    assert roll(browser, "sample") == 2 and drawn() == samples[2]
    assert text(browser, "legend").startswith("Sample 3 of 3:")
    browser.find_elements(By.CSS_SELECTOR, ".sample canvas")[1].click()  # a card chooses its sample too
    assert roll(browser, "sample") == 1 and drawn() == samples[1]
    browser.save_screenshot(str(tmp_path / "samples.png"))


def test_the_page_names_settings_by_their_labels_and_refuses_a_useless_temperature(browser, studio, tmp_path):
    from selenium.webdriver.common.by import By

    open_page(browser, studio)
    error = lambda: browser.find_element(By.ID, "error").text  # noqa: E731
    for fields, message in (
        ({"temperature": "100"}, "Temperature must be within 0.1..3.0 in the studio, got 100"),
        ({"temperature": "1", "top_p": "2"}, "Top-p must be within [1e-06, 1], got 2.0"),
    ):
        fill(browser, fields)
        browser.find_element(By.ID, "generate").click()
        wait_for(lambda: error() == message, 30)  # noqa: B023
        assert "--" not in error()
    browser.save_screenshot(str(tmp_path / "refused.png"))
