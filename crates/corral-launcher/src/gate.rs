//! Giving up on a run whose plan waits on the host's filesystem.
//!
//! Planning looks at the host (each bind source, the working directory,
//! the protected entries of writable binds). A filesystem whose server
//! went away (a hard-mounted NFS export, a FUSE daemon that stopped
//! reading) holds such a lookup in an uninterruptible wait that only the
//! process's death ends, so a thread cannot be called back from it. A
//! front end with threads (the server) plans on a thread it can leave
//! behind, and gives the run up through its [`PlanGate`] when the plan
//! takes too long: the run then never launches, whenever its lookups
//! return, and the front end answers at once.

use std::sync::atomic::{AtomicU8, Ordering};

const PLANNING: u8 = 0;
const LAUNCHING: u8 = 1;
const ABANDONED: u8 = 2;

/// Decides, once, between a run's launch and its abandonment: whichever
/// of [`PlanGate::abandon`] (the front end, after its deadline) and the
/// launcher's passage (after the plan, before anything is started) comes
/// first wins, so a run given up never launches and a launched run is
/// never given up (its own timeout bounds it from then on).
#[derive(Debug, Default)]
pub struct PlanGate {
    state: AtomicU8,
}

impl PlanGate {
    /// A gate whose run is still planning.
    pub fn new() -> PlanGate {
        PlanGate::default()
    }

    /// Gives the run up if it is still planning: `true` when it will now
    /// never launch (the launcher refuses it with [`PlanGate::CODE`] once
    /// its lookups return), `false` when it is launching already.
    pub fn abandon(&self) -> bool {
        self.state
            .compare_exchange(PLANNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the run was given up: a cheap look, for skipping work a
    /// run given up would only undo (the passage decides).
    pub fn is_abandoned(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABANDONED
    }

    /// The passage from planning to launch, which [`crate::execute`]
    /// takes once the plan stands: `false` when the run was given up (it
    /// must not launch then).
    pub fn pass(&self) -> bool {
        self.state
            .compare_exchange(PLANNING, LAUNCHING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The error code of a run given up while it planned: a path of the
    /// host's that the plan looks at did not answer in time.
    pub const CODE: &'static str = "host.unanswered";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_abandon_and_pass_wins_for_good() {
        let given_up = PlanGate::new();
        assert!(!given_up.is_abandoned());
        assert!(given_up.abandon());
        assert!(given_up.is_abandoned());
        assert!(!given_up.pass(), "a run given up never launches");
        assert!(!given_up.abandon(), "given up once");

        let launched = PlanGate::new();
        assert!(launched.pass());
        assert!(!launched.abandon(), "a launched run is not given up");
        assert!(!launched.is_abandoned());
        assert!(!launched.pass(), "it passes once");
    }
}
