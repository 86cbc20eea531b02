"""Run inside a sandbox by the tests: where a secret could be found.

`holders(needles)` walks the workspace, /tmp and the agent's directory
(not its vendored packages, not the script that asks, which names the
needles) and returns the files holding any of the byte strings `needles`,
and the environment variables holding any of them. The tests copy this file
into the agent's directory (`RealRun::helper`).
"""

import os
import sys


def holders(needles):
    me = os.path.abspath(sys.argv[0])
    here = os.path.dirname(os.path.abspath(__file__))
    files = []
    for root in [os.environ["AIRLOCK_WORKSPACE"], "/tmp", here]:
        for d, _, names in os.walk(root):
            if "/vendor" in d:
                continue
            for f in names:
                path = os.path.join(d, f)
                if path in (me, os.path.abspath(__file__)):
                    continue
                try:
                    data = open(path, "rb").read(4 << 20)
                except OSError:
                    continue
                if any(n in data for n in needles):
                    files.append(path)
    env = [k for k, v in os.environ.items() if any(n.decode() in v for n in needles)]
    return files, env
