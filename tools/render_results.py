"""``python tools/render_results.py ARGS`` = ``fedshield results render ARGS``
(fedshield.results.render)."""

import sys

from fedshield.results.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["render", *sys.argv[1:]]))
