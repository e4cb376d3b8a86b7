"""CI has 90 minutes, and nothing lands past them: the reruns of the committed node bundles, CI's largest stage, must
fit the share of them it can afford. evidence/RERUN-SECONDS.json holds each bundle's measured rerun time
(meshbench.results.ci_budget); a new bundle without a time, or bundles whose times add up past the budget, fail
here, before CI runs out of time on a submission. What CI can afford is two thirds of its limit: the rest is for a
cold pip cache (llama.cpp compiled twice, about 8 minutes) and a machine slower or busier than the one measured."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "evidence"
TIMES = json.loads((EVIDENCE / "RERUN-SECONDS.json").read_text())

# .ci/run's other stages on this 2-core machine with pip's cache warm, as a clean clone's run of c545685 printed
# them: the fresh virtualenv 5, README's first command 21, its second (install, then the whole suite) 469, the other
# extras 54 and their tests 363, the llama-server tests 674, the hunt's corpus 109, lint and types 55, the endpoint
# and hunt bundles 24, the DGR-012 comparisons 15 (docs/development.md).
CI_LIMIT_S = 90 * 60
CI_AFFORD_S = CI_LIMIT_S * 2 // 3
OTHER_STAGES_S = 5 + 21 + 469 + 54 + 363 + 674 + 109 + 55 + 24 + 15
RERUN_BUDGET_S = CI_AFFORD_S - OTHER_STAGES_S


def node_bundles() -> list[str]:
    out = []
    for b in sorted(p for p in EVIDENCE.iterdir() if (p / "results.json").is_file()):
        kind = json.loads((b / "results.json").read_text()).get("kind")
        if kind not in ("endpoint", "matrix", "hunt"):
            out.append(b.name)
    return out


def halves(seconds: dict[str, float]) -> list[float]:
    """.ci/run's split: the longest first, each to the lighter of two processes."""
    load = [0.0, 0.0]
    for s in sorted(seconds.values(), reverse=True):
        load[load.index(min(load))] += s
    return load


def test_every_node_bundle_has_a_measured_rerun_time():
    missing = sorted(set(node_bundles()) - set(TIMES["seconds"]))
    stale = sorted(set(TIMES["seconds"]) - set(node_bundles()))
    assert not missing, f"no rerun time for {missing}: measure it (meshbench.results.ci_budget says how)"
    assert not stale, f"times of bundles that are gone: {stale}"


def test_the_reruns_fit_ci_s_budget():
    wall = max(halves(TIMES["seconds"]))  # measured as .ci/run runs them: two at once, one thread each
    assert wall <= RERUN_BUDGET_S, (
        f"the committed node bundles' reruns take about {wall:.0f} s, past CI's {RERUN_BUDGET_S} s for them "
        f"(two thirds of its {CI_LIMIT_S} s limit, less its other stages): make a bundle cheaper to rerun, or do "
        "less in CI"
    )


def test_every_gguf_node_bundle_s_recorded_kernels_are_pinned_for_ci():
    """CI holds each GGUF bundle's recorded kernel family to the one pinned in evidence/KERNELS.json before its
    rerun (which must then reproduce every record): a bundle regenerated (or its fingerprint changed) must change
    the pin in the same commit, where it shows."""
    from meshbench.records import serial
    from meshbench.records.context import Compute
    from meshbench.results import fingerprint

    pinned = json.loads((EVIDENCE / "KERNELS.json").read_text())["kernels"]
    recorded = {}
    for name in node_bundles():
        data = json.loads((EVIDENCE / name / "results.json").read_text())
        if data["config"]["engine"]["kind"] == "gguf":
            recorded[name] = fingerprint.llama_kernels(serial.from_json(data["environment"]["compute"], Compute))
    assert recorded == pinned


def test_the_bundles_ci_reruns_on_narrower_kernels_are_pinned_ones_with_their_measurement():
    """On a CPU narrower than a bundle's recorded llama.cpp kernels, CI reruns it only where a rerun at that width
    reproduced it in full (evidence/KERNELS.json, with the command that measured it); every other is verified from
    its records. Each name there is a pinned GGUF bundle, and each width says how it was measured."""
    kernels = json.loads((EVIDENCE / "KERNELS.json").read_text())
    for width, entry in kernels["reproduced_narrower"].items():
        assert int(width) in (128, 256) and entry["measured"].startswith("meshbench verify ")
        assert entry["bundles"] and set(entry["bundles"]) <= set(kernels["kernels"])
