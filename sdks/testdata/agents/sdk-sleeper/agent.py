# The SDKs' test agent that runs until it is cancelled.
import time

print("sleeping", flush=True)
time.sleep(120)
