"""Reports: what a run's environment did and, for a score bundle, the score a paper cites.

:mod:`.sources` reads a source (a store, a snapshot, a score bundle, an archive of either, a running
server) into one JSON object; :mod:`.tally` counts recorded answers (tool answers and model calls
apart), :mod:`.server` reads a server's ``/stats`` under a deadline and a size bound, :mod:`.bundles`
reads a bundle and compares two; :mod:`.page` and :mod:`.score_page` draw the self-contained HTML page.
``commands/report.py`` is the command line.
"""
