//! Connection slots of a server. When every slot is taken, a newcomer does not wait behind clients
//! that are not between two answered requests: the one that has been so longest (a handshake,
//! headers or a body trickling in, a connection left idle from the start, a request refused as
//! malformed or late) is closed to make room. Only if there is none, the kept connection (idle
//! after a request answered with success, such as the apiserver's keep-alive pool) that has been
//! idle longest goes. A request whose body has been read and is being decided is never cut.
//!
//! Without this, 1000 slow clients against a cap of 512 made about 2 % of new, legitimate
//! connections wait for a timeout (5–10 s) to free a slot: longer than the apiserver waits. And
//! "answered once" alone was not enough (issue 37): a client answered 408 for its trickled body, or
//! answered once and trickling its next body, or re-sending a made-up review every few seconds,
//! kept its slot for good, and newcomers (the apiserver's) waited in the backlog.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// No request yet, or the last one refused: the first to go.
const WAITING: u8 = 0;
/// Headers in, the body arriving: goes like [`WAITING`], oldest first.
const READING: u8 = 1;
/// The body is read and the request is being decided: never cut.
const DECIDING: u8 = 2;
/// Idle after a successful answer: goes only when no [`WAITING`] or [`READING`] one is left.
const KEPT: u8 = 3;

/// The slots of one listener and the connections holding them.
#[derive(Debug)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    open: Mutex<BTreeMap<u64, Tracked>>,
    next_id: AtomicU64,
    /// Orders the moments connections changed state: the smallest of a kind goes first.
    clock: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Tracked {
    state: Arc<AtomicU8>,
    since: Arc<AtomicU64>,
    evict: Arc<Notify>,
}

/// What a connection is doing, as the request layer tells it.
#[derive(Clone, Debug)]
pub struct ConnectionMarks {
    state: Arc<AtomicU8>,
    since: Arc<AtomicU64>,
    clock: Arc<AtomicU64>,
    /// Milliseconds from `epoch` to the last change of state.
    changed_at: Arc<AtomicU64>,
    epoch: Instant,
}

impl ConnectionMarks {
    fn set(&self, state: u8) {
        self.state.store(state, Ordering::Release);
        self.since.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Release);
        self.changed_at.store(millis_since(self.epoch), Ordering::Release);
    }

    /// How long the connection has been waiting (no request yet, or its last one refused), or
    /// `None` when it is doing something else or kept after a success.
    pub fn waiting_for(&self) -> Option<Duration> {
        (self.state.load(Ordering::Acquire) == WAITING).then(|| {
            let changed_at = self.changed_at.load(Ordering::Acquire);
            Duration::from_millis(millis_since(self.epoch).saturating_sub(changed_at))
        })
    }

    /// A request began (its headers arrived).
    pub fn request_started(&self) {
        self.set(READING);
    }

    /// The request's body arrived whole: the request is being decided.
    pub fn body_read(&self) {
        self.set(DECIDING);
    }

    /// The request was answered: a success makes the connection one that is kept.
    pub fn answered(&self, success: bool) {
        self.set(if success { KEPT } else { WAITING });
    }

    /// Whether the connection is idle after a successful answer.
    pub fn kept(&self) -> bool {
        self.state.load(Ordering::Acquire) == KEPT
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One connection's slot, released when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    id: u64,
    /// For the request layer.
    pub marks: ConnectionMarks,
    /// Notified when the connection is to be closed to make room for a newcomer.
    pub evicted: Arc<Notify>,
    owner: Arc<ConnectionSlots>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.owner.open.lock().expect("connection slots lock").remove(&self.id);
    }
}

impl ConnectionSlots {
    /// Slots for at most `max_connections` connections (at least one).
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max_connections.max(1))),
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            clock: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A slot for a connection just accepted: a free one; else the slot of the connection that
    /// [`Self::evict_one`] closes; else the first slot to free up.
    pub async fn claim(self: &Arc<Self>) -> ConnectionSlot {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                self.evict_one();
                self.slots.clone().acquire_owned().await.expect("the connection semaphore is never closed")
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(AtomicU8::new(WAITING));
        let since = Arc::new(AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)));
        let evicted = Arc::new(Notify::new());
        let tracked = Tracked { state: state.clone(), since: since.clone(), evict: evicted.clone() };
        self.open.lock().expect("connection slots lock").insert(id, tracked);
        let epoch = Instant::now();
        let marks = ConnectionMarks { state, since, clock: self.clock.clone(), changed_at: Arc::default(), epoch };
        ConnectionSlot { id, marks, evicted, owner: self.clone(), _permit: permit }
    }

    /// Asks one connection to close: the one waiting or reading for longest, else the one kept
    /// idle for longest; never one deciding. False when there is none.
    fn evict_one(&self) -> bool {
        let mut open = self.open.lock().expect("connection slots lock");
        let oldest = |wanted: &[u8]| {
            open.iter()
                .filter(|(_, tracked)| wanted.contains(&tracked.state.load(Ordering::Acquire)))
                .min_by_key(|(_, tracked)| tracked.since.load(Ordering::Acquire))
                .map(|(id, _)| *id)
        };
        let Some(id) = oldest(&[WAITING, READING]).or_else(|| oldest(&[KEPT])) else {
            return false;
        };
        // Removed now so a second newcomer picks the next one; notify_one keeps the wake-up even
        // if the connection's task is not waiting yet.
        if let Some(tracked) = open.remove(&id) {
            tracked.evict.notify_one();
        }
        true
    }

    /// Connections holding a slot.
    pub fn open_connections(&self) -> usize {
        self.open.lock().expect("connection slots lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Claims a slot at a full `slots` and returns which of `candidates` was told to close.
    async fn evicted_for_a_newcomer(slots: &Arc<ConnectionSlots>, candidates: &[&ConnectionSlot]) -> usize {
        let claiming = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim().await }
        });
        let waits = candidates.iter().enumerate().map(|(index, slot)| {
            let evicted = slot.evicted.clone();
            Box::pin(async move {
                evicted.notified().await;
                index
            })
        });
        let (index, _, _) = tokio::time::timeout(Duration::from_secs(5), futures::future::select_all(waits))
            .await
            .expect("a connection is told to close");
        claiming.abort();
        index
    }

    #[tokio::test]
    async fn a_newcomer_at_the_cap_takes_the_slot_of_the_connection_waiting_longest() {
        let slots = ConnectionSlots::new(3);
        let oldest_idle = slots.claim().await;
        let kept = slots.claim().await;
        kept.marks.request_started();
        kept.marks.answered(true);
        let younger_idle = slots.claim().await;
        assert_eq!(evicted_for_a_newcomer(&slots, &[&oldest_idle, &kept, &younger_idle]).await, 0);
    }

    #[tokio::test]
    async fn the_order_is_when_a_connection_began_waiting_not_when_it_opened() {
        let slots = ConnectionSlots::new(2);
        let first = slots.claim().await;
        let second = slots.claim().await;
        second.marks.request_started();
        // The first, answered, then trickling its next body since after the second began.
        first.marks.request_started();
        first.marks.body_read();
        first.marks.answered(true);
        first.marks.request_started();
        assert_eq!(evicted_for_a_newcomer(&slots, &[&first, &second]).await, 1);
    }

    #[tokio::test]
    async fn a_refused_request_does_not_make_a_connection_kept() {
        let slots = ConnectionSlots::new(2);
        let refused = slots.claim().await;
        refused.marks.request_started();
        refused.marks.answered(false);
        let kept = slots.claim().await;
        kept.marks.request_started();
        kept.marks.answered(true);
        assert!(!refused.marks.kept() && kept.marks.kept());
        assert_eq!(evicted_for_a_newcomer(&slots, &[&refused, &kept]).await, 0);
    }

    #[tokio::test]
    async fn kept_connections_go_idlest_first_and_only_when_no_other_can() {
        let slots = ConnectionSlots::new(2);
        let (idlest, recent) = (slots.claim().await, slots.claim().await);
        for slot in [&idlest, &recent] {
            slot.marks.request_started();
            slot.marks.answered(true);
        }
        assert_eq!(evicted_for_a_newcomer(&slots, &[&idlest, &recent]).await, 0);
    }

    #[tokio::test]
    async fn a_request_being_decided_is_never_cut() {
        let slots = ConnectionSlots::new(1);
        let deciding = slots.claim().await;
        deciding.marks.request_started();
        deciding.marks.body_read();
        let claiming = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim().await }
        });
        let evicted = deciding.evicted.clone();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), evicted.notified()).await.is_err(),
            "a request being decided was cut"
        );
        assert!(!claiming.is_finished(), "the newcomer must wait for a slot");
        drop(deciding);
        let newcomer = tokio::time::timeout(Duration::from_secs(5), claiming).await.unwrap().unwrap();
        assert_eq!(slots.open_connections(), 1);
        drop(newcomer);
        assert_eq!(slots.open_connections(), 0);
    }
}
