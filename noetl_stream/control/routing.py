"""Routing helpers: event names that also answer to their legacy aliases."""

from __future__ import annotations

from noetl_stream.events import LEGACY_ALIASES


class EventName(str):
    """``event.name`` in arc conditions: equal to its canonical name and to legacy aliases.

    Many real playbooks test ``event.name == 'call.done'``; ``call.done`` matches the
    success boundaries, ``call.error`` the failure, ``step.exit`` any boundary.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            if str.__eq__(self, other):
                return True
            aliases = LEGACY_ALIASES.get(other)
            return aliases is not None and str(self) in aliases
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = str.__hash__
