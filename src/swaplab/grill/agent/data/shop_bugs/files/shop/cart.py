"""A shopping cart: lines of (sku, unit price in cents, quantity)."""

from shop.pricing import apply_discount, with_tax


class Cart:
    def __init__(self):
        self.lines = []

    def add(self, sku, unit_cents, quantity=1):
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        self.lines.append((sku, unit_cents, quantity))

    def subtotal(self):
        """The sum of the lines, in cents."""
        return sum(unit_cents for _, unit_cents, quantity in self.lines)

    def total(self, discount_percent=0, tax_percent=0):
        """The subtotal with the discount taken off, then tax added."""
        return with_tax(apply_discount(self.subtotal(), discount_percent), tax_percent)
