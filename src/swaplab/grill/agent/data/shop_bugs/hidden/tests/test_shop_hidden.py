from shop.cart import Cart
from shop.pricing import apply_discount


def test_full_discount():
    assert apply_discount(999, 100) == 0


def test_discount_rounds_to_a_cent():
    assert apply_discount(999, 15) == 849


def test_discount_out_of_range_refused():
    try:
        apply_discount(100, 120)
    except ValueError:
        return
    raise AssertionError("a 120% discount was accepted")


def test_empty_cart():
    assert Cart().total(discount_percent=50, tax_percent=20) == 0


def test_many_lines():
    cart = Cart()
    for sku, cents, quantity in (("a", 199, 4), ("b", 1, 1), ("c", 1000, 2)):
        cart.add(sku, cents, quantity)
    assert cart.subtotal() == 2797
    assert cart.total(tax_percent=5) == 2937
