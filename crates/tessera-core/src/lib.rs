//! # tessera-core: what every part of tessera builds on
//!
//! The bottom layers of [tessera-locks](https://docs.rs/tessera-locks), in a crate of their
//! own so that the compiler keeps them below the stores and the façade: nothing here can name
//! a store, the `Store` handle or a semaphore, because this crate does not depend on them.
//! Programs use `tessera-locks` (`use tessera::…`); store authors find the seam re-exported
//! in `tessera::backend`. The API follows tessera-locks' version and is not meant to be used
//! on its own.
//!
//! The layers, bottom first (a module uses only those above it in this list; the library's
//! `tests/layers.rs` checks it):
//!
//! - `limits`: the bounds every input is checked against;
//! - `error`: the one error type and its kinds;
//! - `model`: names, leases, grants, requests and replies, the store's time;
//! - `clock`: the store clock (system or manual);
//! - `wake`: how a waiter learns of a grant in this process;
//! - `rate::spec`, `rate::seam`, `admission::seam`: what a rate limit and an admission are,
//!   and their store seams;
//! - `seam`: the store seam ([`seam::Backend`]) and its capabilities;
//! - `rate::engine`: the rate decision the memory, SQLite and MySQL stores run;
//! - `stores::batch`, `stores::expiries`, `stores::url`: parts several stores share;
//! - `stores::sql`: the step the SQL stores share, with a dialect each.

pub mod clock;
pub mod error;
pub mod limits;
pub mod model;
pub mod seam;
pub mod wake;

/// Rate limits: what a limit is, the seam, and the decision the Rust stores share.
pub mod rate {
    // Only the stores call the engine; a build without any store has no use for it.
    #[cfg(any(
        feature = "memory",
        feature = "sqlite",
        feature = "redis",
        feature = "mysql",
        feature = "postgres"
    ))]
    pub mod engine;
    pub mod seam;
    pub mod spec;
}

/// Admissions: the seam of permits and rate windows taken in one step.
pub mod admission {
    pub mod seam;
}

/// Parts the stores share.
pub mod stores {
    #[cfg(any(feature = "mysql", feature = "postgres", feature = "redis"))]
    pub mod batch;
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub mod expiries;
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    pub mod sql;
    #[cfg(any(
        feature = "redis",
        feature = "mysql",
        feature = "postgres",
        feature = "etcd"
    ))]
    pub mod url;
}
