"""``{{ keychain.<name> }}``: the worker resolves a step's keychain declarations before it runs (and all
of a playbook's, for the controller's keychain check before its workflow starts).

Providers, chosen by the declaration's fields:

* ``env: VAR`` — the value of an environment variable of the worker (``{value: ...}``);
* ``file: PATH`` — a file on the worker (e.g. a Kubernetes secret mount): a JSON object gives its fields,
  anything else ``{value: <text>}``;
* otherwise the encrypted credential store in NATS KV (``noetl-stream keychain set``).

Resolved values are redacted from everything the step reports (events, results, errors, logs), also
in the forms a task may send them in (URL-encoded, a Basic authorization token: `secret_strings`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from noetl_stream.dataplane.tools.base import WorkerServices
from noetl_stream.errors import NoetlError
from noetl_stream.kv.keychain import secret_strings
from noetl_stream.protocol.wire import KeychainDecl


class CredentialError(NoetlError):
    """A declared credential is not available to this worker; `entry` names it (the message too)."""

    def __init__(self, message: str, entry: str) -> None:
        super().__init__(message)
        self.entry = entry


async def resolve_keychain(
    decls: list[KeychainDecl], services: WorkerServices | None
) -> tuple[dict[str, Any], set[str]]:
    """``({name: fields}, strings to redact)`` for the declarations; raises ``CredentialError``."""
    resolved: dict[str, Any] = {}
    secrets: set[str] = set()
    for decl in decls:
        cfg = decl.config
        try:
            if "env" in cfg:
                fields: dict[str, Any] = {"value": os.environ[str(cfg["env"])]}
            elif "file" in cfg:
                text = Path(str(cfg["file"])).read_text(encoding="utf-8")
                try:
                    loaded = json.loads(text)
                except ValueError:
                    loaded = None
                fields = loaded if isinstance(loaded, dict) else {"value": text.strip()}
            else:
                if services is None or services.credentials is None:
                    raise KeyError(decl.name)
                fields = dict(await services.credentials(decl.name))
        except KeyError:
            if "env" in cfg:
                message = f"keychain entry '{decl.name}' is not available (environment variable {cfg['env']})"
            else:  # the same words as a tool's `auth:` lookup of the store
                message = f"no keychain entry '{decl.name}' in the keychain store"
            raise CredentialError(message, decl.name) from None
        except OSError as exc:
            raise CredentialError(
                f"keychain entry '{decl.name}': cannot read {cfg['file']}: {exc.strerror}", decl.name
            ) from None
        except NoetlError as exc:
            raise CredentialError(f"keychain entry '{decl.name}': {exc}", decl.name) from None
        fields.setdefault("kind", decl.kind)
        resolved[decl.name] = fields
        secrets |= secret_strings(fields)  # the values and the encoded forms a tool sends them in
    return resolved, secrets
