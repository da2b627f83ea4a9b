"""``python -m tailrace ...`` is the ``tailrace`` command."""

from tailrace.cli import main

raise SystemExit(main())
