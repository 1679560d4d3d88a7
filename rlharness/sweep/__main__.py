"""`python -m rlharness.sweep ...`"""

import sys

from rlharness.sweep import main

sys.exit(main())
