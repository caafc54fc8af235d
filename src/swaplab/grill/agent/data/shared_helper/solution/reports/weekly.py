"""The weekly summary."""

from reports.money import format_money


def weekly_summary(totals_by_day):
    """The best day and the week's total; `totals_by_day` maps a day to its cents."""
    best = max(totals_by_day, key=totals_by_day.get)
    week = sum(totals_by_day.values())
    return f"Best day: {best} ({format_money(totals_by_day[best])}); week: {format_money(week)}"
