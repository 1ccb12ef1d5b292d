import os
import re

import pytest

from tier_store import ConfigError, PafkaError, Store
from tier_store.config import KEYS, markdown_table, properties_text, read_properties

from .conftest import ROOT, SCHEMA

CONF = os.path.join(ROOT, "conf", "pafka.properties")


def test_conf_properties_file_matches_the_declared_keys():
    with open(CONF) as f:
        text = f.read()
    assert text == properties_text()
    # Every key is listed, commented out at its default, and so are a third tier's keys.
    listed = re.findall(r"^#([a-z0-9.]+)=(.*)$", text, re.MULTILINE)
    assert {k for k, _ in listed} == set(KEYS) | {"storage.tiers.3.paths",
                                                  "storage.tiers.3.sizes"}
    for k, v in listed:
        if k in KEYS:
            assert KEYS[k].parse(v) == KEYS[k].default
    assert read_properties(CONF) == {}


def test_sample_conf_opens_a_new_and_an_existing_store(tmp_path, shm_dir):
    new = Store.open(tmp_path / "new", CONF)
    assert new.config["log.channel.type"] == "file"
    existing = {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
                "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
                "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0}
    Store.open(tmp_path / "old", existing).create_topic("t", SCHEMA)
    s = Store.open(tmp_path / "old", CONF)
    assert [t.type for t in s.tiers] == ["PMEM", "HDD"] and s.topics() == ["t"]
    assert s.config["log.segment.bytes"] == 64 * 1024


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def test_allowed_text_says_what_every_key_accepts():
    for key in KEYS.values():
        text = key.allowed()
        if key.kind in ("int", "size", "float"):
            for bound in (key.minimum, key.maximum):
                if bound is not None:
                    key.parse(bound)  # the bounds are allowed ...
                    assert _fmt(bound) in text, (key.name, text)
            if key.minimum is not None and key.minimum - 1 not in key.special:
                with pytest.raises(ConfigError):  # ... what lies outside them is not
                    key.parse(key.minimum - 1)
            for s in key.special:
                key.parse(s)
                assert f"or {_fmt(s)}" in text
        if key.kind == "float":
            for bad in ("nan", "inf"):
                with pytest.raises(ConfigError):
                    key.parse(bad)
    threshold = KEYS["storage.migrate.threshold"]
    assert threshold.allowed() == "a number in [0, 1], or -1"
    for bad in (2, 1.5, -0.5):
        with pytest.raises(ConfigError, match=r"\[0, 1\], or -1"):
            threshold.parse(bad)
    assert "not REMOTE" in KEYS["storage.tiers.types"].allowed()


def test_a_key_naming_a_tier_the_store_does_not_have_is_an_error(tmp_path):
    two = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD"}
    with pytest.raises(ConfigError, match=r"storage\.tiers\.3\.paths=/tmp/x names tier 3, but "
                                          r"the store has 2 tiers \(storage\.tiers\.types="
                                          r"NVME,HDD\)"):
        Store.open(tmp_path / "a", {**two, "storage.tiers.3.paths": "/tmp/x"})
    Store.open(tmp_path / "b", two)
    with pytest.raises(ConfigError, match="names tier 3"):
        Store.open(tmp_path / "b", {"storage.tiers.3.sizes": "1g"})
    with pytest.raises(ConfigError, match=r"names tier 2.*log\.channel\.type=file"):
        Store.open(tmp_path / "c", {"storage.tiers.second.paths": str(tmp_path / "slow")})
    # Empty paths and zero sizes set nothing: a file that lists every key still opens.
    Store.open(tmp_path / "d", {"storage.tiers.second.paths": "", "storage.tiers.2.sizes": 0})


def test_a_properties_file_that_is_not_utf8_is_a_clear_error(tmp_path):
    props = tmp_path / "latin1.properties"
    props.write_bytes("log.segment.bytes=1m\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"cannot read configuration file .*latin1\.properties.*"
                                          r"not UTF-8"):
        Store.open(tmp_path / "s", str(props))


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


def test_tier_sizes_are_saved_and_change_only_by_resizing(tmp_path):
    mib = 1024 * 1024
    Store.open(tmp_path, {"storage.tiers.first.sizes": "128m"})
    assert Store.open(tmp_path).tiers[0].capacity == 128 * mib
    Store.open(tmp_path, {"storage.tiers.1.sizes": "128m"})  # the saved size: fine
    with pytest.raises(ConfigError, match=r"storage\.tiers\.1\.sizes=268435456 conflicts "
                                          r".*capacity of 134217728 bytes.*pafka resize"):
        Store.open(tmp_path, {"storage.tiers.first.sizes": "256m"})
    s = Store.open(tmp_path)
    assert s.resize_tier(1, "256m") == 0
    assert s.tiers[0].capacity == 256 * mib and s.config["storage.tiers.first.sizes"] == 256 * mib
    assert Store.open(tmp_path, {"storage.tiers.first.sizes": "256m"}).tiers[0].capacity \
        == 256 * mib
    with pytest.raises(ConfigError, match=r"storage\.tiers\.first\.sizes.* >= 65536"):
        s.resize_tier(1, 10)
    with pytest.raises(PafkaError, match="has no tier 2"):
        s.resize_tier(2, "1g")


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


def test_tier_types_given_without_a_channel_type_imply_tiered(tmp_path):
    # storage.tiers.types is read only by log.channel.type=tiered, whose default is file:
    # listing the types alone used to make one FILE tier without a word.
    s = Store.open(tmp_path / "dict", {"storage.tiers.types": "NVME,HDD"})
    assert [t.type for t in s.tiers] == ["NVME", "HDD"]
    assert s.config["log.channel.type"] == "tiered"
    # Saved as tiered: a later open with no configuration finds the same two tiers.
    assert [t.type for t in Store.open(tmp_path / "dict").tiers] == ["NVME", "HDD"]
    props = tmp_path / "p.properties"
    props.write_text("storage.tiers.types=NVME,SSD,HDD\n")
    assert [t.type for t in Store.open(tmp_path / "file", str(props)).tiers] == [
        "NVME", "SSD", "HDD"]
    # Only an explicit value counts: the key's default (PMEM,HDD) implies nothing.
    assert [t.type for t in Store.open(tmp_path / "default").tiers] == ["FILE"]
    # Types that agree with an explicit single-tier channel type are fine.
    assert [t.type for t in Store.open(tmp_path / "one", {
        "log.channel.type": "file", "storage.tiers.types": "FILE"}).tiers] == ["FILE"]


@pytest.mark.parametrize("channel,types,count", [("file", "PMEM,HDD", "2 tiers"),
                                                 ("pmem", "NVME", "1 tier"),
                                                 ("file", "PMEM", "1 tier")])
def test_tier_types_contradicting_an_explicit_channel_type_are_an_error(tmp_path, channel,
                                                                        types, count):
    with pytest.raises(ConfigError, match=rf"log\.channel\.type={channel} makes one "
                                          rf"{channel.upper()} tier, but storage\.tiers\.types="
                                          rf"{types} lists {count}: set log\.channel\.type="
                                          "tiered"):
        Store.open(tmp_path / "s", {"log.channel.type": channel, "storage.tiers.types": types})
    assert not (tmp_path / "s").exists()  # refused before anything was made
    props = tmp_path / "p.properties"
    props.write_text(f"log.channel.type={channel}\nstorage.tiers.types={types}\n")
    with pytest.raises(ConfigError, match=r"log\.channel\.type=.*storage\.tiers\.types="):
        Store.open(tmp_path / "s", str(props))


def test_a_pmem_tiers_usable_capacity_is_its_pool_and_the_key_says_so(tmp_path, shm_dir):
    doc = KEYS["log.pmem.pool.ratio"].doc
    assert "usable capacity is this ratio times its size" in doc
    assert doc in properties_text() and doc in markdown_table()
    s = Store.open(tmp_path, {"log.channel.type": "pmem", "storage.tiers.first.paths": shm_dir,
                              "storage.tiers.first.sizes": "1m", "log.segment.bytes": "64k",
                              "log.pmem.pool.ratio": 0.5})
    assert s.tiers[0].pool_size == 8  # 0.5 x 1 MiB in 64 KiB segment files
