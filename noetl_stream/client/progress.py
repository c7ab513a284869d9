"""Human-readable live progress for ``noetl-stream run``."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import msgspec

from noetl_stream.client.timeline import duration_text, error_text
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event


class Progress:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self._loops: dict[str, list[int]] = {}
        self._failures: dict[str, str] = {}
        """The error each failed step's line showed (the last run's), so the end does not say it again."""

    def _line(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\033[K")
        self.out.write(text + "\n")
        self.out.flush()

    def on_event(self, ev: Event) -> None:
        name, step = ev.name, ev.step or ""
        if name == E.STEP_STARTED:
            delivery = ev.payload.get("delivery")
            again = f" again (delivery {delivery}, worker {ev.worker})" if delivery else ""
            self._line(f"  ▸ {step} started{again}")
        elif name in (E.STEP_DONE, E.LOOP_DONE) and not ev.payload.get("router"):
            extra = ""
            if name == E.LOOP_DONE:
                p = ev.payload
                extra = f" ({p.get('done', 0)}/{p.get('total', 0)} iterations, {p.get('failed', 0)} failed)"
            self._line(f"  ✔ {step} done{extra}")
        elif name == E.STEP_FAILED:
            said = error_text(ev.payload.get("error") or {}, None)
            self._failures[step] = said
            self._line(f"  ✘ {step} failed: {said}")
        elif name == E.STEP_SKIPPED:
            self._line(f"  ⤼ {step} skipped ({ev.payload.get('reason', '')})")
        elif name == E.LOOP_STARTED:
            self._loops[ev.step_run_id or step] = [0, int(ev.payload.get("total", 0))]
        elif name in (E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED) and self.tty:
            key = ev.step_run_id or step
            counts = self._loops.setdefault(key, [0, 0])
            counts[0] += 1
            total = counts[1] or counts[0]
            width = 30
            filled = int(width * counts[0] / total) if total else width
            self.out.write(
                f"\r\033[K  {step} [{'#' * filled}{'.' * (width - filled)}] {counts[0]}/{total or '?'}"
            )
            self.out.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        """The outcome's line, and on stdout the result and ctx of a success. A failure names the step
        that failed and its error once (after the step's own line, the step alone); it prints no result:
        the last step's result is not the outcome of an execution that failed."""
        status = summary.get("status")
        took = summary.get("duration_s")
        said = f"execution {summary.get('execution_id')} {status}"
        if isinstance(took, (int, float)):
            said += f" in {duration_text(took)}"
        if status == "success":
            self._line(f"✔ {said}")
            print(msgspec.json.encode({"result": summary.get("result"), "ctx": summary.get("ctx")}).decode())
            return
        error = summary.get("error")
        if isinstance(error, dict):
            step = error.get("step")
            what = error_text(error, None)
            if isinstance(step, str) and self._failures.get(step) == what:
                said += f": step {step}"  # its error is on its own line, above
            else:
                said += f": step {step}: {what}" if isinstance(step, str) else f": {what}"
        elif error:
            said += f": {error}"
        self._line(f"✘ {said}")
