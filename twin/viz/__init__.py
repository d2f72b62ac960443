"""Pictures: plots of runs, sweeps and traces (:mod:`.plots`, styled by
:mod:`.style`), the sweep report (:mod:`.report`) and topology drawings
(:mod:`.topology`). matplotlib is imported here and nowhere else, and only when
a picture is drawn."""

from twin.viz.attainment import plot_attainment
from twin.viz.cdf import plot_cdfs
from twin.viz.goodput import plot_goodput
from twin.viz.overtime import plot_over_time
from twin.viz.plots import plot_dir, sweep_figures
from twin.viz.report import build_report, write_report
from twin.viz.style import PlotOptions
from twin.viz.timeline import plot_timeline
from twin.viz.topology import draw as draw_topology

__all__ = [
    "PlotOptions",
    "build_report",
    "draw_topology",
    "plot_attainment",
    "plot_cdfs",
    "plot_dir",
    "plot_goodput",
    "plot_over_time",
    "plot_timeline",
    "sweep_figures",
    "write_report",
]
