//! Connection slots of a server. When every slot is taken, a newcomer does not wait behind
//! clients that are not between two answered requests (a handshake, headers or a body trickling
//! in, a connection left idle from the start, a request refused as malformed or late): the one
//! that has been in that state longest is closed to make room. Connections idle after a request
//! answered with success, such as the apiserver's keep-alive connections, are never closed for a
//! newcomer; when they hold every slot, newcomers wait in the listen backlog.
//!
//! Without this, 1000 slow clients against a cap of 512 made about 2 % of new, legitimate
//! connections wait for a timeout (5–10 s) to free a slot: longer than the apiserver waits. And
//! "answered once" alone was not enough: a client answered 408 for its trickled body, or answered
//! once and trickling its next body, kept its slot for good (issue 37).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The slots of one listener and the connections holding them, oldest first.
#[derive(Debug)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    open: Mutex<BTreeMap<u64, Tracked>>,
    next_id: AtomicU64,
    /// Orders the moments connections became busy: the smallest is evicted first.
    clock: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Tracked {
    served: Arc<AtomicBool>,
    since: Arc<AtomicU64>,
    evict: Arc<Notify>,
}

/// What a connection is doing, as the request layer tells it.
#[derive(Clone, Debug)]
pub struct ConnectionMarks {
    served: Arc<AtomicBool>,
    since: Arc<AtomicU64>,
    clock: Arc<AtomicU64>,
}

impl ConnectionMarks {
    /// A request began (its headers arrived): the connection is busy until it is answered.
    pub fn request_started(&self) {
        self.served.store(false, Ordering::Release);
        self.since.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Release);
    }

    /// The request was answered: a success makes the connection one that is kept.
    pub fn answered(&self, success: bool) {
        if success {
            self.served.store(true, Ordering::Release);
        }
    }
}

/// One connection's slot, released when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    id: u64,
    /// Set while the connection is idle after a request answered with success.
    pub served: Arc<AtomicBool>,
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

    /// A slot for a connection just accepted: a free one; else the slot of the oldest connection
    /// never served, once it has closed; else the first slot to free up.
    pub async fn claim(self: &Arc<Self>) -> ConnectionSlot {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                self.evict_oldest_unserved();
                self.slots.clone().acquire_owned().await.expect("the connection semaphore is never closed")
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let served = Arc::new(AtomicBool::new(false));
        let since = Arc::new(AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)));
        let evicted = Arc::new(Notify::new());
        let tracked = Tracked { served: served.clone(), since: since.clone(), evict: evicted.clone() };
        self.open.lock().expect("connection slots lock").insert(id, tracked);
        let marks = ConnectionMarks { served: served.clone(), since, clock: self.clock.clone() };
        ConnectionSlot { id, served, marks, evicted, owner: self.clone(), _permit: permit }
    }

    /// Asks the connection busy for longest without an answer to close; false when there is none.
    fn evict_oldest_unserved(&self) -> bool {
        let mut open = self.open.lock().expect("connection slots lock");
        let Some(id) = open
            .iter()
            .filter(|(_, tracked)| !tracked.served.load(Ordering::Acquire))
            .min_by_key(|(_, tracked)| tracked.since.load(Ordering::Acquire))
            .map(|(id, _)| *id)
        else {
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

    #[tokio::test]
    async fn a_newcomer_at_the_cap_takes_the_slot_of_the_oldest_connection_never_served() {
        let slots = ConnectionSlots::new(3);
        let oldest_idle = slots.claim().await;
        let served = slots.claim().await;
        served.served.store(true, Ordering::Release);
        let younger_idle = slots.claim().await;
        let evicted = oldest_idle.evicted.clone();
        let waiter = evicted.notified();
        let claiming = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim().await }
        });
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the oldest idle connection is told to close");
        drop(oldest_idle);
        let newcomer = tokio::time::timeout(Duration::from_secs(5), claiming).await.unwrap().unwrap();
        assert_eq!(slots.open_connections(), 3);
        drop((served, younger_idle, newcomer));
        assert_eq!(slots.open_connections(), 0);
    }

    #[tokio::test]
    async fn served_connections_are_never_closed_for_a_newcomer() {
        let slots = ConnectionSlots::new(1);
        let served = slots.claim().await;
        served.served.store(true, Ordering::Release);
        let claiming = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim().await }
        });
        let evicted = served.evicted.clone();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), evicted.notified()).await.is_err(),
            "a served connection was evicted"
        );
        assert!(!claiming.is_finished(), "the newcomer must wait for a slot");
        drop(served);
        tokio::time::timeout(Duration::from_secs(5), claiming).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_connection_busy_again_after_an_answer_is_evicted_before_one_that_just_began() {
        let slots = ConnectionSlots::new(2);
        // Answered once, then trickling its next request from before the newer connection came.
        let trickling = slots.claim().await;
        trickling.marks.request_started();
        trickling.marks.answered(true);
        trickling.marks.request_started();
        let newer = slots.claim().await;
        let waiter = trickling.evicted.clone();
        let notified = waiter.notified();
        let claiming = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim().await }
        });
        tokio::time::timeout(Duration::from_secs(5), notified).await.expect("the trickling connection is closed");
        drop(trickling);
        tokio::time::timeout(Duration::from_secs(5), claiming).await.unwrap().unwrap();
        drop(newer);
    }

    #[tokio::test]
    async fn a_refused_request_does_not_make_a_connection_kept() {
        let slots = ConnectionSlots::new(1);
        let refused = slots.claim().await;
        refused.marks.request_started();
        refused.marks.answered(false);
        let notified = refused.evicted.clone();
        let waiter = notified.notified();
        let claiming = tokio::spawn({
            let slots = slots.clone();
            async move { slots.claim().await }
        });
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("a 408 or 400 keeps no slot");
        drop(refused);
        tokio::time::timeout(Duration::from_secs(5), claiming).await.unwrap().unwrap();
    }
}
