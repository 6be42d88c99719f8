"""``python -m regional timeline <checkpoint> -o timeline.png``: regions x epochs, coloured by outcome,
with each region's lag beside it. Above ``MAX_ROWS`` regions, neighbouring regions share a row that shows
the worst outcome among them (committed work paler when few of them had any) and their largest lag. Needs matplotlib
(``pip install 'pyspark-regional[timeline]'``)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from regional.errors import RegionalConfigError
from regional.store.status import QueryStatus

MAX_ROWS = 64
# Outcome codes, in order of how much they need attention (a shared row shows the largest).
IDLE, COMMITTED, CUT, WAITING, DEAD_LETTERED, FALLEN_BACK, QUARANTINED = range(7)
# WAITING: behind, but not planned in that epoch (a retry or a back-off not due yet): not "no work" (issue 58).
LEGEND = {IDLE: ("no work", "#eeeeee"), COMMITTED: ("committed", "#2e8b57"),
          CUT: ("timed-out prefix", "#9acd32"), WAITING: ("waiting (behind)", "#f5cba7"),
          DEAD_LETTERED: ("dead-lettered", "#8e44ad"),
          FALLEN_BACK: ("fallen back", "#ff8c00"), QUARANTINED: ("quarantined", "#c0392b")}


class Grid(NamedTuple):
    labels: list[str]  # one per row: a region, or "first .. last" for a shared row
    epochs: list[int]
    cells: list[list[int]]  # the outcome code of each (row, epoch); a shared row's worst
    lags: list[int]  # each row's lag; a shared row's largest
    shares: list[list[float]]  # of a row's regions, the share whose outcome is the cell's (1.0 for one region)
    per_row: int  # regions per row: 1, or more when neighbours share rows


def outcome_grid(st: QueryStatus) -> Grid:
    regions = sorted(st.regions)
    epochs = [e.epoch for e in st.epochs]
    cells = []
    for region in regions:
        row = []
        for e in st.epochs:
            if region in e.fallen_back:
                row.append(QUARANTINED if e.fallen_back[region].quarantined else FALLEN_BACK)
            elif region in e.dead_lettered:
                row.append(DEAD_LETTERED)
            elif region in e.committed:
                row.append(CUT if e.committed[region].cut else COMMITTED)
            elif region in e.regions and e.regions[region].ref_epoch is not None:
                row.append(WAITING)
            else:
                row.append(IDLE)
        cells.append(row)
    lags = [st.lag(r) or 0 for r in regions]
    if len(regions) <= MAX_ROWS:
        return Grid(regions, epochs, cells, lags, [[1.0] * len(epochs) for _ in regions], 1)
    size = -(-len(regions) // MAX_ROWS)  # regions per row
    grid = Grid([], epochs, [], [], [], size)
    for i in range(0, len(regions), size):
        members = range(i, min(i + size, len(regions)))
        worst = [max(cells[m][j] for m in members) for j in range(len(epochs))]
        grid.labels.append(f"{regions[members[0]]} .. {regions[members[-1]]}")
        grid.cells.append(worst)
        grid.shares.append([sum(cells[m][j] == w for m in members) / len(members) for j, w in enumerate(worst)])
        grid.lags.append(max(lags[m] for m in members))
    return grid


def draw(st: QueryStatus, out: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import to_rgb
        from matplotlib.patches import Patch
    except ImportError:
        raise RegionalConfigError("the timeline needs matplotlib: pip install 'pyspark-regional[timeline]'") from None
    if not st.epochs:
        raise RegionalConfigError(f"{st.checkpoint} has no epoch records yet: nothing to draw. Draw it once its query "
                                  "has decided an epoch (python -m regional status shows the newest)")
    labels, epochs, cells, lags, shares, per_row = outcome_grid(st)
    height = min(2 + 0.22 * len(labels), 18)
    fig, (grid_ax, lag_ax) = plt.subplots(1, 2, figsize=(12, height), sharey=True,
                                          gridspec_kw={"width_ratios": [5, 1]})
    # A shared row shows a fault in full colour even if one region of many had it (it needs attention);
    # committed work fades towards white as fewer of the row's regions had any, so a busy row reads darker.
    pixels = [[_fade(to_rgb(LEGEND[code][1]), _strength(code, share))
               for code, share in zip(row, row_shares, strict=True)]
              for row, row_shares in zip(cells, shares, strict=True)]
    grid_ax.imshow(pixels, aspect="auto", interpolation="nearest",
                   extent=(epochs[0] - 0.5, epochs[-1] + 0.5, len(labels) - 0.5, -0.5))
    grid_ax.set_yticks(range(len(labels)))
    grid_ax.set_yticklabels(labels, fontsize=7 if len(labels) > 24 else 9)
    grid_ax.set_xlabel("epoch")
    grid_ax.set_title(f"regional epochs of {st.checkpoint}", fontsize=10)
    if len(epochs) <= 60:  # cell borders while epochs are wide enough to see them
        grid_ax.set_xticks([e + 0.5 for e in epochs[:-1]], minor=True)
        grid_ax.grid(which="minor", axis="x", color="white", linewidth=0.8)
        grid_ax.tick_params(which="minor", length=0)
    fig.legend(handles=[Patch(color=c, label=n) for n, c in LEGEND.values()], loc="lower center",
               ncol=len(LEGEND), fontsize=8, frameon=False,
               title=f"a row holds up to {per_row} regions: a fault in any of them shows; "
               "paler green: fewer of them committed" if per_row > 1 else None, title_fontsize=8)
    lag_ax.barh(range(len(labels)), lags, color="#4682b4")
    lag_ax.set_xlim(0, max(1, *lags) * 1.25)
    if len(labels) <= 24:  # a number per bar, so that a region with no lag reads "0", not a blank
        for row, lag in enumerate(lags):
            lag_ax.annotate(f"{lag:,}", (lag, row), xytext=(3, 0), textcoords="offset points", va="center",
                            fontsize=8)
    lag_ax.set_xlabel("lag (offsets)")
    lag_ax.set_title("lag now", fontsize=10)
    fig.tight_layout(rect=(0, 0.06 if len(labels) < 24 else 0.03, 1, 1))
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def svg(st: QueryStatus) -> str:
    """The timeline as an SVG document (the Spark UI tab's picture): the same grid as ``draw``, without
    matplotlib. Labels are escaped: region ids come from the outside world."""
    from html import escape

    if not st.epochs:
        return ""
    labels, epochs, cells, lags, shares, _ = outcome_grid(st)
    cell, label_w, lag_w, top = 14, min(12 + 7 * max(len(label) for label in labels), 260) if labels else 40, 70, 18
    grid_w = max(cell * len(epochs), 90)  # room for the heading over few epochs
    width = max(label_w + grid_w + lag_w, 560)  # at least the legend's
    height = top + cell * max(len(labels), 1) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="10">',
           f'<text x="{label_w}" y="12">epochs {epochs[0]}..{epochs[-1]}</text>',
           f'<text x="{label_w + grid_w + 4}" y="12">lag</text>']
    for row, (label, codes, row_shares, lag) in enumerate(zip(labels, cells, shares, lags, strict=True)):
        y = top + row * cell
        out.append(f'<text x="{label_w - 4}" y="{y + 11}" text-anchor="end">{escape(label[:36])}</text>')
        for column, (code, share) in enumerate(zip(codes, row_shares, strict=True)):
            name, colour = LEGEND[code]
            opacity = _strength(code, share)
            out.append(f'<rect x="{label_w + column * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                       f'fill="{colour}" fill-opacity="{opacity:.2f}"><title>epoch {epochs[column]}: {name}'
                       '</title></rect>')
        out.append(f'<text x="{label_w + grid_w + 4}" y="{y + 11}">{lag:,}</text>')
    x, y = 4, height - 6
    for name, colour in LEGEND.values():
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 13}" y="{y}">{name}</text>')
        x += 20 + 6 * len(name)
    out.append("</svg>")
    return "".join(out)


def _strength(code: int, share: float) -> float:
    """How strongly a cell shows its colour (the PNG's and the SVG's): a fault in full, whatever share of a row's
    regions had it; other outcomes full at share 1, a quarter at share 0 (one region of many stays visible)."""
    return 1.0 if code >= DEAD_LETTERED else 0.25 + 0.75 * share


def _fade(colour: tuple[float, float, float], strength: float) -> tuple[float, float, float]:
    """``colour`` mixed with white: itself at strength 1."""
    return tuple(1.0 + (c - 1.0) * strength for c in colour)  # type: ignore[return-value]
