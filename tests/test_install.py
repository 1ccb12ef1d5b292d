"""The project as installed, seen from outside the repository: Spark must discover
``format("pafka")`` with no ``register()`` call and no PYTHONPATH, both through the
development (editable) install and through the built wheel in a fresh virtual environment."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pafka_source

from .conftest import ROOT
from .support import isolated_env as _env

TIMEOUT = 300  # seconds per subprocess: Spark start-up on a loaded 2-core machine is slow
PACKAGES = ("tier_store", "migration", "pafka_source")

# Run as a file in a directory outside the repository, so neither the working directory nor
# the script's directory can put the project on sys.path; only the install can.
JOB = textwrap.dedent('''\
    import importlib.util
    import sys

    from pyspark.sql import SparkSession

    root = sys.argv[1]
    spark = (SparkSession.builder.master("local[2]").appName("pafka-install-check")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rows = [(i, i * 10, f"v{i}") for i in range(25)]
    df = spark.createDataFrame(rows, "key long, ts long, value string")
    df.write.format("pafka").option("topic", "t").mode("append").save(root)
    back = spark.read.format("pafka").option("topic", "t").load(root)
    got = sorted(tuple(r) for r in back.collect())
    # Where a Python worker finds the project: the install under test must be the one used.
    worker = (spark.sparkContext.parallelize([0], 1)
              .map(lambda _: __import__("pafka_source").__file__).first())
    spark.stop()
    driver = importlib.util.find_spec("pafka_source").origin
    print(f"RESULT match={got == rows} rows={len(got)} columns={back.columns}")
    print(f"WORKER_MODULE {worker}")
    print(f"DRIVER_MODULE {driver}")
    sys.exit(0 if got == rows else 1)
''')


def _run(cmd: list[str], cwd: Path, python: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(python), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}\n--- stdout tail ---\n{proc.stdout[-3000:]}"
        f"\n--- stderr tail ---\n{proc.stderr[-6000:]}")
    return proc


def _outside(tmp_path: Path) -> Path:
    """A working directory that is not inside the repository."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(parents=True, exist_ok=True)
    assert not cwd.resolve().is_relative_to(Path(ROOT).resolve()), "tmp_path lies in the repo"
    return cwd


def _round_trip(python: str, tmp_path: Path) -> dict[str, str]:
    """Run JOB with ``python`` (also the workers' Python) from outside the repository; return
    its report lines by their first word."""
    cwd = _outside(tmp_path)
    script = cwd / "pafka_round_trip.py"
    script.write_text(JOB)
    proc = _run([python, str(script), str(tmp_path / "store")], cwd, python)
    lines = {ln.split(" ", 1)[0]: ln for ln in proc.stdout.splitlines() if " " in ln}
    assert lines.get("RESULT") == (
        "RESULT match=True rows=25 columns=['key', 'ts', 'value']"), proc.stdout
    return {k: v.split(" ", 1)[1] for k, v in lines.items()}


def _inside(path: str, directory: Path) -> bool:
    return Path(path).resolve().is_relative_to(directory.resolve())


def test_pyspark_pafka_is_visible_to_pkgutil_from_outside_the_repository(tmp_path: Path) -> None:
    # What Spark's data-source lookup does; the finder-hook editable install fails this.
    probe = ("import pkgutil; "
             "print(sorted(m.name for m in pkgutil.iter_modules() if m.name == 'pyspark_pafka'))")
    proc = _run([sys.executable, "-c", probe], _outside(tmp_path), sys.executable)
    assert proc.stdout.strip() == "['pyspark_pafka']"


def test_spark_outside_the_repository_finds_pafka_without_register_or_pythonpath(
        tmp_path: Path) -> None:
    report = _round_trip(sys.executable, tmp_path)
    # The workers used this environment's install of the project, the one under test.
    assert Path(report["WORKER_MODULE"]).resolve() == Path(pafka_source.__file__).resolve()


def _site_packages(python: str) -> str:
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                         timeout=TIMEOUT, check=True)
    return out.stdout.strip()


def _sources(dest: Path) -> Path:
    """The repository's files (tracked and untracked, less what .gitignore ignores) copied to
    ``dest``: the build writes build/ and *.egg-info next to its sources, and must not write
    into a repository others are working in."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=TIMEOUT).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = Path(ROOT, name)
        if src.is_file():  # a tracked file may be deleted in the work tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
    return dest


def test_wheel_in_a_fresh_venv_serves_spark_and_the_pafka_command(tmp_path: Path) -> None:
    src = _sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    # Offline: the build uses the setuptools of this environment (dev extra: setuptools>=77).
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", str(wheels), str(src)], tmp_path, sys.executable)
    (wheel,) = wheels.glob("pafka_spark-*.whl")

    # Every module of the source tree ships, the discovery shim and subpackages included.
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"pyspark_pafka.py"} | {
        p.relative_to(src).as_posix() for pkg in PACKAGES for p in (src / pkg).rglob("*.py")}
    assert expected - names == set()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=TIMEOUT)
    python = str(venv / "bin" / "python")
    # Installed before the dependencies are made visible: pip must not see (and offer to
    # replace) the development install of the same distribution in the outer environment.
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
          "--no-index", str(wheel)], tmp_path, sys.executable)

    # The dependencies (pyspark, pyarrow, ...) come from this environment's site-packages
    # through a plain path line: site adds the directory but does not run the .pth files in
    # it, so the editable install's path to the repository does not come along.
    inner = Path(_site_packages(python))
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (inner / "_pafka_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(outer)))

    cwd = _outside(tmp_path)
    probe = ("import os, sys, pafka_source, pyspark_pafka, tier_store.tiers; "
             "print(pafka_source.__file__); print(pyspark_pafka.__file__); "
             "print(tier_store.tiers.__file__); "
             f"print(any(os.path.realpath(p or '.') == {os.path.realpath(ROOT)!r} "
             "for p in sys.path))")
    *files, repo_on_path = _run([python, "-c", probe], cwd, python).stdout.split()
    assert repo_on_path == "False"
    assert all(_inside(f, inner) for f in files), files

    report = _round_trip(python, tmp_path / "job")
    assert _inside(report["WORKER_MODULE"], inner), report
    assert _inside(report["DRIVER_MODULE"], inner), report

    helped = _run([str(venv / "bin" / "pafka"), "--help"], cwd, python)
    assert helped.stdout.startswith("usage: pafka")
