"""The stop signals routed to the program's own handler and put back: the trainer's StopRequest
(tests/test_train.py stops real runs with them; these look at the handlers themselves)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from musegen.signals import STOP_SIGNALS, StopSignalsTo
from musegen.training.processes import StopRequest


class Stopped(Exception):
    pass


def stop_here(signum, frame):
    raise Stopped(signum)


@pytest.fixture
def own_handlers():
    """SIGINT and SIGTERM under a handler of the test's, put back afterwards."""
    previous = {sig: signal.signal(sig, stop_here) for sig in STOP_SIGNALS}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_stop_request_takes_the_first_signal_and_hands_the_second_back(own_handlers, signum):
    with StopRequest() as stop:
        assert all(signal.getsignal(sig) == stop.handler for sig in STOP_SIGNALS)
        os.kill(os.getpid(), signum)  # the handler runs before kill returns
        assert stop.requested
        assert all(signal.getsignal(sig) is stop_here for sig in STOP_SIGNALS)
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signum)
    assert all(signal.getsignal(sig) is stop_here for sig in STOP_SIGNALS)


def test_the_handlers_are_put_back_when_the_block_ends_without_a_signal(own_handlers):
    with StopRequest() as stop:
        pass
    assert not stop.requested
    assert all(signal.getsignal(sig) is stop_here for sig in STOP_SIGNALS)


def test_nothing_is_changed_off_the_main_thread(own_handlers):
    seen = []

    def in_a_thread():
        with StopSignalsTo(lambda *_: None):
            seen.append([signal.getsignal(sig) for sig in STOP_SIGNALS])

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [[stop_here, stop_here]]


def test_the_command_line_takes_sigterm_only_and_puts_it_back(own_handlers, capsys):
    from musegen.cli import run_command

    seen = {}

    def command() -> None:
        seen.update({sig: signal.getsignal(sig) for sig in STOP_SIGNALS})
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as stopped:
        run_command(command, [])
    assert stopped.value.code == 143 and "terminated" in capsys.readouterr().err
    assert seen[signal.SIGINT] is stop_here and seen[signal.SIGTERM] is not stop_here  # Ctrl-C stays KeyboardInterrupt
    assert all(signal.getsignal(sig) is stop_here for sig in STOP_SIGNALS)
