"""How the sink cuts a task's rows into chunks: sized to fill segments two at a time, and due
one partition at a time (a real store; no Spark needed to drive one task's writing)."""

import itertools

from pafka_source.options import SinkOptions
from pafka_source.writer import PafkaBatchWriter, _ChunkWriting, chunk_target
from tier_store import Store
from tier_store.recovery import check_topic
from tier_store.segment import HEADER_SIZE

from .conftest import SCHEMA, make_batch, read_all

SEG = 1024 * 1024


def test_chunk_target_lets_two_chunks_share_a_segment():
    assert chunk_target(64 * SEG) < (64 * SEG - HEADER_SIZE) // 2
    assert chunk_target(64 * SEG) > 31 * SEG
    assert chunk_target(1024 * SEG) == 32 * SEG  # capped: chunks stay a few tens of MiB
    assert chunk_target(HEADER_SIZE) == 1


def _write_task(tmp_path, partitions, batches, key=None):
    root = str(tmp_path / "s")
    store = Store.open(root, {"log.segment.bytes": SEG})
    topic = store.create_topic("t", SCHEMA, partitions=partitions)
    writer = PafkaBatchWriter(SinkOptions(root=root, topic="t", key=key), SCHEMA, partitions)
    writing = _ChunkWriting()
    try:
        records = writer._write(iter(batches), topic, 0, writing)
        refs = writing.refs()
    finally:
        writing.close()
    topic.sync()
    topic.commit(refs)
    return topic, refs, records


def test_chunks_fill_segments_two_at_a_time_and_come_due_one_partition_at_a_time(tmp_path):
    batches = [make_batch(i * 2000, 2000) for i in range(300)]
    topic, refs, records = _write_task(tmp_path, 4, batches)
    assert records == 600_000 and sum(r.records for r in refs) == 600_000
    data = {p: sorted(read_all(topic, p)) for p in range(4)}
    assert sorted(k for ks in data.values() for k in ks) == list(range(600_000))
    assert check_topic(topic).ok

    # Every segment but each partition's last holds two chunks or more.
    per_segment = {}
    for r in refs:
        per_segment.setdefault((r.partition, r.seq), []).append(r)
    for p in range(4):
        seqs = sorted(s for q, s in per_segment if q == p)
        assert len(seqs) >= 3
        assert all(len(per_segment[(p, s)]) >= 2 for s in seqs[:-1])
    assert max(r.length for r in refs) <= (SEG - HEADER_SIZE) // 2

    # The first chunks of the four partitions are cut at 1/4, 2/4, 3/4 and 4/4 of the
    # target, in the order the partitions were first written to.
    firsts = [next(r for r in refs if r.partition == p) for p in range(4)]
    firsts.sort(key=refs.index)
    sizes = [r.records for r in firsts]
    assert sizes == sorted(sizes)
    for i, n in enumerate(sizes):
        assert abs(n / sizes[-1] - (i + 1) / 4) < 0.05, sizes


def test_keyed_rows_are_routed_by_the_store_and_chunks_still_fit_two_per_segment(tmp_path):
    batches = [make_batch(i * 2000, 2000) for i in range(60)]
    topic, refs, records = _write_task(tmp_path, 3, batches, key="key")
    assert records == 120_000
    got = list(itertools.chain.from_iterable(read_all(topic, p) for p in range(3)))
    assert sorted(got) == list(range(120_000))
    assert max(r.length for r in refs) <= (SEG - HEADER_SIZE) // 2
