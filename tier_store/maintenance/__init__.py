"""Maintenance above the log: operations that rewrite where a topic's data lives, or delete it.

One module per operation, each saying what it does, its crash-safe steps, and its danger
(what it deletes or rewrites, and what protects readers):

* :mod:`.housekeeping`: what runs after a commit (checkpoint, garbage, retention).
* :mod:`.retention`: deleting whole old segments past ``log.retention.bytes``/``.ms``.
* :mod:`.garbage`: reclaiming segment files no entry references any more.
* :mod:`.moves`: moving (and merging) sealed segments between tiers, with :mod:`.copy`
  (writing the new file) and :mod:`.adopt` (taking back a segment's old file instead).
* :mod:`.idle`: sealing quiet active segments so that they migrate too.
* :mod:`.check`: checking a topic against its commit log.
* :mod:`.deletion`: deleting a topic, and reclaiming what deleted topics left.

They see a topic through its public primitives (:meth:`~tier_store.topic.Topic.snapshot`,
:meth:`~tier_store.topic.Topic.replace_segments`,
:meth:`~tier_store.topic.Topic.delete_segments`, ...) and the store through
:class:`~tier_store.host.TopicHost` (``topic.store``); never the store itself. Nothing is
imported here, so that importing one operation does not import the others.
"""
