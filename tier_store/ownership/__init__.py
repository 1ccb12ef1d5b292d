"""What a store owns and how it proves it: its saved configuration (``_store.json``), the
claims on its tiers, opening and creating it, the relocation fence, relocating a tier, and
the seam (:class:`RootFiles`) through which it reads and writes its root's own files: a
local directory (:class:`PosixRootFiles`) or an ``s3://`` prefix (:class:`ObjectRootFiles`)."""

from __future__ import annotations

from .claims import claim_of, claim_tier
from .fence import RelocationFence
from .objectroot import ObjectRootFiles
from .opening import Opened, open_root
from .relocate import Relocation, relocate_tier
from .resize import create_entry, resize_tier
from .rootfiles import PosixRootFiles, RootFiles, read_json_object
from .saved import decode_saved, encode_saved, jsonable

__all__ = [
    "ObjectRootFiles",
    "Opened",
    "PosixRootFiles",
    "Relocation",
    "RelocationFence",
    "RootFiles",
    "claim_of",
    "claim_tier",
    "create_entry",
    "decode_saved",
    "encode_saved",
    "jsonable",
    "open_root",
    "read_json_object",
    "relocate_tier",
    "resize_tier",
]
