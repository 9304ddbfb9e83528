"""Code run *inside* the sandbox, in front of the model's code.

This file is not imported by the host: its source text is handed to the sandboxed interpreter with
``python -I -u -c <source> MODE LIMITS [CTL_FD PIDNS]`` (LIMITS: ``RLIMIT_X=value,...``). It must only use
the standard library and run on any CPython >= 3.8 (the sandbox interpreter is not necessarily the host's).

``-u``: the program's stdout and stderr are unbuffered (every write goes to the pipe at once), so what it printed
before a kill (deadline, CPU limit, a signal, ``os._exit``) is not lost in a buffer of the dead process.

The program runs as module ``__main__``: a fresh module object registered as ``sys.modules["__main__"]`` (the
driver's own module, which ``-c`` made ``__main__``, stays alive through its functions' globals), so ``import
__main__``, pickling what the program defines, ``multiprocessing`` with the program's functions and
``dataclasses`` / ``typing`` (which look up ``sys.modules[cls.__module__]``) see the program's names, as under a
host ``python -c``. In a session every call runs in that one module's namespace.

Modes:
- ``cold``: read the whole program from stdin, point fd 0 at /dev/null, lower the resource limits
  (soft = hard for every one, so the program cannot raise any of them again; RLIMIT_CPU is one second above
  the CPU budget and a CPU-time interval timer, ITIMER_PROF, ends the process with SIGPROF at the budget
  itself, so the cause of death is visible; code that ignores SIGPROF is SIGKILLed by the kernel one second
  later), run the program once and exit with its status.
- ``session``: a small REPL server. Requests arrive as JSON lines on the original stdin
  (``{"code": str, "nonce": str}``); the program's stdout/stderr go to fd 1/2 (pipes read by the host),
  followed by the nonce so the host knows where one call's output ends; the reply
  (``{"exit_code": int, "error": str | null}``) is written as a JSON line to fd CTL_FD. Globals persist
  between requests. The session's RLIMIT_CPU (soft = hard) is its CPU budget over all its calls
  (``RLIMIT_CPU`` in LIMITS is the per-call budget, ``SESSION_CPU`` the session's); each call gets a fresh
  ITIMER_PROF of the per-call budget. When PIDNS is 1 (the driver runs in its own PID namespace) every other
  process of the namespace is killed after each request. None of this is trusted: the model's code runs in
  this interpreter and can replace any of it, so the host checks from outside after every call (it kills
  what outlived the call and accounts the session's CPU, ``local.PythonSession``).
"""

import faulthandler
import os
import resource
import sys

# json, signal, time and traceback are imported where needed: every import here costs start-up time
# on every cold call.

CODE_FILENAME = "<code>"


_NPROC = [None]  # RLIMIT_NPROC once applied (None: not limited)


def _apply_limits(limits):
    # soft = hard for every resource: the program can lower a limit, never raise it back.
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _NPROC[0] = limits.get("RLIMIT_NPROC")


def _process_limit_note(exc):
    """A line naming the process limit when ``exc`` is what starting a process or thread beyond it raises
    (fork: EAGAIN; a thread: "can't start new thread"), else None. A non-blocking read's EAGAIN looks the same,
    hence the "if"."""
    n = _NPROC[0]
    if n is None:
        return None
    import errno

    hit = (isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN) or (
        isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)
    )
    if not hit:
        return None
    return (f"[sandbox: at most {n} processes and threads may run at once (RLIMIT_NPROC); if this error came from "
            f"starting one (os.fork, subprocess, multiprocessing.Pool, threading), start fewer (e.g. "
            f"multiprocessing.Pool(k) with k well below {n})]")


def _cpu_timer(seconds):
    # ITIMER_PROF counts the process's CPU time (every thread); its SIGPROF (default action: terminate) ends
    # the program at its CPU budget. Not a limit (the program can cancel it): RLIMIT_CPU is.
    import _signal

    _signal.setitimer(_signal.ITIMER_PROF, float(seconds))


def _null_stdin():
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


def _print_exception(exc):
    # Hide the driver's own frames: the model should only see frames of its code.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CODE_FILENAME:
        tb = tb.tb_next
    try:
        import traceback

        traceback.print_exception(type(exc), exc, tb)
        note = _process_limit_note(exc)
        if note is not None:
            print(note, file=sys.stderr)
    except BaseException:  # printing can fail too (closed stderr, limits): the exit code still tells
        pass


def _run(src, main):
    """Compile and run ``src`` as module ``main`` (made ``sys.modules["__main__"]`` again first: an earlier call of
    a session may have replaced it); return (exit_code, exception type name or None)."""
    sys.modules["__main__"] = main
    try:
        code = compile(src, CODE_FILENAME, "exec")
        exec(code, main.__dict__)
    except SystemExit as exc:
        status = exc.code
        if status is None:
            return 0, None
        if isinstance(status, int):
            return status & 0xFF, None
        try:
            print(status, file=sys.stderr)
        except BaseException:
            pass
        return 1, None
    except BaseException as exc:
        _print_exception(exc)
        return 1, type(exc).__name__
    return 0, None


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass


def _main_module():
    """A fresh module named ``__main__`` for the program (what ``python -c`` would give it: no ``__file__``)."""
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=__builtins__, __loader__=__loader__)
    return main


def main_cold(limits):
    src = sys.stdin.buffer.read()
    _null_stdin()
    faulthandler.enable()
    cpu_s = limits.get("RLIMIT_CPU")
    if cpu_s is not None:
        limits["RLIMIT_CPU"] = cpu_s + 1  # the kernel's kill, one second after the timer's SIGPROF
    _apply_limits(limits)
    if cpu_s is not None:
        _cpu_timer(cpu_s)
    sys.argv = [CODE_FILENAME]
    status, _ = _run(src, _main_module())
    _flush()
    os._exit(status)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _others_alive():
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X"):
            return True
    return False


def _kill_others():
    # Every process of the namespace but its init and ourselves dies before the call returns.
    import signal
    import time

    clean = 0
    for _ in range(400):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        _reap()
        clean = 0 if _others_alive() else clean + 1
        if clean >= 2:  # two clean listings in a row: one can miss a double fork's grandchild (_io.CLEAN_LISTINGS)
            return
        time.sleep(0.005)


def _identity(fd):
    """(device, inode) of what ``fd`` refers to; None once it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _usable_stream(stream, fd):
    """``stream`` (the session's text stream of descriptor ``fd``) when it can still be written, else a new one like
    it (what ``-u`` gives: UTF-8 text written through to the descriptor at once, never closing it): a call that
    closed ``sys.stdout`` or detached its buffer must not leave every later call failing."""
    try:
        if stream is not None and not stream.closed:
            stream.fileno()  # raises once the buffer is detached
            return stream
    except (ValueError, OSError, AttributeError):
        pass
    import io

    try:
        encoding, errors = stream.encoding, stream.errors
    except (ValueError, AttributeError):
        encoding, errors = "utf-8", "backslashreplace" if fd == 2 else "strict"
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=encoding, errors=errors, write_through=True)


def main_session(limits, ctl_fd, in_pidns):
    import json

    ctl_in = os.fdopen(os.dup(0), "rb")
    _null_stdin()
    out_fd, err_fd = os.dup(1), os.dup(2)
    faulthandler.enable()
    cpu_s = limits.get("RLIMIT_CPU")
    session_cpu = limits.pop("SESSION_CPU", None)
    if session_cpu is not None:
        limits["RLIMIT_CPU"] = session_cpu  # the whole session's budget, soft = hard
    _apply_limits(limits)
    sys.argv = [CODE_FILENAME]
    main = _main_module()
    # The code runs in this process and can tamper with the driver's own descriptors. Their identities are kept so
    # that a replaced or closed one ends the session (no reply: the host reports it and starts a fresh one) rather
    # than a later call being answered wrongly; a control input left non-blocking is made blocking again.
    in_fd = ctl_in.fileno()
    own = {fd: _identity(fd) for fd in (in_fd, out_fd, err_fd, ctl_fd)}
    streams = [sys.__stdout__, sys.__stderr__]
    os.write(ctl_fd, b'{"ready": true}\n')
    while True:
        try:
            os.set_blocking(in_fd, True)
            line = ctl_in.readline()
        except (OSError, ValueError):
            os._exit(70)
        if not line:
            break
        request = json.loads(line)
        # Undo what the previous call may have done to the standard streams: descriptors 1 and 2 pointed at the
        # pipes again, and sys.stdout/sys.stderr set back (made anew when a call closed or detached them).
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        streams = [_usable_stream(streams[0], 1), _usable_stream(streams[1], 2)]
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__ = streams
        if cpu_s is not None:
            _cpu_timer(cpu_s)
        status, error = _run(request["code"], main)
        if cpu_s is not None:
            _cpu_timer(0)
        _flush()
        if in_pidns:
            _kill_others()
        if any(_identity(fd) != ident for fd, ident in own.items()):
            os._exit(70)  # before any reply: one written to a replaced descriptor could go anywhere
        nonce = request["nonce"].encode()
        os.write(out_fd, nonce)
        os.write(err_fd, nonce)
        os.write(ctl_fd, json.dumps({"exit_code": status, "error": error}).encode() + b"\n")


def _parse_limits(text):
    # "RLIMIT_AS=1073741824,RLIMIT_CPU=10" (no json import on the cold path)
    return {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}


if __name__ == "__main__":
    _DRIVER = sys.modules["__main__"]  # kept (through this global) once the program's module replaces it there
    _mode, _limits = sys.argv[1], _parse_limits(sys.argv[2])
    if _mode == "cold":
        main_cold(_limits)
    else:
        main_session(_limits, int(sys.argv[3]), sys.argv[4] == "1")
