"""Extend, the prompt's bars and Stop in the studio's page (Debian's headless Chromium, as in
test_studio_browser.py): a fresh page, the form's defaults but for a few bars and a seed, and the
files each writes checked against `musegen sample`'s for the same settings."""

from __future__ import annotations

import pytest
from test_studio import EXAMPLE, EXAMPLES, POP, serving
from test_studio_browser import fill, newest_result, open_page, prompt_named, pytestmark, wait_for  # noqa: F401
from test_studio_extend import musegen_sample, notes, same_files

from musegen.music.notes import NoteTable
from musegen.studio.models import Models
from musegen.studio.server import create_app
from musegen.studio.sound import Sound


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """The studio with the pop model, served: (its base URL, its --out folder). Without the page's
    synthesiser: its 148 MB soundfont, read while the page opens, is no part of these tests."""
    out = tmp_path_factory.mktemp("out")
    silent = Sound.find(tmp_path_factory.mktemp("no-node-modules"))
    with serving(create_app(out, Models([POP]), sound=silent)) as base:
        yield base, out


def text(page, id_: str) -> str:
    return page.execute_script("return document.getElementById(arguments[0]).textContent", id_)


def session(page) -> str:
    return page.execute_script("return session")


def test_extend_grows_the_sample_in_its_card_as_sample_continues_its_midi(browser, studio, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    base, out = studio
    open_page(browser, base)
    browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
    prompt_named(browser, EXAMPLE)
    fill(browser, {"bars": "1", "seed": "3"})  # two samples, the form's default
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: text(browser, "status").startswith("done"), 60)
    first = browser.execute_script("return state.view.samples[1]")
    by = browser.find_elements(By.CSS_SELECTOR, ".sample")[1].find_element(By.CSS_SELECTOR, ".extend-bars")
    assert by.get_attribute("value") == "4"  # its default; 2 here, to be quick
    by.clear()
    by.send_keys("2")
    browser.find_elements(By.CSS_SELECTOR, ".sample")[1].find_element(By.CSS_SELECTOR, ".extend").click()
    wait_for(
        lambda: (
            text(browser, "status").startswith("done") and browser.execute_script("return state.run") != first["run"]
        ),
        60,
    )
    samples = browser.execute_script("return state.view.samples")
    assert len(samples) == 2 and samples[0]["run"] == first["run"]  # the other sample stays
    grown = samples[1]
    assert grown["run"] != first["run"] and len(grown["notes"]) > len(first["notes"])
    link = browser.find_elements(By.CSS_SELECTOR, ".sample")[1].find_element(By.LINK_TEXT, "MIDI")
    assert f"/files/{grown['run']}/pop_progression_001_000.mid" in link.get_attribute("href")
    entry = newest_result(browser, "(extends sample 2 of ")
    assert "1 × 2 bars, seed 3" in entry, entry

    folder = out / session(browser)
    sample = folder / first["run"] / "pop_progression_001.mid"
    same_files(folder / grown["run"], musegen_sample(tmp_path / "cli", sample, "--bars", 2, "--seed", 3))


def test_the_prompt_bars_are_checked_in_the_page_and_run_as_sample_runs_them(browser, studio, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    base, out = studio
    open_page(browser, base)
    assert not browser.find_element(By.ID, "prompt-bars").is_displayed()  # no prompt: nothing to choose
    browser.find_element(By.ID, "file").send_keys(str(EXAMPLES / EXAMPLE))
    prompt_named(browser, EXAMPLE)
    value = lambda id_: browser.find_element(By.ID, id_).get_attribute("value")  # noqa: E731
    assert (value("prompt-from"), value("prompt-to")) == ("1", "4")  # the whole file, as sample takes it

    runs = lambda: len(list((out / session(browser)).glob("2*")))  # noqa: E731
    before = runs()
    for fields, message in [
        ({"prompt-from": "5"}, "prompt from bar must be a whole number from 1 to 4"),
        ({"prompt-from": "3", "prompt-to": "2"}, "prompt to bar must be a whole number from 3 to 4"),
        ({"prompt-from": "2", "prompt-to": "1.5"}, "prompt to bar must be a whole number from 2 to 4"),
    ]:
        fill(browser, fields)
        browser.find_element(By.ID, "generate").click()
        wait_for(lambda: text(browser, "error") == message, 5)
    assert runs() == before and text(browser, "status") == "ready"  # nothing was asked of the server

    fill(browser, {"prompt-from": "2", "prompt-to": "3", "bars": "1", "samples": "1", "seed": "6"})
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: text(browser, "status").startswith("done"), 60)
    assert not browser.find_element(By.ID, "error").is_displayed()
    run = browser.execute_script("return state.run")
    newest_result(browser, "prompt bars 2–3")
    flags = ("--prompt-from", 2, "--prompt-bars", 2, "--bars", 1, "--seed", 6)
    same_files(out / session(browser) / run, musegen_sample(tmp_path / "cli", EXAMPLES / EXAMPLE, *flags))


def test_stop_in_the_page_keeps_what_sample_writes_for_the_bars_drawn(browser, studio, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    base, out = studio
    open_page(browser, base)
    fill(browser, {"bars": "64", "samples": "1", "seed": "5"})  # minutes of sampling: Stop ends it
    browser.find_element(By.ID, "generate").click()
    wait_for(lambda: browser.execute_script("return document.getElementById('progress').value") * 64 > 1, 60)
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: text(browser, "status").startswith("stopped: "), 60)
    kept = out / session(browser) / browser.execute_script("return state.run")
    # `musegen sample` with the same seed draws the same tokens: its bar is the kept run's first
    cli = musegen_sample(tmp_path / "cli", None, "--bars", 1, "--seed", 5)
    assert sorted(p.name for p in kept.iterdir()) == sorted(p.name for p in cli.iterdir())
    bar = 4 * NoteTable.read(cli / "sample_000.mid").tpq
    first_bar = [n for n in notes(kept / "sample_000.mid") if n[0] < bar]
    assert first_bar and first_bar == notes(cli / "sample_000.mid")
