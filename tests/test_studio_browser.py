"""musegen studio's page in a real browser (Debian's headless Chromium, driven by Selenium through
Debian's chromedriver): upload a prompt, generate and see the notes drawn while they are sampled,
play in the page or, without its synthesiser, the server's WAV, download, see the error for a bad
file; and no request leaves for another host."""

from __future__ import annotations

import json
import shutil
import time
from urllib.parse import urlsplit

import pytest
from test_studio import EXAMPLE, EXAMPLES, GROOVE, POP, serving

from musegen.studio.models import Models
from musegen.studio.server import create_app
from musegen.studio.sound import Sound

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="Debian's chromium and chromium-driver are not installed (scripts/setup.sh)"
)


@pytest.fixture(scope="module")
def pop_and_groove(tmp_path_factory):
    """The studio with the pop and the groove model (pop first: the page's default), served."""
    with serving(create_app(tmp_path_factory.mktemp("out"), Models([POP, GROOVE]))) as base:
        yield base


def wait_for(condition, timeout: float = 120, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s")


def newest_result(browser, marker: str) -> str:
    """The text of the results list's first (newest) entry once it holds `marker`, read in one
    script call: the list is redrawn when a run ends, so an element held across calls can go
    stale between finding it and reading it."""
    read = "const entry = document.querySelector('#results li'); return entry ? entry.innerText : ''"

    def holding() -> str:
        entry = browser.execute_script(read).strip()
        return entry if marker in entry else ""

    return wait_for(holding)


def requested_urls(driver) -> list[str]:
    events = (json.loads(entry["message"])["message"] for entry in driver.get_log("performance"))
    return [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]


def open_page(browser, base: str) -> None:
    """A fresh page, once it says it is ready."""
    from selenium.webdriver.common.by import By

    browser.get(base + "/")
    wait_for(lambda: browser.find_element(By.ID, "status").text == "ready")


def fill(browser, fields: dict[str, str]) -> None:
    """Type each value into its form field, in place of what the field held."""
    from selenium.webdriver.common.by import By

    for field, value in fields.items():
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)


def test_the_page_generates_downloads_and_reports_a_bad_file(browser, tmp_path):
    from selenium.webdriver.common.by import By

    text = lambda id_: browser.find_element(By.ID, id_).text
    with serving(create_app(tmp_path / "out", Models([POP]))) as base:
        open_page(browser, base)
        browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
        wait_for(lambda: text("prompt-name").startswith("Prompt: pop_progression.mid (4 bars"))
        fill(browser, {"bars": "6", "samples": "2", "seed": "3"})
        browser.find_element(By.ID, "generate").click()

        # notes are drawn while the run samples: seen before it is done, with the progress under 1
        def drawing():
            seen = browser.execute_script(
                "return [document.getElementById('roll').dataset.notes, document.getElementById('progress').value,"
                " document.getElementById('status').textContent]"
            )
            return seen if seen[0] and seen[2] == "sampling…" else None

        notes, progress, _ = wait_for(drawing)
        assert int(notes) > 0 and progress < 1
        wait_for(lambda: text("status").startswith("done"))
        cards = browser.find_elements(By.CSS_SELECTOR, ".sample")
        assert len(cards) == 2
        entry = newest_result(browser, "tempo")  # for a later visit
        assert entry.endswith("tempo keep"), entry  # the default: the prompt's tempo held

        # download the MIDI file of sample 1
        cards[0].find_element(By.LINK_TEXT, "MIDI").click()
        # (Chromium may create the file before it writes it: wait until it holds something)
        midi = wait_for(lambda: [p for p in (tmp_path / "dl").glob("*.mid") if p.stat().st_size])
        assert midi[0].read_bytes()[:4] == b"MThd"

        # a bad file: its one-line message in the page
        broken = tmp_path / "broken.mid"
        broken.write_bytes(b"MThd\x00\x00\x00\x06garbage")
        browser.find_element(By.ID, "file").send_keys(str(broken))
        wait_for(lambda: browser.find_element(By.ID, "error").is_displayed())
        assert "broken.mid: corrupt MIDI" in text("error")

        # a tempo that is neither keep, free nor a BPM: the request's one line, in the page's words
        browser.find_element(By.ID, "tempo").send_keys("brisk")
        browser.find_element(By.ID, "generate").click()
        wait_for(lambda: "Tempo must be keep, free or a tempo in BPM" in text("error"))

        urls = requested_urls(browser)
    hosts = {urlsplit(url).netloc for url in urls if urlsplit(url).scheme in ("http", "https", "ws", "wss")}
    assert urls and hosts == {urlsplit(base).netloc}, hosts


def choose(browser, id_: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    Select(browser.find_element(By.ID, id_)).select_by_value(value)


def shown(browser, id_: str) -> str:
    return browser.execute_script("return document.getElementById(arguments[0]).value", id_)


def prompt_named(browser, name: str, timeout: float = 20) -> str:
    """The prompt line once it names `name` (the prompt the page holds is that file)."""
    from selenium.webdriver.common.by import By

    line = lambda: browser.find_element(By.ID, "prompt-name").text
    wait_for(lambda: line().startswith(f"Prompt: {name} (") and browser.execute_script("return state.prompt"), timeout)
    assert browser.execute_script("return state.prompt.name") == name
    return line()


def test_the_example_menu_offers_only_what_the_chosen_model_can_continue(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    open_page(browser, pop_and_groove)
    offered = lambda: [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#example option")]
    assert offered() == ["", "bach_chorale.mid", "groove_rock.mid", EXAMPLE]
    choose(browser, "model", "groove")  # the groove tokenizer needs drums: only the groove example has them
    assert offered() == ["", "groove_rock.mid"]
    choose(browser, "example", "groove_rock.mid")
    prompt_named(browser, "groove_rock.mid")
    choose(browser, "model", "pop")
    assert offered() == ["", "bach_chorale.mid", "groove_rock.mid", EXAMPLE]
    assert not browser.find_element(By.ID, "error").is_displayed()


def test_changing_the_model_reads_the_prompt_again_or_clears_it_where_it_can_be_seen(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    text = lambda id_: browser.find_element(By.ID, id_).text
    open_page(browser, pop_and_groove)
    choose(browser, "example", "groove_rock.mid")
    prompt_named(browser, "groove_rock.mid")
    held = browser.execute_script("return state.prompt.prompt")
    # the groove model reads it too: the prompt is kept, read again by the new model's tokenizer
    choose(browser, "model", "groove")
    prompt_named(browser, "groove_rock.mid")
    assert browser.execute_script("return state.prompt.prompt") == held and not text("error")

    # one the groove model cannot read: cleared, and every control says so
    choose(browser, "model", "pop")
    browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
    prompt_named(browser, EXAMPLE)
    choose(browser, "model", "groove")
    wait_for(lambda: "no drum track" in text("error"), 20)
    assert text("prompt-name").startswith("No prompt") and EXAMPLE in text("prompt-name")
    assert browser.execute_script("return state.prompt") is None
    assert shown(browser, "example") == "" and shown(browser, "file") == ""


def test_picking_the_same_example_or_file_again_loads_it_again(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    open_page(browser, pop_and_groove)
    choose(browser, "example", "groove_rock.mid")
    prompt_named(browser, "groove_rock.mid")
    browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
    prompt_named(browser, EXAMPLE)
    choose(browser, "example", "groove_rock.mid")
    prompt_named(browser, "groove_rock.mid")
    browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
    prompt_named(browser, EXAMPLE)


def test_an_earlier_result_names_its_model_and_seed_and_brings_back_its_form(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    text = lambda id_: browser.find_element(By.ID, id_).text
    open_page(browser, pop_and_groove)
    choose(browser, "model", "groove")
    choose(browser, "example", "groove_rock.mid")
    prompt_named(browser, "groove_rock.mid")
    form = {"bars": "2", "samples": "1", "temperature": "0.7", "top_p": "0.95", "seed": "7", "tempo": "free"}
    fill(browser, form)
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: text("status").startswith("done"))

    open_page(browser, pop_and_groove)  # a later visit: the form as a fresh page has it
    assert shown(browser, "model") == "pop" and shown(browser, "seed") == ""
    entry = newest_result(browser, " with groove: ")
    assert "seed 7" in entry, entry
    browser.find_elements(By.CSS_SELECTOR, "#results li")[0].click()
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".sample .downloads")) == 1)
    assert shown(browser, "model") == "groove"
    assert {field: shown(browser, field) for field in form} == form
    prompt_named(browser, "groove_rock.mid")
    assert browser.find_elements(By.CSS_SELECTOR, "#example option")[-1].get_attribute("value") == "groove_rock.mid"


def test_stop_keeps_the_bars_drawn_so_far_as_a_result(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    text = lambda id_: browser.find_element(By.ID, id_).text
    open_page(browser, pop_and_groove)
    fill(browser, {"bars": "64", "samples": "1", "seed": "5"})
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: int(browser.execute_script("return document.getElementById('roll').dataset.notes || 0")) > 0)
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: text("status").startswith("stopped: "), 60)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".sample .downloads")) == 1  # played and downloaded as any result
    newest_result(browser, "(stopped at ")


def roll_data(browser, key: str):
    script = "return document.getElementById('roll').dataset[arguments[0]] || 'null'"
    return json.loads(browser.execute_script(script, key))


def test_drums_are_drawn_in_a_lane_of_their_own_below_the_pitched_notes(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    text = lambda id_: browser.find_element(By.ID, id_).text
    open_page(browser, pop_and_groove)
    choose(browser, "model", "groove")
    choose(browser, "example", "groove_rock.mid")
    prompt_named(browser, "groove_rock.mid")
    fill(browser, {"bars": "2", "samples": "1", "seed": "2"})
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: text("status").startswith("done"))
    notes = browser.execute_script("return state.view.samples[0].notes")  # the prompt's and the run's
    drums = sorted({n[2] for n in notes if n[4]})
    assert drums and len(drums) < len(notes)  # groove_rock has drums and pitched notes
    *pitched, lane = roll_data(browser, "lanes")  # a lane per track, the drums last
    assert lane["name"] == "Drums" and lane["pitches"] == drums  # one row per drum pitch used
    assert pitched and lane["top"] >= max(p["bottom"] for p in pitched)  # below every pitched note
    assert lane["notes"] == sum(1 for n in notes if n[4])


def test_bar_numbers_thin_out_so_that_they_never_overlap(browser, pop_and_groove):
    from selenium.webdriver.common.by import By

    open_page(browser, pop_and_groove)
    for bars in ("2", "64"):  # a 6-bar roll, then a 68-bar one
        fill(browser, {"bars": bars})
        browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
        prompt_named(browser, EXAMPLE)
        drawn = lambda: roll_data(browser, "barLabels") or [[0]]
        labels = wait_for(lambda: drawn()[-1][0] > int(bars) and drawn(), 10)  # this prompt's roll
        numbers = [n for n, _, _ in labels]
        assert numbers[0] == 1 and numbers[-1] > int(bars)  # the prompt's 4 bars and the run's
        for (_, x, width), (_, next_x, _) in zip(labels, labels[1:]):
            assert x + width < next_x, labels
    assert len(numbers) < 68 and numbers[1] - numbers[0] in (2, 4, 8)  # thinned out evenly


def sound(browser, expression: str):
    """`expression` evaluated in the page, where `sound` is its player's state (studio.js)."""
    return browser.execute_script(f"return {expression}")


def generated(browser, base: str) -> dict:
    """The example prompt continued by 4 bars in 2 samples, on a fresh page: its first sample's view."""
    from selenium.webdriver.common.by import By

    open_page(browser, base)
    choose(browser, "example", EXAMPLE)
    prompt_named(browser, EXAMPLE)
    fill(browser, {"bars": "4", "samples": "2", "seed": "3"})
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: browser.find_element(By.ID, "status").text.startswith("done"))
    return sound(browser, "state.view")


def test_play_sounds_in_the_page_from_two_bars_before_the_seam_and_asks_the_server_for_no_wav(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with serving(create_app(tmp_path / "out", Models([POP]))) as base:
        view = generated(browser, base)
        wait_for(lambda: sound(browser, "document.getElementById('transport').dataset.engine"), 60)
        assert sound(browser, "document.getElementById('transport').dataset.engine") == "synth"
        assert browser.find_element(By.ID, "sound-note").text == ""
        bar = 4 * view["ticksPerBeat"]
        assert view["promptEnd"] == 4 * bar  # the example's 4 bars: the seam is at bar 5
        assert browser.find_element(By.ID, "from-bar").get_attribute("value") == "3"

        browser.find_element(By.ID, "play").click()
        wait_for(lambda: sound(browser, "document.getElementById('transport').dataset.playing") == "1", 10)
        started = sound(browser, "sound.started")
        assert started["from"] == 2 * bar and started["sample"] == 0 and started["heard"] > started["clicked"]
        print(f"click to the first note heard: {started['heard'] - started['clicked']:.1f} ms")

        # the playhead moves on from the chosen bar, on the roll too
        position = lambda: sound(browser, "sound.player.position()")
        playhead = lambda: float(browser.find_element(By.ID, "playhead").value_of_css_property("left")[:-2])
        first, left = position(), playhead()
        assert 2 * bar <= first < 4 * bar
        wait_for(lambda: position() > first + view["ticksPerBeat"], 10)
        assert playhead() > left and browser.find_element(By.ID, "playhead").is_displayed()

        # A/B: the second sample goes on from where the first one was
        before = position()
        browser.find_elements(By.CSS_SELECTOR, "#ab button")[1].click()
        wait_for(lambda: sound(browser, "sound.started.sample") == 1, 10)
        assert sound(browser, "state.selected") == 1 and position() >= before
        assert "selected" in browser.find_elements(By.CSS_SELECTOR, "#ab button")[1].get_attribute("class")

        # loop the seam: from bar 3 to two bars past the seam, then bar 3 again
        browser.find_element(By.ID, "loop").click()
        browser.find_element(By.ID, "play").click()
        seen = [position()]
        wait_for(lambda: seen.append(position()) or seen[-1] < seen[-2], 30)
        assert 6 * bar - view["ticksPerBeat"] < max(seen) <= 6 * bar and 2 * bar <= seen[-1] < 3 * bar

        browser.find_element(By.ID, "stop-sound").click()
        assert sound(browser, "document.getElementById('transport').dataset.playing") == ""
        assert position() is None and not browser.find_element(By.ID, "playhead").is_displayed()
        urls = requested_urls(browser)
    assert not [url for url in urls if ".wav" in url]
    assert any(url.endswith("/sound/soundfont.sf2") for url in urls)
    hosts = {urlsplit(url).netloc for url in urls if urlsplit(url).scheme in ("http", "https", "ws", "wss")}
    assert hosts == {urlsplit(base).netloc}


def test_without_the_synthesiser_play_renders_the_wav_and_the_page_says_why(browser, tmp_path):
    from selenium.webdriver.common.by import By

    no_library = Sound.find(tmp_path / "no-node-modules")
    with serving(create_app(tmp_path / "out", Models([POP]), sound=no_library)) as base:
        generated(browser, base)
        note = browser.find_element(By.ID, "sound-note").text
        assert note == (
            "Playing the server's WAV: the in-page synthesiser is not installed (scripts/setup.sh runs npm for it)."
        )
        browser.find_element(By.ID, "play").click()
        wait_for(lambda: sound(browser, "document.getElementById('transport').dataset.playing") == "1", 60)  # rendered
        beat = sound(browser, "state.view.ticksPerBeat")
        wait_for(lambda: sound(browser, "sound.player.position()") > 2 * 4 * beat + beat, 10)  # from bar 3, on
        assert browser.find_element(By.ID, "playhead").is_displayed()
        urls = requested_urls(browser)
    assert [url for url in urls if ".wav" in url] and not [url for url in urls if "/vendor/" in url]
