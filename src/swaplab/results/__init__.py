"""The SQLite store every part of swaplab records into (the router's activity, bench and grill runs) and its statistics."""

from swaplab.results.activity import ActivityRecord, recent_activity
from swaplab.results.runs import RequestRow, Run, get_run, list_runs, recorded_models, runs_for_models, save_run
from swaplab.results.stats import Comparison, compare, distribution, spread
from swaplab.results.store import StoreVersionError, connect, default_path
from swaplab.results.writer import ActivityWriter

__all__ = [
    "ActivityRecord", "ActivityWriter", "Comparison", "RequestRow", "Run", "StoreVersionError", "compare", "connect",
    "default_path", "distribution", "get_run", "list_runs", "recent_activity", "recorded_models", "runs_for_models",
    "save_run", "spread",
]
