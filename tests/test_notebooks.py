"""The notebooks run from top to bottom (with a kernel from this venv), and their figures show
what they claim. Each figure leaves the numbers it drew (read back from its artists) beside
it as a JSON output (``pafka_source.tier_plots.show``); these tests read them back."""

import base64
import glob
import io
import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import ROOT

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
EXPLORE = os.path.join(ROOT, "notebooks", "explore_store.ipynb")
TIERING = os.path.join(ROOT, "notebooks", "tiering.ipynb")
STREAMING = os.path.join(ROOT, "notebooks", "spark_streaming.ipynb")
MiB = 1 << 20


def _sample_dirs():
    return set(glob.glob("/dev/shm/pafka-notebook-*"))


def _execute(path, cwd):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _text(nb):
    """What a reader sees as text: printed output and plain-text results."""
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                   for o in _outputs(nb))


def _figures(nb):
    """The numbers of each figure, by its name."""
    return {d["figure"]: d for o in _outputs(nb)
            if isinstance(d := o.get("data", {}).get("application/json"), dict)
            and "figure" in d}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run a notebook once per module (on the sample store: no PAFKA_NOTEBOOK_* set); returns
    the executed notebook and the /dev/shm sample directories before and after."""
    runs = {}

    def run(path):
        if path not in runs:
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv("PAFKA_NOTEBOOK_ROOT", raising=False)
                mp.delenv("PAFKA_NOTEBOOK_MIGRATE", raising=False)
                before = _sample_dirs()
                nb = _execute(path, tmp_path_factory.mktemp("notebook"))
                runs[path] = nb, before, _sample_dirs()
        return runs[path]
    return run


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_and_draws_real_images(path, executed):
    from PIL import Image

    nb, before, after = executed(path)
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert images, "no figure was drawn"
    for png in images:
        img = Image.open(io.BytesIO(base64.b64decode(png)))
        img.load()  # decodes the whole image: a truncated or corrupt PNG fails here
        assert img.format == "PNG" and img.width >= 300 and img.height >= 150
        colors = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 20, "a blank image"
    # Human sizes: 256 KiB is never printed as "0 MiB" (nor "0.0 MiB").
    assert not re.search(r"(?<![\d.])0(\.0+)? [KMGT]iB", _text(nb))
    assert after <= before  # the sample store's memory tier was removed


def test_explore_draws_tiers_against_capacity_with_the_threshold_band(executed):
    fig = _figures(executed(EXPLORE)[0])["tier usage"]
    assert fig["labels"] == ["before", "after migration"]
    t1, t2, t3 = fig["tiers"]
    cap = t1["capacity"]
    assert cap == 4 * MiB and t1["xlim"] == [0, cap]  # the bars' scale is the capacity
    assert t1["threshold_high"] == [pytest.approx(0.6 * cap)]  # the band of the sample store
    assert t1["threshold_low"] == [pytest.approx(0.4 * cap)]
    assert t1["bars"]["before"] == cap  # the sample overflowed tier 1
    assert 0 < t1["bars"]["after migration"] <= 0.6 * cap  # drained to the threshold
    # Tier 2 has the same band, and holds what tier 1 gave up to its top.
    assert t2["capacity"] == 6 * MiB and t2["xlim"] == [0, 6 * MiB]
    assert t2["threshold_high"] == [pytest.approx(0.6 * 6 * MiB)]
    assert 0 < t2["bars"]["before"] < t2["bars"]["after migration"] <= 0.6 * 6 * MiB
    # Tier 3, the lake, is unbounded: no threshold, both bars on its one scale; the oldest
    # segments went there.
    assert t3["capacity"] == 0 and not t3["threshold_high"] and not t3["threshold_low"]
    assert t3["xlim"][1] >= t3["bars"]["after migration"] > t3["bars"]["before"] == 0


def test_explore_shows_the_freshness_order_broken_by_overflow_and_restored(executed):
    nb = executed(EXPLORE)[0]
    panels = _figures(nb)["segment age"]["panels"]
    assert not panels["before"]["held"]  # overflow put the newest segments on tier 2
    after = panels["after migration"]
    assert after["held"] and after["tiers"]["1"]["count"] > 0
    assert "after migration: freshness order held" in _text(nb)


def test_explore_charts_each_topics_bytes_per_tier(executed):
    figures = _figures(executed(EXPLORE)[0])
    topics = figures["topic bytes per tier"]["topics"]
    assert set(topics) == {"clicks", "views"}
    assert topics["clicks"]["1"] > 0 and topics["clicks"]["2"] > 0  # clicks on both disks
    # The topics' tier-2 bytes add up to the tier-2 bar of the usage figure (same moment).
    tier2 = figures["tier usage"]["tiers"][1]["bars"]["before"]
    assert sum(t["2"] for t in topics.values()) == tier2


def test_explore_shows_each_topics_lake_table_and_reads_one(executed):
    text = _text(executed(EXPLORE)[0])
    m = re.search(r"clicks: table version (\d+), (\d+) files, ([\d,]+) rows", text)
    assert m and int(m[1]) >= 1 and int(m[2]) >= 1
    rows = [int(n.replace(",", "")) for n in re.findall(r"partition \d: ([\d,]+) rows", text)]
    assert rows and sum(rows) == int(m[3].replace(",", ""))  # the table read alone agrees


def test_tiering_measures_the_burst_beside_pafkas_formula(executed):
    nb = executed(TIERING)[0]
    fig = _figures(nb)["tiering timeline"]
    cap = fig["capacity"]
    assert cap == 8 * MiB and fig["capacity_line"] == [cap] and fig["ylim"][1] >= cap
    assert fig["threshold_high"] == [pytest.approx(0.5 * cap)] and fig["samples"] > 50
    # Pafka's formula: (1 - 0.5) x 8 MiB / (1.25 MB/s - 0.5 MB/s).
    assert fig["predicted_s"] == pytest.approx(0.5 * cap / 750_000)
    measured = fig["measured_s"]
    assert measured is not None, "tier 1 never filled during the burst"
    assert 0.25 * fig["predicted_s"] <= measured <= 2 * fig["predicted_s"]
    assert fig["marks"]["measured full"] and fig["marks"]["predicted full"]
    assert fig["used_max"] >= 0.75 * cap  # the burst filled tier 1
    assert fig["used_end"] <= fig["limit"] and fig["drain_s"] is not None  # and it drained
    assert fig["down_end"] > 0
    assert "tier 1 absorbs the burst" in _text(nb) and "Pafka's formula" in _text(nb)
    usage = _figures(nb)["tier usage"]["tiers"][0]
    assert usage["xlim"] == [0, cap] and usage["threshold_high"] == [pytest.approx(cap / 2)]
    assert usage["bars"]["fullest"] >= usage["bars"]["at the end"]


def test_streaming_plots_the_readers_lag_falling_to_zero_both_ways(executed):
    fig = _figures(executed(STREAMING)[0])["streaming lag"]
    assert fig["written"] == fig["counted"] > 0  # the reader counted every click
    helper, store = fig["helper_records"], fig["store_records"]
    assert max(helper) > 0 and helper[-1] == 0  # behind at first, caught up at the end
    assert max(store) > 0 and store[-1] == 0  # the store's view of the group agrees
    assert fig["helper_bytes"][-1] == 0 and max(fig["helper_bytes"]) > 0
    assert all(s is None or 0 <= s <= 1 for s in fig["tier1_share"])


def _run(path, tmp_path):
    nb = _execute(path, tmp_path)
    return "".join(o.get("text", "") for o in _outputs(nb))


def test_a_notebook_root_without_a_store_is_an_error_not_a_new_store(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError
    missing = tmp_path / "mistyped"
    monkeypatch.setenv("PAFKA_NOTEBOOK_ROOT", str(missing))
    with pytest.raises(CellExecutionError, match=f"no store at {missing}"):
        _run(EXPLORE, tmp_path)
    assert not missing.exists()


def _store_above_threshold(root, fast):
    from tier_store import Store

    from .conftest import SCHEMA, make_batch
    s = Store.open(root, {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
                          "storage.tiers.first.paths": fast, "storage.tiers.first.sizes": "1m",
                          "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0,
                          "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    return {x.id: x.tier for x in t.segments()}


def test_the_notebook_migrates_a_named_store_only_when_asked(tmp_path, shm_dir, monkeypatch):
    from tier_store import Store
    root = tmp_path / "store"
    before = _store_above_threshold(root, shm_dir)
    monkeypatch.setenv("PAFKA_NOTEBOOK_ROOT", str(root))
    out = _run(EXPLORE, tmp_path)
    assert "RUN_MIGRATION is off: nothing moved" in out and "tier 1 -> 2" in out
    assert {x.id: x.tier for x in Store.open(root).topic("t").segments()} == before
    monkeypatch.setenv("PAFKA_NOTEBOOK_MIGRATE", "1")
    out = _run(EXPLORE, tmp_path)
    after = {x.id: x.tier for x in Store.open(root).topic("t").segments()}
    assert "RUN_MIGRATION is off" not in out and after != before


def test_human_sizes_keep_small_sizes_visible():
    from pafka_source.tier_figures import human_size
    assert [human_size(n) for n in (0, 1023, 256 << 10, 1536 << 10, 4 << 20, 10 ** 9)] == [
        "0 B", "1023 B", "256 KiB", "1.5 MiB", "4 MiB", "954 MiB"]


def test_the_figures_modules_leave_matplotlib_optional():
    import subprocess

    from .conftest import PYTHON
    code = ("import sys, pafka_source.tier_figures, pafka_source.tier_plots; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
