"""`python -m cli ...`: the `onthejob` command (torchrun and the tests start it so)."""

from __future__ import annotations

import sys

from cli.main import main

sys.exit(main())
