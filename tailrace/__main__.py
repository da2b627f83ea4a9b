"""``python -m tailrace ...`` is the ``tailrace`` command."""

import sys

try:
    from tailrace.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command is still importing: no traceback either
    sys.exit(130)

raise SystemExit(main())
