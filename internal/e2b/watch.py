# airlock's E2B watcher: runs in the box (python3, as the request's user),
# watches DIR (and, when RECURSIVE is "1", its subdirectories) with inotify
# and prints one JSON line per event: ["ready"] once the watches are in
# place, then [type, name] (name relative to DIR; type create, write,
# remove, rename, chmod, as envd's fsnotify names them), ["overflow"] when
# the kernel's event queue overflowed (events were lost), ["error", msg].
# Usage: python3 -c SCRIPT DIR RECURSIVE MAXWATCHES
import ctypes
import json
import os
import struct
import sys

IN_MODIFY, IN_ATTRIB = 0x2, 0x4
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x4000, 0x8000, 0x40000000
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF

out = os.fdopen(1, "w", encoding="utf-8", errors="surrogateescape")


def emit(*v):
    out.write(json.dumps(v) + "\n")
    out.flush()


root, recursive, max_watches = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_CLOEXEC)
if fd < 0:
    emit("error", "inotify_init1: " + os.strerror(ctypes.get_errno()))
    sys.exit(1)
dirs = {}


def add(rel):
    if len(dirs) >= max_watches:
        emit("error", "more than %d directories to watch under %s: watch a smaller tree" % (max_watches, root))
        sys.exit(1)
    p = os.path.join(root, rel) if rel else root
    wd = libc.inotify_add_watch(fd, os.fsencode(p), MASK)
    if wd < 0:
        if not rel:
            emit("error", "watch %s: %s" % (root, os.strerror(ctypes.get_errno())))
            sys.exit(1)
        return  # a subdirectory gone already
    dirs[wd] = rel
    if recursive:
        try:
            names = [e.name for e in os.scandir(p) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for n in names:
            add(os.path.join(rel, n))


add("")
emit("ready")
head = struct.Struct("iIII")
while True:
    buf = os.read(fd, 1 << 16)
    i = 0
    while i + head.size <= len(buf):
        wd, mask, _, n = head.unpack_from(buf, i)
        name = buf[i + head.size:i + head.size + n].rstrip(b"\0").decode("utf-8", "surrogateescape")
        i += head.size + n
        if mask & IN_Q_OVERFLOW:
            emit("overflow")
            continue
        if mask & IN_IGNORED:
            dirs.pop(wd, None)
            if not dirs:
                sys.exit(0)  # the watched directory is gone
            continue
        rel = dirs.get(wd)
        if rel is None:
            continue
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
            # A subdirectory's own end is reported by its parent's watch.
            if not rel:
                emit("remove" if mask & IN_DELETE_SELF else "rename", ".")
            continue
        name = os.path.join(rel, name) if name else (rel or ".")
        if mask & (IN_CREATE | IN_MOVED_TO):
            if recursive and mask & IN_ISDIR:
                add(name)  # first: once the event is out, the new directory is watched
            emit("create", name)
        elif mask & IN_MODIFY:
            emit("write", name)
        elif mask & IN_DELETE:
            emit("remove", name)
        elif mask & IN_MOVED_FROM:
            emit("rename", name)
        elif mask & IN_ATTRIB:
            emit("chmod", name)
