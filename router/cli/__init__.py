"""The ``sievekv`` operator command (console script ``sievekv = router.cli:main``).

One module per concern: :mod:`.app` (parsing, dispatch, errors), :mod:`.lifecycle`
(cluster start/stop/restart), :mod:`.status`, :mod:`.data_cmds` (put/get/delete/scan/load),
:mod:`.report_cmds` (filters/stats/flush/compact/config), :mod:`.records` and :mod:`.codec`
(record formats and encodings), :mod:`.table` (text tables), :mod:`.exit_codes`, and the
load test: :mod:`.bench_cmd` (the command), :mod:`.bench_worker` (a client process),
:mod:`.bench_report` (merging and printing the results).
Command reference: docs/cli.md.
"""

from .app import main

__all__ = ["main"]
