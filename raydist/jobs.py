"""Deprecated: Ray Jobs moved to :mod:`raydist.ray_jobs` (``Jobs`` is ``RayJobs``).

"jobs" alone meant Spark jobs, Ray Jobs and training functions at once; Ray
Jobs are ``ray_jobs`` everywhere now. This module keeps old imports working.
"""

from __future__ import annotations

from raydist.ray_jobs import TERMINAL, JobInfo, RayJobs

Jobs = RayJobs

__all__ = ["JobInfo", "Jobs", "TERMINAL"]
