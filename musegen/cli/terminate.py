"""SIGTERM as an exception: the command line's handler raises `Terminated` where the program is, so
`finally` blocks remove temporary files and stop child processes (`musegen studio` catches it to
stop quietly)."""

from __future__ import annotations

import os
import signal


class Terminated(BaseException):
    """SIGTERM (a BaseException: no `except Exception` in a library swallows it)."""


handler_pid = os.getpid()  # the process whose handler this is; set again when a command starts


def on_sigterm(signum, frame):
    if os.getpid() != handler_pid:
        # a forked worker inherited this handler (possibly before its own setup could replace it):
        # it ends as SIGTERM ends a process, quietly, instead of unwinding with a traceback
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    raise Terminated
