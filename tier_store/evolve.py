"""``Topic.evolve``: a topic's schema changed in its commit log, and in its Delta table.

The change is one ``schema`` entry, which every reader and writer reads; the rules are
:mod:`tier_store.schemas`'. On a store whose last tier is a lake, the topic's Delta table
changes right after: columns added (nullable), NOT NULL dropped. A table that holds files
cannot widen a type (delta-rs has no type widening), so such a change is refused before
anything is published. Should the table's change fail after the entry is published (a
crash, an object store's error), the next demotion makes it before adding its file.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from .entries import SchemaEntry
from .errors import InvalidArgument, PafkaError, SchemaMismatch
from .lake import table_schema
from .maintenance.demote import lake_table
from .schemas import changes, check, schema_to_text

if TYPE_CHECKING:
    from .state import TopicState
    from .topic import Topic

log = logging.getLogger(__name__)


def evolve(topic: Topic, schema: pa.Schema) -> pa.Schema:
    """``Topic.evolve``: make ``schema`` the topic's schema. :class:`SchemaMismatch` naming
    each problem unless it is an allowed evolution. Idempotent: the schema the topic has
    already publishes nothing. Concurrent changes are decided one after another, each
    against the schema the one before it left. Returns the topic's schema after it."""
    if not isinstance(schema, pa.Schema):
        raise InvalidArgument(f"evolve takes a pyarrow.Schema, got {type(schema).__name__}")
    last = topic.store.tiers[-1]
    table = lake_table(topic, last) if last.is_lake else None  # type: ignore[arg-type]

    def make(st: TopicState) -> SchemaEntry | None:
        assert st.schema is not None
        if st.schema.equals(schema, check_metadata=True):
            return None
        check(st.schema, schema, topic.name)
        if table is not None:
            try:
                table_schema(schema)  # names the lake's own columns take
            except PafkaError as e:
                raise SchemaMismatch(f"topic {topic.name!r}: {e}") from None
        widened = [c for c in changes(st.schema, schema) if c.startswith("widened")]
        if widened and table is not None and table.version() >= 0:
            raise SchemaMismatch(
                f"topic {topic.name!r} keeps its history in a Delta table, which cannot widen "
                f"a type (delta-rs has no type widening): {'; '.join(widened)} is refused. "
                "Add a column instead")
        return SchemaEntry(max(st.last_ts, int(time.time() * 1000)), schema_to_text(schema))

    topic.log.publish_retrying(make)
    if table is not None:
        try:
            done = table.evolve(topic.schema)
            if done:
                log.info("topic %s: its Delta table %s: %s", topic.name, table.uri,
                         "; ".join(done))
        except Exception as e:  # noqa: BLE001 - the next demotion makes the change
            log.warning("topic %s: its Delta table's schema was not changed yet (%s): the "
                        "next demotion changes it", topic.name, e)
    return topic.schema
