"""swaplab grill: the quality suite (code, agentic tool use, long-context recall) and its scoring."""
