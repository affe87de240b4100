"""musegen studio's Play, as a page hears it: from the click to the first note out of the page's
own synthesiser, and how long the soundfont takes to load when the page opens.

    python -m bench.studio_play            # 10 Plays (run from the repository root)
    python -m bench.studio_play --plays 20

The studio is started as a user starts it (`musegen studio --port 0`) and its page driven in
Debian's headless Chromium (selenium + chromedriver, installed by scripts/setup.sh). The example
prompt is continued by the pop model by 4 bars in 2 samples; then Play is clicked, from the default bar, and
stopped, `--plays` times. The page times each Play itself (studio.js, `sound.started`): from the
click handler's start to the moment the first note's audio leaves the output, that is the
context time it is scheduled at, plus the context's output latency.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import cpu_name
from bench.studio import EXAMPLE, start_studio

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000")


def wait_for(condition, timeout: float = 120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.02)
    raise SystemExit(f"the page did not get there in {timeout} s")


def main() -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plays", type=int, default=10)
    args = parser.parse_args()
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        raise SystemExit("Debian's chromium and chromium-driver are not installed (scripts/setup.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as out:
        server, url = start_studio(Path(out))
        browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            engine = "return document.getElementById('transport').dataset.engine"
            opened = time.perf_counter()
            browser.get(url)
            if wait_for(lambda: browser.execute_script(engine)) != "synth":
                raise SystemExit(f"the page plays no sound itself: {browser.find_element(By.ID, 'sound-note').text}")
            loaded = time.perf_counter() - opened
            Select(browser.find_element(By.ID, "model")).select_by_value("pop")
            Select(browser.find_element(By.ID, "example")).select_by_value(EXAMPLE)
            wait_for(lambda: browser.execute_script("return state.prompt"))
            for field, value in {"bars": "4", "samples": "2", "seed": "1"}.items():
                browser.find_element(By.ID, field).clear()
                browser.find_element(By.ID, field).send_keys(value)
            browser.find_element(By.ID, "generate").click()
            wait_for(lambda: browser.find_element(By.ID, "status").text.startswith("done"))
            times = []
            for _ in range(args.plays):
                browser.find_element(By.ID, "play").click()
                started = wait_for(lambda: browser.execute_script("return sound.playing && sound.started"))
                times.append(started["heard"] - started["clicked"])
                time.sleep(0.5)
                browser.find_element(By.ID, "stop-sound").click()
                browser.execute_script("sound.started = null")
        finally:
            browser.quit()
            server.terminate()
            server.wait(30)
    print(f"musegen studio, Play in the page; {cpu_name()}, {os.cpu_count()} cores, headless Chromium")
    print(f"soundfont loaded (page opened to ready): {loaded:.2f} s")
    print(f"click to first note heard, {len(times)} Plays: median {statistics.median(times):.0f} ms,")
    print(f"  min {min(times):.0f} ms, max {max(times):.0f} ms")


if __name__ == "__main__":
    main()
