"""The demo HTTP API the playbooks of this directory read: ``python playbooks/services/api.py``.

A small, deterministic shop API (aiohttp; no database, the data is generated):

``GET /regions``                                   ``{"regions": ["north", ...]}``
``GET /orders?region=R&page=P&page_size=Z``        one page of a region's orders:
    ``{"data": [{id, region, customer, amount, ordered_at}, ...], "paging": {page, page_size, total, has_more}}``
    (404 for an unknown region, 400 for a bad page or page size)
``GET /customers/{id}``                            ``{id, name, tier}`` (404 if unknown)

``--list north,atlantis`` makes ``/regions`` list those names instead (an unknown one then fails with 404).
``--flaky`` makes the first request for page 2 of every region answer ``503`` with ``Retry-After: 0``,
so the playbooks' retry policies have something to do. The tests import `make_app` / `ShopApi`.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import socket
from collections.abc import Sequence
from typing import Any

from aiohttp import web

REGIONS = ("north", "south", "east", "west")
TIERS = ("bronze", "silver", "gold")
CUSTOMERS = 12
EPOCH = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def customer(cid: int) -> dict[str, Any]:
    return {"id": cid, "name": f"customer-{cid:02d}", "tier": TIERS[cid % len(TIERS)]}


def orders(per_region: int) -> list[dict[str, Any]]:
    """Every order, ids 1..N, region by region (the same list on every call)."""
    out: list[dict[str, Any]] = []
    for r, region in enumerate(REGIONS):
        for i in range(per_region + 3 * r):  # regions of different sizes: 3 more orders each
            oid = len(out) + 1
            out.append(
                {
                    "id": oid,
                    "region": region,
                    "customer": 1 + (oid * 7) % CUSTOMERS,
                    "amount": round(5 + (oid * 37) % 90 + 0.25 * (oid % 4), 2),
                    "ordered_at": (EPOCH + datetime.timedelta(hours=oid * 5 + i)).isoformat(),
                }
            )
    return out


class ShopApi:
    def __init__(self, per_region: int = 23, flaky: bool = False, listed: Sequence[str] = REGIONS) -> None:
        self.orders = orders(per_region)
        self.flaky = flaky
        self.listed = list(listed)
        self.calls: collections.Counter[str] = collections.Counter()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/regions", self._regions)
        app.router.add_get("/orders", self._orders)
        app.router.add_get("/customers/{id}", self._customer)
        return app

    async def _regions(self, request: web.Request) -> web.Response:
        self.calls["regions"] += 1
        return web.json_response({"regions": self.listed})

    async def _orders(self, request: web.Request) -> web.Response:
        region = request.query.get("region", "")
        try:
            page = int(request.query.get("page", "1"))
            size = int(request.query.get("page_size", "10"))
        except ValueError:
            return web.json_response({"error": "page and page_size must be integers"}, status=400)
        if page < 1 or not 1 <= size <= 500:
            return web.json_response({"error": "page >= 1, 1 <= page_size <= 500"}, status=400)
        key = f"orders/{region}/{page}"
        self.calls[key] += 1
        if region not in REGIONS:
            return web.json_response({"error": f"no region {region!r}"}, status=404)
        if self.flaky and page == 2 and self.calls[key] == 1:
            return web.json_response({"error": "busy, try again"}, status=503, headers={"Retry-After": "0"})
        rows = [o for o in self.orders if o["region"] == region]
        chunk = rows[(page - 1) * size : page * size]
        paging = {"page": page, "page_size": size, "total": len(rows), "has_more": page * size < len(rows)}
        return web.json_response({"data": chunk, "paging": paging})

    async def _customer(self, request: web.Request) -> web.Response:
        self.calls["customers"] += 1
        try:
            cid = int(request.match_info["id"])
        except ValueError:
            cid = 0
        if not 1 <= cid <= CUSTOMERS:
            return web.json_response({"error": "no such customer"}, status=404)
        return web.json_response(customer(cid))


def make_app(per_region: int = 23, flaky: bool = False, listed: Sequence[str] = REGIONS) -> web.Application:
    return ShopApi(per_region, flaky, listed).app()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--per-region", type=int, default=23, help="orders of the smallest region")
    parser.add_argument("--flaky", action="store_true", help="503 once for page 2 of every region")
    parser.add_argument(
        "--list", default=",".join(REGIONS), help="the regions /regions lists (comma-separated)"
    )
    args = parser.parse_args()
    with socket.socket() as probe:  # a clear message instead of a traceback when the port is taken
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((args.host, args.port))
        except OSError as exc:
            raise SystemExit(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    web.run_app(
        make_app(args.per_region, args.flaky, [r for r in args.list.split(",") if r]),
        host=args.host,
        port=args.port,
        access_log=None,
    )


if __name__ == "__main__":
    main()
