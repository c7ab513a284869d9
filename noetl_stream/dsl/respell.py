"""The NoETL dialect forms the compiler reads as they stand, rewritten in their canonical spelling.

``dialect.normalize`` turns the structural forms (``set:``, policy shorthands, ``call.done``, task
``input:``) into canonical data; the runtime reads what is left as NoETL does and ``validate`` warns
about each (code ``dialect``). ``noetl-stream migrate`` runs this after ``dialect.normalize`` to write
those in the canonical spelling too, so that the migrated playbook validates without a ``dialect``
warning and runs the same:

* ``output`` in a task policy (NoETL's envelope of the outcome): ``outcome`` (`envelope`);
* the names templates read (`dialect_spellings` in names.py): the loop's item bare (``iter.<it>``),
  NoETL's loop positions, ctx values bare (``ctx.<k>``), ``ctx.<step>`` and ``ctx.<workload key>``,
  ``output``/``result`` in arcs (the step's name);
* task keys: ``credential:`` (``auth:``), http ``timeout:``/``timeout_seconds:`` (``spec.timeout``),
  an inline ``script:`` (python ``code:``, postgres ``command:``).

Each rewrite is a warning (code ``dialect``) naming the form and what it became; a form with no
canonical spelling is an error (code ``migrate``), and migrate writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from noetl_stream.dsl import dialect
from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.checks import _site, _step_name, _strings, _who
from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.kinds import kind_info
from noetl_stream.dsl.model import Playbook
from noetl_stream.dsl.names import RESULT_NAMES, Namespace, Place, dialect_spellings
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import (
    ChainRewrite,
    Rewrite,
    SplitError,
    UntranslatableError,
    rewrite_chains,
    rewrite_text,
    split_event,
)
from noetl_stream.dsl.source import SourceMap
from noetl_stream.dsl.templates import attribute_reads, undeclared_names
from noetl_stream.dsl.toolforms import HTTP_TIMEOUTS, SCRIPT_KINDS
from noetl_stream.protocol.events import LOOP_DONE, STEP_DONE, STEP_FAILED

CODE = "dialect"
SUCCESS = frozenset({STEP_DONE, LOOP_DONE})
"""The boundaries a step's arcs see when it succeeds."""
REFUSED = "migrate"

ERROR_FIELDS: dict[str, tuple[str, str]] = {
    "kind": ("outcome.error.kind", "none"),
    "message": ("outcome.error.message", "none"),
    "retryable": ("outcome.error.retryable", "false"),
    "status_code": ("outcome.error.status", "none"),
    "code": ("outcome.error.code | default(outcome.pg.code)", "none"),
}
"""``output.error.<key>`` (NoETL's envelope: every key there, null or false on success) -> the outcome's
own field and the envelope's value where the outcome has none."""
HTTP_FIELDS: dict[str, tuple[str, str]] = {
    "status": ("outcome.http.status", "none"),
    "headers": ("outcome.http.headers", "{}"),
}


def envelope(attrs: tuple[str, ...], compared: Callable[[int], bool]) -> tuple[str, int]:
    """``output.<attrs>`` in a task policy as the outcome reads it (see `rewrite.ChainRewrite`).

    ``output.status`` is ``outcome.status`` and ``output.data`` ``outcome.result``. The envelope's
    ``error`` and ``http`` hold every key on every outcome (nulls, ``retryable: false``), the outcome
    only those it has: read elsewhere than in a comparison, a missing one gets the envelope's value
    (``outcome.error.retryable | default(false)``)."""
    if not attrs:
        raise UntranslatableError(
            "'output' as a whole is NoETL's envelope, which has no canonical spelling: read its keys "
            "(output.status, output.data, output.error.kind, ...)"
        )
    head = attrs[0]
    if head == "status":
        return "outcome.status", 1
    if head == "data":
        return "outcome.result", 1
    if head == "meta":
        if attrs[1:2] == ("duration_ms",):
            raise UntranslatableError(
                "'output.meta.duration_ms' has no canonical spelling: read outcome.meta.duration_s (seconds)"
            )
        return "outcome.meta", 1
    fields = {"error": ERROR_FIELDS, "http": HTTP_FIELDS}.get(head)
    if fields is None:
        raise UntranslatableError(
            f"'output.{head}' is not a key of NoETL's envelope (status, data, error, http, meta)"
        )
    if len(attrs) < 2 or attrs[1] not in fields:
        keys = ", ".join(fields)
        raise UntranslatableError(
            f"'output.{head}' as a whole (or a key other than {keys}) has no canonical spelling: "
            f"read outcome.{head}.<key>"
        )
    expr, missing = fields[attrs[1]]
    if compared(2) and "|" not in expr:
        return expr, 2
    return f"{expr} | default({missing})", 2


def tasks(data: Any) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(path, who, body) of every task: the workflow's steps' and the root workbook's."""
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        if isinstance(step, dict):
            for _, body, rel in dialect._tasks(step):
                yield ("workflow", i, *rel), _who(("workflow", i, *rel, "kind"), data), body
    for path, name, body in dialect._workbook(data):
        yield path, f"workbook '{name}'", body


def _rename(node: dict[str, Any], old: str, new: str, value: Any) -> None:
    """``node[old]`` becomes ``node[new] = value`` in its place (the keys after it keep their order)."""
    items = list(node.items())
    node.clear()
    for k, v in items:
        if k == old:
            node[new] = value
        else:
            node[k] = v


class Respell:
    """One playbook's rewrite, in place on ``data`` (canonical data but for these forms)."""

    def __init__(self, data: Any, origins: Origins, smap: SourceMap) -> None:
        self.data = data
        self.origins = origins
        self.authored = smap
        self.diagnostics: list[Diagnostic] = []

    def _smap(self) -> SourceMap:
        return self.origins.source_map(self.data, self.authored)

    def warn(self, smap: SourceMap, path: Path, message: str, *, at_key: bool = False) -> None:
        self.diagnostics.append(smap.diagnostic(path, message, severity="warning", at_key=at_key, code=CODE))

    def refuse(self, smap: SourceMap, path: Path, message: str, *, at_key: bool = False) -> None:
        self.diagnostics.append(smap.diagnostic(path, message, at_key=at_key, code=REFUSED))

    # -- task keys ------------------------------------------------------------------------------
    def task_keys(self) -> None:
        smap = self._smap()
        for path, who, body in list(tasks(self.data)):
            kind = body.get("kind")
            info = kind_info(kind) if isinstance(kind, str) else None
            if (
                "credential" in body
                and "auth" not in body
                and info is not None
                and info.keys
                and "auth" in info.keys
            ):
                self.origins.mark_key(body, "auth", (*path, "credential"))
                _rename(body, "credential", "auth", body["credential"])
                self.warn(
                    smap, (*path, "credential"), f"{who}: 'credential:' written as 'auth:'", at_key=True
                )
            if kind == "http":
                self._http_timeout(smap, path, who, body)
            if isinstance(kind, str) and kind in SCRIPT_KINDS and isinstance(body.get("script"), dict):
                self._inline_script(smap, path, who, body, SCRIPT_KINDS[kind])

    def _http_timeout(self, smap: SourceMap, path: Path, who: str, body: dict[str, Any]) -> None:
        given = [k for k in HTTP_TIMEOUTS if k in body]
        spec = body.get("spec")
        if len(given) != 1 or not V.is_seconds(body[given[0]]):
            return  # (none, or the validator's error)
        if spec is not None and (not isinstance(spec, dict) or "timeout" in spec):
            return
        key = given[0]
        value = body.pop(key)
        if spec is None:
            spec = body["spec"] = {}
        spec["timeout"] = value
        self.origins.mark_key(spec, "timeout", (*path, key))
        self.warn(
            smap,
            (*path, key),
            f"{who}: '{key}: {value}' written as 'spec: {{timeout: {value}}}'",
            at_key=True,
        )

    def _inline_script(
        self, smap: SourceMap, path: Path, who: str, body: dict[str, Any], code_key: str
    ) -> None:
        source = body["script"].get("source")
        if not (
            isinstance(source, dict)
            and source.get("type") == "inline"
            and isinstance(source.get("code"), str)
        ):
            return  # a file (canonical as it is) or the validator's error
        if code_key in body:
            return
        self.origins.mark_key(body, code_key, (*path, "script", "source", "code"))
        _rename(body, "script", code_key, source["code"])
        self.warn(
            smap, (*path, "script"), f"{who}: the inline 'script:' written as '{code_key}:'", at_key=True
        )

    # -- output in task policies ----------------------------------------------------------------
    def policies(self) -> None:
        smap = self._smap()
        for path, who, body in tasks(self.data):
            spec = body.get("spec")
            policy = spec.get("policy") if isinstance(spec, dict) else None
            if not isinstance(policy, dict):
                continue
            ppath: Path = (*path, "spec", "policy")
            for tpath, text in list(_strings(policy, ppath)):
                try:
                    new = rewrite_chains(text, "output", envelope)
                except UntranslatableError as exc:
                    self.refuse(smap, tpath, f"{who}: {exc}")
                    continue
                if new != text:  # (dialect.normalize warned, once per policy)
                    _put(self.data, tpath, new)

    # -- names templates read -------------------------------------------------------------------
    def names(self, playbook: Playbook) -> None:
        smap = self._smap()
        data = self.data
        ns = Namespace.of(playbook, data)
        by_name = {s.name: s for s in playbook.workflow}
        iterators = frozenset(s.loop.iterator for s in playbook.workflow if s.loop is not None)
        labels_by_index: dict[int, frozenset[str]] = {}
        for i, item in enumerate(data.get("workflow") or []):
            step = by_name.get(str(item.get("step"))) if isinstance(item, dict) else None
            if step is not None:
                labels_by_index[i] = frozenset({t.name for t in step.tasks}) | (
                    {"input"} if step.input is not None else frozenset()
                )
        again = _reentered(playbook)
        for root in ("workflow", "workbook", "workload"):
            for path, text in list(_strings(data.get(root), (root,))):
                owner = _step_name(path, data)
                site = _site(path)
                step = by_name.get(owner) if owner is not None else None
                if step is not None and step.loop is not None and site == "a task":
                    its = frozenset({step.loop.iterator})
                else:
                    its = iterators if root == "workbook" else frozenset()
                index = path[1] if len(path) > 1 else None
                labels = labels_by_index.get(index, frozenset()) if isinstance(index, int) else frozenset()
                place = Place(site, its, labels, owner)
                spellings, _ = dialect_spellings(undeclared_names(text), attribute_reads(text), place, ns)
                if not spellings:
                    continue
                names = {k: v for s in spellings for k, v in s.names}
                results = {n: names.pop(n) for n in RESULT_NAMES if n in names}
                new = rewrite_text(
                    text, Rewrite(names=names, attrs={k: v for s in spellings for k, v in s.attrs})
                )
                for name, step_name in results.items():  # (in an arc: the step's result)
                    new = rewrite_chains(new, name, self._arc_result(path, step_name, again))
                if new == text:
                    continue  # (a spelling the rewrite does not reach, ctx['k']: migrate refuses it)
                _put(data, path, new)
                who = _who(path, data)
                for s in spellings:
                    self.warn(smap, path, f"{who}: {s.message}")

    def _arc_result(self, path: Path, step: str, again: set[str]) -> ChainRewrite:
        """How ``output``/``result`` in the arc at `path` is spelled: the step's name where that reads
        the same. In a failed step's arcs they are null, while ``{{ <step> }}`` is undefined (the step
        has no result) or, in a step that ran before (a cycle), its last result: there, where the arc
        can see the failure (its ``when`` does not exclude it), a read of the value itself (``is
        none``, a filter, a comparison), or any read in a step run again, is spelled
        ``none if event.name == 'step.failed' else <step>``."""
        arc = self.data["workflow"][path[1]]["next"]["arcs"][path[4]]
        when = arc.get("when") if isinstance(arc, dict) else None
        try:
            tested = split_event(when).events if isinstance(arc, dict) and "when" in arc else SUCCESS
        except SplitError:
            tested = None
        sees_failure = tested is None or not tested <= SUCCESS
        guarded = f"none if event.name == '{STEP_FAILED}' else {step}"

        def spell(attrs: tuple[str, ...], compared: Callable[[int], bool]) -> tuple[str, int]:
            if not sees_failure or (attrs and step not in again):
                return step, 0
            return guarded, 0

        return spell


def _reentered(playbook: Playbook) -> set[str]:
    """The steps an arc path leads back to (a cycle): they may hold a result from an earlier run."""
    nxt = {s.name: [a.step for a in s.next.arcs] if s.next is not None else [] for s in playbook.workflow}
    out: set[str] = set()
    for start in nxt:
        seen: set[str] = set()
        todo = list(nxt[start])
        while todo:
            name = todo.pop()
            if name == start:
                out.add(start)
                break
            if name not in seen:
                seen.add(name)
                todo.extend(nxt.get(name, ()))
    return out


def _put(data: Any, path: Path, value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def arc_sets(data: Any) -> Iterator[tuple[Path, str]]:
    """The arcs that keep NoETL's ``set:`` (which v10 has no form of): path and who."""
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        if isinstance(step, dict):
            nxt = step.get("next")
            arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
            for j, arc in enumerate(arcs if isinstance(arcs, list) else []):
                if isinstance(arc, dict) and "set" in arc:
                    yield (
                        ("workflow", i, "next", "arcs", j, "set"),
                        (f"step '{step.get('step')}' arc '{arc.get('step')}'"),
                    )


__all__ = ["Respell", "arc_sets", "envelope"]
