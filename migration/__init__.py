"""Migration between tiers: Pafka's threshold policy and the service that applies it."""

from __future__ import annotations

from .policy import Move, SegmentView, TierView, plan_moves
from .service import MigrationService, MigrationStats, read_stats

__all__ = ["MigrationService", "MigrationStats", "Move", "SegmentView", "TierView",
           "plan_moves", "read_stats"]
