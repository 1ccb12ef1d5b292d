"""Migration between tiers: the freshness-order policy (the newest data on the fastest tiers,
thresholds deciding how much each tier holds) and the service that applies it, with retention."""

from __future__ import annotations

from .policy import Move, SegmentView, TierView, plan_moves
from .service import MigrationService, store_views
from .stats import MigrationStats, read_stats
from .throttle import Throttle

__all__ = ["MigrationService", "MigrationStats", "Move", "SegmentView", "TierView", "Throttle",
           "plan_moves", "read_stats", "store_views"]
