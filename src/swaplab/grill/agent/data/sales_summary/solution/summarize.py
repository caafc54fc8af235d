"""Summarises data/sales.csv into summary.json."""

import csv
import json
from collections import defaultdict


def summarize(rows):
    revenue = defaultdict(float)
    units = defaultdict(int)
    for row in rows:
        revenue[row["region"]] += int(row["units"]) * float(row["unit_price"])
        units[row["product"]] += int(row["units"])
    return {
        "rows": len(rows),
        "revenue_by_region": {region: round(total, 2) for region, total in sorted(revenue.items())},
        "top_product": max(units, key=units.get),
    }


def main():
    with open("data/sales.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    with open("summary.json", "w") as handle:
        json.dump(summarize(rows), handle, indent=2)


if __name__ == "__main__":
    main()
