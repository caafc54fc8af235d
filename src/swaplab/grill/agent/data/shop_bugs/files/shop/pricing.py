"""Prices in cents, and what discounts do to them."""


def apply_discount(cents, percent):
    """`cents` reduced by `percent` per cent, rounded to the nearest cent."""
    if not 0 <= percent <= 100:
        raise ValueError("a discount is between 0 and 100 per cent")
    return round(cents * percent / 100)


def with_tax(cents, rate_percent):
    """`cents` plus tax at `rate_percent`, rounded to the nearest cent."""
    return round(cents * (100 + rate_percent) / 100)
