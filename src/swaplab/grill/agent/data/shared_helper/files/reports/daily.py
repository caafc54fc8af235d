"""The daily sales report."""


def format_money(cents):
    """Cents as dollars with thousands separators: 123456 -> '$1,234.56', -5 -> '-$0.05'."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars:,}.{rest:02d}"


def daily_report(day, sales):
    """One line per sale, then the total; `sales` are (customer, cents)."""
    lines = [f"Sales on {day}"]
    for customer, cents in sales:
        lines.append(f"  {customer}: {format_money(cents)}")
    lines.append(f"Total: {format_money(sum(cents for _, cents in sales))}")
    return "\n".join(lines)
