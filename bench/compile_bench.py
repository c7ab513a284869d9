"""Compile-time figures of a 003 §12 streaming pagination step, embedded in a full playbook.

    python -m bench.compile_bench [--rounds N] [--json]

* parse: YAML text -> plain data + source map (ruamel, pure Python), for the whole playbook;
* compile: ``compile_data`` on the pre-parsed data (normalize, validate, template checks);
* per step: the pagination step's share, i.e. the playbook with the step minus the same playbook
  without it; "warm" reuses the per-process template cache (a controller compiling the playbook of
  each request), "cold" clears it first (the first compile of a template text in a process);
* per added step: the marginal warm cost of one more copy of the step, from a playbook with 50.

The step is the repository's fixture tests/data/dsl/streaming_pagination_step.yaml (the one
tests/dsl/test_dsl_examples.py compiles). Figures are medians; this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noetl_stream.dsl.compiler import compile_data
from noetl_stream.dsl.source import load_yaml
from noetl_stream.dsl.templates import analyze, compile_template

ROOT = Path(__file__).resolve().parents[1]
STEP_FILE = ROOT / "tests" / "data" / "dsl" / "streaming_pagination_step.yaml"
STEP_NAME = "harvest_feeds"
COPIES = 50

HEADER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: compile_bench, path: bench/compile}
keychain:
  - {name: warehouse_pg, kind: postgres_credential}
workload:
  base_url: "http://127.0.0.1:8080"
  feeds: [{name: a, path: /a, size: 2}]
workflow:
"""
TAIL = """\
  - step: check_totals
    tool: {kind: noop}
  - step: abandon
    tool: {kind: noop}
"""


def pagination_step() -> tuple[str, str]:
    """The step's YAML (a one-item list, at column 0) and where it came from."""
    return STEP_FILE.read_text(encoding="utf-8"), str(STEP_FILE.relative_to(ROOT))


def playbook(step: str, copies: int) -> str:
    """A playbook whose start step fans out to ``copies`` renamed copies of the step (0: none)."""
    names = [STEP_NAME] + [f"{STEP_NAME}_{i}" for i in range(1, copies)]
    names = names[:copies]
    body = textwrap.indent(step.strip("\n"), "  ") + "\n"
    if f"- step: {STEP_NAME}\n" not in body:
        raise SystemExit(f"{STEP_FILE} has no step '{STEP_NAME}'")
    steps = "".join(body.replace(f"- step: {STEP_NAME}\n", f"- step: {name}\n", 1) for name in names)
    targets = names or ["check_totals", "abandon"]
    arcs = "".join(f"        - step: {name}\n" for name in targets)
    start = "  - step: start\n    next:\n      spec: {mode: inclusive}\n      arcs:\n" + arcs
    return HEADER + start + steps + TAIL


def clear_template_caches() -> None:
    analyze.cache_clear()
    compile_template.cache_clear()


def median_s(fn: Callable[[], Any], rounds: int, setup: Callable[[], None] | None = None) -> float:
    samples = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(rounds: int) -> dict[str, Any]:
    step, source = pagination_step()
    texts = {"base": playbook(step, 0), "one": playbook(step, 1), "many": playbook(step, COPIES)}
    parsed = {key: load_yaml(text, "bench.yaml") for key, text in texts.items()}
    for data, smap in parsed.values():
        result = compile_data(data, smap)
        assert not result.diagnostics, [d.format() for d in result.diagnostics]

    def compile_s(key: str, cold: bool) -> float:
        data, smap = parsed[key]
        n = rounds if cold else rounds * 5
        return median_s(lambda: compile_data(data, smap), n, clear_template_caches if cold else None)

    parse_s = median_s(lambda: load_yaml(texts["one"], "bench.yaml"), rounds)
    warm = {key: compile_s(key, cold=False) for key in texts}
    cold = {key: compile_s(key, cold=True) for key in ("base", "one")}
    ms = 1000.0
    return {
        "source": source,
        "playbook_lines": texts["one"].count("\n"),
        "playbook_steps": len(parsed["one"][0]["workflow"]),
        "parse_ms": round(parse_s * ms, 3),
        "compile_warm_ms": round(warm["one"] * ms, 3),
        "compile_cold_ms": round(cold["one"] * ms, 3),
        "pagination_step_warm_ms": round((warm["one"] - warm["base"]) * ms, 3),
        "pagination_step_cold_ms": round((cold["one"] - cold["base"]) * ms, 3),
        "added_step_warm_ms": round((warm["many"] - warm["one"]) * ms / (COPIES - 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    figures = measure(args.rounds)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"003 §12 pagination step, from {figures['source']}")
    print(f"  playbook: {figures['playbook_lines']} lines, {figures['playbook_steps']} steps")
    print(f"  parse (YAML -> data + positions), whole playbook : {figures['parse_ms']:8.3f} ms")
    print(f"  compile after parse, whole playbook       warm  : {figures['compile_warm_ms']:8.3f} ms")
    print(f"                                            cold  : {figures['compile_cold_ms']:8.3f} ms")
    print(f"  compile after parse, the pagination step  warm  : {figures['pagination_step_warm_ms']:8.3f} ms")
    print(f"                                            cold  : {figures['pagination_step_cold_ms']:8.3f} ms")
    print(f"  one more copy of the step (of {COPIES})       warm  : {figures['added_step_warm_ms']:8.3f} ms")


if __name__ == "__main__":
    main()
