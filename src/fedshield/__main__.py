import sys

from fedshield.cli import main

sys.exit(main())
