"""The REST edge: an aiohttp app served by the controller process (``controller --http``)."""

from noetl_stream.api.app import build_app
from noetl_stream.api.http import ApiContext
from noetl_stream.api.server import ApiServer, parse_listen, tokens_from

__all__ = ["ApiContext", "ApiServer", "build_app", "parse_listen", "tokens_from"]
