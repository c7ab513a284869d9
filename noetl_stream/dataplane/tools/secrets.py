"""``secrets``: read a keychain entry for later tasks of the same pipeline.

``auth: <name>`` (or ``secret: <name>``) names the entry; ``field`` (or ``key``) picks one field, else
the result is the mapping of all its fields. The outcome is marked ``secret``: later tasks of the
same pipeline read the value by task name (``{{ token_task }}``, ``{{ token_task.password }}``), while
the pipeline replaces it (and every occurrence of its text in any other payload of that pipeline run)
with ``"***"`` in ``task.done``, boundary events and logs. A step's result never carries a secret.
"""

from __future__ import annotations

from typing import Any

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.errors import ConfigurationError
from noetl_stream.kv.keychain import CredentialNotFoundError


async def run_secrets(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    name = config.get("auth", config.get("secret"))
    field = config.get("field", config.get("key"))
    if not isinstance(name, str) or not name:
        return Outcome.fail("config_error", "secrets task needs 'auth' (the keychain entry's name)")
    if field is not None and not isinstance(field, str):
        return Outcome.fail("config_error", "'field' must be a field name")
    try:
        cred = await ctx.credential(name)
    except CredentialNotFoundError as exc:
        return Outcome.fail("credential_error", str(exc))
    except KeyError:
        return Outcome.fail("credential_error", f"no keychain entry {name!r}")
    except ConfigurationError as exc:
        return Outcome.fail("credential_error", str(exc))
    kind = cred.get("kind")
    fields = {k: v for k, v in cred.items() if k != "kind"}
    info = {"name": name, "kind": kind, "field": field}
    if field is None:
        return Outcome(status="ok", result=fields, secret=True, helpers={"secrets": info})
    if field not in fields:
        return Outcome.fail(
            "credential_error", f"keychain entry {name!r} has no field {field!r}", secrets=info
        )
    return Outcome(status="ok", result=fields[field], secret=True, helpers={"secrets": info})
