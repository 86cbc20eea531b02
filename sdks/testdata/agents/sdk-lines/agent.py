# The SDKs' test agent: one request its network refuses (an egress record),
# ten log lines 0.3 s apart (a stream to cut and resume), then its result.
import json
import os
import time
import urllib.error
import urllib.request

with open(os.environ["AIRLOCK_PROMPT_FILE"]) as f:
    prompt = f.read()
try:
    # Through the sidecar's forward proxy (HTTP_PROXY), which refuses it: the
    # run's network is "none". No packet leaves the sandbox.
    urllib.request.urlopen("http://refused.test/sdk", timeout=10)
    refused = False
except urllib.error.HTTPError as e:
    refused = e.code == 403
for i in range(10):
    print(f"line {i} {prompt}", flush=True)
    time.sleep(0.3)
with open(os.environ["AIRLOCK_RESULT_FILE"], "w") as f:
    json.dump({"echo": prompt, "refused": refused}, f)
