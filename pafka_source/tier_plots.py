"""The notebooks' tier figures, drawn with matplotlib from :mod:`pafka_source.tier_figures`.

matplotlib is imported when a function here is called, so the package does not need it
(``pip install matplotlib``, or the ``dev`` extra). Each function returns the figure and the
numbers it drew, read back from the drawn artists (bar widths, axis limits, line positions):
:func:`show` displays both in a notebook, so a test can check the figure, not just its
presence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .tier_figures import freshness, human_size

__all__ = ["plot_ages", "plot_tiers", "plot_timeline", "plot_topic_bytes", "show"]

TIER_COLORS = ("tab:orange", "tab:blue", "tab:green", "tab:purple")
MARK_COLORS = ("tab:purple", "black", "tab:cyan")


def _plt() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # an optional dependency of the package
        raise ImportError("pafka_source.tier_plots needs matplotlib: pip install matplotlib "
                          "(or the dev extra)") from e
    return plt


def _bytes_axis(axis: Any) -> None:
    """Ticks at multiples of a power of two bytes (1 MiB, not 977 KiB), in binary units."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter, Locator

    class BinaryLocator(Locator):
        def __call__(self) -> Any:
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin: float, vmax: float) -> Any:
            span = vmax - vmin
            if span <= 0:
                return np.array([vmin])
            step = 2.0 ** math.ceil(math.log2(span / 6))  # at most about six ticks
            return np.arange(math.ceil(vmin / step) * step, vmax + step * 1e-9, step)

    axis.set_major_locator(BinaryLocator())
    axis.set_major_formatter(FuncFormatter(lambda x, _: human_size(x)))


def _threshold_lines(ax: Any, low: float, high: float, vertical: bool) -> None:
    """The threshold (``high``) as a red dashed line; a band (low < high) shaded."""
    line, span = (ax.axvline, ax.axvspan) if vertical else (ax.axhline, ax.axhspan)
    line(high, color="tab:red", ls="--", lw=1.5, gid="threshold-high",
         label="threshold" if low == high else "threshold band (high)")
    if low < high:
        line(low, color="tab:red", ls=":", lw=1.2, gid="threshold-low", label="band (low)")
        span(low, high, color="tab:red", alpha=0.08, gid="threshold-band")


def _lines(ax: Any, gid: str) -> list[float]:
    return [float(ln.get_xdata()[0] if ln.get_xdata()[0] == ln.get_xdata()[-1]
                  else ln.get_ydata()[0]) for ln in ax.get_lines() if ln.get_gid() == gid]


def plot_tiers(snapshots: Mapping[str, dict[str, Any]], title: str) -> tuple[Any, dict]:
    """One row per tier, one bar per snapshot (e.g. "before", "after"), all on that tier's
    one scale: its capacity (the grey frame), or the largest bar when it is unbounded. The
    threshold (and band) is drawn where the policy applies one."""
    plt = _plt()
    labels = list(snapshots)
    first = snapshots[labels[0]]["tiers"]
    fig, axes = plt.subplots(len(first), 1, figsize=(8, 1.2 + 1.0 * len(first) * len(labels)),
                             squeeze=False)
    data: dict[str, Any] = {"figure": "tier usage", "labels": labels, "tiers": []}
    for row, tier in zip(axes[:, 0], first, strict=True):
        n = tier["tier"]
        rows = [next(t for t in snapshots[label]["tiers"] if t["tier"] == n) for label in labels]
        cap = tier["capacity"]
        scale = cap if cap else max([r["used"] for r in rows] + [1]) * 1.25
        ys = list(range(len(labels)))[::-1]
        if cap:
            row.barh(ys, [cap] * len(ys), color="0.92", edgecolor="0.5", gid="capacity")
        bars = row.barh(ys, [r["used"] for r in rows], height=0.6,
                        color=TIER_COLORS[(n - 1) % len(TIER_COLORS)], gid="used")
        for y, r in zip(ys, rows, strict=True):
            row.text(scale * 0.01, y, "  " + _bar_text(r), va="center", fontsize=8)
        if tier["thresholds"]:
            _threshold_lines(row, *tier["thresholds"], vertical=True)
            row.legend(loc="lower right", fontsize=7)
        row.set_xlim(0, scale)
        row.set_yticks(ys, labels)
        _bytes_axis(row.xaxis)
        kind = f"capacity {human_size(cap)}" if cap else "unbounded"
        row.set_title(f"tier {n} {tier['type']} ({kind})", fontsize=9, loc="left")
        data["tiers"].append({
            "tier": n, "capacity": cap, "xlim": list(row.get_xlim()),
            "bars": {label: float(b.get_width()) for label, b in zip(labels, bars, strict=True)},
            "threshold_high": _lines(row, "threshold-high"),
            "threshold_low": _lines(row, "threshold-low")})
    fig.suptitle(title)
    fig.tight_layout()
    return fig, data


def _bar_text(r: dict[str, Any]) -> str:
    if r["pool_file"]:
        files = r["used"] // r["pool_file"]
        of = f"{files} of {r['capacity'] // r['pool_file']} pool files of " \
             f"{human_size(r['pool_file'])}"
        return f"{of}; {human_size(r['committed'])} committed"
    cap = f" of {human_size(r['capacity'])}" if r["capacity"] else ""
    return f"{human_size(r['used'])}{cap}, {r['segments']} segments"


def plot_ages(ages: Mapping[str, list[dict[str, Any]]], title: str,
              pool_files: Mapping[int, int] | None = None) -> tuple[Any, dict]:
    """Segment age against tier, one panel per label: with the freshness order held, every
    point on tier 1 is left of (younger than) every point on the slower tiers. Segments
    that can never go to a faster pmem tier (:func:`~pafka_source.tier_figures.freshness`)
    are crosses."""
    plt = _plt()
    labels = list(ages)
    fig, axes = plt.subplots(1, len(labels), figsize=(4.5 * len(labels), 3), sharex=True,
                             sharey=True, squeeze=False)
    topics = sorted({a["topic"] for rows in ages.values() for a in rows})
    data: dict[str, Any] = {"figure": "segment age", "panels": {}}
    for ax, label in zip(axes[0], labels, strict=True):
        rows = [a for a in ages[label] if a["sealed"]]
        order = freshness(ages[label], pool_files)
        exempt = set(order["exempt"])
        for i, topic in enumerate(topics):
            offset = (i - (len(topics) - 1) / 2) * 0.12  # topics side by side on a tier
            for never in (False, True):
                mine = [a for a in rows if a["topic"] == topic
                        and (f"{topic}/{a['id']}" in exempt) == never]
                ax.scatter([a["age_s"] for a in mine], [a["tier"] + offset for a in mine],
                           s=22 if never else 14, marker="x" if never else "o", alpha=0.7,
                           color=f"C{i}", label=None if never else topic)
        if exempt:
            ax.scatter([], [], marker="x", color="0.3", label="too big for a pool file")
        verdict = "freshness order held" if order["held"] else "freshness order broken"
        ax.set_title(f"{label}: {verdict}", fontsize=9)
        ax.set_xlabel("segment age (s since its newest record)")
        tiers = sorted({a["tier"] for a in rows})
        data["panels"][label] = {
            "held": order["held"], "partition_order": order["partition_order"],
            "age_order": order["age_order"], "exempt": len(exempt),
            "tiers": {str(t): {"count": sum(a["tier"] == t for a in rows),
                               "youngest_s": min(a["age_s"] for a in rows if a["tier"] == t),
                               "oldest_s": max(a["age_s"] for a in rows if a["tier"] == t)}
                      for t in tiers}}
    axes[0][0].set_ylabel("tier (1 = fastest)")
    axes[0][0].yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(fontsize=7, loc="center right")  # between the tiers' rows
    fig.suptitle(title)
    fig.tight_layout()
    return fig, data


def plot_topic_bytes(per_topic: Mapping[str, Mapping[int, int]], title: str
                     ) -> tuple[Any, dict]:
    """Each topic's committed bytes as one bar split by tier."""
    plt = _plt()
    names = list(per_topic)
    tiers = sorted({t for per in per_topic.values() for t in per})
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * max(1, len(names))))
    left = [0.0] * len(names)
    data: dict[str, Any] = {"figure": "topic bytes per tier", "topics": {n: {} for n in names}}
    for t in tiers:
        widths = [per_topic[n].get(t, 0) for n in names]
        bars = ax.barh(names, widths, left=left, label=f"tier {t}",
                       color=TIER_COLORS[(t - 1) % len(TIER_COLORS)])
        for name, bar in zip(names, bars, strict=True):
            data["topics"][name][str(t)] = float(bar.get_width())
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f"  {human_size(total)}", va="center", fontsize=8)
    ax.set_xlim(0, max(left + [1]) * 1.2)
    _bytes_axis(ax.xaxis)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    return fig, data


def plot_timeline(samples: list[dict[str, Any]], title: str, tier: int = 1,
                  spans: Mapping[str, tuple[float, float]] | None = None,
                  marks: Mapping[str, float] | None = None, rate_lines: Mapping[str, float]
                  | None = None) -> tuple[Any, dict]:
    """Tier ``tier``'s usage over time against its capacity and threshold (top), the ingest
    rate from the samples' ``produced`` bytes (middle), and the bytes moved down and up
    (bottom). ``spans`` shades intervals (a burst), ``marks`` draws vertical lines, and
    ``rate_lines`` horizontal ones on the rate panel (bytes/s)."""
    plt = _plt()
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(11, 7.5), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 2, 2]})
    ts = [s["t"] for s in samples]
    rows = [next(x for x in s["tiers"] if x["tier"] == tier) for s in samples]
    cap, band = rows[0]["capacity"], rows[0]["thresholds"]
    top.plot(ts, [r["used"] for r in rows], color="tab:orange", gid="used",
             label=f"tier {tier} used (pool files)" if rows[0]["pool_file"] else "used")
    if rows[0]["pool_file"]:
        # Placement needs a free pool file: one a move freed returns after the run's cleanup.
        top.plot(ts, [r["capacity"] - r["pool_free"] * r["pool_file"] for r in rows],
                 color="0.5", lw=0.8, ls="-.", gid="taken", label="pool files taken")
    top.plot(ts, [r["committed"] for r in rows], color="tab:brown", lw=0.8, gid="committed",
             label="committed bytes")
    top.axhline(cap, color="0.3", lw=1.5, gid="capacity", label="capacity")
    if band:
        _threshold_lines(top, band[0], band[1], vertical=False)
    top.set_ylim(0, cap * 1.08)
    _bytes_axis(top.yaxis)
    top.set_ylabel(f"tier {tier}")
    # Ingest rate: the produced counter's slope over bins of about half a second.
    step = max(1, round(0.5 / max(1e-3, (ts[-1] - ts[0]) / max(1, len(ts) - 1))))
    mids, rates = [], []
    for a, b in zip(samples[::step], samples[step::step], strict=False):
        if b["t"] > a["t"]:
            mids.append((a["t"] + b["t"]) / 2)
            rates.append((b.get("produced", 0) - a.get("produced", 0)) / (b["t"] - a["t"]))
    mid.step(mids, rates, where="mid", color="tab:blue", gid="ingest", label="ingest")
    for name, rate in (rate_lines or {}).items():
        mid.axhline(rate, ls="--", lw=1, color="0.4", gid=f"rate-{name}", label=name)
    mid.set_ylabel("ingest /s")
    _bytes_axis(mid.yaxis)
    low.plot(ts, [s["down"] for s in samples], color="tab:red", gid="down",
             label="moved down (to slower tiers)")
    low.plot(ts, [s["up"] for s in samples], color="tab:green", gid="up",
             label="moved up (to faster tiers)")
    low.plot(ts, [s.get("produced", 0) for s in samples], color="tab:blue", lw=0.8,
             gid="produced", label="produced")
    _bytes_axis(low.yaxis)
    low.set_ylabel("bytes, cumulative")
    low.set_xlabel("seconds")
    for ax in (top, mid, low):
        for name, (a, b) in (spans or {}).items():
            ax.axvspan(a, b, color="tab:blue", alpha=0.07, label=name if ax is top else None)
        for i, (name, x) in enumerate((marks or {}).items()):
            ax.axvline(x, color=MARK_COLORS[i % len(MARK_COLORS)], lw=1.4, ls=(0, (4, 2)),
                       gid=f"mark-{name}", label=name if ax is top else None)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # off the lines
    top.set_title(title)
    fig.tight_layout()
    data = {"figure": "tiering timeline", "tier": tier, "capacity": cap, "ylim": list(
        top.get_ylim()), "capacity_line": _lines(top, "capacity"),
        "threshold_high": _lines(top, "threshold-high"),
        "threshold_low": _lines(top, "threshold-low"),
        "used_max": max(r["used"] for r in rows), "used_end": rows[-1]["used"],
        "down_end": samples[-1]["down"], "up_end": samples[-1]["up"],
        "samples": len(samples), "max_rate": max(rates, default=0.0),
        "marks": {name: _lines(top, f"mark-{name}") for name in (marks or {})}}
    return fig, data


def show(fig: Any, data: dict[str, Any]) -> None:
    """Display ``fig`` and, beside it, the numbers it drew (as JSON), then close it."""
    from IPython.display import JSON, display
    display(fig)
    _plt().close(fig)
    display(JSON(data, root=data.get("figure", "figure")))
