"""Playing along in the studio's page (Debian's headless Chromium, as in test_studio_browser.py):
keys pressed in time with the page's own clock (the AudioContext's), the bars sent to the server,
the model's answer scheduled on the piece's bar lines, and the piece written as it was played."""

from __future__ import annotations

import io

import httpx
import miditoolkit
import pytest
from test_studio import POP, serving
from test_studio_browser import choose, fill, open_page, pytestmark, shown, wait_for  # noqa: F401

from musegen.studio.models import Models
from musegen.studio.server import create_app
from musegen.studio.sound import Sound


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """The studio with the pop model, served, without the page's synthesiser (its soundfont is no
    part of these tests): the page keeps time on an AudioContext of its own."""
    silent = Sound.find(tmp_path_factory.mktemp("no-node-modules"))
    with serving(create_app(tmp_path_factory.mktemp("out"), Models([POP]), sound=silent)) as base:
        yield base


def live(page, expression: str):
    return page.execute_script(f"return {expression}")


def at_time(page, seconds: float) -> None:
    """Waits until the page's AudioContext clock reaches `seconds`."""
    wait_for(lambda: live(page, "musegenLive.context.currentTime") >= seconds, 30, every=0.005)


def play(page, key: str, start: float, end: float) -> None:
    """Presses `key` when the page's clock is at `start` and lets it go at `end` (context seconds)."""
    from selenium.webdriver.common.action_chains import ActionChains

    at_time(page, start)
    ActionChains(page).key_down(key).perform()
    at_time(page, end)
    ActionChains(page).key_up(key).perform()


def test_two_bars_played_and_space_bring_an_answer_on_the_next_bar_line_and_the_piece_is_saved(browser, studio):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, studio)
    fill(browser, {"seed": "1", "live-bpm": "100"})
    browser.find_element(By.ID, "live-start").click()
    wait_for(lambda: live(browser, "musegenLive.on"), 30)
    tpq, bar_ticks = live(browser, "musegenLive.tpq"), live(browser, "musegenLive.barTicks")
    beat = 60 / 100
    assert bar_ticks == 4 * tpq and live(browser, "musegenLive.secondsPerTick") == pytest.approx(beat / tpq)
    first_line = live(browser, "musegenLive.barLines[0]")
    assert first_line["bar"] == 0 and first_line["tick"] == 0
    # two bars of quarter notes on the first three beats, C E G then D F A; Space in the second bar
    for bar, keys in enumerate(("adg", "sfh")):
        for k, key in enumerate(keys):
            onset = first_line["at"] + (4 * bar + k) * beat
            play(browser, key, onset, onset + beat / 2)
    at_time(browser, first_line["at"] + 7 * beat)
    ActionChains(browser).key_down(Keys.SPACE).key_up(Keys.SPACE).perform()

    wait_for(lambda: live(browser, "musegenLive.scheduled.length"), 60)
    posts = live(browser, "musegenLive.posts.map(({bar, notes, answer}) => ({bar, notes, answer}))")
    assert [(p["bar"], p["answer"]) for p in posts] == [(0, 0), (1, 2)]  # Space: an answer of the panel's 2 bars
    assert [n[2] for p in posts for n in p["notes"]] == [60, 64, 67, 62, 65, 69]
    # the answer starts on the next bar line: in the piece's ticks and on the AudioContext's clock
    line = live(browser, "musegenLive.barLines.find((b) => b.bar === 2)")
    first = live(browser, "musegenLive.scheduled[0]")
    assert line["tick"] == 2 * bar_ticks and first["tick"] == line["tick"]
    assert first["at"] == line["at"] == pytest.approx(first_line["at"] + 8 * beat, abs=1e-9)
    scheduled = live(browser, "musegenLive.scheduled")
    for note in scheduled:  # each at its place after the bar line
        assert note["at"] == pytest.approx(line["at"] + (note["tick"] - line["tick"]) * beat / tpq, abs=1e-9)
    assert all(2 * bar_ticks <= n["tick"] < 4 * bar_ticks for n in scheduled)

    wait_for(lambda: "answered" in browser.find_element(By.ID, "live-status").text, 60)
    answer = live(browser, "musegenLive.scheduled.map((n) => [n.tick, n.end, n.pitch, n.velocity])")
    browser.find_element(By.ID, "live-stop").click()
    link = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#live-saved a"), 30)[0]
    midi = miditoolkit.MidiFile(file=io.BytesIO(httpx.get(link.get_attribute("href")).content))
    assert midi.ticks_per_beat == tpq and midi.tempo_changes[0].tempo == pytest.approx(100)
    tracks = {i.name: i.notes for i in midi.instruments}
    played = [tuple(n) for p in posts for n in p["notes"]]
    assert sorted((n.start, n.end, n.pitch, n.velocity) for n in tracks["player"]) == sorted(played)  # as played
    # the answer's notes at their ticks (two of one pitch that overlap pair their ends either way in MIDI)
    assert sorted((n.start, n.pitch) for n in tracks["musegen"]) == sorted((n[0], n[2]) for n in answer)
    assert sorted((n.end, n.pitch) for n in tracks["musegen"]) == sorted((n[1], n[2]) for n in answer)


def test_a_silent_bar_after_a_phrase_asks_for_the_answer_and_playing_over_it_hands_the_piece_back(browser, studio):
    from selenium.webdriver.common.by import By

    open_page(browser, studio)
    fill(browser, {"seed": "2", "live-answer-bars": "2"})
    browser.find_element(By.ID, "live-start").click()
    wait_for(lambda: live(browser, "musegenLive.on"), 30)
    bar_ticks, beat = live(browser, "musegenLive.barTicks"), 60 / 100
    first_line = live(browser, "musegenLive.barLines[0]")["at"]
    for k, key in enumerate("dgk"):  # bar 1 played, bar 2 silent: the answer comes in bars 3 and 4
        play(browser, key, first_line + k * beat, first_line + (k + 0.5) * beat)
    play(browser, "h", first_line + 10 * beat, first_line + 10.5 * beat)  # over the answer's first bar
    at_time(browser, first_line + 15 * beat)  # late in the answer's second bar, its post not yet sent

    posts = live(
        browser, "musegenLive.posts.map(({bar, notes, answer, hand_back}) => ({bar, notes, answer, hand_back}))"
    )
    assert [(p["bar"], p["answer"], p["hand_back"]) for p in posts] == [(0, 0, False), (1, 2, False), (2, 0, True)]
    assert [n[2] for n in posts[2]["notes"]] == [69]  # the note played over the answer, sent as the bar's
    scheduled = wait_for(lambda: live(browser, "musegenLive.scheduled"), 60)
    kept = [n for n in scheduled if n["tick"] < 3 * bar_ticks]
    assert kept and all(not n["dropped"] for n in kept) and min(n["tick"] for n in kept) == 2 * bar_ticks
    # the rest of the answer, from the next bar line on, never reaches the synthesiser
    assert all(n["dropped"] and not n.get("handed") for n in scheduled if n["tick"] >= 3 * bar_ticks)

    browser.find_element(By.ID, "live-stop").click()
    link = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#live-saved a"), 30)[0]
    midi = miditoolkit.MidiFile(file=io.BytesIO(httpx.get(link.get_attribute("href")).content))
    tracks = {i.name: i.notes for i in midi.instruments}
    assert sorted(n.pitch for n in tracks["player"]) == [64, 67, 69, 72]
    assert sorted((n.start, n.pitch) for n in tracks["musegen"]) == sorted((n["tick"], n["pitch"]) for n in kept)


def test_accompany_asks_for_the_band_s_next_bar_at_each_bar_s_end_and_schedules_it_under_the_player(browser, tmp_path):
    from selenium.webdriver.common.by import By

    silent = Sound.find(tmp_path / "no-node-modules")
    with serving(create_app(tmp_path / "out", Models([POP.parent / "song"]), sound=silent)) as base:
        open_page(browser, base)
        choose(browser, "example", "groove_rock.mid")  # drums, piano and bass, 2 bars: the backing
        wait_for(lambda: browser.find_element(By.ID, "prompt-name").text.startswith("Prompt: groove_rock.mid"), 30)
        fill(browser, {"seed": "1"})
        choose(browser, "live-mode", "accompany")
        choose(browser, "live-program", "73")  # a flute over the band
        browser.find_element(By.ID, "live-backing").click()
        browser.find_element(By.ID, "live-start").click()
        wait_for(lambda: live(browser, "musegenLive.on"), 30)
        bar_ticks, beat = live(browser, "musegenLive.barTicks"), 60 / 100
        line = live(browser, "musegenLive.barLines[0]")
        assert line["bar"] == 2  # the backing's two bars come first
        assert {(n["program"], n["drum"]) for n in live(browser, "musegenLive.backing")} == {
            (0, True),
            (0, False),
            (33, False),
        }
        for k, key in enumerate("kjhg"):
            play(browser, key, line["at"] + k * beat, line["at"] + (k + 0.5) * beat)
        at_time(browser, line["at"] + 5 * beat)  # in the player's second bar
        posts = live(browser, "musegenLive.posts.map(({bar, notes, accompany}) => ({bar, notes, accompany}))")
        assert [(p["bar"], p["accompany"]) for p in posts] == [(None, True), (2, True)]
        assert [n[2] for n in posts[1]["notes"]] == [72, 71, 69, 67]
        wait_for(lambda: live(browser, f"musegenLive.scheduled.some((n) => n.tick >= {3 * bar_ticks})"), 60)
        scheduled = live(browser, "musegenLive.scheduled")
    assert {n["tick"] // bar_ticks for n in scheduled} == {2, 3}  # under the player's first two bars
    assert all(n["program"] != 73 or n["drum"] for n in scheduled)  # never the player's instrument
    for note in scheduled:
        assert note["at"] == pytest.approx(line["at"] + (note["tick"] - line["tick"]) * beat / 480, abs=1e-9)


def test_the_meter_menu_offers_only_the_meters_the_chosen_model_plays(browser, tmp_path):
    from selenium.webdriver.common.by import By

    offered = lambda: [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#live-meter option")]
    enabled = lambda id_: browser.find_element(By.ID, id_).is_enabled()
    silent = Sound.find(tmp_path / "no-node-modules")
    song, groove = POP.parent / "song", POP.parent / "groove"
    with serving(create_app(tmp_path / "out", Models([POP, song, groove]), sound=silent)) as base:
        open_page(browser, base)
        assert offered() == ["4/4"] and shown(browser, "live-meter") == "4/4"  # pop: REMI writes 4/4 only
        choose(browser, "model", "song")
        assert offered() == ["4/4", "3/4", "2/4", "6/8"] and shown(browser, "live-meter") == "4/4"
        choose(browser, "live-meter", "6/8")
        choose(browser, "model", "groove")  # its tokens put no notes on a grid: nothing to choose, no Start
        assert offered() == [] and not enabled("live-meter") and not enabled("live-start")
        assert browser.find_element(By.ID, "live-status").text == "The chosen model cannot play along: choose another."
        browser.find_element(By.ID, "live-panel").screenshot(str(tmp_path / "no_meters.png"))
        choose(browser, "model", "pop")
        assert offered() == ["4/4"] and enabled("live-meter") and enabled("live-start")
        assert browser.find_element(By.ID, "live-status").text.startswith("Keys A W S")
        choose(browser, "model", "song")
        choose(browser, "live-meter", "6/8")
        browser.find_element(By.ID, "live-panel").screenshot(str(tmp_path / "meters.png"))
        browser.find_element(By.ID, "live-start").click()  # the menu's meter is the session's
        wait_for(lambda: live(browser, "musegenLive.on"), 30)
        assert live(browser, "musegenLive.meter") == [6, 8]
        assert live(browser, "musegenLive.barTicks") == 3 * live(browser, "musegenLive.tpq")
        browser.find_element(By.ID, "live-stop").click()
        wait_for(lambda: browser.find_element(By.ID, "live-status").text == "stopped", 30)
