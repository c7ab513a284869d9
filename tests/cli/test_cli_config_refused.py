"""Configuration a command cannot work with, refused before it connects: exit 2 and one line naming
what is wrong (the ``--processes`` supervisor stops restarting on exit 2). An operator's probe found
options taken as given (a negative ``--grace``), tracebacks (``--concurrency 0``, ``--log-level
nonsense``), an unknown ``NOETL_EVENT_LOOP`` run without a word, and ``--nats http://...`` answered
with "Name or service not known"."""

from __future__ import annotations

import pytest
from test_cli_errors import one_error_line, usage_error
from test_cli_run import noetl

# Nothing listens on port 1; a worker or a controller waits for NATS without a limit, so a check made
# only after connecting never answers (the subprocess times out).
UNREACHABLE = "nats://127.0.0.1:1"
EXPECTED_FORM = "expected nats://HOST:PORT (or tls://, ws://, wss://), several comma-separated for a cluster"


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--concurrency", "0"],
        ["worker", "--concurrency", "-3"],
        ["worker", "--grace", "-1"],
        ["controller", "--grace", "-5"],
        ["worker", "--log-level", "nonsense"],
        ["controller", "--log-level", "nonsense"],
    ],
)
def test_a_meaningless_worker_or_controller_option_is_a_usage_error_before_connecting(
    args: list[str],
) -> None:
    """Exit 2 (usage) and the option named; the rest of the line is click's."""
    proc = noetl(*args, "--nats", UNREACHABLE, timeout=30)
    assert args[1] in usage_error(proc)


def test_log_levels_are_taken_in_any_case() -> None:
    # The level is checked first (options are processed in the order given): WARNING passes, and
    # the error is about the concurrency.
    proc = noetl("worker", "--log-level", "WARNING", "--concurrency", "0", "--nats", UNREACHABLE, timeout=30)
    line = usage_error(proc)
    assert "--concurrency" in line and "--log-level" not in line


def test_an_executions_page_out_of_range_is_refused_before_connecting() -> None:
    proc = noetl("executions", "--limit", "0", "--nats", UNREACHABLE, env={"NOETL_CONNECT_WAIT_S": "1"})
    assert one_error_line(proc, 2) == "error: 'limit' must be between 1 and 1000"
    proc = noetl("executions", "--offset", "-1", "--nats", UNREACHABLE, env={"NOETL_CONNECT_WAIT_S": "1"})
    assert one_error_line(proc, 2) == "error: 'offset' must be >= 0"


@pytest.mark.parametrize("command", [["status", "x"], ["worker"]])
def test_an_unknown_event_loop_is_named_with_the_values_it_takes(command: list[str]) -> None:
    # it ran asyncio's loop without a word
    proc = noetl(
        *command,
        "--nats",
        UNREACHABLE,
        env={"NOETL_EVENT_LOOP": "bogus", "NOETL_CONNECT_WAIT_S": "1"},
        timeout=30,
    )
    assert one_error_line(proc, 2) == "error: NOETL_EVENT_LOOP='bogus': expected uvloop or asyncio"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "http://127.0.0.1:4222",
            "invalid NATS URL 'http://127.0.0.1:4222' (--nats / NOETL_NATS_URL): the scheme must be nats, "
            "tls, ws or wss, not 'http'",
        ),
        (
            "garbage url",
            "invalid NATS URL 'garbage url' (--nats / NOETL_NATS_URL): 'garbage url' is not a host name or "
            "address",
        ),
        (
            "nats://admin:s3cret@",
            "invalid NATS URL 'nats://***@' (--nats / NOETL_NATS_URL): it names no host",
        ),
        (
            "nats://127.0.0.1:4222,https://admin:s3cret@127.0.0.1:4223",
            "invalid NATS URL 'https://***@127.0.0.1:4223' (--nats / NOETL_NATS_URL): the scheme must be",
        ),
    ],
)
@pytest.mark.parametrize("command", [["status", "x"], ["run", "playbooks/hello.yaml"]])
def test_a_nats_url_the_client_cannot_use_is_named_with_the_form_expected(
    command: list[str], url: str, said: str
) -> None:
    # `http://host:4222` was read as the host "http": "Name or service not known"
    proc = noetl(*command, "--nats", url, env={"NOETL_CONNECT_WAIT_S": "1"}, timeout=30)
    line = one_error_line(proc, 2)
    assert line.startswith(f"error: {said}") and line.endswith(EXPECTED_FORM), line
    assert "s3cret" not in proc.stderr and "admin" not in proc.stderr


def test_a_worker_refuses_a_bad_nats_url_from_the_environment_at_once() -> None:
    # it retried the unresolvable host "http" for ever
    proc = noetl("worker", env={"NOETL_NATS_URL": "http://127.0.0.1:4222"}, timeout=30)
    assert "invalid NATS URL 'http://127.0.0.1:4222'" in one_error_line(proc, 2)


def test_websocket_and_plain_urls_cannot_be_mixed() -> None:
    proc = noetl("status", "x", "--nats", "nats://127.0.0.1:1,ws://127.0.0.1:2", timeout=30)
    assert "cannot be mixed" in one_error_line(proc, 2)


@pytest.mark.parametrize("url", ["127.0.0.1:1", "tls://127.0.0.1:1"])
def test_urls_the_client_takes_are_tried(url: str) -> None:
    # HOST:PORT alone is nats:// to the client: refusing it would break a working configuration
    proc = noetl("status", "x", "--nats", url, env={"NOETL_CONNECT_WAIT_S": "1"}, timeout=30)
    assert "cannot connect to NATS at" in one_error_line(proc, 1)
