"""Backend processes: supervision, the swap decision and the one owner of their state."""

from swaplab.fleet.backend import Backend, State
from swaplab.fleet.fleet import Fleet
from swaplab.fleet.logs import LogHub

__all__ = ["Backend", "Fleet", "LogHub", "State"]
