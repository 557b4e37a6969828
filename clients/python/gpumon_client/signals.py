"""Stop signals: tells the daemon that the process received SIGTERM, SIGINT or SIGHUP (Ctrl-C,
`timeout`, scancel, `kubectl delete`, preemption), so that its end reads as a stop and not as a
crash. The handler chains: after telling, the disposition that was there before runs as it would
have (the trainer's handler is called; the default action happens, the signal re-raised with
SIG_DFL; Python's own SIGINT handler raises KeyboardInterrupt). A signal is never swallowed, and
an ignored one (SIG_IGN, `nohup`) is left alone.

Installed from the main thread only (Python's rule), once per signal; a handler the trainer
sets later replaces this one, which is its right. GPUMON_SIGNALS=0 leaves every handler alone.
"""

import os
import signal
import threading
from typing import Any, Callable, Dict, Optional

from . import _env

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")

_previous: Dict[int, Any] = {}  # signal number -> the disposition before ours
_notify: Optional[Callable[[str], None]] = None
_owner: Optional[int] = None  # the pid that installed: a forked child (a DataLoader worker) only chains
_received: Optional[str] = None  # the first stop signal this process received


def received() -> Optional[str]:
    """The first stop signal this process received (its name), or None."""
    return _received


def install(notify: Callable[[str], None]) -> None:
    """Chains `notify(name)` in front of each stop signal's disposition. Never raises."""
    global _notify, _owner
    if _env.flag("GPUMON_SIGNALS") is False:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    _notify = notify
    _owner = os.getpid()
    for name in STOP_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        try:
            current = signal.getsignal(signum)
            if current is _handler or current == signal.SIG_IGN:
                continue
            signal.signal(signum, _handler)
        except (ValueError, OSError, RuntimeError):
            continue
        _previous[signum] = current


def _handler(signum: int, frame: Any) -> Any:
    global _received
    name = signal.Signals(signum).name
    if os.getpid() == _owner:
        if _received is None:
            _received = name
        try:
            if _notify is not None:
                _notify(name)
        except Exception:
            pass  # the signal's own disposition must run whatever telling did
    previous = _previous.get(signum)
    if callable(previous):
        return previous(signum, frame)
    # SIG_DFL, or None (a handler set outside Python): the default action, as if never caught.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return None
