from reports.daily import daily_report
from reports.weekly import weekly_summary


def test_daily():
    assert daily_report("Mon", [("Ann", 1250), ("Bo", 99)]) == "Sales on Mon\n  Ann: $12.50\n  Bo: $0.99\nTotal: $13.49"


def test_weekly():
    assert weekly_summary({"Mon": 123456, "Tue": 500}) == "Best day: Mon ($1,234.56); week: $1,239.56"
