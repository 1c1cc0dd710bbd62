//! Resources: hard rlimits cannot be raised, a thread bomb stops at the
//! process limit. Fork and memory bombs, output floods, timeouts and
//! daemons are in limits.rs and lifecycle.rs.

use crate::common::*;
use crate::support::*;

#[test]
fn attack_raising_hard_rlimits_is_refused() {
    if !x86_64("attack_raising_hard_rlimits_is_refused") {
        return;
    }
    expect(
        r#"import resource
def raise_hard(res):
    soft, hard = resource.getrlimit(res)
    new = (ctypes.c_ulong * 2)(hard + 1, hard + 1)
    return sc(302, 0, res, new, 0)
for name in ('RLIMIT_NOFILE', 'RLIMIT_NPROC', 'RLIMIT_CORE', 'RLIMIT_FSIZE'):
    say(name, raise_hard(getattr(resource, name)))
say('core', resource.getrlimit(resource.RLIMIT_CORE))
"#,
        "RLIMIT_NOFILE EPERM\nRLIMIT_NPROC EPERM\nRLIMIT_CORE EPERM\nRLIMIT_FSIZE EPERM\ncore (0, 0)\n",
    );
}

#[test]
fn attack_thread_bomb_stops_at_the_process_limit() {
    // Bounded: at most 500 threads, all parked on one event.
    let (_d, cfg) = config(
        "[profile.threads]\nextends = \"code\"\n[profile.threads.limits]\npids = 32\nprocesses = 32\n",
    );
    let (code, out, err) = attack(
        &[
            "--config",
            cfg.to_str().expect("utf-8"),
            "--profile",
            "threads",
        ],
        r#"import threading
stop = threading.Event()
threads = []
try:
    for _ in range(500):
        t = threading.Thread(target=stop.wait)
        t.start()
        threads.append(t)
    say('started all', len(threads))
except RuntimeError as e:
    say('stopped', len(threads), str(e))
stop.set()
for t in threads:
    t.join()
"#,
    );
    assert_eq!(code, 0, "{err}");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"stopped"), "{out}");
    let n: usize = words[1].parse().expect("count");
    assert!(n < 32, "{n} threads got past a limit of 32");
    assert!(out.contains("can't start new thread"), "{out}");
}
