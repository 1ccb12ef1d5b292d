"""Index pieces of a commit log in a directory (:class:`PosixLogStore`'s part):
``_index/<folder>/<name>``, each written as a complete, fsynced temporary file linked to
its name, so a piece is whole or absent."""

from __future__ import annotations

import os

from ..errors import CorruptLog
from ..index_pieces import INDEX_DIR
from ..layout import TMP_PREFIX, fsync_dir, read_regular, write_temp
from ..tiers import NO_SPACE
from .base import Blob


def _index_path(base: str, folder: str = "") -> str:
    return os.path.join(base, *folder.split("/")) if folder else os.path.join(base, INDEX_DIR)


class PosixPieces:
    """The index-piece methods of :class:`~tier_store.logstore.posix.PosixLogStore`."""

    path: str

    def put_piece(self, folder: str, name: str, data: bytes) -> None:
        where = _index_path(self.path, folder)
        target = os.path.join(where, name)
        if os.path.lexists(target):
            return  # the same bytes: the name is their digest
        try:
            os.makedirs(where, exist_ok=True)
            tmp = write_temp(where, data)
            try:
                os.link(tmp, target)
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            fsync_dir(where)
            fsync_dir(os.path.dirname(where))
            fsync_dir(self.path)  # _index itself, made by the first piece: the checkpoint needs it
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise self._full(  # type: ignore[attr-defined]
                f"index piece {target} was not written", e) from None

    def read_piece(self, folder: str, name: str) -> Blob | None:
        # Not followed out of the log: a link there is damage (OSError ELOOP).
        path = os.path.join(_index_path(self.path, folder), name)
        try:
            return read_regular(path, CorruptLog, "index piece", follow=False)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                return None
            raise CorruptLog(f"index piece {path} is unreadable: {e}") from None

    def piece_folders(self) -> list[tuple[str, float]]:
        out = []
        try:
            with os.scandir(_index_path(self.path)) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        out.append((entry.name, entry.stat(follow_symlinks=False).st_mtime))
        except FileNotFoundError:
            pass
        return sorted(out)

    def delete_piece_folder(self, folder: str) -> int:
        where = _index_path(self.path, folder)
        deleted = 0
        try:
            names = os.listdir(where)
        except FileNotFoundError:
            return 0
        for name in names:
            try:
                os.unlink(os.path.join(where, name))
                deleted += not name.startswith(TMP_PREFIX)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(where)
        except OSError:
            pass  # a piece written meanwhile (its segment lives again): left for later
        return deleted
