"""`python -I -m daemon.runtime.sandbox`: see entry.py."""

import sys

from daemon.runtime.sandbox.entry import main

sys.exit(main())
