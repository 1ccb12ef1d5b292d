"""Property tests: any sequence of writes, commits, replays, retention and reopen keeps offsets
gapless and reads equal to what was committed."""

import itertools
import shutil
import tempfile

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tier_store import CommitConflict, Store

from .conftest import SCHEMA

PARTS = 3
_keys = itertools.count()

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, PARTS - 1), st.integers(1, 300)),
        st.tuples(st.just("keyed"), st.integers(1, 300), st.none()),
        st.tuples(st.just("batch"), st.integers(0, 3), st.integers(1, 200)),
        st.tuples(st.just("pending"), st.integers(0, PARTS - 1), st.integers(1, 50)),
        st.tuples(st.just("retention"), st.none(), st.none()),
        st.tuples(st.just("reopen"), st.none(), st.none()),
    ),
    min_size=1, max_size=25,
)


def _batch(n: int) -> pa.RecordBatch:
    start = next(_keys) * 1000
    keys = list(range(start, start + n))
    return pa.record_batch([pa.array(keys, pa.int64()), pa.array(keys, pa.int64()),
                            pa.array([f"v{k}" for k in keys])], schema=SCHEMA)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_any_sequence_keeps_offsets_gapless_and_reads_equal_commits(sequence):
    root = tempfile.mkdtemp(prefix="pafka-prop-")
    try:
        conf = {"log.segment.bytes": "32k", "log.checkpoint.interval": 4,
                "log.cleanup.grace.ms": 0, "log.retention.bytes": -1}
        store = Store.open(root, conf)
        topic = store.create_topic("t", SCHEMA, partitions=PARTS)
        model: list[list[int]] = [[] for _ in range(PARTS)]
        done_batches: dict[str, int] = {}
        pending = []
        for op, a, b in sequence:
            if op == "append":
                batch = _batch(b)
                topic.append(batch, partition=a)
                model[a].extend(batch.column(0).to_pylist())
            elif op == "keyed":
                batch = _batch(a)
                for r in topic.commit(topic.write_chunks(batch, key="key")):
                    got = [k for x in topic.read(r.partition, r.base_offset,
                                                 r.base_offset + r.records)
                           for k in x.column(0).to_pylist()]
                    model[r.partition].extend(got)
            elif op == "batch":
                writer = f"w{a % 2}"
                batch_id = done_batches.get(writer, -1) + (1 if a < 2 else 0)  # some replays
                batch = _batch(b)
                res = topic.commit(topic.write_chunks(batch, partition=a % PARTS),
                                   writer_id=writer, batch_id=batch_id)
                if batch_id > done_batches.get(writer, -1):
                    assert res and res[0].records == b
                    model[a % PARTS].extend(batch.column(0).to_pylist())
                    done_batches[writer] = batch_id
                else:
                    assert res == []
            elif op == "pending":
                batch = _batch(b)
                pending.append((a, batch, topic.write_chunks(batch, partition=a)))
            elif op == "retention":
                store.close()
                store = Store.open(root, dict(conf, **{"log.retention.bytes": "40k"}))
                topic = store.topic("t")
                topic.apply_retention()
            elif op == "reopen":
                store.close()
                store = Store.open(root)
                topic = store.topic("t")
            # Invariants after every step.
            latest, earliest = topic.latest_offsets(), topic.earliest_offsets()
            for p in range(PARTS):
                assert latest[p] == len(model[p])
                got = [k for x in topic.read(p, earliest[p]) for k in x.column(0).to_pylist()]
                assert got == model[p][earliest[p]:]
        # Chunks written but never committed stay invisible; committing them later works.
        for p, batch, refs in pending:
            try:
                topic.commit(refs)
            except CommitConflict:
                # Allowed only when retention deleted the segment the chunk was written to.
                assert any(f"{r.partition}-{r.seq}@{r.tier}" in topic.state().tombstones
                           for r in refs)
                continue
            model[p].extend(batch.column(0).to_pylist())
        for p in range(PARTS):
            e = topic.earliest_offsets()[p]
            got = [k for x in topic.read(p, e) for k in x.column(0).to_pylist()]
            assert got == model[p][e:]
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
