"""``qd plot``: a run's archive and curves as figures (PNG, SVG), from its directory.

- :mod:`qd.plot.archive` — the archive per island: a heatmap (grid), Voronoi cells
  (CVT), a scatter (novelty, or a CVT of more than two dimensions), and the
  parallel-axes plot of the elites' descriptors;
- :mod:`qd.plot.curves` — QD score, coverage and best fitness over evaluations, for
  one run, and for several runs grouped by setting (median and min–max over seeds);
- :mod:`qd.plot.fronts` — a Pareto run's hypervolume over evaluations and its
  cells' fronts in objective space;
- :mod:`qd.plot.command` — the command line: which figures, where they are written.

Each figure builder returns the matplotlib ``Figure`` and the data it drew, so tests
(and callers) check the numbers rather than pixels. Figures are made with
``matplotlib.figure.Figure`` (no pyplot, no display, no global state); pyribs is not
needed. See ``docs/plots.md``.
"""

from qd.plot.command import main

__all__ = ["main"]
