# Reads its input file from the workspace and leaves its upper-cased copy,
# and a symlink pointing outside, in its output directory.
import os

ws = os.environ["AIRLOCK_WORKSPACE"]
out = os.environ["AIRLOCK_OUTPUT_DIR"]
with open(os.path.join(ws, "in/note.txt")) as f:
    text = f.read()
with open(os.path.join(out, "note.txt"), "w") as f:
    f.write(text.upper())
os.symlink("/etc/passwd", os.path.join(out, "leak"))
print("done", flush=True)
