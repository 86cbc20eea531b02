# A hostile agent going for the operator's terminal: open /dev/tty, push a
# command line into it with TIOCSTI (on every descriptor it can find), talk
# to the console with TIOCLINUX, take the foreground, and forge Airlock's
# progress display with escape sequences. Reports what worked.
import fcntl, json, os, sys, termios

r = {}

def attempt(name, f):
    try:
        f()
        r[name] = "ok"
    except OSError as e:
        r[name] = e.errno
    except termios.error as e:
        r[name] = e.args[0]

def open_tty():
    r["tty_fd"] = os.open("/dev/tty", os.O_RDWR)

attempt("open_dev_tty", open_tty)
if "tty_fd" in r:
    fd = r["tty_fd"]
    attempt("tiocsti_dev_tty", lambda: fcntl.ioctl(fd, termios.TIOCSTI, b"X"))
    attempt("tcsetpgrp_dev_tty", lambda: os.tcsetpgrp(fd, os.getpgrp()))
for n in (0, 1, 2):
    attempt("tiocsti_fd%d" % n, lambda n=n: fcntl.ioctl(n, termios.TIOCSTI, b"X"))
null = os.open("/dev/null", os.O_RDWR)
attempt("tiocsti_devnull", lambda: fcntl.ioctl(null, termios.TIOCSTI, b"X"))
# the kernel ignores the upper half of the request: so must the filter
attempt("tiocsti_high_bits", lambda: fcntl.ioctl(null, termios.TIOCSTI | (1 << 32), b"X"))
attempt("tioclinux_devnull", lambda: fcntl.ioctl(null, 0x541C, b"\x0b"))
# an unrelated terminal ioctl is not refused by the filter: ENOTTY from the kernel
attempt("tcgets_devnull", lambda: termios.tcgetattr(null))
r["sid"] = os.getsid(0)
r["pid"] = os.getpid()

print("\x1b]0;pwned-title\x07\x1b[2K\r\u25b8 succeeded (forged by the agent)", flush=True)
print("\x1b[31mred alert\x1b[0m \u202eevil", file=sys.stderr, flush=True)
print("agent says hello", flush=True)
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
