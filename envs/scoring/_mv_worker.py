"""math-verify worker process (run as ``python -m envs.scoring._mv_worker``).

Protocol: one JSON object per line on stdin, one JSON object per line on stdout.

Request: ``{"pairs": [[gold, pred], ...], "parse_timeout": int, "verify_timeout": int}`` (candidate
LaTeX strings without ``$``, tried in order; the answer is equal when any pair verifies).
Reply: ``{"equal": bool}`` or ``{"error": str}``. On start the worker prints ``{"ready": true}``.

It runs in its own process so that the caller can enforce a hard wall-clock limit by killing it: inside
this process math-verify's signal-based time limits work (they need the main thread), and the parent
kills the process if even those do not fire (time spent inside C code). The worker exits on EOF of
stdin, i.e. when its parent goes away.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import OrderedDict


def main() -> int:
    """Serve requests until stdin closes. Returns the exit status."""
    logging.disable(logging.CRITICAL)  # math-verify warns on every timeout; the parent reports
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    cache: OrderedDict[tuple[str, int], list] = OrderedDict()

    def parsed(s: str, t: int) -> list:
        key = (s, t)
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        res = parse("$" + s + "$", extraction_config=configs, parsing_timeout=t)
        cache[key] = res
        if len(cache) > 4096:
            cache.popitem(last=False)
        return res

    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the reply stream
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            pt = max(1, int(req.get("parse_timeout", 2)))
            vt = max(1, int(req.get("verify_timeout", 2)))
            equal = False
            for g, p in req["pairs"]:
                gp = parsed(g, pt)
                pp = parsed(p, pt) if gp else None
                if gp and pp and verify(gp, pp, timeout_seconds=vt):
                    equal = True
                    break
            reply = {"equal": equal}
        except Exception as err:  # noqa: BLE001 - a worker must answer every request
            reply = {"error": f"{type(err).__name__}: {err}"[:300]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
