"""`pafka demo` as a newcomer runs it: from a directory outside the repository, with no
PYTHONPATH. Its facts are checked in its output and in the store it leaves."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from migration import read_stats
from pafka_source.demo import demo_paths, freshness_violations
from tier_store import Store


def test_the_demo_overflows_tier_1_migrates_down_and_every_count_matches(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    pafka = os.path.join(os.path.dirname(sys.executable), "pafka")
    try:
        r = subprocess.run([pafka, "demo", "--seconds", "6"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
        out = r.stdout
        assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
        root = str(tmp_path / "pafka-data")
        # The story's lines, in order.
        for step in ("1. A burst", "2. The producer stops", "3. What happened"):
            assert step in out
        # It writes exactly what it announces: 6 s of 60,000 clicks per one-second trigger.
        assert "1. A burst: query 1 writes 360,000 clicks, 60,000 per one-second trigger" in out
        m = re.search(r"query 1 wrote ([\d,]+) clicks of the 360,000 announced; query 2 "
                      r"counted ([\d,]+): ok", out)
        assert m and m.group(1) == m.group(2) == "360,000"
        assert re.search(r"consumer group 'per-page': committed .*, lag 0: ok", out)
        down = int(re.search(r"moved (\d+) segments down", out).group(1))
        assert down > 0
        # The same facts in the store the demo left.
        store = Store.open(root)
        topic = store.topic("clicks")
        written = sum(topic.latest_offsets().values())
        assert written == int(m.group(1).replace(",", ""))
        assert topic.positions()["per-page"] == topic.latest_offsets()  # lag 0
        usage = {u["tier"]: u for u in store.tier_usage()}
        assert usage[2]["used"] > 0 and usage[2]["segments"] > 0
        assert read_stats(root)["segments_down"] >= down
        assert freshness_violations(topic) == []
        assert "freshness: in every partition, tier 2 holds only data older than tier 1's: ok" \
            in out
    finally:
        shutil.rmtree(demo_paths(str(tmp_path))[1], ignore_errors=True)

