"""evidence/RERUN-SECONDS.json: how long `meshbench verify --rerun` took for each committed node bundle, measured on
one machine, so that a test (tests/test_ci_budget.py) fails when the reruns CI must make no longer fit its time.

The seconds are those of CI's own stage: .ci/run writes each half's report (two verify processes at once, each on
a core of its own with --threads 1); ``python -m meshbench.results.ci_budget node-0.json node-1.json --how "..."
> evidence/RERUN-SECONDS.json`` turns them into this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from meshbench import machine
from meshbench.errors import MeshbenchError

NAME = "RERUN-SECONDS.json"


def from_verify(reports: list[dict[str, Any]], how: str) -> dict[str, Any]:
    """The seconds of each bundle the `verify --rerun --json` reports hold, which must all have passed."""
    if not all(r.get("rerun") for r in reports):
        raise MeshbenchError("a verify report was not made with --rerun")
    seconds = {}
    for b in (b for r in reports for b in r["bundles"]):
        if b.get("status") != "ok":
            raise MeshbenchError(f"{b.get('bundle')}: did not pass ({b.get('status')}): its time is not a budget")
        seconds[Path(b["bundle"]).name] = round(float(b["seconds"]), 1)
    return {
        "what": "seconds of `meshbench verify BUNDLE --rerun` for each committed node bundle, on the machine below",
        "machine": f"{machine.cpu_model()}, {machine.usable_cpus()} cores",
        "how": how,
        "seconds": dict(sorted(seconds.items())),
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    how = args[args.index("--how") + 1] if "--how" in args else "as .ci/run runs them"
    paths = [a for i, a in enumerate(args) if a != "--how" and (i == 0 or args[i - 1] != "--how")]
    doc = from_verify([json.loads(Path(p).read_text()) for p in paths], how)
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
