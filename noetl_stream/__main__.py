"""``python -m noetl_stream``: the ``noetl-stream`` command (worker processes started by a supervisor use it)."""

from noetl_stream.console import entry

entry()
