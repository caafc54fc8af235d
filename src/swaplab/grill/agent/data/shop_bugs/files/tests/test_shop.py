from shop.cart import Cart
from shop.pricing import apply_discount, with_tax


def test_discount():
    assert apply_discount(1000, 10) == 900
    assert apply_discount(1000, 0) == 1000


def test_tax():
    assert with_tax(1000, 20) == 1200


def test_subtotal_counts_quantities():
    cart = Cart()
    cart.add("apple", 50, quantity=3)
    cart.add("pear", 80)
    assert cart.subtotal() == 230


def test_total_with_discount_and_tax():
    cart = Cart()
    cart.add("book", 2000, quantity=2)
    assert cart.total(discount_percent=25, tax_percent=10) == 3300
