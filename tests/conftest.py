"""Shared fixtures: real POP909 songs and reference encodings, and temporary folders.

The repository carries what the default suite needs (`tests/data/`: 34 POP909 songs with their
annotations, a subset of the golden encodings), so a clone alone runs every kind of test. Tests
over the whole corpus are marked `slow` and read it from `../shared` beside the repository, or
from `$MUSEGEN_POP909` / `$MUSEGEN_GOLDEN`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
POP909 = DATA / "pop909"  # the in-repository subset
GOLDEN = DATA / "golden"
FULL_POP909 = Path(os.environ.get("MUSEGEN_POP909", REPO.parent / "shared" / "datasets" / "pop909"))
FULL_GOLDEN = Path(os.environ.get("MUSEGEN_GOLDEN", REPO.parent / "shared" / "golden"))

# "auto" precision is decided by timing fp32 against bf16 on this CPU; where the two come close
# (Zen 5 at tiny shapes) the choice is a coin toss and so would be every tolerance that compares
# numbers. The suite runs in fp32 unless told otherwise (this reaches the CLI's subprocesses too);
# tests of the timing itself unset it (test_precision.py).
os.environ.setdefault("MUSEGEN_PRECISION", "fp32")


def pop909_files(limit: int | None = None, folder: Path = POP909) -> list[Path]:
    files = sorted(p for p in folder.glob("*/*.mid") if p.stem == p.parent.name)
    return files[:limit] if limit else files


@pytest.fixture(scope="session")
def pop909_dir() -> Path:
    """The in-repository POP909 subset (34 songs)."""
    return POP909


@pytest.fixture(scope="session")
def pop909_songs(pop909_dir) -> list[Path]:
    """The first 20 songs: enough for real behaviour, small enough for CI."""
    return pop909_files(20)


@pytest.fixture(scope="session")
def full_pop909() -> Path:
    """The whole shared corpus, for `slow` tests only."""
    if not FULL_POP909.is_dir():
        pytest.skip(f"the whole POP909 corpus is not at {FULL_POP909} (set MUSEGEN_POP909)")
    return FULL_POP909


@pytest.fixture(scope="module")
def one_torch_thread():
    """Many small torch ops on two shared cores: the thread pool thrashes and costs more than it
    gives, so modules that sample token by token opt into one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def browser(tmp_path):
    """Debian's headless Chromium, driven by Selenium through Debian's chromedriver (the studio's
    page tests: test_studio_browser.py, test_studio_roll.py)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_script_timeout(30)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path / "dl")})
    yield driver
    driver.quit()
