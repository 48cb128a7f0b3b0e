"""`python -m vllm_acs.cli ...`: the same as `vllm-acs ...`."""

import sys

from . import main

sys.exit(main())
