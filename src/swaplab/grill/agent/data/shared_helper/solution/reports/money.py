"""Money as the reports print it."""


def format_money(cents):
    """Cents as dollars with thousands separators: 123456 -> '$1,234.56', -5 -> '-$0.05'."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars:,}.{rest:02d}"
