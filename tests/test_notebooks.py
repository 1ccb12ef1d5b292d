"""The notebooks run from top to bottom (with a kernel from this venv)."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import ROOT

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_and_plots(path, tmp_path):
    def sample_dirs():
        return set(glob.glob("/dev/shm/pafka-notebook-*"))

    before = sample_dirs()
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots were drawn
    assert sample_dirs() <= before  # the sample store's memory tier was removed


EXPLORE = os.path.join(ROOT, "notebooks", "explore_store.ipynb")


def _run(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))


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
