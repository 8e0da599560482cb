"""The faults an admin may inject into a running job (chaos tests), by name.

The API validates the kind, the supervisor passes it on, and the worker arms it
(workers/runtime/faults.py says what each one does to a rank).
"""

from __future__ import annotations

from enum import StrEnum


class FaultKind(StrEnum):
    KILL = "kill"  # the rank's process ends, as the OOM killer would end it
    HANG = "hang"  # its training thread stops between two steps
    RAISE = "raise"  # its next step raises
    NAN = "nan"  # its weights turn NaN, so the next step's loss is not finite
