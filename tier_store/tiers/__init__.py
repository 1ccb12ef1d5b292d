"""Tiers: one contract (:mod:`.base`) and a module per kind of storage."""

from __future__ import annotations

from ..config import StoreConfig, TierSpec
from .base import SegmentWriter, Tier
from .file import FileTier
from .pmem import PmemTier

__all__ = ["FileTier", "PmemTier", "SegmentWriter", "Tier", "make_tier"]


def make_tier(spec: TierSpec, config: StoreConfig) -> Tier:
    """Build the tier object for a configured tier (PMEM → pmem tier, others → file tier)."""
    if spec.is_pmem:
        return PmemTier(spec, config["log.segment.bytes"], config["log.pmem.pool.ratio"])
    return FileTier(spec, config["log.segment.bytes"])
