//! The pooler agent's decisions (pure): where the read-write PgBouncer points, and when a pause
//! the operator asked for ends. The agent acts on what [`step`] returns.

use std::time::{Duration, Instant};

pub use crate::api::pooler::MAX_PAUSE;
/// How long a pause may wait for its switchover to show up in the status before the agent
/// decides the operator never published it (it crashed, or lost its leadership, in between).
pub const UNSTARTED_GRACE: Duration = Duration::from_secs(10);

/// What the agent read of the DatabaseService's status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// `status.currentPrimary`.
    pub current_primary: Option<String>,
    /// `status.targetPrimary`.
    pub target_primary: Option<String>,
    /// A failover or switchover is in progress.
    pub transition: bool,
}

impl Observed {
    /// The primary to point at: known and not changing.
    pub fn settled_primary(&self) -> Option<&str> {
        let current = self.current_primary.as_deref()?;
        (!self.transition && self.target_primary.as_deref() == Some(current)).then_some(current)
    }
}

/// Whether the read-write pool is paused, and for what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PauseState {
    /// Serving.
    Running,
    /// Paused for the switchover to `target`.
    Paused {
        /// The instance the operator switches over to.
        target: String,
        /// When the pause began.
        since: Instant,
        /// The switchover was seen in the status.
        seen_transition: bool,
    },
}

/// What the agent does now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Point the read-write PgBouncer at this instance (write, RELOAD, RECONNECT).
    Point(String),
    /// Resume the read-write PgBouncer, for this reason.
    Resume(&'static str),
}

/// The actions for `observed`, the instance pointed at, and `state` (updated).
pub fn step(state: &mut PauseState, pointed: Option<&str>, observed: &Observed, now: Instant) -> Vec<Action> {
    let settled = observed.settled_primary();
    let point = |to: Option<&str>| to.filter(|to| Some(*to) != pointed).map(|to| Action::Point(to.to_string()));
    let PauseState::Paused { target, since, seen_transition } = state else {
        return point(settled).into_iter().collect();
    };
    *seen_transition |= observed.transition;
    let waited = now.saturating_duration_since(*since);
    let reason = if waited >= MAX_PAUSE {
        Some("paused for too long")
    } else if observed.transition {
        None
    } else if settled == Some(target.as_str()) {
        Some("switched over")
    } else if *seen_transition {
        Some("switchover ended")
    } else if waited >= UNSTARTED_GRACE {
        Some("the switchover never started")
    } else {
        None
    };
    let Some(reason) = reason else { return Vec::new() };
    let mut actions: Vec<Action> = point(settled).into_iter().collect();
    actions.push(Action::Resume(reason));
    *state = PauseState::Running;
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(current: &str, target: &str, transition: bool) -> Observed {
        Observed { current_primary: Some(current.into()), target_primary: Some(target.into()), transition }
    }

    fn paused(at: Instant) -> PauseState {
        PauseState::Paused { target: "db-1".into(), since: at, seen_transition: false }
    }

    #[test]
    fn a_running_pool_follows_the_settled_primary_only() {
        let now = Instant::now();
        let mut state = PauseState::Running;
        assert_eq!(step(&mut state, None, &observed("db-0", "db-0", false), now), [Action::Point("db-0".into())]);
        assert!(step(&mut state, Some("db-0"), &observed("db-0", "db-0", false), now).is_empty());
        assert!(step(&mut state, Some("db-0"), &observed("db-0", "pending", true), now).is_empty(), "a failover runs");
        assert_eq!(
            step(&mut state, Some("db-0"), &observed("db-1", "db-1", false), now),
            [Action::Point("db-1".into())]
        );
    }

    #[test]
    fn a_pause_holds_through_the_switchover_and_resumes_on_the_new_primary() {
        let start = Instant::now();
        let mut state = paused(start);
        // Asked before the operator published the switchover: the old primary still settled.
        assert!(step(&mut state, Some("db-0"), &observed("db-0", "db-0", false), start).is_empty());
        assert!(
            step(&mut state, Some("db-0"), &observed("db-0", "db-1", true), start + Duration::from_secs(1)).is_empty()
        );
        let done = step(&mut state, Some("db-0"), &observed("db-1", "db-1", false), start + Duration::from_secs(3));
        assert_eq!(done, [Action::Point("db-1".into()), Action::Resume("switched over")]);
        assert_eq!(state, PauseState::Running);
    }

    #[test]
    fn an_abandoned_or_unstarted_or_endless_switchover_resumes() {
        let start = Instant::now();
        let mut state = paused(start);
        step(&mut state, Some("db-0"), &observed("db-0", "db-1", true), start);
        let abandoned =
            step(&mut state, Some("db-0"), &observed("db-0", "db-0", false), start + Duration::from_secs(2));
        assert_eq!(abandoned, [Action::Resume("switchover ended")]);

        let mut state = paused(start);
        let early = step(&mut state, Some("db-0"), &observed("db-0", "db-0", false), start + Duration::from_secs(9));
        assert!(early.is_empty());
        let late = step(&mut state, Some("db-0"), &observed("db-0", "db-0", false), start + UNSTARTED_GRACE);
        assert_eq!(late, [Action::Resume("the switchover never started")]);

        let mut state = paused(start);
        let endless = step(&mut state, Some("db-0"), &observed("db-0", "db-1", true), start + MAX_PAUSE);
        assert_eq!(endless, [Action::Resume("paused for too long")]);
    }
}
