"""Pictures: plots of runs, sweeps and traces (:mod:`.plots`) and topology drawings
(:mod:`.topology`). matplotlib is imported here and nowhere else, and only when a
picture is drawn."""

from twin.viz.plots import (
    plot_attainment,
    plot_cdfs,
    plot_dir,
    plot_goodput,
    plot_over_time,
    plot_timeline,
)
from twin.viz.topology import draw as draw_topology

__all__ = [
    "draw_topology",
    "plot_attainment",
    "plot_cdfs",
    "plot_dir",
    "plot_goodput",
    "plot_over_time",
    "plot_timeline",
]
