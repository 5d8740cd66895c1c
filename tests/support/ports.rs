//! TCP ports for servers a test starts later (PostgreSQL, an object store, an operator).
//!
//! `bind("127.0.0.1:0")` then drop hands out a port from the kernel's ephemeral range: until
//! the server binds it, any outgoing connection of the same machine may take it as its local
//! port, and the next `bind(0)` may hand it out again. Seen in CI: a loopback primary could
//! not bind its port, and its standby cloned another test's server from that port. These ports
//! come from below the ephemeral range (never used for outgoing connections) and each one is
//! handed out once per process.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// First port handed out (the default ephemeral range starts at 32768).
const FIRST: u32 = 20_000;
/// Number of ports in the range.
const COUNT: u32 = 12_000;

static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A TCP port that nothing listens on (on any address), never handed out before by this process.
pub fn unused_port() -> u16 {
    // Start at a place of the range that depends on the process, so that two test binaries
    // (or an earlier run's leftovers) rarely walk the same ports.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % COUNT,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..COUNT {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst) % COUNT;
        let port = (FIRST + offset) as u16;
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no unused TCP port in {FIRST}..{}", FIRST + COUNT);
}
