"""`swaplab sim`: a scriptable OpenAI-compatible server for exact timing and fault injection."""

from swaplab.sim.server import Sim, SimSettings, SimStats, run

__all__ = ["Sim", "SimSettings", "SimStats", "run"]
