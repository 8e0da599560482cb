"""CPU priority of a job's processes: ranks at normal priority, warm spares below them.

Ray starts its worker processes at nice 15, so on a busy node every other process (the
raylet, Ray's agents, the API, the control plane's loops) ran before a training rank. A
warm spare imports torch and the engine while its job trains; on CPU ranks that share
their cores, that start took whole cores from the first steps (on 2 cores, steps 2 to 7
of the demo took 1 to 3.6 s instead of 0.45 s). So a rank raises itself to nice 0, and a
spare goes to the lowest priority until a restart takes it and raises it back: only where
the process may raise it back (CAP_SYS_NICE, or RLIMIT_NICE allowing nice 0), or it would
train at the lowest priority for ever. No torch here.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

LOWEST = 19
CAP_SYS_NICE = 23  # its bit in the capability sets


def can_raise_back() -> bool:
    """Whether this process may set a thread's nice value back to 0 after lowering it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= 20:  # the ceiling is 20 - soft
        return True
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    return False


def lower() -> bool:
    """Lower the calling thread (and the threads it starts from now) to the lowest
    priority, where it can be raised back; whether it was lowered."""
    if not can_raise_back():
        return False
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST)
    return True


def raise_back() -> None:
    """Every thread of this process back to nice 0 (Linux keeps a nice value per thread)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 0)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


def normal() -> bool:
    """Every thread of this process to nice 0 where it may be; whether it was."""
    if not can_raise_back():
        return False
    raise_back()
    return True


def thread_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
