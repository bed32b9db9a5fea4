"""What the driver reads from /proc (Linux only): CPU seconds and peak RSS of process trees,
and the pids of the shared RabbitMQ and PostgreSQL servers, found by their ports."""

import os

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # The command name is in parentheses and may hold spaces: split after its last ')'.
    return text[text.rindex(")") + 2:].split()


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def tree(roots):
    """`roots` and all their living descendants."""
    children = {}
    for pid in _pids():
        try:
            children.setdefault(int(_stat(pid)[1]), []).append(pid)
        except (OSError, ValueError):
            pass
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_seconds(pids):
    """utime + stime + cutime + cstime of each living process (fields 14-17 of
    /proc/PID/stat): its own CPU since it started and that of the children it reaped (a
    server's finished backends, a pool's replaced workers), so the sum never falls when a
    process of the tree exits and its parent reaps it."""
    total = 0.0
    for pid in pids:
        try:
            fields = _stat(pid)
            total += sum(int(f) for f in fields[11:15]) / TICK
        except (OSError, ValueError, IndexError):
            pass
    return total


def peak_rss_mib(pids):
    """Sum of VmHWM (each process's peak resident set) in MiB."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _read0(path):
    try:
        with open(path, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def broker_pids(port):
    """The beam.smp started with RABBITMQ_NODE_PORT=port (other brokers run on this box)."""
    want = f"RABBITMQ_NODE_PORT={port}".encode()
    return [pid for pid in _pids()
            if _read0(f"/proc/{pid}/cmdline")[:1] and b"beam.smp" in _read0(f"/proc/{pid}/cmdline")[0]
            and want in _read0(f"/proc/{pid}/environ")]


def postgres_pids(port):
    """The postmaster listening on port and its children (backends of every client)."""
    for pid in _pids():
        argv = _read0(f"/proc/{pid}/cmdline")
        if argv and argv[0].endswith(b"/postgres") and b"-p" in argv:
            i = argv.index(b"-p")
            if i + 1 < len(argv) and argv[i + 1] == str(port).encode():
                return tree([pid])
    return []
