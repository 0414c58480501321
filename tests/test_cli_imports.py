"""Every `sievekv` command builds the whole parser: it must not load numpy or the engine's
readers (each CLI process would pay ~0.15 s of CPU for them; the suite runs hundreds)."""

import subprocess
import sys

CODE = """
import sys
import router.cli.app as app
app.build_parser()
heavy = sorted(m for m in sys.modules
               if m == "numpy" or (m.startswith("engine.") and m not in ("engine.errors", "engine.vfs")))
print(",".join(heavy))
"""


def test_building_the_cli_parser_loads_no_numpy_and_no_engine_readers():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"loaded by every CLI command: {out.stdout.strip()}"
