"""Keep-alive HTTP clients for the service benchmarks (bench/serve.sh,
bench/serve-tp-ab.sh, bench/serve-profile.sh): one definition of how a
batch of executions is sent to `corral serve` and checked, so all of them
measure the same thing."""

import http.client
import json
import threading
import time

BODY = json.dumps({"command": ["python3", "-c", "print(1)"]}).encode()


def run_executions(addr, count, clients):
    """Sends `count` executions of `python3 -c 'print(1)'` to the server at
    `addr` (host:port) over `clients` keep-alive connections, one thread
    each, and returns the wall time in seconds. Each answer must be 200
    with stdout "1\\n"; otherwise exits (SystemExit) naming the first
    failure, after the whole batch."""
    host, port = addr.rsplit(":", 1)
    bad = []

    def worker(k):
        c = http.client.HTTPConnection(host, int(port))
        for i in range(k):
            try:
                c.request("POST", "/v1/executions", BODY, {"content-type": "application/json"})
                r = c.getresponse()
                d = r.read()
            except (OSError, http.client.HTTPException) as e:
                # A refused or reset connection fails the batch (a thread's
                # exception would otherwise end it quietly, fewer sent).
                bad.extend([f"{e!r}"] * (k - i))
                return
            try:
                ok = r.status == 200 and json.loads(d).get("stdout") == "1\n"
            except ValueError:
                ok = False
            if not ok:
                bad.append(f"{r.status} {d[:300]!r}")

    share = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
    threads = [threading.Thread(target=worker, args=(k,)) for k in share]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if bad:
        raise SystemExit(f"{len(bad)} of {count} requests failed; the first: {bad[0]}")
    return elapsed
