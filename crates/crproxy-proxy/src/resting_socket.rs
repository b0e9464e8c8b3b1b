//! A socket whose arrivals can be left unannounced for a while.
//!
//! The ownership cache reads its watch in batches: after each read it rests for a
//! few milliseconds so that events gather in the socket. Not reading is not
//! enough: every event the target sends still makes the kernel wake the runtime's
//! poller, which finds nobody waiting and sleeps again. On an otherwise idle proxy
//! that wake-up was most of the cost of an event (docs/performance.md,
//! twenty-third pass). While the socket rests, its receive low-water mark
//! (`SO_RCVLOWAT`) is raised, so arrivals below it do not make the socket
//! readable and wake no one; lowering it again announces whatever has gathered.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use crproxy_sockopt::set_receive_low_water;

/// Bytes that may gather while the socket rests before it wakes its reader
/// anyway. Linux caps the mark at half of `net.ipv4.tcp_rmem`'s largest buffer
/// (3 MiB with the kernel's defaults), grows the socket's receive buffer to hold
/// it and clamps the receive window at it, so the mark also bounds what the
/// target may send in one pause: 256 KiB held the cache's watch to 256 KiB per
/// 10 ms (docs/performance.md, twenty-third pass). As large as the cap allows,
/// a pause gathers what the socket's autotuning would have let in anyway. Both
/// outlast the rest: a watch's connection that goes back to the pool serves its
/// later exchanges with the larger buffer.
pub const REST_THRESHOLD: i32 = 4 * 1024 * 1024;

/// A duplicate of a connection's socket (it keeps the socket open as long as it
/// lives, so it must not outlive the reading of that connection by much).
#[derive(Debug)]
pub struct RestingSocket {
    socket: Arc<OwnedFd>,
    state: Rest,
}

/// Where a [`RestingSocket`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rest {
    Awake,
    Resting,
    /// The mark could not be raised (not Linux, or not a socket): the socket
    /// is read as any other, and no later pause tries again.
    Unable,
}

impl RestingSocket {
    pub fn new(socket: Arc<OwnedFd>) -> Self {
        Self {
            socket,
            state: Rest::Awake,
        }
    }

    /// From now until [`RestingSocket::wake`], arrivals under [`REST_THRESHOLD`]
    /// leave the socket unreadable. A socket the option cannot be set on just
    /// stays as it was (resting only saves wake-ups), and is not asked again:
    /// what failed once fails at every pause.
    pub fn rest(&mut self) {
        if self.state != Rest::Awake {
            return;
        }
        match set_receive_low_water(self.socket.as_fd(), REST_THRESHOLD) {
            Ok(()) => self.state = Rest::Resting,
            Err(error) => {
                tracing::debug!(%error, "the watch socket cannot rest; it is read as it comes");
                self.state = Rest::Unable;
            }
        }
    }

    /// Makes the socket readable again as soon as anything has arrived, including
    /// what gathered while it rested (the kernel announces that at once).
    pub fn wake(&mut self) {
        if self.state != Rest::Resting {
            return;
        }
        match set_receive_low_water(self.socket.as_fd(), 1) {
            Ok(()) => self.state = Rest::Awake,
            Err(error) => tracing::debug!(%error, "could not wake the watch socket"),
        }
    }
}

impl Drop for RestingSocket {
    /// A connection never goes back to the pool with its socket resting.
    fn drop(&mut self) {
        self.wake();
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests;
