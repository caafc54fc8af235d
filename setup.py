"""setuptools' build hook: every wheel and sdist carries the web page's two libraries.

`tools/ui_vendor.py` (which `make ui-vendor` runs too) fetches them with npm into
src/swaplab/router/api/static/vendor/ unless they are there already. A build that cannot
get them fails, saying why: a wheel without charts is never made unnoticed. To make one
anyway, set SWAPLAB_UI_VENDOR=skip (the page then says charts need the libraries).
An editable install (`pip install -e .`, as `make install` does) serves the checkout's
own folder and skips the hook: there `make ui-vendor` fetches them.
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import ui_vendor  # noqa: E402

SKIP_VARIABLE = "SWAPLAB_UI_VENDOR"


def vendor() -> None:
    if os.environ.get(SKIP_VARIABLE) == "skip":
        if not ui_vendor.present():
            print(f"\n*** swaplab build: {SKIP_VARIABLE}=skip: this build has no uPlot or ansi_up;"
                  " the web page will have no charts and no log colours ***\n", file=sys.stderr)
        return
    try:
        ui_vendor.fetch()
    except ui_vendor.VendorUnavailable as error:
        raise SystemExit(
            f"swaplab build: the web page's libraries ({', '.join(ui_vendor.PACKAGES)}) are not in"
            f" {ui_vendor.VENDOR_DIR}, and {error}. Install npm (the build fetches them), or fetch them"
            f" once with `python3 tools/ui_vendor.py`, or set {SKIP_VARIABLE}=skip for a wheel without"
            " charts and log colours."
        )


class BuildPyWithVendor(build_py):
    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            vendor()
        super().run()


class SdistWithVendor(sdist):
    # The sdist carries the files too, so a wheel built from it (pip install swaplab.tar.gz) needs no npm.
    def run(self) -> None:
        vendor()
        super().run()


setup(cmdclass={"build_py": BuildPyWithVendor, "sdist": SdistWithVendor})
