"""Leveled compaction: ``picker`` decides (pure), ``runner`` does the I/O."""

from .picker import CompactionTask, apply, full_task, level_task, pick, rewrite_tasks
from .runner import (CompactionJob, CompactionResult, compaction_job, execute, max_outputs,
                     plan, raw_input_bytes)

__all__ = ["CompactionTask", "CompactionJob", "CompactionResult", "pick", "apply", "level_task",
           "full_task", "rewrite_tasks", "plan", "execute", "max_outputs", "raw_input_bytes",
           "compaction_job"]
