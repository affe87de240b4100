"""SIGINT and SIGTERM, the two ways a user stops a command (Ctrl-C; a job scheduler or `kill`),
sent for a while to a handler of the program's own. Torch-free: `musegen render` uses it too."""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignalsTo:
    """Inside `with`, SIGINT and SIGTERM (or the `signals` given) go to `handler(signum, frame)`;
    `restore()` (called by the handler, say) or the block's end puts back the handlers they had.
    Nothing is changed off the main thread (only it runs Python handlers) or where a handler was
    not set from Python (`signal.signal` could not put it back)."""

    def __init__(self, handler, signals: tuple[int, ...] = STOP_SIGNALS):
        self.handler = handler
        self.signals = signals
        self._previous: dict[int, object] = {}

    def __enter__(self):
        sigs_are_ours = None not in map(signal.getsignal, self.signals)
        if threading.current_thread() is threading.main_thread() and sigs_are_ours:
            self._previous = {sig: signal.signal(sig, self.handler) for sig in self.signals}
        return self

    def restore(self) -> None:
        while self._previous:
            sig, handler = self._previous.popitem()
            signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        self.restore()
