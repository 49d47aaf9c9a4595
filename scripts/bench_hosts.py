#!/usr/bin/python3
"""tools/dev bench-hosts: comms against Open MPI across two simulated hosts.

Two network namespaces this script makes (comms-bh-<pid>-h0 and -h1, one
veth cable between them, 192.0.2.1 and .2 from the documentation range,
nothing added outside them) stand for two hosts; each launch also gets its
own UTS namespace named after its host, so that a library telling hosts
apart by host name (comms' UCX, Open MPI, UCX itself) sees two hosts.
Every row runs 2 hosts x --ranks-per-host ranks:
  comms     one commsrun per host (--nnodes 2, the store on host 0's
            address) running comms-bench, for each --backends entry;
  Open MPI  mpirun on host 0 with --host h0:N,h1:N and a launch agent (in
            place of ssh) that runs orted inside host 1's namespace, its
            out-of-band and TCP traffic on the veth, yielding when idle as
            it does on an oversubscribed host (its pml is ob1: the UCX pml
            declines a machine with only TCP and shared memory).
Medians of --runs alternating launches per side, as bench-mpi (whose code
this reuses); ranks are not bound to cores on either side (the two hosts
share this machine's cores). Writes OUT/sweep.json and OUT/sweep.md.
Root only (ip netns). The namespaces go on every exit path, and namespaces
of an earlier run whose process is gone are removed first.
"""
import argparse
import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench_mpi_sweep import (add_common_args, alternate, default_sizes, iterations, parse_size, print_row, row,
                             sweep_sizes, table, write_results)

PREFIX = "comms-bh-"
OPS = ["all_reduce", "all_gather"]
HOSTS = 2


def ip(*argv, check=True):
    p = subprocess.run(["ip"] + list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)
    if check and p.returncode != 0:
        raise RuntimeError("ip %s failed (%d): %s" % (" ".join(argv), p.returncode, p.stdout.strip()))
    return p.stdout


def namespaces(prefix):
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.startswith(prefix)]


def remove_namespace(name):
    """Kills whatever still runs inside, then deletes the namespace."""
    for _ in range(100):
        pids = [int(p) for p in ip("netns", "pids", name, check=False).split() if p.isdigit()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    ip("netns", "del", name, check=False)


def remove_stale():
    """Namespaces of earlier runs whose process no longer exists."""
    for name in namespaces(PREFIX):
        owner = name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not os.path.exists("/proc/" + owner):
            remove_namespace(name)


class Hosts:
    """Two namespaces joined by a veth pair (eth0 on each side)."""

    def __init__(self):
        self.names = ["%s%d-h%d" % (PREFIX, os.getpid(), i) for i in range(HOSTS)]
        self.addresses = ["192.0.2.%d" % (i + 1) for i in range(HOSTS)]
        self.made = []
        atexit.register(self.remove)
        try:
            for name in self.names:
                ip("netns", "add", name)
                self.made.append(name)
            ip("-n", self.names[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
               self.names[1])
            for name, address in zip(self.names, self.addresses):
                ip("-n", name, "addr", "add", address + "/24", "dev", "eth0")
                ip("-n", name, "link", "set", "lo", "up")
                ip("-n", name, "link", "set", "eth0", "up")
            self.wait_running()
        except BaseException:
            self.remove()
            raise

    def wait_running(self, seconds=10):
        """Waits until both ends of the cable run: the kernel reports a veth's
        carrier up to a second after `link set up`, and UCX leaves out of a
        worker's address the interfaces that do not run yet (a peer then finds
        the host unreachable)."""
        deadline = time.monotonic() + seconds
        while not all("state UP" in ip("-n", name, "link", "show", "eth0") for name in self.names):
            if time.monotonic() > deadline:
                raise RuntimeError("the veth between %s did not come up within %d s" % (" and ".join(self.names),
                                                                                      seconds))
            time.sleep(0.05)

    def remove(self):
        while self.made:
            remove_namespace(self.made.pop())

    def run_in(self, i):
        """The prefix that runs a command on host i: its network namespace and
        a UTS namespace whose host name is the namespace's name."""
        return ["ip", "netns", "exec", self.names[i], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[i]]

    def write_agent(self, folder):
        """Open MPI's launch agent: called as `agent [options] HOST COMMAND...`
        like ssh, it runs COMMAND on that host."""
        path = os.path.join(folder, "netns-agent")
        cases = "".join("  %s) ns=%s ;;\n" % (a, n) for a, n in zip(self.addresses, self.names))
        with open(path, "w") as f:
            f.write('#!/bin/sh\n# argv as ssh gets it: options, the host, the command as words.\n'
                    'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\n'
                    'host=$1; shift\ncase "$host" in\n' + cases +
                    '  *) echo "netns-agent: unknown host $host" >&2; exit 255 ;;\nesac\n'
                    'exec ip netns exec "$ns" unshare --uts sh -c \'hostname "$0" && exec /bin/sh -c "$1"\' '
                    '"$ns" "$*"\n')
        os.chmod(path, 0o755)
        return path


def comms_commands(args, hosts, backend, op, size, iters, port):
    warm = max(2, iters // 10)
    cmds = []
    for i in range(HOSTS):
        cmds.append(hosts.run_in(i) + [
            os.path.join(args.build, "tools", "commsrun"), "-n", str(args.ranks_per_host), "--nnodes", str(HOSTS),
            "--node-rank", str(i), "--master-addr", hosts.addresses[0], "--master-port", str(port), "--timeout",
            str(args.timeout), "--", os.path.join(args.build, "tools", "comms-bench"), "-C", op, "--outofplace",
            "--check", "1", "--backend", backend, "--minbytes", str(size), "--maxbytes", str(size), "--iters",
            str(iters), "--warmup", str(warm)])
    return cmds


def mpi_command(args, hosts, agent, op, size, iters):
    warm = max(2, iters // 10)
    n = args.ranks_per_host
    # Yield when idle: mpirun counts each host's slots, not that the two
    # hosts share this machine's cores, so it would leave its ranks spinning
    # on cores the other host's ranks need (an 8 B all_reduce then takes
    # tens of ms); Open MPI yields by itself where it sees oversubscription.
    return hosts.run_in(0) + [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
        "-np", str(HOSTS * n), "--host",
        ",".join("%s:%d" % (a, n) for a in hosts.addresses), "--mca", "plm_rsh_agent", agent,
        "--mca", "oob_tcp_if_include", "eth0", "--mca", "btl_tcp_if_include", "eth0",
        os.path.join(args.build, "tools", "mpi-bench"), "--op", op, "--minbytes", str(size), "--maxbytes",
        str(size), "--iters", str(iters), "--warmup", str(warm)]


def on_signal(signum, _frame):
    sys.exit(128 + signum)  # unwinds through atexit, which removes the namespaces


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--out", help="output folder (default BUILD/bench-hosts)")
    ap.add_argument("--backends", default="cpu:ucx,cpu:gloo", help="comms backends, each against Open MPI")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--ranks-per-host", type=int, default=2)
    args = ap.parse_args()
    if args.runs < 1 or args.ranks_per_host < 1:
        ap.error("--runs and --ranks-per-host must be at least 1")
    if os.geteuid() != 0:
        sys.exit("bench-hosts: needs root (it makes network namespaces)")
    for tool in ("commsrun", "comms-bench", "mpi-bench"):
        if not os.access(os.path.join(args.build, "tools", tool), os.X_OK):
            sys.exit("bench-hosts: %s/tools/%s is missing" % (args.build, tool))
    for op in args.ops.split(","):
        if op not in OPS:
            ap.error("unknown op '%s' (ops: %s)" % (op, ", ".join(OPS)))
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else default_sizes()
    ranks = HOSTS * args.ranks_per_host
    remove_stale()
    hosts = Hosts()
    load_before = os.getloadavg()
    rows = []
    launch = 0
    with tempfile.TemporaryDirectory(prefix="comms-bench-hosts-") as folder:
        agent = hosts.write_agent(folder)
        for backend in args.backends.split(","):
            for op in args.ops.split(","):
                for size in sweep_sizes(op, ranks, sizes):
                    iters = iterations(size, args.iters, args.budget_bytes)
                    launch += 1  # a fresh store port per row: no wait on the last one's TIME_WAIT
                    cmds = {"comms": comms_commands(args, hosts, backend, op, size, iters, 29500 + launch % 1000),
                            "mpi": mpi_command(args, hosts, agent, op, size, iters)}
                    p50s, algorithm = alternate(cmds, args.runs, args.timeout + 30)
                    rows.append(dict(row(op, ranks, size, iters, p50s, algorithm), backend=backend))
                    print_row(rows[-1])
    hosts.remove()
    load_after = os.getloadavg()
    result = {"backends": args.backends, "hosts": HOSTS, "ranks_per_host": args.ranks_per_host, "runs": args.runs,
              "loadavg_before": load_before, "loadavg_after": load_after, "rows": rows}
    note = ("%d hosts (network namespaces, one veth) x %d ranks; median of %d alternating runs per side, ranks "
            "not bound; load average %.2f before, %.2f after\n\n") % (
                HOSTS, args.ranks_per_host, args.runs, load_before[0], load_after[0])
    md = ""
    for backend in args.backends.split(","):
        md += "comms %s against Open MPI:\n\n" % backend + table([r for r in rows if r["backend"] == backend]) + "\n"
    write_results(args.out or os.path.join(args.build, "bench-hosts"), result, note, md)


if __name__ == "__main__":
    main()
