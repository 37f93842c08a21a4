"""``python -m devicehost``: the same as the ``devicehost`` command."""

from devicehost.host.cli import main

raise SystemExit(main())
