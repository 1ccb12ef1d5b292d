import os

import pytest

from tier_store import ConfigError, Store
from tier_store.config import KEYS, markdown_table, properties_text, read_properties

from .conftest import ROOT


def test_conf_properties_file_matches_the_declared_keys():
    with open(os.path.join(ROOT, "conf", "pafka.properties")) as f:
        assert f.read() == properties_text()
    parsed = read_properties(os.path.join(ROOT, "conf", "pafka.properties"))
    assert set(parsed) == set(KEYS)


def test_readme_key_table_matches_the_declared_keys():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert markdown_table() in f.read()


def test_unknown_key_names_the_closest_known_key(tmp_path):
    with pytest.raises(ConfigError, match=r"log\.segment\.bites.*log\.segment\.bytes"):
        Store.open(tmp_path, {"log.segment.bites": 1})


@pytest.mark.parametrize("key,value,allowed", [
    ("storage.migrate.threshold", "1.5", r"\[0, 1\], or -1"),
    ("log.segment.bytes", "12", ">= 16384"),
    ("log.channel.type", "tape", "one of file, pmem, tiered"),
    ("compression.type", "gzip", "one of none, lz4, zstd"),
    ("storage.tiers.types", "PMEM,FLOPPY", "comma-separated list"),
    ("num.partitions", "four", "an integer"),
])
def test_bad_value_names_key_value_and_what_is_allowed(tmp_path, key, value, allowed):
    with pytest.raises(ConfigError, match=rf"{value!r}.*{key}.*{allowed}|{key}.*{allowed}") as e:
        Store.open(tmp_path, {key: value})
    assert key in str(e.value) and value in str(e.value)


def test_sizes_accept_binary_suffixes(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "2m", "storage.tiers.first.sizes": "1GiB"})
    assert s.config["log.segment.bytes"] == 2 * 1024 * 1024
    assert s.tiers[0].capacity == 1024 ** 3


def test_layout_is_saved_and_a_conflicting_open_names_both_values(tmp_path):
    Store.open(tmp_path, {"log.segment.bytes": "1m"})
    again = Store.open(tmp_path)  # reads the saved layout
    assert again.config["log.segment.bytes"] == 1024 * 1024
    with pytest.raises(ConfigError, match=r"log\.segment\.bytes=2097152.*1048576"):
        Store.open(tmp_path, {"log.segment.bytes": "2m"})


def test_changeable_keys_may_differ_per_open(tmp_path):
    Store.open(tmp_path, {"log.retention.ms": 1000})
    s = Store.open(tmp_path, {"log.retention.ms": 5000})
    assert s.config["log.retention.ms"] == 5000


def test_properties_file_is_accepted_and_numbered_tier_keys_alias_first_second(tmp_path):
    props = tmp_path / "p.properties"
    props.write_text("# comment\nlog.channel.type=tiered\nstorage.tiers.types=NVME,HDD\n"
                     f"storage.tiers.1.paths={tmp_path / 'fast'}\nstorage.tiers.1.sizes=4m\n")
    s = Store.open(tmp_path / "root", str(props))
    assert [t.type for t in s.tiers] == ["NVME", "HDD"]
    assert s.tiers[0].path == str(tmp_path / "fast") and s.tiers[0].capacity == 4 * 1024 ** 2


def test_three_tiers_use_numbered_keys(tmp_path):
    s = Store.open(tmp_path / "r", {"log.channel.type": "tiered",
                                    "storage.tiers.types": "NVME,SSD,HDD",
                                    "storage.tiers.3.paths": str(tmp_path / "cold")})
    assert [t.number for t in s.tiers] == [1, 2, 3]
    assert s.tiers[2].path == str(tmp_path / "cold")


def test_missing_properties_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        Store.open(tmp_path, str(tmp_path / "nope.properties"))


def test_readme_option_tables_match_the_declared_options():
    from pafka_source.options import markdown_tables
    with open(os.path.join(ROOT, "README.md")) as f:
        assert markdown_tables() in f.read()
