"""``python -m node_agent.applier``: the same as ``node-agent-applier``."""

import sys

from node_agent.applier.applier import main

sys.exit(main())
