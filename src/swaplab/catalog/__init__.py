"""The per-model catalogue: static pages from the config, the results store and the notes, and the same pages live.

Nothing is imported here: `swaplab site` parses its arguments without loading jinja2
(`swaplab.catalog.build.build_site` is the library call).
"""
