//! One folder per store, each with the same file names: `mod.rs` (URL, connection and the
//! [`crate::store::Backend`] glue) and `ops.rs` (the atomic operations).

#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;
