"""Forms of the NoETL dialect as deployed (noetl.io/v2) that v10 does not show, accepted as canonical.

* Task ``set:`` with scoped keys (``ctx.total: ...``, ``iter.page: ...``, or ``ctx: {total: ...}``)
  is applied when the task completes: it becomes ``set_ctx``/``set_iter`` on every rule of the task's
  policy that does not retry or fail (and on an ``else`` that continues), so the worker needs nothing
  new. Its templates read the task's result as ``outcome.result`` (or by the task's name).
* Step ``set:`` is applied when the step completes: on the rules that end the pipeline (``break``
  anywhere; ``continue`` of the last task). Templates read the step's result by the step's name.
* Step ``set:`` on a looped step is applied once, after the last iteration, with the loop's result
  (the list of iteration results) as the step's name; it writes ``ctx`` only (there is no iteration
  scope then). No task sees the end of a loop, so it runs in a step ``<step>_set`` that the loop's
  success leads to; the step's arcs move there, so they route after the patch, as on any step with
  a ``set:``, and see the loop's boundary as before (``event.name``, ``event.total``, ``event.failed``,
  ... handed on as ``args.loop_event``, and ``args``); failures, and arcs testing a boundary a loop never
  has, still route from the loop step itself.
* Task ``input:`` is the task's ``args``; given beside ``args:``, the two mappings are merged and
  ``input``'s keys win. Step ``input:`` stays on the step (``Step.input``).
* ``set:`` keys: ``ctx.k`` and ``iter.k`` write those scopes; ``step.k`` and a bare ``k`` write ``ctx``
  on a step, an arc and a policy ``then``, and on a task a name its step's later tasks read: it is kept
  in the step run's ``iter`` and their ``{{ k }}`` reads ``iter.k``. A policy ``then``'s ``set:``
  becomes its ``set_ctx``/``set_iter``; an arc's stays on the arc, its keys as ctx names (the
  controller writes them when the arc fires, ``Arc.set_ctx``).
* Task policies: ``else: {do: ...}`` is ``else: {then: {do: ...}}``; ``jump`` ``to: previous`` names the
  task before; ``backoff: fixed`` (and any name we do not know) is ``none``, the same delay each time.
* Arc conditions: ``'call.done'`` is ``'step.done'`` (``'loop.done'`` on a looped step) and
  ``'call.error'`` is ``'step.failed'``.

Each form gets a warning (code ``dialect``) naming its canonical spelling.
"""

from __future__ import annotations

import copy
from typing import Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import (
    Rewrite,
    SplitError,
    alias_literals,
    aliases_to_canonical,
    as_expression,
    inner,
    reads,
    reads_attr,
    rewrite_value,
    split_event,
    template,
)
from noetl_stream.dsl.source import SourceMap
from noetl_stream.errors import NoetlError
from noetl_stream.protocol.events import LOOP_DONE, STEP_DONE, STEP_FAILED

SCOPES = {"ctx": "set_ctx", "iter": "set_iter"}
STEP_SCOPE = "step"
"""``set: {step.k: ...}``: the same as a bare ``k``."""
CALL_NAMES = {"call.done": (STEP_DONE,), "call.error": (STEP_FAILED,)}
CALL_NAMES_LOOPED = {"call.done": (LOOP_DONE,), "call.error": (STEP_FAILED,)}
"""NoETL's boundary names in arc conditions, and ours (a looped step ends with ``loop.done``)."""
OK = "{{ outcome.status == 'ok' }}"
FAILED = "event.name == 'step.failed'"
SUCCEEDED = "event.name != 'step.failed'"
SOURCE_ARGS = "source_args"
"""Where the ``<step>_set`` step of a looped step finds the loop step's ``args``."""
BOUNDARY = "loop_event"
"""... and the fields of the loop's boundary event its arcs read."""
BOUNDARY_FIELDS = ("name", "status", "total", "done", "failed")
ITERATION_ONLY = ("iter", "input", "_prev", "_task", "_attempt")


def _tasks(step: dict[str, Any]) -> list[tuple[int | None, dict[str, Any], Path]]:
    """(index, task body, path relative to the step) of the step's tasks, whatever their shape."""
    tool = step.get("tool")
    if isinstance(tool, dict):
        return [(None, tool, ("tool",))] if "kind" in tool else []
    out: list[tuple[int | None, dict[str, Any], Path]] = []
    for i, item in enumerate(tool if isinstance(tool, list) else []):
        if isinstance(item, dict) and "kind" not in item and len(item) == 1:
            label, body = next(iter(item.items()))
            if isinstance(body, dict):
                out.append((i, body, ("tool", i, label)))
                continue
        if isinstance(item, dict):
            out.append((i, item, ("tool", i)))
    return out


def has_dialect(data: Any) -> bool:
    """Whether `data` uses a form `normalize` rewrites or warns about (a rule reading ``output`` too)."""
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for step in workflow if isinstance(workflow, list) else []:
        if isinstance(step, dict):
            if "set" in step or any("set" in arc or _call_names(arc.get("when")) for arc in _arcs(step)):
                return True
            for _, body, _ in _tasks(step):
                if "set" in body or "input" in body or any(_rule_forms(r) for r in _rules(body)):
                    return True
    return any(_rule_forms(r) for _, _, body in _workbook(data) for r in _rules(body))


def _rule_forms(rule: dict[str, Any]) -> bool:
    return _then_forms(rule) or _reads_output(rule, ()) is not None


def _arcs(step: dict[str, Any]) -> list[dict[str, Any]]:
    nxt = step.get("next")
    arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
    return [a for a in arcs if isinstance(a, dict)] if isinstance(arcs, list) else []


def _rules(task: dict[str, Any]) -> list[dict[str, Any]]:
    spec = task.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    rules = policy.get("rules") if isinstance(policy, dict) else None
    return [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []


def _call_names(when: Any) -> bool:
    return isinstance(when, str) and any(a in CALL_NAMES for a in alias_literals(when))


def _shorthand_else(rule: dict[str, Any]) -> bool:
    """``- else: {do: ...}``: NoETL's ``else`` without ``then``."""
    body = rule.get("else")
    return isinstance(body, dict) and "then" not in body and "do" in body and not {"when", "then"} & set(rule)


def _then_forms(rule: dict[str, Any]) -> bool:
    """Whether a policy rule uses a dialect form (``else`` shorthand, ``then.set``, ``to: previous``, a
    backoff name of NoETL's)."""
    if _shorthand_else(rule):
        return True
    then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
    if not isinstance(then, dict):
        return False
    backoff = then.get("backoff")
    return (
        "set" in then
        or (then.get("do") == "jump" and then.get("to") == "previous")
        or (isinstance(backoff, str) and backoff not in V.BACKOFF_VALUES)
    )


def _reads_output(rule: dict[str, Any], rpath: Path) -> Path | None:
    """The authored path of the first template of a rule (its ``when``, its ``then`` values) that reads
    ``output``."""
    for key in ("when", "then", "else"):
        if key in rule:
            found = _first_read(rule[key], (*rpath, key), "output")
            if found is not None:
                return found
    return None


def _first_read(value: Any, path: Path, name: str) -> Path | None:
    if isinstance(value, dict):
        for k, v in value.items():
            found = _first_read(v, (*path, k), name)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _first_read(v, (*path, i), name)
            if found is not None:
                return found
    elif name in reads(value):
        return path
    return None


class _RejectError(NoetlError):
    pass


class Dialect:
    def __init__(self, origins: Origins, smap: SourceMap) -> None:
        self.origins = origins
        self.smap = smap
        self.diagnostics: list[Diagnostic] = []
        self.taken: set[str] = set()
        """Step names and workload keys: a bare ``output`` or ``result`` that is one of them is not
        NoETL's name for a step's result."""

    def error(self, path: Path, message: str) -> _RejectError:
        self.diagnostics.append(self.smap.diagnostic(path, message, at_key=True, code="dialect"))
        return _RejectError(message)

    def warn(self, path: Path, message: str, code: str = "dialect") -> None:
        self.diagnostics.append(
            self.smap.diagnostic(path, message, severity="warning", at_key=True, code=code)
        )

    def scoped(
        self,
        raw: Any,
        path: Path,
        who: str,
        where: dict[tuple[str, str], Path] | None = None,
        local: set[str] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """``set:`` keys by scope: ``{"set_ctx": {...}, "set_iter": {...}}``; `where` gets the authored
        path of each ``(scope, name)``. A bare key and a ``step.`` key write ctx, or, with `local` (a
        task's ``set:``), the step run's ``iter``, their names added to `local`."""
        if where is None:
            where = {}
        if not isinstance(raw, dict) or not raw:
            raise self.error(path, f"{who}: 'set' must be a mapping like {{ctx.total: ..., iter.page: ...}}")
        bare = "set_iter" if local is not None else "set_ctx"
        out: dict[str, dict[str, Any]] = {}

        def put(scope: str, name: str, value: Any, at: Path) -> None:
            self._name(name, at, who)
            if name in out.get(scope, {}):
                raise self.error(
                    at, f"{who}: 'set' writes '{name}' twice (a key with a scope and one without)"
                )
            out.setdefault(scope, {})[name] = value
            where[(scope, name)] = at

        for key, value in raw.items():
            key = str(key)
            if key in SCOPES and isinstance(value, dict):
                for name, v in value.items():
                    put(SCOPES[key], str(name), v, (*path, key, name))
                continue
            scope, dot, name = key.partition(".")
            if not dot:
                scope, name = STEP_SCOPE, key
                if key in (*SCOPES, STEP_SCOPE):
                    raise self.error(
                        (*path, key),
                        f"{who}: 'set' key '{key}' needs a name: '{key}.<name>' (or '{key}: {{...}}')",
                    )
            if scope == STEP_SCOPE:
                put(bare, name, value, (*path, key))
                if local is not None:
                    local.add(name)
            elif scope in SCOPES:
                put(SCOPES[scope], name, value, (*path, key))
            else:
                raise self.error(
                    (*path, key),
                    f"{who}: 'set' key '{key}': the scope must be 'ctx', 'iter' or 'step' (or none), not '{scope}'",
                )
        return out

    def mark_patches(self, task: dict[str, Any], where: dict[tuple[str, str], Path]) -> None:
        """Point the ``set_ctx``/``set_iter`` entries the rules of `task` got from a ``set:`` at the key
        the author wrote (so a diagnostic in one shows that key's path and line)."""
        for then in _thens(task):
            for scope in SCOPES.values():
                values = then.get(scope)
                if isinstance(values, dict):
                    for name in values:
                        authored = where.get((scope, str(name)))
                        if authored is not None:
                            self.origins.mark_key(values, name, authored)

    def _merge_input(self, task: dict[str, Any], tpath: Path, twho: str) -> None:
        """Task ``input:`` beside ``args:``: one mapping, ``input``'s keys winning (as a non-empty
        ``input`` wins over a child playbook's ``payload``). A template standing for either cannot be
        merged before it renders: an error."""
        args, given = task["args"], task.pop("input")
        if not isinstance(args, dict) or not isinstance(given, dict):
            which = "input" if not isinstance(given, dict) else "args"
            self.error(
                (*tpath, which),
                f"{twho}: 'input' and 'args' are merged (input's keys win), so both must be mappings; "
                f"'{which}' is not: keep one",
            )
            return
        for key, value in given.items():
            args[key] = value
            self.origins.mark_key(args, key, (*tpath, "input", key))

    def _name(self, name: str, path: Path, who: str) -> None:
        if not V.is_identifier(name):
            raise self.error(
                path, f"{who}: 'set' writes one level of ctx or iter; {name!r} is not a plain name"
            )

    def _route(self, step: dict[str, Any], path: Path, who: str) -> None:
        """NoETL's forms in arcs. In a condition ``'call.done'`` is the step's success boundary and
        ``'call.error'`` its failure (``step.exit`` stays a legacy alias). An arc's ``set:`` keys become
        ctx names (``Arc.set_ctx``: the controller writes them when the arc fires)."""
        self.calls(step, path, who)
        for i, arc in enumerate(_arcs(step)):
            if "set" in arc:
                self._arc_set(arc, (*path, "next", "arcs", i), f"{who} arc '{arc.get('step')}'")

    def calls(self, step: dict[str, Any], path: Path, who: str) -> None:
        """``'call.done'``/``'call.error'`` in the step's arc conditions, as the step's boundaries."""
        names = CALL_NAMES_LOOPED if "loop" in step else CALL_NAMES
        for i, arc in enumerate(_arcs(step)):
            when = arc.get("when")
            if isinstance(when, str) and _call_names(when):
                arc["when"] = aliases_to_canonical(when, names, swap=True)
                for alias in dict.fromkeys(a for a in alias_literals(when) if a in names):
                    self.warn(
                        (*path, "next", "arcs", i, "when"),
                        f"{who}: '{alias}' is NoETL's name for '{names[alias][0]}' in an arc condition",
                    )

    def _arc_set(self, arc: dict[str, Any], apath: Path, who: str) -> None:
        where: dict[tuple[str, str], Path] = {}
        try:
            patches = self.scoped(arc["set"], (*apath, "set"), who, where)
            if "set_iter" in patches:
                name = next(iter(patches["set_iter"]))
                raise self.error(
                    where[("set_iter", name)],
                    f"{who}: 'set' on an arc writes ctx when the arc is taken, after the step run and its "
                    f"iter are gone: 'iter.{name}' cannot be written (write 'ctx.{name}')",
                )
        except _RejectError:
            del arc["set"]
            return
        values = patches.get("set_ctx", {})
        arc["set"] = self.origins.mark(values, (*apath, "set"))
        for name in values:
            self.origins.mark_key(values, name, where[("set_ctx", name)])
        self.warn(
            (*apath, "set"),
            f"{who}: 'set:' on an arc is NoETL's (v10 has no form of it): the controller writes its keys to "
            "ctx when the arc is taken, before the target is scheduled; a canonical playbook writes ctx "
            "with set_ctx in a task policy",
        )

    def _policy(self, task: dict[str, Any], tpath: Path, who: str, labels: list[str], position: int) -> None:
        """NoETL's forms in a task policy's rules, in place: the ``else`` shorthand, ``then.set``,
        ``to: previous`` and backoff names; a warning where the rules read the ``output`` envelope."""
        rules = _rules(task)
        ppath: Path = (*tpath, "spec", "policy", "rules")
        envelope: Path | None = None
        for k, rule in enumerate(rules):
            rpath: Path = (*ppath, k)
            if envelope is None:
                envelope = _reads_output(rule, rpath)
            if _shorthand_else(rule):
                self.warn(
                    (*rpath, "else"),
                    f"{who}: 'else: {{do: ...}}' is NoETL's shorthand for 'else: {{then: {{do: ...}}}}'",
                )
                rule["else"] = self.origins.mark({"then": rule["else"]}, (*rpath, "else"))
                tp: Path = (*rpath, "else")
            else:
                tp = (*rpath, "else", "then") if isinstance(rule.get("else"), dict) else (*rpath, "then")
            then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
            if isinstance(then, dict):
                self._then(then, tp, who, labels, position)
        if envelope is not None:
            self.warn(
                envelope,
                f"{who}: 'output' in a task policy is NoETL's envelope of the task's outcome; canonical: "
                "outcome (output.status is outcome.status, output.data outcome.result, output.error "
                "outcome.error, output.http.status outcome.http.status)",
            )

    def _then(self, then: dict[str, Any], tp: Path, who: str, labels: list[str], position: int) -> None:
        if "set" in then:
            raw = then.pop("set")
            where: dict[tuple[str, str], Path] = {}
            try:
                patches = self.scoped(raw, (*tp, "set"), who, where)
            except _RejectError:
                patches = {}
            for key, values in patches.items():
                given = then.get(key)
                if given is None:
                    then[key] = values
                    self.origins.mark_key(then, key, (*tp, "set"))
                elif isinstance(given, dict):  # (else the validator says set_ctx must be a mapping)
                    twice = sorted(set(given) & set(values))
                    if twice:
                        self.error(
                            (*tp, "set"), f"{who}: both 'set' and '{key}' write '{twice[0]}': give it once"
                        )
                    given.update(values)
                for name in values:
                    if isinstance(then.get(key), dict):
                        self.origins.mark_key(then[key], name, where[(key, name)])
            if patches:
                self.warn(
                    (*tp, "set"),
                    f"{who}: 'set:' in a policy's 'then' is NoETL's; canonical: set_ctx (ctx., step. and "
                    "bare keys) and set_iter (iter. keys)",
                )
        backoff = then.get("backoff")
        if isinstance(backoff, str) and backoff not in V.BACKOFF_VALUES:
            then["backoff"] = "none"
            if backoff == "fixed":
                self.warn(
                    (*tp, "backoff"),
                    f"{who}: 'backoff: fixed' is NoETL's name for 'backoff: none' (the same delay before "
                    "every retry)",
                )
            else:
                self.warn(
                    (*tp, "backoff"),
                    f"{who}: unknown backoff '{backoff}'{V.suggest(backoff, V.BACKOFF_VALUES)}: it waits the "
                    "same delay before every retry, as 'none' does (NoETL's rule for a name it does not "
                    f"know); write one of {V.one_of(V.BACKOFF_VALUES)}",
                    code="unknown-backoff",
                )
        if then.get("do") == "jump" and then.get("to") == "previous" and "previous" not in labels:
            if position == 0:
                return  # (the validator says there is no task before this one)
            then["to"] = labels[position - 1]
            self.warn(
                (*tp, "to"),
                f"{who}: 'to: previous' is NoETL's; canonical: the label of the task before, "
                f"'to: {labels[position - 1]}'",
            )

    def _task_set_names(
        self, step: dict[str, Any], given: set[str], where: dict[tuple[str, str], Path], who: str
    ) -> bool:
        """A task's ``set:`` names live in the step run's ``iter``: not the loop's own names there."""
        loop = step.get("loop")
        iterator = loop.get("iterator", "item") if isinstance(loop, dict) else None
        taken = {*V.ITER_RESERVED, *([str(iterator)] if iterator is not None else [])}
        for name in sorted(given & taken):
            self.error(
                where[("set_iter", name)],
                f"{who}: 'set' key '{name}' names what the step's iteration holds (its item or position): "
                "choose another name",
            )
        return not given & taken

    def _read_local(self, task: dict[str, Any], local: dict[str, Path]) -> None:
        """The names earlier tasks' ``set:`` gave, as this task reads them: ``{{ k }}`` is ``iter.k``."""
        rw = Rewrite(names={name: f"iter.{name}" for name in local})
        for key in list(task):
            if key not in ("name", "kind"):
                task[key] = rewrite_value(task[key], rw)

    def step(self, step: dict[str, Any], path: Path, names: set[str]) -> dict[str, Any] | None:
        """Normalize ``step`` in place; return the step to add after it (``<step>_set``), if any."""
        who = f"step '{step.get('step')}'"
        self._route(step, path, who)
        tasks = _tasks(step)
        labels = [
            str(
                task.get("name")
                or (
                    rel[-1]
                    if len(rel) == 3
                    else f"task_{index}"
                    if index is not None
                    else f"{step.get('step')}_task"
                )
            )
            for index, task, rel in tasks
        ]
        local: dict[str, Path] = {}
        """Names a task's ``set:`` gave the later tasks of this step (kept in ``iter``), and where."""
        for position, (_, task, rel) in enumerate(tasks):
            tpath = (*path, *rel)
            label = labels[position]
            twho = f"{who} task '{label}'"
            if local:
                self._read_local(task, local)
            self._policy(task, tpath, twho, labels, position)
            if "input" in task:
                if "args" in task:
                    self._merge_input(task, tpath, twho)
                else:
                    items = list(task.items())
                    task.clear()
                    for k, v in items:
                        task["args" if k == "input" else k] = v
                    self.origins.mark_key(task, "args", (*tpath, "input"))
            if "set" in task:
                raw = task.pop("set")
                where: dict[tuple[str, str], Path] = {}
                given: set[str] = set()
                try:
                    patches = self.scoped(raw, (*tpath, "set"), twho, where, given)
                except _RejectError:
                    continue
                if not self._task_set_names(step, given, where, twho):
                    continue
                self.warn(
                    (*tpath, "set"),
                    f"{twho}: 'set:' on a task is NoETL's; canonical: set_ctx (ctx. keys) and set_iter (iter. "
                    "keys, and the names later tasks of the step read: step. and bare keys, read as "
                    "iter.<name>) in the 'then' of its spec.policy rules that go on; 'output' there is its "
                    "result, outcome.result",
                )
                rw = Rewrite(names={str(label): "outcome.result", "output": "outcome.result"})
                patches = {k: rewrite_value(v, rw) for k, v in patches.items()}
                local.update({n: where[("set_iter", n)] for n in given})
                if not add_patches(task, patches, ("continue", "jump", "break")):
                    self.error(
                        (*tpath, "set"),
                        f"{twho}: 'set' cannot be added to this task's spec.policy (see its errors)",
                    )
                self.mark_patches(task, where)
        if "set" in step:
            raw = step.pop("set")
            try:
                added = self._loop_set(step, raw, path, who, names) if "loop" in step else None
                if "loop" not in step:
                    self._step_set(step, raw, path, who)
            except _RejectError:
                return None
            self.warn(
                (*path, "set"),
                f"{who}: 'set:' on a step is NoETL's; canonical: set_ctx (ctx., step. and bare keys) in the "
                "'then' of the rules that end its pipeline (the last task's that go on, and any 'break'); on "
                "a looped step, in a task of a step after the loop",
            )
            return added
        return None

    def _loop_set(
        self, step: dict[str, Any], raw: Any, path: Path, who: str, names: set[str]
    ) -> dict[str, Any] | None:
        """Step ``set:`` of a looped step: a step ``<step>_set`` after the loop applies it and routes."""
        spath: Path = (*path, "set")
        where: dict[tuple[str, str], Path] = {}
        patches = self.scoped(raw, spath, who, where)
        if "set_iter" in patches:
            key = next(iter(patches["set_iter"]))
            raise self.error(
                spath,
                f"{who}: step 'set' on a looped step applies once, after the last iteration, where there is "
                f"no iteration scope: 'iter.{key}' cannot be written (use 'set' on a task to write iter "
                "in each iteration)",
            )
        values = patches["set_ctx"]
        late = sorted(reads(values) & set(ITERATION_ONLY))
        if late:
            raise self.error(
                spath,
                f"{who}: step 'set' on a looped step applies after the last iteration, where '{late[0]}' "
                f"does not exist (it reads the loop's result, the list of iteration results, as "
                f"'{{{{ {step.get('step')} }}}}')",
            )
        nxt = step.get("next")
        arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
        if "next" in step and not (
            isinstance(arcs, list)
            and arcs
            and all(isinstance(a, dict) and "step" in a and _condition(a.get("when", True)) for a in arcs)
        ):
            return None  # the router's own errors are reported by the validator
        name = str(step.get("step"))
        set_name = f"{name}_set"
        while set_name in names:
            set_name += "_"
        names.add(set_name)
        rw = Rewrite(
            # (`output`, `result`: the loop's result, as in any arc; warned about by the template checks)
            names={
                "args": f"args.{SOURCE_ARGS}",
                "event": f"args.{BOUNDARY}",
                **self._output(arcs, name, name),
            },
            attrs={("event", "result"): name},  # event.name too is the loop's: args.loop_event.name
        )
        stay: list[dict[str, Any]] = []
        moved: list[dict[str, Any]] = []
        for i, arc in enumerate(arcs or []):
            when = as_expression(arc["when"]) if "when" in arc else None
            if "when" in arc and when is None:
                raise self.error(
                    (*path, "next", "arcs", i, "when"),
                    f"{who}: with a step 'set' on a looped step, arc conditions must be expressions "
                    "('{{ ... }}' without '{% %}')",
                )
            apath: Path = (*path, "next", "arcs", i)
            tested = _tested_events(arc.get("when"))
            if tested is not None and not tested & (FAILURE_NAMES | SUCCESS_NAMES | EITHER_NAMES):
                stay.append(arc)  # a boundary a loop never has (step.done): never fires, as without 'set'
                continue
            # An arc without 'when' is taken on success boundaries only: no copy of it stays for failures.
            if tested & (FAILURE_NAMES | EITHER_NAMES) if tested is not None else "when" in arc:
                guard = None if tested is not None and tested <= FAILURE_NAMES else FAILED
                stay.append(self.origins.mark({**arc, "when": template(_and(guard, when))}, apath))
            if tested is None or tested & (SUCCESS_NAMES | EITHER_NAMES):
                guard = None if tested is not None and tested <= SUCCESS_NAMES else SUCCEEDED
                out = rewrite_value(copy.deepcopy(arc), rw)
                out["when"] = template(_and(guard, as_expression(out["when"]) if "when" in out else None))
                moved.append(self.origins.mark_tree(out, apath))
        values = rewrite_value(
            values,
            Rewrite(names={"args": f"args.{SOURCE_ARGS}", **self._output(values, name, name, spath, who)}),
        )
        hand_on: dict[str, Any] = {}
        if reads_attr([moved, values], "args", SOURCE_ARGS):
            hand_on[SOURCE_ARGS] = template("args")
        if reads_attr(moved, "args", BOUNDARY):
            hand_on[BOUNDARY] = {f: template(f"event.{f} | default(none)") for f in BOUNDARY_FIELDS}
        to_set: dict[str, Any] = {"step": set_name, "when": template(SUCCEEDED)}
        if hand_on:
            to_set["args"] = hand_on
        router = {k: v for k, v in (nxt or {}).items() if k != "arcs"}  # the mode applies on both steps
        step["next"] = self.origins.mark({**router, "arcs": [*stay, to_set]}, spath)
        task: dict[str, Any] = {"kind": "noop", "result": template(name)}
        add_patches(task, {"set_ctx": values}, ("continue",))
        self.mark_patches(task, where)
        added: dict[str, Any] = {"step": set_name, "tool": task}
        if moved:
            added["next"] = {**copy.deepcopy(router), "arcs": moved}
        return self.origins.mark(added, spath)

    def _step_set(self, step: dict[str, Any], raw: Any, path: Path, who: str) -> None:
        where: dict[tuple[str, str], Path] = {}
        patches = self.scoped(raw, (*path, "set"), who, where)
        name = str(step.get("step"))
        rw = Rewrite(
            names={
                name: "outcome.result",
                **self._output(patches, "outcome.result", name, (*path, "set"), who),
            }
        )
        patches = {k: rewrite_value(v, rw) for k, v in patches.items()}
        tasks = _tasks(step)
        if not tasks:
            if "tool" in step:
                return
            step["tool"] = [self.origins.mark({"name": f"{name}_set", "kind": "noop"}, (*path, "set"))]
            tasks = _tasks(step)
        for n, (_, task, _) in enumerate(tasks):
            last = n == len(tasks) - 1
            if not add_patches(task, patches, ("break", "continue") if last else ("break",), create=last):
                raise self.error(
                    (*path, "set"),
                    f"{who}: 'set' cannot be added to the policy of its tasks (see their errors)",
                )
            self.mark_patches(task, where)

    def _output(
        self, values: Any, target: str, step: str, path: Path | None = None, who: str = ""
    ) -> dict[str, str]:
        """NoETL's names for a finished step's result, ``output`` and the legacy ``result``, as `values`
        read them (unless a step or a workload key has the name), each renamed `target`; a warning at
        `path` for each (None: the template checks warn, as in arcs)."""
        found: dict[str, str] = {
            n: target for n in ("output", "result") if n in reads(values) and n not in self.taken
        }
        if path is not None:
            for n in found:
                self.warn(
                    path,
                    f"{who}: '{n}' in a step's 'set' is NoETL's name for the step's result; canonical: the "
                    f"step's name ('{{{{ {step} }}}}')",
                )
        return found


def add_patches(
    task: dict[str, Any], patches: dict[str, dict[str, Any]], dos: tuple[str, ...], *, create: bool = True
) -> bool:
    """Add ``set_ctx``/``set_iter`` to the rules of ``task`` whose ``do`` is in ``dos`` (and, when
    ``continue`` is in ``dos`` and the policy has no ``else``, a last rule that continues an ``ok``
    outcome: an error no rule matches still fails the task). False when the policy is malformed (the
    validator reports it)."""
    spec = task.get("spec")
    if spec is None:
        if not create:
            return True
        spec = task["spec"] = {}
    if not isinstance(spec, dict):
        return False
    policy = spec.get("policy")
    if policy is None:
        if not create:
            return True
        spec["policy"] = {"rules": [{"when": OK, "then": {"do": "continue", **_copy(patches)}}]}
        return True
    rules = policy.get("rules") if isinstance(policy, dict) else None
    if not isinstance(rules, list):
        return False
    has_else = False
    for rule in rules:
        if not isinstance(rule, dict):
            return False
        has_else = has_else or "else" in rule
        then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
        if not isinstance(then, dict):
            return False
        if then.get("do", "continue") in dos:
            for key, values in patches.items():
                merged = dict(then.get(key) or {}) if isinstance(then.get(key) or {}, dict) else None
                if merged is None:
                    return False
                merged.update(values)
                then[key] = merged
    if not has_else and "continue" in dos:
        rules.append({"when": OK, "then": {"do": "continue", **_copy(patches)}})
    return True


def _thens(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``then`` mappings of the rules of a task's policy (an ``else``'s too)."""
    spec = task.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    rules = policy.get("rules") if isinstance(policy, dict) else None
    out: list[dict[str, Any]] = []
    for rule in rules if isinstance(rules, list) else ():
        if isinstance(rule, dict):
            then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
            if isinstance(then, dict):
                out.append(then)
    return out


def _copy(patches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: dict(v) for k, v in patches.items()}


def _condition(when: Any) -> bool:
    """What the validator accepts as an arc's ``when``: a boolean or one template expression."""
    return isinstance(when, bool) or inner(when) is not None


def _and(*parts: str | None) -> str:
    items = [p for p in parts if p]
    return " and ".join(f"({p})" if len(items) > 1 and (" or " in p or " if " in p) else p for p in items)


FAILURE_NAMES = frozenset({"step.failed", "call.error"})
SUCCESS_NAMES = frozenset({"loop.done", "call.done"})
EITHER_NAMES = frozenset({"step.exit"})


def _tested_events(when: Any) -> frozenset[str] | None:
    """The boundary names an arc condition requires (``event.name == ...``); None: it does not say."""
    try:
        return split_event(when).events
    except SplitError:
        return None


def normalize(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    dialect = Dialect(origins, smap)
    workflow = data.get("workflow") if isinstance(data, dict) else None
    if not isinstance(workflow, list):
        return dialect.diagnostics
    names = {str(s.get("step")) for s in workflow if isinstance(s, dict)}
    workload = data.get("workload")
    dialect.taken = names | (set(map(str, workload)) if isinstance(workload, dict) else set())
    out: list[Any] = []
    for i, step in enumerate(workflow):
        out.append(step)
        if isinstance(step, dict):
            added = dialect.step(step, ("workflow", i), names)
            if added is not None:
                out.append(added)
    if len(out) != len(workflow):
        workflow[:] = out
    for path, name, task in _workbook(data):
        dialect._policy(task, path, f"workbook '{name}' task '{name}'", [name], 0)
    return dialect.diagnostics


def call_names(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    """Only ``'call.done'``/``'call.error'`` in arc conditions (`normalize` does it too). ``migrate`` runs
    it before the legacy translation, which spells ``'call.done'`` as both boundaries
    (``in ['step.done', 'loop.done']``) where the step has one."""
    dialect = Dialect(origins, smap)
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        if isinstance(step, dict):
            dialect.calls(step, ("workflow", i), f"step '{step.get('step')}'")
    return dialect.diagnostics


def _workbook(data: Any) -> list[tuple[Path, str, dict[str, Any]]]:
    """The root workbook's templates (authored path, name, task body), in its list or mapping shape."""
    raw = data.get("workbook") if isinstance(data, dict) else None
    out: list[tuple[Path, str, dict[str, Any]]] = []
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            if isinstance(item, dict) and "name" in item:
                body, path = (
                    (item["tool"], ("workbook", i, "tool")) if "tool" in item else (item, ("workbook", i))
                )
                if isinstance(body, dict):
                    out.append((path, str(item["name"]), body))
    elif isinstance(raw, dict):
        base: Path = ("workbook",)
        if set(raw) == {"tasks"} and isinstance(raw["tasks"], dict):
            raw, base = raw["tasks"], ("workbook", "tasks")
        out += [((*base, k), str(k), v) for k, v in raw.items() if isinstance(v, dict)]
    return out


__all__ = ["add_patches", "call_names", "has_dialect", "normalize"]
