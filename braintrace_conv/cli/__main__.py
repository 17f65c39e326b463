"""``python -m braintrace_conv.cli``: the ``braintrace-conv`` command."""
import sys

from . import main

sys.exit(main())
