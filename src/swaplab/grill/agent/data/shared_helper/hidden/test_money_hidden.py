from reports.daily import daily_report
from reports.money import format_money
from reports.weekly import weekly_summary


def test_format_money():
    assert format_money(123456) == "$1,234.56"
    assert format_money(-5) == "-$0.05"
    assert format_money(0) == "$0.00"
    assert format_money(100000000) == "$1,000,000.00"


def test_reports_unchanged():
    assert daily_report("Sun", []) == "Sales on Sun\nTotal: $0.00"
    assert weekly_summary({"Fri": -250}) == "Best day: Fri (-$2.50); week: -$2.50"


def test_one_definition_shared_by_both_reports():
    import inspect

    from reports import daily, money, weekly

    for module in (daily, weekly):
        assert "def format_money" not in inspect.getsource(module), module.__name__
        assert getattr(module, "format_money", money.format_money) is money.format_money, module.__name__
