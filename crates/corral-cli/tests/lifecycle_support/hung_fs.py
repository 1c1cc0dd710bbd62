"""A FUSE filesystem that stops answering, as a network filesystem does
when its server goes away: mounted on argv[1] (root only: it opens
/dev/fuse and mounts it itself; stdlib only), it holds one directory,
`sub`. Root's requests are answered; everyone else's (a sandbox's init
runs as another uid) are held until the kernel interrupts them, which it
does for a process that is being killed. A lookup is valid for no time, so
every path walk through `sub` asks again.

With `none` as argv[2] it answers nothing at all, not even the kernel's
first request: every access waits (until killed), until it gets SIGUSR1:
then it answers everyone, root or not, the requests waiting first (the
filesystem's server is back).

Prints `mounted` once mounted, then `held UID` for each request it holds.
Runs until the mount is gone or it is killed. Exits with status 3, saying
why on stderr, when this host does not let it mount (no /dev/fuse, no
CAP_SYS_ADMIN: a container, say)."""
import ctypes, os, signal, stat, struct, sys

target = sys.argv[1]
try:
    dev = os.open("/dev/fuse", os.O_RDWR)
except OSError as e:
    print(f"/dev/fuse: {e.strerror}", file=sys.stderr)
    sys.exit(3)
libc = ctypes.CDLL(None, use_errno=True)
options = f"fd={dev},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"corral-test-hung", target.encode(), b"fuse", 0, options) != 0:
    print("mount: " + os.strerror(ctypes.get_errno()), file=sys.stderr)
    sys.exit(3)
print("mounted", flush=True)
answer_all = sys.argv[2:] == ["none"]
if answer_all:
    # Read nothing: each request stays queued, so its process can be
    # killed; SIGUSR1 ends the wait.
    back = []
    signal.signal(signal.SIGUSR1, lambda *_: back.append(True))
    while not back:
        signal.pause()
    print("answering", flush=True)

# struct fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, extlen, padding
IN_HEADER = struct.Struct("<IIQQIIIHH")
INIT, LOOKUP, GETATTR, FORGET, RELEASEDIR, INTERRUPT, BATCH_FORGET = 26, 1, 3, 2, 29, 36, 42
NO_REPLY = (FORGET, BATCH_FORGET)


def attr(ino):
    """struct fuse_attr of a directory (ino, size, blocks, a/m/ctime and
    their nsec, mode, nlink, uid, gid, rdev, blksize, flags)."""
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 0, 0, 0, 0, 0, 0, 0, 0,
                       stat.S_IFDIR | 0o755, 2, 0, 0, 0, 4096, 0)


def reply(unique, error=0, body=b""):
    os.write(dev, struct.pack("<IiQ", 16 + len(body), error, unique) + body)


held = set()
while True:
    try:
        request = os.read(dev, 1 << 20)
    except OSError as e:
        if e.errno == 19:  # ENODEV: unmounted
            break
        if e.errno in (2, 4):  # ENOENT (the request was withdrawn), EINTR
            continue
        raise
    length, opcode, unique, nodeid, uid, _, _, _, _ = IN_HEADER.unpack_from(request)
    body = request[IN_HEADER.size:length]
    if opcode == INIT:
        _, _, readahead = struct.unpack_from("<III", body)
        # struct fuse_init_out, protocol 7.31, nothing optional asked for.
        reply(unique, 0, struct.pack("<IIIIHHIIHHII", 7, 31, readahead, 0, 16, 12,
                                     65536, 1, 16, 0, 0, 0) + bytes(24))
    elif opcode == INTERRUPT:
        (interrupted,) = struct.unpack_from("<Q", body)
        if interrupted in held:
            held.discard(interrupted)
            reply(interrupted, -4)  # EINTR
    elif opcode in NO_REPLY:
        pass
    elif uid != 0 and not answer_all:
        held.add(unique)
        print(f"held {uid}", flush=True)
    elif opcode == LOOKUP and body.rstrip(b"\0") == b"sub":
        # struct fuse_entry_out: nodeid, generation, entry and attr validity 0.
        reply(unique, 0, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2))
    elif opcode == GETATTR:
        reply(unique, 0, struct.pack("<QII", 0, 0, 0) + attr(nodeid))
    elif opcode == RELEASEDIR:
        reply(unique)
    else:
        reply(unique, -38)  # ENOSYS
