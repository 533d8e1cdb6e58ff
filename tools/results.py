"""``python tools/results.py ARGS`` = ``fedshield results page ARGS`` (fedshield.results.make)."""

import sys

from fedshield.results.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["page", *sys.argv[1:]]))
