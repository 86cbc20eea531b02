//! A run's audit, read a page at a time: its egress records (`egress_log`)
//! and its other decisions (`run_events` of [`AUDIT_EVENT_KINDS`]), merged
//! by time.
//!
//! Contracts: a page holds at most `limit` entries and reads at most
//! `limit` rows of each table, so a reader of a whole run holds one page at
//! a time, never the run. Each table's rows come in id order; the two are
//! merged by `at` (an egress record first on a tie), and a table whose page
//! ran out while it has more rows ends the page, so no later page holds an
//! entry the merge should have put earlier. The cursor names the last row
//! read of each table, and which tables were read to their end: those are
//! not asked again (a run's decision events are few among its log lines,
//! and the page that finds none scans to the end of the run's events), so
//! a record written to a table after it was read to its end is in the next
//! export, not this one.

use crate::{EgressEntry, Event, Store, StoreError};

/// The `run_events` kinds that are decisions, and so part of the audit:
/// refusals counted rather than recorded one by one, tools an allowlist
/// hid, live policy changes, requests held for a person and how each was
/// settled.
pub const AUDIT_EVENT_KINDS: [&str; 5] = [
    "refusals",
    "tool_excluded",
    "policy_change",
    "approval.pending",
    "approval.settled",
];

/// Where an audit page starts: the last egress row and the last event row
/// already read (0: none), and whether each table was read to its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditCursor {
    pub egress: i64,
    pub event: i64,
    pub egress_done: bool,
    pub events_done: bool,
}

/// One decision of a run's audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditEntry {
    Egress(EgressEntry),
    Event(Event),
}

impl AuditEntry {
    pub fn at(&self) -> i64 {
        match self {
            AuditEntry::Egress(e) => e.at,
            AuditEntry::Event(e) => e.at,
        }
    }
}

/// A page of a run's audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Where the next page starts; `None` when this page ends the audit.
    pub next: Option<AuditCursor>,
}

impl Store {
    /// The entries of `run_id`'s audit after `after`, at most `limit`.
    pub async fn audit_page(
        &self,
        run_id: &str,
        after: AuditCursor,
        limit: u32,
    ) -> Result<AuditPage, StoreError> {
        let limit = limit.max(1);
        let egress = if after.egress_done {
            Vec::new()
        } else {
            self.egress_after(run_id, after.egress, limit).await?
        };
        let events = if after.events_done {
            Vec::new()
        } else {
            self.audit_events_after(run_id, after.event, limit).await?
        };
        Ok(merge(egress, events, after, limit as usize))
    }
}

/// Merges one page of each table (each `limit` rows when its table may
/// have more) into the audit's next page.
fn merge(
    egress: Vec<EgressEntry>,
    events: Vec<Event>,
    after: AuditCursor,
    limit: usize,
) -> AuditPage {
    let more_egress = egress.len() >= limit;
    let more_events = events.len() >= limit;
    let mut egress = egress.into_iter().peekable();
    let mut events = events.into_iter().peekable();
    let mut entries = Vec::with_capacity(limit);
    let mut cursor = after;
    while entries.len() < limit {
        let take_egress = match (egress.peek(), events.peek()) {
            (Some(e), Some(v)) => e.at <= v.at,
            // A table whose page ran out may have earlier rows unread.
            (Some(_), None) if more_events => break,
            (None, Some(_)) if more_egress => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let entry = if take_egress {
            egress.next().map(|e| {
                cursor.egress = e.id;
                AuditEntry::Egress(e)
            })
        } else {
            events.next().map(|v| {
                cursor.event = v.id;
                AuditEntry::Event(v)
            })
        };
        entries.extend(entry);
    }
    cursor.egress_done = !more_egress && egress.peek().is_none();
    cursor.events_done = !more_events && events.peek().is_none();
    AuditPage {
        entries,
        next: (!(cursor.egress_done && cursor.events_done)).then_some(cursor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EgressDecision, EgressSource};

    fn egress(id: i64, at: i64) -> EgressEntry {
        EgressEntry {
            id,
            at,
            run_id: "run".into(),
            decision: EgressDecision::Refused,
            reason: Some(crate::RefusalCode::RuleRefused),
            rule: Some("read-only".into()),
            source: EgressSource::ApiCall,
            plane: crate::EgressPlane::Api,
            integration: Some("gh".into()),
            method: "DELETE".into(),
            host: "api.gh.test".into(),
            url: format!("https://api.gh.test/items/{id}"),
            status: None,
            duration_ms: None,
            bytes_out: 0,
            bytes_in: 0,
            seq: Some(id),
            outcome: None,
            metering: None,
        }
    }

    fn event(id: i64, at: i64) -> Event {
        Event {
            id,
            run_id: "r".into(),
            at,
            kind: "tool_excluded".into(),
            payload: "{}".into(),
        }
    }

    fn ats(p: &AuditPage) -> Vec<i64> {
        p.entries.iter().map(AuditEntry::at).collect()
    }

    #[test]
    fn two_short_pages_merge_by_time_and_end_the_audit() {
        let p = merge(
            vec![egress(1, 10), egress(2, 30)],
            vec![event(7, 20), event(8, 30)],
            AuditCursor::default(),
            5,
        );
        assert_eq!(ats(&p), [10, 20, 30, 30]);
        assert!(
            matches!(p.entries[2], AuditEntry::Egress(_)),
            "egress first on a tie"
        );
        assert_eq!(p.next, None);
    }

    #[test]
    fn a_full_page_that_runs_out_ends_the_page_at_its_last_row() {
        // Two egress rows read of more: the events after them wait for the
        // egress table's next page, which may hold earlier ones.
        let p = merge(
            vec![egress(1, 10), egress(2, 20)],
            vec![event(7, 50)],
            AuditCursor::default(),
            2,
        );
        assert_eq!(ats(&p), [10, 20]);
        assert_eq!(
            p.next,
            Some(AuditCursor {
                egress: 2,
                ..AuditCursor::default()
            })
        );
        let next = merge(vec![egress(3, 40)], vec![event(7, 50)], p.next.unwrap(), 2);
        assert_eq!(ats(&next), [40, 50]);
        assert_eq!(next.next, None);
    }

    #[test]
    fn a_page_cut_at_the_limit_keeps_its_cursor() {
        let p = merge(
            vec![egress(1, 10), egress(2, 20), egress(3, 30)],
            vec![event(5, 15)],
            AuditCursor::default(),
            3,
        );
        assert_eq!(ats(&p), [10, 15, 20]);
        assert_eq!(
            p.next,
            Some(AuditCursor {
                egress: 2,
                event: 5,
                egress_done: false,
                // The events table was read to its end: the next page does
                // not ask it again.
                events_done: true,
            })
        );
    }
}
