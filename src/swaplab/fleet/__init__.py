"""Backend processes: supervision, the swap decision and the one owner of their state."""

from swaplab.fleet.fleet import Fleet
from swaplab.fleet.logs import LogHub
from swaplab.fleet.process import Backend, State

__all__ = ["Backend", "Fleet", "LogHub", "State"]
