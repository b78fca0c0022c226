//! The eviction check at connect: a server that may evict tessera's keys can silently drop
//! leases (see the [store's docs](super)).

use super::error::store_error;
use super::url::{Config, EvictionPolicy};
use tessera_core::error::{Error, Result, StoreErrorKind};

/// Reads the memory limit and eviction policy; warns or refuses if tessera's keys may be
/// evicted. A refused `CONFIG` (ACL, managed services) is logged and tolerated.
pub(super) async fn check_eviction(
    conn: &mut redis::aio::MultiplexedConnection,
    config: &Config,
    secret: Option<&str>,
) -> Result<()> {
    async fn get(
        conn: &mut redis::aio::MultiplexedConnection,
        param: &str,
    ) -> redis::RedisResult<Option<String>> {
        let v: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(param)
            .query_async(conn)
            .await?;
        Ok(v.get(1).cloned())
    }
    let (maxmemory, policy) = match (
        get(conn, "maxmemory").await,
        get(conn, "maxmemory-policy").await,
    ) {
        (Ok(m), Ok(p)) => (m.unwrap_or_default(), p.unwrap_or_default()),
        (Err(e), _) | (_, Err(e)) => {
            if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                return Err(store_error(e, secret));
            }
            tracing::info!(url = %config.redacted, error = %store_error(e, secret),
                "cannot read the eviction policy (CONFIG refused); make sure maxmemory-policy is noeviction");
            return Ok(());
        }
    };
    let limited = maxmemory
        .trim()
        .parse::<u64>()
        .map(|m| m > 0)
        .unwrap_or(false);
    let evicts = policy.starts_with("allkeys-") || policy.starts_with("volatile-");
    if limited && evicts {
        let message = format!(
            "{} has maxmemory {maxmemory} with maxmemory-policy {policy}: Redis may evict tessera's \
             lease keys under memory pressure and over-grant permits; set maxmemory-policy noeviction",
            config.redacted
        );
        if config.eviction == EvictionPolicy::Refuse {
            return Err(Error::store(
                StoreErrorKind::Other,
                format!("refused (eviction=refuse): {message}"),
            ));
        }
        tracing::warn!("{message}");
    }
    Ok(())
}
