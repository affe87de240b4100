"""Choosing the prompt's bars on the studio's piano roll (Debian's headless Chromium, as in
test_studio_roll.py): a drag across the roll while it shows the prompt picks whole bars, snapped to
the bar lines of the prompt's meters, into the two boxes that hold the choice; typing in the boxes
moves the shading; a double-click or "all bars" takes the whole prompt again. Each test leaves a
screenshot of the page in its tmp_path."""

from __future__ import annotations

import json

import pytest
from conftest import POP909
from test_studio import EXAMPLE, EXAMPLES, POP, serving
from test_studio_browser import choose, fill, open_page, prompt_named, pytestmark, wait_for  # noqa: F401
from test_studio_extend import musegen_sample, same_files
from test_studio_roll import SONG, built_midi

from musegen.studio.models import Models
from musegen.studio.server import create_app
from musegen.studio.sound import Sound

LABEL_TOP = 14  # the bar numbers' ruler above the lanes (roll.js)


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """The studio with the pop and the song model, served: (its base URL, its --out folder); without
    the page's synthesiser (its soundfont is no part of these tests)."""
    out = tmp_path_factory.mktemp("out")
    silent = Sound.find(tmp_path_factory.mktemp("no-node-modules"))
    with serving(create_app(out, Models([POP, SONG]), sound=silent)) as base:
        yield base, out


def load(browser, base: str, model: str, path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, base)
    choose(browser, "model", model)
    browser.find_element(By.ID, "file").send_keys(str(path))
    prompt_named(browser, path.name, 120)


def boxes(browser) -> tuple[str, str]:
    """What the two boxes read: the prompt's bars from..to."""
    script = "return ['prompt-from', 'prompt-to'].map((id) => document.getElementById(id).value)"
    return tuple(browser.execute_script(script))


def chosen(browser) -> dict | None:
    """The bars shaded on the roll: {bars: [from, to], ticks: [start, end], x: [left, right] on the canvas}."""
    drawn = browser.execute_script("return document.getElementById('roll').dataset.chosen")
    return json.loads(drawn) if drawn else None


def window(browser) -> tuple[float, float]:
    """The ticks the large roll shows, from..to."""
    return tuple(browser.execute_script("const d = document.getElementById('roll').dataset; return [+d.from, +d.to]"))


def offset(browser, tick: float, y: float) -> tuple[int, int]:
    """Where `tick` is on the roll, `y` CSS pixels from its top, as an offset from its centre (what
    Selenium's pointer moves take)."""
    width, height = browser.execute_script(
        "const b = document.getElementById('roll').getBoundingClientRect(); return [b.width, b.height]"
    )
    start, end = window(browser)
    return round((tick - start) / (end - start) * width - width / 2), round(y - height / 2)


def drag(browser, ticks: tuple[float, float], y: float = 200) -> None:
    """Press the mouse over the first tick, move to the second, let go (Selenium's pointer actions)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    roll = browser.find_element(By.ID, "roll")
    (x0, y0), (x1, y1) = (offset(browser, t, y) for t in ticks)
    ActionChains(browser).move_to_element_with_offset(roll, x0, y0).click_and_hold().move_to_element_with_offset(
        roll, x1, y1
    ).release().perform()


def wheel(browser, **event) -> None:
    """A wheel event over the roll (Ctrl + wheel zooms, Shift + wheel scrolls)."""
    script = "document.getElementById('roll').dispatchEvent(new WheelEvent('wheel', arguments[0]))"
    browser.execute_script(script, {**event, "bubbles": True, "cancelable": True})


def test_a_drag_across_the_roll_picks_bars_3_to_5_and_runs_as_sample_runs_them(browser, studio, tmp_path):
    from selenium.webdriver.common.by import By

    base, out = studio
    song = POP909 / "001" / "001.mid"
    load(browser, base, "pop", song)  # 73 bars of 4/4 as REMI reads them
    assert boxes(browser) == ("1", "73") and chosen(browser) is None
    bar = 4 * browser.execute_script("return state.view.ticksPerBeat")
    starts = lambda n: (n - 1) * bar  # noqa: E731

    # the roll opens on the seam, far from bar 3: all of it (zoom out), then Ctrl + wheel at its left edge
    while window(browser)[0] > 0:
        browser.find_element(By.ID, "zoom-out").click()
    left = browser.execute_script("return document.getElementById('roll').getBoundingClientRect().left")
    wheel(browser, deltaY=-500, ctrlKey=True, clientX=left)  # about tick 0
    start, end = window(browser)
    assert start == 0 and 8 * bar < end < 20 * bar  # bars 1 to about 12

    play_from = browser.find_element(By.ID, "from-bar").get_attribute("value")
    drag(browser, (starts(3) + bar / 2, starts(5) + bar / 2))
    assert boxes(browser) == ("3", "5")
    assert chosen(browser)["bars"] == [3, 5] and chosen(browser)["ticks"] == [starts(3), starts(6)]
    assert window(browser) == (start, end)  # the drag moved no window
    assert browser.find_element(By.ID, "from-bar").get_attribute("value") == play_from  # and was no click
    browser.save_screenshot(str(tmp_path / "bars_3_to_5.png"))

    wheel(browser, deltaY=300, shiftKey=True)  # Shift + wheel scrolls on, the choice stays
    assert window(browser)[0] > start and boxes(browser) == ("3", "5")

    fill(browser, {"bars": "1", "samples": "1", "seed": "6"})
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: browser.find_element(By.ID, "status").text.startswith("done"), 120)
    assert not browser.find_element(By.ID, "error").is_displayed()
    run = out / browser.execute_script("return session") / browser.execute_script("return state.run")
    flags = ("--prompt-from", 3, "--prompt-bars", 3, "--bars", 1, "--seed", 6)
    same_files(run, musegen_sample(tmp_path / "cli", song, *flags))

    start, end = window(browser)  # the roll shows the run: a drag across it picks nothing
    drag(browser, (start + (end - start) / 4, start + (end - start) * 3 / 4))
    assert boxes(browser) == ("3", "5") and chosen(browser) is None


def ruler_colour(browser, x: int) -> list[int]:
    """The colour drawn at `x` on the canvas, in the bar numbers' ruler above any number's glyphs."""
    script = "return [...document.getElementById('roll').getContext('2d').getImageData(arguments[0], 1, 1, 1).data]"
    return browser.execute_script(script, x)[:3]


def test_typing_in_the_boxes_moves_the_shading_and_all_bars_clears_it(browser, studio, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    base, _ = studio
    load(browser, base, "pop", EXAMPLES / EXAMPLE)  # 4 bars, all in the roll's window
    bar = 4 * browser.execute_script("return state.view.ticksPerBeat")
    width = browser.execute_script("return document.getElementById('roll').width")
    start, end = window(browser)
    canvas_x = lambda tick: round((tick - start) / (end - start) * width)  # noqa: E731

    for typed, (first, last) in (({"prompt-from": "2", "prompt-to": "3"}, (2, 3)), ({"prompt-to": "4"}, (2, 4))):
        fill(browser, typed)
        shaded = chosen(browser)
        assert shaded["bars"] == [first, last] and shaded["ticks"] == [(first - 1) * bar, last * bar]
        assert shaded["x"] == [canvas_x((first - 1) * bar), canvas_x(last * bar)]
        inside, outside = ruler_colour(browser, sum(shaded["x"]) // 2), ruler_colour(browser, shaded["x"][0] // 2)
        assert inside[2] > inside[0] + 30  # the chosen bars: tinted blue
        assert max(outside) - min(outside) < 10  # the others: dimmed grey
    browser.save_screenshot(str(tmp_path / "typed.png"))

    fill(browser, {"prompt-to": "9"})  # out of the prompt: nothing shaded (Generate says why)
    assert chosen(browser) is None
    fill(browser, {"prompt-to": "3"})
    assert chosen(browser)["bars"] == [2, 3]
    browser.find_element(By.ID, "all-bars").click()
    assert boxes(browser) == ("1", "4") and chosen(browser) is None
    fill(browser, {"prompt-from": "3"})
    ActionChains(browser).double_click(browser.find_element(By.ID, "roll")).perform()
    assert boxes(browser) == ("1", "4") and chosen(browser) is None


def test_the_drag_snaps_to_the_bar_lines_of_each_meter(browser, studio, tmp_path):
    from selenium.webdriver.common.by import By

    base, _ = studio
    beat = 480  # the song tokens' ticks per beat
    lines = [0, 4 * beat, 8 * beat, 11 * beat, 14 * beat, 17 * beat, 20 * beat]  # 2 bars of 4/4, then 4 of 3/4
    changing = built_midi(tmp_path / "changing.mid", [(0, 4, 4), (2, 3, 4)], 6)
    load(browser, base, "song", changing)
    assert boxes(browser) == ("1", "6")
    browser.find_element(By.ID, "scroll-left").click()  # the roll opens on bar 3: back to bar 1
    assert (
        window(browser)[0] == 0
        and json.loads(browser.execute_script("return document.getElementById('roll').dataset.barLines"))[:7] == lines
    )

    middle = lambda n: (lines[n - 1] + lines[n]) / 2  # noqa: E731
    drag(browser, (middle(2), middle(4)), y=LABEL_TOP / 2)  # on the bar numbers' ruler
    assert boxes(browser) == ("2", "4") and chosen(browser)["ticks"] == [lines[1], lines[4]]
    drag(browser, (middle(6), lines[2] + beat / 2))  # leftwards, from bar 6 into bar 3's first beat
    assert boxes(browser) == ("3", "6") and chosen(browser)["ticks"] == [lines[2], lines[6]]
    browser.save_screenshot(str(tmp_path / "meters.png"))
