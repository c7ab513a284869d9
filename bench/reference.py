"""An outside reference raw figure: an external ``js_limits.py`` script's 100-concurrent-chains step round trip.

`bench.raw` measures the raw round trip with the method of ``js_limits.py`` but on this project's
consumer (`puller.ContinuousPuller`: messages handed to a plain function as nats-py parses them, no
subscription queue), which makes it faster than ``js_limits.py``'s own "raw" mode (docs/performance.md
has both, from the same runs). ``make bench`` reports the runtime against both: `bench.raw` (the stricter) and, here, the
figure ``js_limits.py`` itself measures in the same run (``step_c100_raw_msgspec``: 100 chains of 60
steps, msgspec, one process, uvloop; its own nats-server). The script is not part of this project: it is
run only when ``NOETL_BENCH_JS_LIMITS`` names its file (``NOETL_BENCH_JS_LIMITS=/path/js_limits.py make
bench``); without it ``make bench`` reports the ratios against `bench.raw` alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from noetl_stream.jetstream.embedded import find_nats_server

__all__ = ["JS_LIMITS", "js_limits_concurrent_steps_per_s"]

JS_LIMITS: Path | None = (
    Path(os.environ["NOETL_BENCH_JS_LIMITS"]) if os.environ.get("NOETL_BENCH_JS_LIMITS") else None
)
CASE = "step_c100_raw_msgspec"


def js_limits_concurrent_steps_per_s(quick: bool = False, script: Path | None = JS_LIMITS) -> float | None:
    """``js_limits.py``'s ``step_c100_raw_msgspec`` (uvloop, one repeat; ``--scale 0.2`` when `quick`),
    or None when no script is named (or it is not there)."""
    if script is None or not script.is_file():
        return None
    with tempfile.TemporaryDirectory(prefix="noetl-jslimits-") as tmp:
        out = Path(tmp) / "js_limits.json"
        cmd = [
            sys.executable,
            str(script),
            "--nats-server",
            str(find_nats_server()),
            "--repeat",
            "1",
            "--scale",
            "0.2" if quick else "1",
            "--only",
            CASE,
            "--loops",
            "uvloop",
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"js_limits.py failed ({done.returncode}): {done.stderr[-2000:]}")
        metrics = json.loads(out.read_text())["metrics"]["uvloop"]
    return float(metrics[CASE]["median"])
