"""Tiers: one contract (:mod:`.base`) and a module per kind of storage."""

from __future__ import annotations

from ..config import StoreConfig, TierSpec
from .base import NO_SPACE, SegmentWriter, Tier, throttle_tier_writes
from .file import FileTier
from .lake_tier import LakeTier
from .pmem import PmemTier
from .remote import RemoteTier

__all__ = ["NO_SPACE", "FileTier", "LakeTier", "PmemTier", "RemoteTier", "SegmentWriter", "Tier",
           "make_tier", "throttle_tier_writes"]


def make_tier(spec: TierSpec, config: StoreConfig) -> Tier:
    """Build the tier object: PMEM → pmem tier, REMOTE → fsspec tier, LAKE → lake tier,
    others → file tier."""
    if spec.is_lake:
        return LakeTier(spec, config["log.segment.bytes"])
    if spec.is_pmem:
        return PmemTier(spec, config["log.segment.bytes"], config["log.pmem.pool.ratio"])
    if spec.type == "REMOTE":
        return RemoteTier(spec, config["log.segment.bytes"])
    return FileTier(spec, config["log.segment.bytes"], config["log.file.direct.bytes"])
