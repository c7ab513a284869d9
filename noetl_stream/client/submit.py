"""Submitting executions: a request from a playbook and its attachments (`request_for`), its publish (`submit`), a retry of a failed one (`retry_request`)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from noetl_stream.dsl.compiler import compile_playbook
from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.publish import publish_stored
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology, check_new_id
from noetl_stream.protocol.wire import (
    ExecutionRequest,
    encode,
    new_execution_id,
    request_msg_id,
)

_PLAYBOOK_KIND = re.compile(r"""kind["']?\s*:\s*["']?playbook\b""")


def child_paths(text: str, file: str, extensions: Iterable[str] = ()) -> list[str]:
    """Literal ``path``s of ``kind: playbook`` tasks (steps and workbook) of a playbook."""
    return _file_refs(text, file, extensions)[0]


def _file_refs(text: str, file: str, extensions: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """The files a playbook names: its child playbooks (`child_paths`) and its tasks' script files
    (``script: {uri, source: {type: file}}``, compiled to ``script: {path}``)."""
    children = "playbook" in text and _PLAYBOOK_KIND.search(text) is not None
    if not children and "script" not in text:
        return [], []  # neither: skip compiling
    result = compile_playbook(text, file, extensions=extensions)
    if result.playbook is None:
        return [], []
    pb = result.playbook
    tasks = [t for s in pb.workflow for t in s.tasks] + list(pb.workbook.values())
    paths = [
        str(t.config["path"]) for t in tasks if t.kind == "playbook" and isinstance(t.config.get("path"), str)
    ]
    scripts = [
        str(t.config["script"]["path"])
        for t in tasks
        if isinstance(t.config.get("script"), dict) and isinstance(t.config["script"].get("path"), str)
    ]
    return paths, scripts


class AttachmentError(NoetlError, ValueError):
    """Child playbook files that cannot all be shipped with a request."""


MAX_ATTACHMENTS = 64
"""Child playbook files shipped with one request, at most (`collect_attachments`)."""


def attachment_key(directory: str, ref: str) -> str:
    """The key of a child playbook ``ref`` written by a playbook in ``directory`` (itself relative to the
    submitted file's directory, "" for that file): the reference resolved against it, normalized."""
    joined = posixpath.join(directory, ref)
    normal = posixpath.normpath(joined)
    return "" if normal == "." else normal


def collect_attachments(
    text: str, file: str, limit: int = MAX_ATTACHMENTS, extensions: Iterable[str] = ()
) -> dict[str, str]:
    """Texts of the child playbooks a playbook runs by file path, recursively, keyed by their path relative
    to the submitted file's directory: a reference is resolved against the file that wrote it, so
    ``sub/mid.yaml``'s ``grand.yaml`` is ``sub/grand.yaml``. (The controller re-keys a child's attachments
    relative to the child's directory, where its worker looks its references up.) A reference written
    otherwise than its key (``./grand.yaml``) is kept under that spelling too. More than ``limit`` files
    raise `AttachmentError`."""
    found: dict[str, str] = {}
    files = 0
    todo = [(text, "", Path(file).parent)]
    while todo:
        body, directory, base = todo.pop()
        children, scripts = _file_refs(body, str(base / "_"), extensions)
        for ref in scripts:  # a task's script file: shipped as it is, read by its worker
            key = attachment_key(directory, ref)
            if key not in found and (base / ref).is_file():
                if files >= limit:
                    raise AttachmentError(
                        f"{file}: its child playbooks and script files reach more than {limit} files "
                        f"(the most shipped with one request; {ref!r} is one too many)"
                    )
                found[key] = (base / ref).read_text(encoding="utf-8")
                files += 1
            if key in found:
                found.setdefault(posixpath.join(directory, ref), found[key])
        for ref in children:
            key = attachment_key(directory, ref)
            spelled = posixpath.join(directory, ref)
            if key in found:
                found.setdefault(spelled, found[key])
                continue
            for candidate in (base / ref, base / f"{ref}.yaml", base / f"{ref}.yml"):
                if candidate.is_file():
                    if files >= limit:
                        raise AttachmentError(
                            f"{file}: its child playbooks reach more than {limit} files (the most shipped "
                            f"with one request; {ref!r} is one too many): register some in the catalog "
                            "and run them by catalog path"
                        )
                    child = candidate.read_text(encoding="utf-8")
                    files += 1
                    found[key] = found[spelled] = child
                    todo.append((child, posixpath.dirname(key), candidate.parent))
                    break
    return found


def request_for(
    text: str,
    file: str,
    payload: dict[str, Any] | None = None,
    execution_id: str | None = None,
    *,
    extensions: Iterable[str] = (),
) -> ExecutionRequest:
    """A request to run ``text``; ``extensions`` (``legacy``) are recorded with it and used to compile it
    (and the child playbooks it ships)."""
    exts = sorted(set(extensions))
    return ExecutionRequest(
        playbook=text,
        file=file,
        payload=payload or {},
        execution_id=execution_id or new_execution_id(),
        attachments=collect_attachments(text, file, extensions=exts),
        extensions=exts,
    )


SUBMIT_RETRY_S = 10.0
"""How long `submit` publishes a request again after a failure that passes (same id: stored once)."""


async def submit(nc: NATS, topology: Topology, request: ExecutionRequest) -> str:
    """Publish onto the durable request subject; returns the execution id (set here if missing).

    An execution id the controller would refuse raises `SubjectError` here: the controller records the
    rejection under an id of its own, which the caller would never learn. A publish whose ack was lost is
    published again with the same id (`publish_stored`): a caller that gave up and submitted again would
    start a second execution."""
    if request.execution_id is None:
        request = msgspec.structs.replace(request, execution_id=new_execution_id())
    assert request.execution_id is not None
    check_new_id(request.execution_id)
    msg_id = request_msg_id(request.execution_id)
    await publish_stored(nc, topology.request_subject, encode(request), msg_id, SUBMIT_RETRY_S)
    return request.execution_id


class RetryError(NoetlError, ValueError):
    """An execution that cannot be retried as asked."""


def check_from_steps(request: ExecutionRequest, execution_id: str, from_steps: tuple[str, ...]) -> None:
    """Refuse (`RetryError`) a step to retry from that the execution's playbook does not have, before
    submitting a retry the controller could only fail."""
    from noetl_stream.dsl.compiler import compile_playbook

    if not from_steps or not isinstance(request.playbook, str):
        return
    compiled = compile_playbook(
        request.playbook, request.file or "<playbook>", extensions=tuple(request.extensions)
    )
    if compiled.playbook is None:
        return  # the controller compiles it (maybe with its own extensions) and says what is wrong
    steps = compiled.playbook.steps
    unknown = [step for step in from_steps if step not in steps]
    if unknown:
        raise RetryError(
            f"execution {execution_id} has no step {', '.join(map(repr, unknown))} (steps: {', '.join(steps)})"
        )


async def retry_request(
    nc: NATS, topology: Topology, execution_id: str, from_steps: tuple[str, ...] = ()
) -> ExecutionRequest:
    """A request that re-runs an ended execution from its failed steps and those its end interrupted (a
    cancel, the deadline: the runs still scheduled or running, with the args they had), or from
    ``from_steps``, reusing the recorded results and ctx of everything that succeeded."""
    from noetl_stream.control.replay import replay
    from noetl_stream.kv.history import read_events

    js = nc.jetstream()
    request_payload: dict[str, Any] | None = None
    scheduled_args: dict[str, dict[str, Any]] = {}
    last_args_by_step: dict[str, dict[str, Any]] = {}
    async for _, ev in read_events(
        js, topology, execution_id, names=(E.EXECUTION_REQUESTED, E.STEP_SCHEDULED)
    ):
        if ev.name == E.EXECUTION_REQUESTED:
            request_payload = ev.payload.get("request")
        elif ev.step_run_id and ev.step:
            args = ev.payload.get("args") or {}
            scheduled_args[ev.step_run_id] = args
            last_args_by_step[ev.step] = args
    if not isinstance(request_payload, dict) or not request_payload.get("playbook"):
        raise RetryError(f"no request recorded for execution {execution_id}")
    state = await replay(js, topology, execution_id)
    if state is None:
        raise RetryError(f"no execution {execution_id}")
    if state.status == "running":
        raise RetryError(f"execution {execution_id} is still running")
    tokens: list[dict[str, Any]] = []
    if from_steps:
        for step in from_steps:
            tokens.append({"step": step, "args": last_args_by_step.get(step, {})})
    else:
        for failure in state.unhandled:
            failed_step, run_id = failure.get("step"), failure.get("step_run_id")
            if isinstance(failed_step, str):
                tokens.append({"step": failed_step, "args": scheduled_args.get(str(run_id), {})})
        # Interrupted: the runs the end (a cancel, the deadline, another step's failure) caught scheduled
        # or running, and the tokens a pause held back. They run again, with the args they had.
        for run in state.runs.values():
            if run.status in ("scheduled", "looping"):
                tokens.append({"step": run.step, "args": scheduled_args.get(run.run_id, run.args)})
        for token in state.deferred:
            if isinstance(token.get("step"), str):
                tokens.append({"step": token["step"], "args": token.get("args") or {}})
    if not tokens:
        raise RetryError(
            f"execution {execution_id} has no failed step (nor an interrupted one) to retry (name one with "
            "--from-step)"
        )
    results = {k: v for k, v in state.results.items() if k not in {t["step"] for t in tokens}}
    meta = {k: v for k, v in state.result_meta.items() if k in results}
    request = msgspec.convert(
        {
            **{
                k: v
                for k, v in request_payload.items()
                if k
                in (
                    "playbook",
                    "file",
                    "payload",
                    "attachments",
                    "pool",
                    "return_step",
                    "deadline_s",
                    "extensions",
                    "parent_iter",  # a child started from a loop iteration: its steps read iter.parent
                )
            },
            "execution_id": new_execution_id(),
            "resume": {
                "execution_id": execution_id,
                "tokens": tokens,
                "results": results,
                **({"result_meta": meta} if meta else {}),
                "ctx": state.ctx,
                "step_status": {k: v for k, v in state.step_status.items() if v == "done"},
            },
        },
        ExecutionRequest,
    )
    return request
