"""swaplab: one endpoint in front of many local inference servers."""

__version__ = "0.1.0"
