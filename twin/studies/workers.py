"""Local pool workers that never outlive the command that started them.

A sweep's process pool is stopped by its parent on Ctrl-C, SIGTERM or an
error (:class:`twin.studies.sweep.Executor`); a parent killed outright
(SIGKILL, the out-of-memory killer) runs no code, and its workers would go
on simulating for minutes. So each worker, when it starts
(:func:`init_worker`, the pool's initializer), arranges to end when its
parent does: on Linux the kernel sends it SIGKILL as its parent thread exits
(``prctl(PR_SET_PDEATHSIG)``, prctl(2)); elsewhere, and as a second guard, a
daemon thread sees its parent process id change (a dead parent's children
are re-parented) and ends the process. A worker writes no file (its parent
writes every result), so ending it at any instant loses nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from twin._io import pid_alive

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_S = 0.5  # how often the guard thread looks at the parent process id


def init_worker(parent: int) -> None:
    """A pool worker's initializer: Ctrl-C is left to the parent (which stops
    the pool, without a traceback per worker), SIGTERM ends the worker at once
    (a forked worker would otherwise inherit the parent's handler, raise
    SystemExit inside a job, which the pool reports as the job's error, and go
    on with the next job while the parent waits for it), and the worker ends
    when the process ``parent`` (the pool's owner, or a fork server it
    started) is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    ppid = os.getppid()
    if ppid != parent and not pid_alive(parent):  # it died before this worker got here
        os._exit(1)
    threading.Thread(target=_watch, args=(ppid,), name="twin-parent-watch", daemon=True).start()


def _die_with_parent() -> None:
    """Ask Linux for SIGKILL when the parent exits; nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no libc to ask: the guard thread remains
        pass


def _watch(ppid: int) -> None:
    while os.getppid() == ppid:
        time.sleep(WATCH_S)
    os._exit(1)
