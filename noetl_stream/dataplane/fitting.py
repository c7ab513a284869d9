"""Fitting a command run's worker events under the size limits: results by reference.

An event's result above the executor's inline limit goes to the object store and the event carries its
reference (`EventFitter.fit`; a pipeline's results by task label first, the largest first); a value the
run stored already is not stored again. An event still above the server's payload limit
(`MAX_EVENT_BYTES`) becomes a clear error (`_fit`). `RunEvents` (run_events.py) fits what it publishes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from noetl_stream.kv.results import ResultStore, inline_limit
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.refs import is_ref
from noetl_stream.protocol.wire import Event, encode

MAX_EVENT_BYTES = 900 * 1024


class EventFitter:
    """Fits one command run's events: stores their large results, each once, under
    ``<execution_id>/<entity id>[~<delivery>]/<name>``."""

    def __init__(self, results: ResultStore, executor_spec: dict[str, Any], id_suffix: str) -> None:
        self._results = results
        self._executor_spec = executor_spec
        self._id_suffix = id_suffix
        """A redelivery's suffix (``~<delivery>``, `CommandRun`): its values are stored under keys of its own."""
        self._stored: dict[str, dict[str, Any]] = {}
        """References of the large results this run stored, by checksum (`fit`: each is stored once)."""
        self._inline_limit: int | None = None

    @property
    def inline_limit(self) -> int:
        """Bytes of an event's result that travel inline (the executor's limit; computed once)."""
        limit = self._inline_limit
        if limit is None:
            limit = self._inline_limit = inline_limit(self._executor_spec)
        return limit

    async def fit(self, ev: Event, data: bytes | None = None) -> tuple[Event, bytes]:
        """Reference-first: a result above the inline limit goes to the object store and the event
        carries its reference; no event ever exceeds the server's payload limit. ``data``: ``ev``
        encoded, if the caller has it."""
        if data is None:
            data = encode(ev)
        limit = self.inline_limit
        if len(data) <= limit or "result" not in ev.payload or ev.name not in _WITH_RESULT:
            return _fit(ev, data)
        try:
            out = ev
            if isinstance(ev.payload.get("tasks"), dict):  # a pipeline's results by label, first
                out, data = await self.store_tasks(ev, limit)
            if len(data) > limit and not is_ref(out.payload["result"]):
                out = msgspec.structs.replace(
                    out, payload={**out.payload, "result": await self.store_result(out)}
                )
                data = encode(out)
        except Exception as exc:  # the object store is unavailable: fail clearly rather than lose it
            reason = f"could not store the large result ({len(data)} bytes): {exc}"
            if ev.name in _BOUNDARY_WITH_RESULT:
                return _fit(ev, data, reason)
            # task.done is progress: its step's boundary reports the failure (or stores the value)
            out = msgspec.structs.replace(
                ev, payload={**ev.payload, "result": {"truncated": True, "size": len(data), "error": reason}}
            )
            return _fit(out, encode(out))
        return _fit(out, data)

    async def store_result(self, ev: Event, value: Any = None, name: str = "result") -> dict[str, Any]:
        """Store the event's result (or `value`) under ``<execution_id>/<entity id>[~<delivery>]/<name>``
        and return its reference; a value this run stored already (a task's result that is also its
        step's, or its iteration's) is not stored again: its reference is returned."""
        data = msgspec.json.encode(ev.payload["result"] if value is None else value)
        checksum = hashlib.sha256(data).hexdigest()
        ref = self._stored.get(checksum)
        if ref is None:
            key = f"{ev.execution_id}/{ev.entity_id}{self._id_suffix}/{name}"
            ref = self._stored[checksum] = await self._results.put_encoded(key, data)
        return ref

    async def store_tasks(self, ev: Event, limit: int) -> tuple[Event, bytes]:
        """A pipeline's boundary with its result and its results by task label (``tasks``) stored by
        reference, the largest first, until it fits `limit` (each is the value its ``task.done``
        stored: not stored again)."""
        tasks = dict(ev.payload["tasks"])
        result = ev.payload.get("result")
        sizes = {label: len(msgspec.json.encode(value)) for label, value in tasks.items()}
        parts: list[str | None] = sorted(tasks, key=sizes.__getitem__, reverse=True)
        result_size = len(msgspec.json.encode(result))
        parts.insert(
            next((i for i, label in enumerate(parts) if sizes[label] < result_size), len(parts)), None
        )
        out, data = ev, encode(ev)
        for label in parts:  # None: the step's result
            if len(data) <= limit:
                break
            if label is None:
                result = await self.store_result(ev)
            else:
                tasks[label] = await self.store_result(ev, tasks[label], f"tasks/{label}")
            out = msgspec.structs.replace(ev, payload={**ev.payload, "tasks": tasks, "result": result})
            data = encode(out)
        return out, data


_BOUNDARY_WITH_RESULT = frozenset({E.STEP_DONE, E.LOOP_DONE, E.LOOP_ITERATION_DONE})
_WITH_RESULT = _BOUNDARY_WITH_RESULT | {E.TASK_DONE}
"""Events whose large ``result`` goes to the object store (`EventFitter.fit`)."""


def _fit(ev: Event, data: bytes, reason: str | None = None) -> tuple[Event, bytes]:
    """Last resort: an event still above the server's payload limit becomes a clear error."""
    if len(data) <= MAX_EVENT_BYTES and reason is None:
        return ev, data
    data_len = len(data)
    payload = {
        k: v
        for k, v in ev.payload.items()
        if k not in ("result", "results", "ctx_patches", "tasks", "result_task")
    }
    error = ErrorInfo(
        kind="result_too_large",
        retryable=False,
        message=reason
        or f"the event is {data_len} bytes, above the {MAX_EVENT_BYTES}-byte limit (large ctx patches or "
        "errors?); store large data with a storage task and keep references in ctx",
    ).to_dict()
    if ev.name in (E.STEP_DONE, E.LOOP_DONE):
        out = msgspec.structs.replace(
            ev, name=E.STEP_FAILED, status="error", payload={**payload, "error": error}
        )
    elif ev.name == E.LOOP_ITERATION_DONE:
        out = msgspec.structs.replace(
            ev, name=E.LOOP_ITERATION_FAILED, status="error", payload={**payload, "error": error}
        )
    else:
        out = msgspec.structs.replace(ev, payload={**payload, "truncated": True})
    return out, encode(out)
