"""The supervisor of one job, in parts (as Ray Train's controller is):

- calls: what the control plane calls (the actor's API); machine: the state loop (each
  step returns the next state and why)
- watch: one verdict on the group from the ranks' typed statuses
- relay: progress to the control plane's buffer, replay and gap fill
- decisions: the failure budget and the non-finite policy, with no I/O
- handling: acting on a failure or a non-finite loss; recovery: timing each recovery
- grow: elastic grow-back; preempted: leaving nodes on a preemption notice
- workers: the worker-group protocol it drives
"""

from shardline.workers.runtime.supervisor.machine import JobSupervisor
from shardline.workers.runtime.supervisor.workers import FaultRefused, Workers

__all__ = ["FaultRefused", "JobSupervisor", "Workers"]
