"""The interactive memory page: one self-contained HTML file per analysis or rewrite.

- :mod:`memopt.pages.model`: analyses -> plain page data (lanes, series on
  the original program's x axis, holders);
- :mod:`memopt.pages.render`: page data -> HTML (inline SVG drawn by a small
  script, :mod:`memopt.pages.assets`; no network at view time);
- :mod:`memopt.pages.writer`: :func:`~memopt.pages.writer.write_page`, what
  :meth:`memopt.analysis.Analysis.to_html`, :meth:`memopt.report.Report.to_html`
  and ``memopt analyze/optimize --html`` call.

(This file imports nothing: a package whose modules import each other
keeps its ``__init__`` empty, so the import graph has no cycle.)
"""
