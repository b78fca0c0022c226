//! The limits every store enforces on what crosses the seam. The bottom layer: it imports
//! nothing of tessera, so the error messages ([`crate::error`]) and the model can both name
//! them.

use std::time::Duration;

/// Largest capacity a semaphore may have.
pub const MAX_CAPACITY: u32 = 1_000_000;
/// Largest wait-queue cap.
pub const MAX_QUEUE_CAP: u32 = 1_000_000;
/// Longest name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest holder label, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;
/// Shortest lease TTL.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// Longest lease TTL.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
