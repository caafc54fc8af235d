"""The per-model catalogue: static pages from the config, the results store and the notes, and the same pages live."""

from swaplab.catalog.build import build_site
from swaplab.catalog.render import SiteRenderer
from swaplab.catalog.site import Site, gather, read_site

__all__ = ["Site", "SiteRenderer", "build_site", "gather", "read_site"]
