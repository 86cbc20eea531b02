//! Test-only fail points: `AIRLOCK_TEST_FAIL_POINT` names one place where
//! the process aborts (as a SIGKILL would end it: no destructor, no
//! cleanup), so that a test can place a crash exactly between two steps
//! that must survive one. Unset (the default, and the only setting for
//! production), nothing happens. docs/configuration.md lists it as
//! test-only.

/// The variable that names the fail point.
pub const ENV_FAIL_POINT: &str = "AIRLOCK_TEST_FAIL_POINT";

/// Where the process may be made to abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    /// Right after a run's end is stored, before this replica does anything
    /// else for it (queueing, sending its webhook).
    AfterRunEnd,
    /// Right after this replica claims webhook deliveries, before it sends
    /// any.
    AfterDeliveryClaim,
}

impl FailPoint {
    pub fn parse(v: &str) -> Option<FailPoint> {
        match v {
            "after-run-end" => Some(FailPoint::AfterRunEnd),
            "after-delivery-claim" => Some(FailPoint::AfterDeliveryClaim),
            _ => None,
        }
    }

    /// Aborts the process if `set` is this point.
    pub fn hit(self, set: Option<FailPoint>) {
        if set == Some(self) {
            eprintln!("airlock serve: {} = {self:?}: aborting", ENV_FAIL_POINT);
            std::process::abort();
        }
    }
}
