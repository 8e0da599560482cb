"""Checkpoints of a rank's training: the manager (when and which tier), one tier's DCP
save and restore, and the stateful parts they hold."""

from shardline.workers.engine.checkpoint.manager import CheckpointManager

__all__ = ["CheckpointManager"]
