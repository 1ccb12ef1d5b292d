"""How the sink cuts a task's rows into chunks: sized to fill segments two at a time, and due
one partition at a time (a real store; no Spark needed to drive one task's writing)."""

import itertools
import os
import subprocess

from pafka_source.options import SinkOptions
from pafka_source.writer import PafkaBatchWriter, _ChunkWriting, chunk_target
from tier_store import Store, check_topic
from tier_store.segment import HEADER_SIZE

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all

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


# One write task in a fresh process, fed like a Spark worker: every batch read from a stream
# into buffers of its own. Prints the minor page faults of a second write of the same rows.
_TASK = r"""
import io, os, resource, sys
import numpy as np, pyarrow as pa
from pafka_source.options import SinkOptions
from pafka_source.writer import PafkaBatchWriter, keep_freed_memory
from tier_store import Store
n = 10_000
schema = pa.schema([("key", pa.int64()), ("value", pa.binary())])
offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 100)
values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(os.urandom(n * 100))])
batch = pa.record_batch([pa.array(np.arange(n)), values], schema=schema)
sink = io.BytesIO()
with pa.ipc.new_stream(sink, schema) as w:
    for _ in range(200):
        w.write_batch(batch)
data = sink.getvalue()
root = sys.argv[1]
Store.open(root, {"log.segment.bytes": 16 << 20}).create_topic("t", schema, partitions=4)
writer = PafkaBatchWriter(SinkOptions(root=root, topic="t"), schema, 4)
def task():
    with pa.ipc.open_stream(io.BytesIO(data)) as r:
        return writer.write(iter(r))
task()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
task()
print(keep_freed_memory(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def test_a_writing_worker_reuses_the_memory_its_batches_freed(tmp_path):
    # 240 MB per task in chunks of 8 MB: where glibc hands the batches of written chunks back
    # to the kernel, about 12,000 pages are faulted in again; kept, almost none.
    def run(name, env):
        out = subprocess.run([PYTHON, "-c", _TASK, str(tmp_path / name)], cwd=ROOT,
                             env={**os.environ, **env}, capture_output=True, text=True,
                             check=True).stdout.split()
        return out[0] == "True", int(out[1])

    kept, faults = run("kept", {})
    assert kept and faults < 2_000, faults
    # A process started with malloc settings of its own keeps them, and pays the faults. An
    # explicit mmap threshold also stops glibc from raising it on its own after a large free,
    # which would hide the faults depending on what the process allocated before.
    own, own_faults = run("own", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"})
    assert not own and own_faults > 6_000, own_faults
