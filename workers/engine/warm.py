"""What a rank imports to train, imported ahead by a process that has the time: a warm
spare, a pooled worker, `shardline train`'s fork server.

The trainer names model families (and the experimental data-parallel strategies) and
imports them when a job asks for one, so importing the trainer alone leaves the family
modules to each rank's start; importing this module loads every family too.
"""

from __future__ import annotations

import shardline.workers.engine.trainer  # noqa: F401
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.registry import FAMILIES

for _family in FAMILIES:
    load_family(_family)
