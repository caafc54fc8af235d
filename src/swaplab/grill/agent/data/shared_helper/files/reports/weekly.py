"""The weekly summary."""


def format_money(cents):
    """Cents as dollars with thousands separators: 123456 -> '$1,234.56', -5 -> '-$0.05'."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars:,}.{rest:02d}"


def weekly_summary(totals_by_day):
    """The best day and the week's total; `totals_by_day` maps a day to its cents."""
    best = max(totals_by_day, key=totals_by_day.get)
    week = sum(totals_by_day.values())
    return f"Best day: {best} ({format_money(totals_by_day[best])}); week: {format_money(week)}"
