"""``python -m node_agent.remote.schema FILE...``: check saved wire messages.

Each file holds one message (JSON). Checked as the applier checks it:
version, schema, digest, then the rules that span fields. Prints one line
per file; exits 0 when all are valid, 1 when one is refused, 2 when one
cannot be read as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from node_agent.remote import wire


def main(argv: Optional[Sequence[str]] = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m node_agent.remote.schema MESSAGE.json...", file=sys.stderr)
        return 2
    worst = 0
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                message = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read a JSON message: {exc}", file=sys.stderr)
            worst = 2
            continue
        try:
            wire.check_outgoing(message)
        except wire.Malformed as exc:
            print(f"{path}: refused: {exc}")
            worst = max(worst, 1)
        else:
            kind = "heartbeat" if "body" not in message else "full message"
            print(f"{path}: valid wire format {message['version']} {kind}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
