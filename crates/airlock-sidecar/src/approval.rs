//! Human approval of a held request (docs/egress.md, "Human approval"): a
//! request an `ask` rule admitted waits here, before any byte of it leaves,
//! for a person's answer, which the sidecar asks the platform for
//! ([`airlock_platform_api::approval`]).
//!
//! Invariants:
//! - at most [`MAX_HELD`] requests of the run wait at once; one more is
//!   refused at once (`approval_cap`);
//! - what the platform is told is a [`Description`] the caller built from
//!   the agent's request before any credential was put into it;
//! - a run that asked for as many approvals as the platform allows is
//!   refused at once (`approvals_exhausted`), never held;
//! - no answer (the platform said `expired`, or could not be asked) is a
//!   refusal (`approval_timeout`); `denied` and `dropped` (the run ended)
//!   are `approval_denied`; only `allowed_once` and `allowed_run` let the
//!   request go on;
//! - "allow for this run" lets every later request matching the same rule,
//!   method and host go on without a hold.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use airlock_egress::{EgressCode, EgressError, GuardStep, Hold};
pub use airlock_platform_api::approval::Description;
use airlock_platform_api::approval::{self, AskRequest, MAX_WAIT_MS, Outcome};
use airlock_platform_api::{PlatformClient, PlatformError};
use tokio::sync::Semaphore;

/// Most requests of one run held at once.
pub const MAX_HELD: usize = 8;

/// How much longer than the hold the sidecar waits for the platform's
/// answer (which says `expired` at the hold's end).
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// The run's held requests and what a person allowed for the whole run.
pub struct Approvals {
    held: Semaphore,
    /// `(rule, method, host)` allowed for the run.
    allowed: Mutex<HashSet<(String, String, String)>>,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals {
            held: Semaphore::new(MAX_HELD),
            allowed: Mutex::default(),
        }
    }
}

fn refusal(code: EgressCode, d: &Description, why: &str) -> EgressError {
    EgressError::new(
        code,
        GuardStep::Approval,
        Some(&d.host),
        format!("{} {}{}: rule {:?} {why}", d.method, d.host, d.path, d.rule),
    )
}

impl Approvals {
    fn allowed_for_run(&self, key: &(String, String, String)) -> bool {
        self.allowed.lock().is_ok_and(|a| a.contains(key))
    }

    /// Waits for a person's answer to `what`, held by `hold`: `Ok` when the
    /// request may go on, else the typed refusal.
    pub async fn pass(
        &self,
        platform: &PlatformClient,
        hold: &Hold,
        what: Description,
    ) -> Result<(), EgressError> {
        let what = Description {
            rule: hold.rule.clone(),
            ..what
        }
        .bounded();
        let key = (what.rule.clone(), what.method.clone(), what.host.clone());
        if self.allowed_for_run(&key) {
            return Ok(());
        }
        let Ok(_held) = self.held.try_acquire() else {
            return Err(refusal(
                EgressCode::ApprovalCap,
                &what,
                &format!("holds it, and the run already holds {MAX_HELD} requests"),
            ));
        };
        let wait_ms = u64::try_from(hold.timeout.as_millis())
            .unwrap_or(MAX_WAIT_MS)
            .min(MAX_WAIT_MS);
        let ask = AskRequest {
            request: what.clone(),
            wait_ms,
        };
        let deadline = Duration::from_millis(wait_ms) + ANSWER_GRACE;
        let answer = tokio::time::timeout(deadline, platform.ask_approval(&ask)).await;
        let outcome = match answer {
            Ok(Ok(a)) => a.outcome,
            Ok(Err(PlatformError::Refused { code, message, .. }))
                if code == approval::EXHAUSTED =>
            {
                return Err(refusal(
                    EgressCode::ApprovalsExhausted,
                    &what,
                    &format!("holds it, and the platform refused to hold it: {message}"),
                ));
            }
            Ok(Err(PlatformError::Refused { code, .. })) if code == approval::RUN_ENDING => {
                return Err(refusal(
                    EgressCode::ApprovalDenied,
                    &what,
                    "holds it, and the run is ending: no one was asked",
                ));
            }
            Ok(Err(e)) => {
                tracing::warn!("approval: the platform could not be asked: {e}");
                Outcome::Expired
            }
            Err(_) => Outcome::Expired,
        };
        match outcome {
            Outcome::AllowedOnce => Ok(()),
            Outcome::AllowedRun => {
                if let Ok(mut a) = self.allowed.lock() {
                    a.insert(key);
                }
                Ok(())
            }
            Outcome::Denied => Err(refusal(
                EgressCode::ApprovalDenied,
                &what,
                "held it, and a person denied it",
            )),
            Outcome::Dropped => Err(refusal(
                EgressCode::ApprovalDenied,
                &what,
                "held it, and the run ended before an answer",
            )),
            Outcome::Expired => Err(refusal(
                EgressCode::ApprovalTimeout,
                &what,
                &format!("held it, and no one answered within {wait_ms} ms"),
            )),
        }
    }
}

/// What a request to `target` with `method` would do, as a person is
/// asked about it: the host and the path, never the query.
pub fn describe(
    method: &http::Method,
    target: &airlock_egress::Target,
    integration: Option<&str>,
) -> Description {
    Description {
        method: method.as_str().to_owned(),
        host: target.authority(),
        path: target.url().path().to_owned(),
        integration: integration.map(str::to_owned),
        rule: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use airlock_platform_api::approval::{ASK_PATH, AskAnswer};
    use axum::Json;
    use axum::extract::State;
    use tokio::sync::Notify;

    use super::*;

    /// A platform that answers every ask with `outcome` once `go` is
    /// notified, counting the asks and recording what it was told.
    #[derive(Clone)]
    struct Fake {
        outcome: Outcome,
        go: Arc<Notify>,
        asks: Arc<AtomicUsize>,
        told: Arc<Mutex<Vec<AskRequest>>>,
    }

    async fn ask(State(f): State<Fake>, Json(req): Json<AskRequest>) -> Json<AskAnswer> {
        f.asks.fetch_add(1, Ordering::SeqCst);
        f.told.lock().unwrap().push(req);
        f.go.notified().await;
        Json(AskAnswer {
            id: "a1".into(),
            outcome: f.outcome,
            answered_by: None,
        })
    }

    fn platform(outcome: Outcome) -> (PlatformClient, Fake, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("p.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let fake = Fake {
            outcome,
            go: Arc::new(Notify::new()),
            asks: Arc::default(),
            told: Arc::default(),
        };
        let app = axum::Router::new()
            .route(ASK_PATH, axum::routing::post(ask))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = PlatformClient::new(&sock, "t".to_owned().into());
        (client, fake, dir)
    }

    fn hold(secs: u64) -> Hold {
        Hold {
            rule: "ask".into(),
            timeout: Duration::from_secs(secs),
        }
    }

    fn what(method: &str, host: &str) -> Description {
        Description {
            method: method.into(),
            host: host.into(),
            path: "/x".into(),
            integration: Some("gh".into()),
            rule: String::new(),
        }
    }

    #[tokio::test]
    async fn allow_for_run_lets_the_same_rule_method_and_host_pass_without_asking() {
        let (p, fake, _dir) = platform(Outcome::AllowedRun);
        fake.go.notify_one();
        let a = Approvals::default();
        a.pass(&p, &hold(5), what("POST", "a.test")).await.unwrap();
        a.pass(&p, &hold(5), what("POST", "a.test")).await.unwrap();
        assert_eq!(fake.asks.load(Ordering::SeqCst), 1, "asked once");
        assert_eq!(fake.told.lock().unwrap()[0].request.rule, "ask");
        // Another method or host is asked about again.
        fake.go.notify_one();
        a.pass(&p, &hold(5), what("DELETE", "a.test"))
            .await
            .unwrap();
        assert_eq!(fake.asks.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn denied_expired_and_dropped_are_typed_refusals() {
        for (outcome, code) in [
            (Outcome::Denied, EgressCode::ApprovalDenied),
            (Outcome::Dropped, EgressCode::ApprovalDenied),
            (Outcome::Expired, EgressCode::ApprovalTimeout),
        ] {
            let (p, fake, _dir) = platform(outcome);
            fake.go.notify_one();
            let e = Approvals::default()
                .pass(&p, &hold(5), what("POST", "a.test"))
                .await
                .unwrap_err();
            assert_eq!(e.code, code);
            assert!(e.to_string().contains("\"ask\""), "names the rule: {e}");
        }
    }

    /// What a hold of an hour comes to when the platform refuses to hold
    /// it (`status`, `code`): at once, or the test fails.
    async fn refused_by_platform(
        status: http::StatusCode,
        code: &'static str,
        message: &'static str,
    ) -> airlock_egress::EgressError {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("p.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let refuse = move || async move {
            (
                status,
                Json(serde_json::json!({"error": code, "message": message})),
            )
        };
        let app = axum::Router::new().route(ASK_PATH, axum::routing::post(refuse));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let p = PlatformClient::new(&sock, "t".to_owned().into());
        let (approvals, held) = (Approvals::default(), hold(3600));
        let asked = approvals.pass(&p, &held, what("POST", "a.test"));
        tokio::time::timeout(Duration::from_secs(30), asked)
            .await
            .expect("refused at once, not after the rule's timeout")
            .unwrap_err()
    }

    /// A platform that refuses to hold one more request of the run (its
    /// bound of approvals reached) is a refusal that says so, at once: not
    /// `approval_timeout`, and not after the rule's timeout.
    #[tokio::test]
    async fn a_run_past_the_platforms_bound_is_refused_at_once_by_name() {
        let e = refused_by_platform(
            http::StatusCode::TOO_MANY_REQUESTS,
            approval::EXHAUSTED,
            "the run asked for as many approvals as it may (1000)",
        )
        .await;
        assert_eq!(e.code, EgressCode::ApprovalsExhausted);
        assert_eq!(e.http_status(), 429);
        assert!(e.to_string().contains("1000"), "says what happened: {e}");
    }

    /// A run being torn down asks no one: its request is denied at once,
    /// saying why, not left to the rule's timeout.
    #[tokio::test]
    async fn a_run_that_is_ending_is_denied_at_once_without_asking() {
        let e = refused_by_platform(
            http::StatusCode::CONFLICT,
            approval::RUN_ENDING,
            "the run is ending: no one is asked",
        )
        .await;
        assert_eq!(e.code, EgressCode::ApprovalDenied);
        assert!(e.to_string().contains("ending"), "says why: {e}");
    }

    #[tokio::test]
    async fn a_platform_that_cannot_be_asked_is_no_answer() {
        let dir = tempfile::tempdir().unwrap();
        let p = PlatformClient::new(dir.path().join("none.sock"), "t".to_owned().into());
        let e = Approvals::default()
            .pass(&p, &hold(5), what("POST", "a.test"))
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::ApprovalTimeout);
    }

    #[tokio::test]
    async fn more_than_the_cap_held_at_once_is_refused_at_once() {
        let (p, fake, _dir) = platform(Outcome::AllowedOnce);
        let a = Arc::new(Approvals::default());
        let mut waiting = Vec::new();
        for i in 0..MAX_HELD {
            let (a, p) = (a.clone(), p.clone());
            waiting.push(tokio::spawn(async move {
                a.pass(&p, &hold(60), what("POST", &format!("h{i}.test")))
                    .await
            }));
        }
        while fake.asks.load(Ordering::SeqCst) < MAX_HELD {
            tokio::task::yield_now().await;
        }
        let e = a
            .pass(&p, &hold(60), what("POST", "one-more.test"))
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::ApprovalCap);
        for _ in 0..MAX_HELD {
            fake.go.notify_one();
        }
        for w in waiting {
            w.await.unwrap().unwrap();
        }
    }
}
