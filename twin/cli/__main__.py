"""``python -m twin.cli``: the ``twin`` command."""

import sys

from twin.cli import main

if __name__ == "__main__":
    sys.exit(main())
