"""Confirm the payments of the orders `place_orders` placed, as the payment provider would:
one `payment_confirmed` event per order on `<ns>.events` (the declined order and the
unconfirmed express order get none).

    python -m examples.orders.confirm_payments --key-prefix shop-1a2b3c4d- --orders 40 --seed 7

Each event is `{"name": "payment_confirmed", "correlation": ORDER_ID, "id": "pay-ORDER_ID",
"payload": {...}}`; the order's id is its business key, which the workflow's wait matches
(`match="input.order_id"`). Sending them again changes nothing (same ids). Reads
SASFLOW_BROKER_URL and SASFLOW_NAMESPACE like every sasflow command.
"""

from __future__ import annotations

import json

import click

from examples.orders.shop import confirm_payments
from sasflow import SasflowError, Settings
from sasflow.demo.scenario import DEFAULT_ORDERS, DEFAULT_SEED, MIN_ORDERS


@click.command()
@click.option("--key-prefix", required=True, help="What place_orders printed as key_prefix.")
@click.option(
    "--orders",
    type=click.IntRange(MIN_ORDERS, 100_000),
    default=DEFAULT_ORDERS,
    show_default=True,
    help="Orders placed.",
)
@click.option(
    "--seed", type=int, default=DEFAULT_SEED, show_default=True, help="Seed of the scenario."
)
def main(key_prefix: str, orders: int, seed: int) -> None:
    """Publish a payment confirmation for every order but the declined one."""
    try:
        sent = confirm_payments(Settings(), key_prefix, orders, seed)
    except SasflowError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps({"confirmed": sent, "key_prefix": key_prefix}))


if __name__ == "__main__":
    main()
