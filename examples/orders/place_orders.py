"""Place the example's orders (the demo's, with lines: shop.py) on `<ns>.submit`, as a shop
front would.

    python -m examples.orders.place_orders --orders 40 --seed 7

Reads SASFLOW_BROKER_URL and SASFLOW_NAMESPACE like every sasflow command; prints the business
key prefix of the orders it placed (as JSON), to find them with `sasflow runs list`.
"""

from __future__ import annotations

import json

import click

from examples.orders.shop import place_orders
from sasflow import SasflowError, Settings
from sasflow.demo.scenario import DEFAULT_ORDERS, DEFAULT_SEED, MIN_ORDERS


@click.command()
@click.option(
    "--orders",
    type=click.IntRange(MIN_ORDERS, 100_000),
    default=DEFAULT_ORDERS,
    show_default=True,
    help="Orders to place.",
)
@click.option(
    "--seed",
    type=int,
    default=DEFAULT_SEED,
    show_default=True,
    help="Seed of the scenario (which order meets which trouble).",
)
def main(orders: int, seed: int) -> None:
    """Publish the scenario's orders to the submission queue."""
    try:
        prefix = place_orders(Settings(), orders, seed)
    except SasflowError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps({"published": orders, "key_prefix": prefix}))


if __name__ == "__main__":
    main()
