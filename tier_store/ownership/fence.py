"""The relocation fence: data written to a tier's old place never becomes visible.

:func:`~tier_store.ownership.relocate.relocate_tier` counts and saves a tier's new path
under ``_tiers.lock`` held exclusively; every commit-log entry is published holding it
shared. So an entry is published either before a relocation starts (and the relocation's
check sees it) or after it ends (and this fence refuses it when the data it names was
written under an older count), whichever process commits it. The lock orders one host's
processes: a store whose root is shared by hosts (an object store) is never relocated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Iterator

from ..errors import ConfigError, TierRelocated
from ..layout import STORE_FILE, TIERS_LOCK
from .rootfiles import RootFiles
from .saved import decode_saved, relocations


class RelocationFence:
    """Each tier's relocation count as this handle opened the store, checked against the
    saved counts whenever an entry is published."""

    def __init__(self, files: RootFiles, opened: list[int]):
        self.files = files
        self.opened = list(opened)
        self._stamp: Hashable | None = None
        self._saved: list[tuple[int, str]] | None = None

    def relocation(self, number: int) -> int:
        """How many times tier ``number`` had been relocated when the store was opened:
        what its writes record."""
        return self.opened[number - 1]

    def relocated(self) -> bool:
        """Whether a tier was relocated since the store was opened."""
        return [n for n, _ in self.saved()] != self.opened

    @contextlib.contextmanager
    def publishing(self, tiers: Iterable[tuple[int, int]] = ()) -> Iterator[None]:
        """Hold the fence shared while an entry is published; :class:`TierRelocated` when
        data it names (``tiers``: (tier number, relocation count it was written under))
        was written to a tier relocated since."""
        with self.files.lock(TIERS_LOCK, shared=True):
            # A root shared by hosts refuses relocations (relocate.py says why): its counts
            # never change, so the counts this handle opened with stand for the saved ones,
            # and a commit saves the listing of _store.json's versions.
            for number, written in tiers:
                if self.files.shared:
                    if written != self.opened[number - 1]:
                        raise TierRelocated(
                            f"data written to tier {number} names relocation count {written}, "
                            f"but the store at {self.files.root} has "
                            f"{self.opened[number - 1]} (a shared root is never relocated): "
                            "write it again through this store")
                    continue
                now, path = self.saved()[number - 1]
                if written != now:
                    raise TierRelocated(
                        f"tier {number} of the store at {self.files.root} was relocated (to "
                        f"{path}) after data was written to it: open the store again and "
                        "write again (that data stays invisible)")
            yield

    def saved(self) -> list[tuple[int, str]]:
        """(relocation count, path) per tier as ``_store.json`` has them now, parsed again
        only when the file changed."""
        stamp = self.files.stamp(STORE_FILE)
        if stamp is None or stamp != self._stamp or self._saved is None:
            saved = decode_saved(self.files.read(STORE_FILE), self.files.root,
                                 self.files.where(STORE_FILE)) if stamp is not None else None
            if saved is None:
                raise ConfigError(f"{self.files.root}/{STORE_FILE} is gone: the store was "
                                  "deleted while this process had it open")
            self._saved = list(zip(relocations(saved), saved["layout"]["tier.paths"],
                                   strict=True))
            self._stamp = stamp
        return self._saved


__all__ = ["RelocationFence"]
