#!/usr/bin/env python3
"""Lists every function of corral's image that a sandbox's init and the
program's process run, exactly: single-steps them under ptrace.

Usage: trace-sandbox-text.py OUT -- corral run ... -- true
       trace-sandbox-text.py OUT -- corral serve ...   (stop it with SIGTERM)

Sampling (perf) misses the short functions that init runs once (a system
call's wrapper, a path helper): each one missed lands elsewhere in the
text, and costs init a page fault that maps another 64 KiB window (fault
around) and that window's page-table entries, unmapped again when init
exits on the launch's critical path (docs/PERFORMANCE.md, issue 17). So
scripts/link-order.sh takes init's functions from this trace: the
command runs as usual (continued, every thread of it), and every process
it starts, or a fork server of its starts, is stepped one instruction at
a time until it executes another program (the fork server itself is such
a program: `corral serve` starts it with `execve`). Each instruction's
address inside corral's image is mapped to its function (`nm`). Writes
the mangled names to OUT, in the order first run. Works as any user who
may run the command (its processes are traced from their start, so no
later ptrace check applies; as root the sandbox's cgroup path is traced
too) and takes some seconds per sandbox.
"""

import bisect
import ctypes
import os
import signal
import subprocess
import sys

PTRACE_TRACEME, PTRACE_PEEKUSER, PTRACE_CONT, PTRACE_SINGLESTEP = 0, 3, 7, 9
PTRACE_SETOPTIONS, PTRACE_GETEVENTMSG = 0x4200, 0x4201
O_TRACEFORK, O_TRACEVFORK, O_TRACECLONE, O_TRACEEXEC, O_EXITKILL = 2, 4, 8, 0x10, 0x100000
EVENT_FORK, EVENT_VFORK, EVENT_CLONE, EVENT_EXEC = 1, 2, 3, 4
RIP_OFFSET = 16 * 8  # struct user_regs_struct: rip is the 17th field
WALL = 0x40000000

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


def ptrace(req, pid, addr=0, data=0):
    ctypes.set_errno(0)
    r = libc.ptrace(req, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    if r == -1 and ctypes.get_errno():
        raise OSError(ctypes.get_errno(), f"ptrace({req}, {pid})")
    return r


def functions(binary):
    """(start offsets, names) of the image's functions, sorted."""
    nm = subprocess.run(
        ["nm", "-n", "--no-demangle", binary], check=True, capture_output=True, text=True
    ).stdout
    out = []
    for line in nm.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "tTwW":
            out.append((int(p[0], 16), p[2]))
    return [a for a, _ in out], [n for _, n in out]


def image_range(pid, binary):
    """Load address and end of `binary`'s mappings in `pid`."""
    real = os.path.realpath(binary)
    lo = hi = None
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        if len(f) >= 6 and f[5] == real:
            a, b = (int(x, 16) for x in f[0].split("-"))
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return lo, hi


def thread_group(pid):
    """The process (thread group) `pid` belongs to, or None once gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def is_fork_server(pid):
    try:
        return b"__sandbox-zygote" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    out, argv = sys.argv[1], sys.argv[3:]
    binary = argv[0]
    starts, names = functions(binary)
    child = os.fork()
    if child == 0:
        ptrace(PTRACE_TRACEME, 0)
        os.kill(os.getpid(), signal.SIGSTOP)
        os.execv(binary, argv)
    os.waitpid(child, 0)
    ptrace(
        PTRACE_SETOPTIONS,
        child,
        0,
        O_TRACEFORK | O_TRACEVFORK | O_TRACECLONE | O_TRACEEXEC | O_EXITKILL,
    )
    stepped = set()  # processes stepped: what the command or a fork server started
    decided = {}  # new tracee -> whether it is stepped, until its first stop
    parked = set()  # new tracees stopped before their parent's event came
    # pid -> (load address, end) of corral's image in it: read at each
    # exec (a new layout) and handed on at each fork or clone, as the
    # sandbox's processes cannot be read once init is not dumpable.
    images = {}
    seen, order = set(), []

    def resume(pid, deliver=0):
        try:
            if pid in stepped:
                base, end = images.get(pid, (None, None))
                rip = ptrace(PTRACE_PEEKUSER, pid, RIP_OFFSET) & (2**64 - 1)
                if base is not None and base <= rip < end:
                    i = bisect.bisect_right(starts, rip - base) - 1
                    if i >= 0 and i not in seen:
                        seen.add(i)
                        order.append(names[i])
                # A signal is delivered with the step: its handler, if
                # any, is stepped too.
                ptrace(PTRACE_SINGLESTEP, pid, 0, deliver)
            else:
                ptrace(PTRACE_CONT, pid, 0, deliver)
        except ProcessLookupError:
            pass

    def forget(pid):
        live.discard(pid)
        stepped.discard(pid)
        images.pop(pid, None)
        decided.pop(pid, None)
        parked.discard(pid)

    ptrace(PTRACE_CONT, child)
    live = {child}
    while live:
        try:
            pid, status = os.waitpid(-1, WALL)
        except ChildProcessError:
            break
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            forget(pid)
            if pid == child:
                # Its children's fork events will not come now: let the
                # ones still waiting for theirs go, unstepped.
                for p in list(parked):
                    parked.discard(p)
                    resume(p)
            continue
        if not os.WIFSTOPPED(status):
            continue
        sig, event = os.WSTOPSIG(status), status >> 16
        if pid not in live:
            # A new tracee's first stop: resumed once its parent's event
            # said whether it is stepped.
            live.add(pid)
            if pid in decided:
                if decided.pop(pid):
                    stepped.add(pid)
                resume(pid)
            else:
                parked.add(pid)
            continue
        deliver = 0
        if event in (EVENT_FORK, EVENT_VFORK, EVENT_CLONE):
            new = ctypes.c_ulong()
            try:
                ptrace(PTRACE_GETEVENTMSG, pid, 0, ctypes.addressof(new))
            except ProcessLookupError:
                continue
            new = new.value
            group = thread_group(pid)
            parent_ok = group == child or pid in stepped or is_fork_server(pid)
            step = parent_ok and thread_group(new) == new
            inherited = images.get(pid) or images.get(group)
            if inherited:
                images[new] = inherited
            if new in parked:
                parked.discard(new)
                if step:
                    stepped.add(new)
                resume(new)
            else:
                decided[new] = step
        elif event == EVENT_EXEC:
            # Another program now: its instructions are not corral's. A
            # thread that executed it took the process's pid; the other
            # threads are gone without an exit of their own.
            former = ctypes.c_ulong()
            try:
                ptrace(PTRACE_GETEVENTMSG, pid, 0, ctypes.addressof(former))
                if former.value != pid:
                    forget(former.value)
            except ProcessLookupError:
                pass
            if pid != child:
                stepped.discard(pid)
            try:
                images[pid] = image_range(pid, binary)
            except OSError:
                images.pop(pid, None)
        elif sig != signal.SIGTRAP:
            deliver = sig
        resume(pid, deliver)
    with open(out, "w") as f:
        f.write("".join(n + "\n" for n in order))
    print(f"{out}: {len(order)} functions run by the sandbox's processes", file=sys.stderr)


if __name__ == "__main__":
    main()
