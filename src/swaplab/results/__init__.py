"""The SQLite store every part of swaplab records into: the router's activity, later bench runs."""

from swaplab.results.activity import ActivityRecord, recent_activity
from swaplab.results.store import StoreVersionError, connect, default_path
from swaplab.results.writer import ActivityWriter

__all__ = ["ActivityRecord", "ActivityWriter", "StoreVersionError", "connect", "default_path", "recent_activity"]
