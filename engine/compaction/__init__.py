"""Leveled compaction: ``picker`` decides (pure), ``runner`` does the I/O."""

from .picker import CompactionTask, apply, full_task, level_task, pick
from .runner import CompactionResult, run

__all__ = ["CompactionTask", "CompactionResult", "pick", "apply", "level_task", "full_task", "run"]
