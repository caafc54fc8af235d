"""The SQLite store every part of swaplab records into (the router's activity, bench and grill runs) and its statistics.

`store` is the file (where it lives, its schema, its migrations); `activity` and
`writer` the router's requests; `runs` the bench and grill runs; `report` their JSON
reports; `stats` the statistics; `present` how commands show them. Nothing is imported
here, so a command that never opens the store doesn't load it.
"""
