"""The daily sales report."""

from reports.money import format_money


def daily_report(day, sales):
    """One line per sale, then the total; `sales` are (customer, cents)."""
    lines = [f"Sales on {day}"]
    for customer, cents in sales:
        lines.append(f"  {customer}: {format_money(cents)}")
    lines.append(f"Total: {format_money(sum(cents for _, cents in sales))}")
    return "\n".join(lines)
