"""A tiny shop: carts, prices and discounts."""
