//! [`Phase`]: what a connection is doing, and so which deadline it is under.
//!
//! Go's `net/http` server (kube-apiserver's, controller-runtime's) runs each connection through
//! the same cycle, and this is its transition table:
//!
//! | phase | event | next phase |
//! |---|---|---|
//! | (opened, TLS done) | | `ReadingHead { since: now }` |
//! | `Idle` | a byte arrives | `ReadingHead { since: now }` |
//! | any | a request head is parsed (the handler is called) | `Busy { in_flight + 1 }` |
//! | `Busy { 1 }` | its response ends (body sent or dropped) | `Idle { since: now }` |
//! | `Busy { n > 1 }` | a response ends | `Busy { n - 1 }` |
//!
//! Deadlines: `ReadingHead` closes at `since + read_header_timeout`, `Idle` at
//! `since + idle_timeout`, `Busy` never (a watch streams for as long as it lasts; what ends it
//! is the handler, the client, or TCP keep-alive finding the peer gone).
//!
//! hyper's own `header_read_timeout` is not used: it starts when hyper waits for the next head,
//! so it would also close idle keep-alive connections after 32 s instead of 90 s.

use crate::ServingConfig;
use tokio::time::Instant;

/// The phase of one connection. Invariant: `Busy::in_flight >= 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reading a request's line and headers: since the connection opened (its first request)
    /// or since the first byte of a later request arrived.
    ReadingHead {
        /// When the head began.
        since: Instant,
    },
    /// Between requests, nothing read of the next one.
    Idle {
        /// When the last response ended.
        since: Instant,
    },
    /// Requests whose handler runs or whose response body is still being sent.
    Busy {
        /// How many (HTTP/1.1 serves one at a time; pipelining may briefly overlap two).
        in_flight: usize,
    },
}

/// Why a connection was closed by its deadline (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// `read_header_timeout` passed while reading a head.
    HeaderRead,
    /// `idle_timeout` passed between requests.
    Idle,
}

impl Expiry {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Expiry::HeaderRead => "read header timeout",
            Expiry::Idle => "idle timeout",
        }
    }
}

impl Phase {
    /// A connection ready for its first request.
    pub(crate) fn opened(now: Instant) -> Phase {
        Phase::ReadingHead { since: now }
    }

    /// Bytes arrived from the client.
    pub(crate) fn on_read(self, now: Instant) -> Phase {
        match self {
            Phase::Idle { .. } => Phase::ReadingHead { since: now },
            other => other,
        }
    }

    /// A request's head was parsed and its handler called.
    pub(crate) fn on_request(self) -> Phase {
        match self {
            Phase::Busy { in_flight } => Phase::Busy {
                in_flight: in_flight.saturating_add(1),
            },
            _ => Phase::Busy { in_flight: 1 },
        }
    }

    /// A request's response ended (fully sent, or dropped with the handler).
    pub(crate) fn on_response_end(self, now: Instant) -> Phase {
        match self {
            Phase::Busy { in_flight } if in_flight > 1 => Phase::Busy {
                in_flight: in_flight - 1,
            },
            Phase::Busy { .. } => Phase::Idle { since: now },
            // Not reachable (every end follows its request); stay put rather than invent one.
            other => other,
        }
    }

    /// When the connection is to be closed, and why; `None` while busy.
    pub(crate) fn deadline(self, config: &ServingConfig) -> Option<(Instant, Expiry)> {
        match self {
            Phase::ReadingHead { since } => Some((since + config.read_header_timeout, Expiry::HeaderRead)),
            Phase::Idle { since } => Some((since + config.idle_timeout, Expiry::Idle)),
            Phase::Busy { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config() -> ServingConfig {
        ServingConfig::default()
            .read_header_timeout(Duration::from_secs(32))
            .idle_timeout(Duration::from_secs(90))
    }

    #[test]
    fn a_new_connection_is_under_the_header_deadline() {
        let t0 = Instant::now();
        let phase = Phase::opened(t0);
        assert_eq!(
            phase.deadline(&config()),
            Some((t0 + Duration::from_secs(32), Expiry::HeaderRead))
        );
        // Bytes of the head do not push the deadline back (a slowloris sends a byte at a time).
        let later = t0 + Duration::from_secs(10);
        assert_eq!(phase.on_read(later), phase);
    }

    #[test]
    fn a_busy_connection_has_no_deadline_however_long_it_streams() {
        let t0 = Instant::now();
        let busy = Phase::opened(t0).on_request();
        assert_eq!(busy, Phase::Busy { in_flight: 1 });
        assert_eq!(busy.deadline(&config()), None);
        // Reads during a request (its body) change nothing.
        assert_eq!(busy.on_read(t0 + Duration::from_secs(1000)), busy);
    }

    #[test]
    fn idle_after_the_response_then_header_deadline_from_the_next_first_byte() {
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(5);
        let idle = Phase::opened(t0).on_request().on_response_end(end);
        assert_eq!(
            idle.deadline(&config()),
            Some((end + Duration::from_secs(90), Expiry::Idle))
        );
        let byte = end + Duration::from_secs(60);
        assert_eq!(
            idle.on_read(byte).deadline(&config()),
            Some((byte + Duration::from_secs(32), Expiry::HeaderRead))
        );
    }

    #[test]
    fn overlapping_requests_stay_busy_until_the_last_ends() {
        let t0 = Instant::now();
        let two = Phase::opened(t0).on_request().on_request();
        assert_eq!(two, Phase::Busy { in_flight: 2 });
        assert_eq!(two.on_response_end(t0), Phase::Busy { in_flight: 1 });
        assert_eq!(two.on_response_end(t0).on_response_end(t0), Phase::Idle { since: t0 });
        // An end with nothing in flight is ignored.
        assert_eq!(Phase::Idle { since: t0 }.on_response_end(t0), Phase::Idle { since: t0 });
    }
}
