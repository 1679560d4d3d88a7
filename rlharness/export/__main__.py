"""`python -m rlharness.export ...`"""

import sys

from rlharness.export import main

sys.exit(main())
