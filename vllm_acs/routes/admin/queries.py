"""The admin routes' query parameters, read with their bounds: a value outside them, or a
parameter the route does not read, is a 400 naming the parameter. API server process."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from ...errors import InvalidRequest, echoed

_PERIOD = re.compile(r"\d{4}-(0[1-9]|1[0-2])")
TEXT_MAX = 200


def only(params: Mapping[str, str], names: Collection[str]) -> None:
    """A 400 for a query parameter the route does not read, as for an unknown body field: a
    misspelt filter (`?staus=all`) would otherwise answer as if it were not there."""
    for name in params:
        if name not in names:
            known = ", ".join(sorted(names)) or "none"
            raise InvalidRequest(
                f"Unknown query parameter '{echoed(name)}' (this route reads: {known}).",
                param=echoed(name),
            )


def choice(params: Mapping[str, str], name: str, options: Sequence[str]) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if value not in options:
        raise InvalidRequest(f"'{name}' must be one of: {', '.join(options)}.", param=name)
    return value


def integer(params: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if not re.fullmatch(r"\d{1,16}", value) or not low <= int(value) <= high:
        raise InvalidRequest(f"'{name}' must be a whole number from {low} to {high}.", param=name)
    return int(value)


def text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not 1 <= len(value) <= TEXT_MAX:
        raise InvalidRequest(f"'{name}' must be 1-{TEXT_MAX} characters.", param=name)
    return value


def period(params: Mapping[str, str], default: str) -> str:
    value = params.get("period")
    if value is None:
        return default
    if not _PERIOD.fullmatch(value):
        raise InvalidRequest("'period' must be a UTC month, YYYY-MM.", param="period")
    return value
