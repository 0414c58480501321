"""The ``sievekv`` operator command (console script ``sievekv = router.cli:main``).

One module per concern:

- parsing and plumbing: :mod:`.app` (parsing, dispatch, errors), :mod:`.exit_codes`,
  :mod:`.target` (which cluster a command talks to), :mod:`.rpc` (direct Admin calls, TLS
  files), :mod:`.progress` (progress lines on stderr), :mod:`.table` (text tables);
- the cluster: :mod:`.lifecycle` (start/stop/restart), :mod:`.status`, :mod:`.config_toml`
  (a resolved config written back), :mod:`.offline` (what the commands on a stopped
  cluster's data share), :mod:`.restore_cmd`, :mod:`.reshard_cmd`;
- data: :mod:`.data_cmds` (put/get/delete/scan/load), :mod:`.value_source` (put's value),
  :mod:`.sizes` (limits checked before sending), :mod:`.records` and :mod:`.codec` (record
  formats and encodings);
- reports and maintenance: :mod:`.report_cmds` (stats/flush/compact/config), :mod:`.filters`,
  :mod:`.verify_cmd`, :mod:`.checkpoint_cmd`;
- the load test: :mod:`.bench_cmd` (the command), :mod:`.bench_worker` (a client process),
  :mod:`.bench_report` (merging and printing the results).

Command reference: docs/cli.md.
"""

from .app import main

__all__ = ["main"]
