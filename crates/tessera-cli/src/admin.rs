//! Admin commands: `revoke`, `resize`, `delete`. Each validates its arguments before it
//! opens the store, never creates one, prints one line, and exits [`exit::NOT_FOUND`] when
//! there was nothing to change (including when there is no store yet).

use tessera::backend::Name;
use tessera::LeaseId;

use crate::exit::{self, Failure, Outcome};

/// `tessera revoke NAME LEASE_ID`.
pub async fn revoke(store_url: Option<&str>, name: &str, lease: &str) -> Outcome {
    Name::new(name)?;
    lease.parse::<LeaseId>()?;
    let store = crate::store_url::open_existing(store_url)
        .await?
        .required("nothing revoked")?;
    if store.revoke(name, lease).await? {
        println!("revoked lease {lease} on {name}; its holder is told it lost the permit");
        Ok(exit::OK)
    } else {
        Err(Failure::new(
            exit::NOT_FOUND,
            format!("lease {lease} does not hold {name}; nothing revoked"),
        ))
    }
}

/// `tessera resize NAME CAPACITY`.
pub async fn resize(store_url: Option<&str>, name: &str, capacity: u32) -> Outcome {
    Name::new(name)?;
    if capacity == 0 || capacity > tessera::MAX_CAPACITY {
        return Err(tessera::InvalidInput::Capacity(capacity).into());
    }
    let store = crate::store_url::open_existing(store_url)
        .await?
        .required("nothing resized")?;
    match store.resize(name, capacity).await {
        Ok(old) => {
            println!("resized {name}: capacity {old} -> {capacity}");
            Ok(exit::OK)
        }
        Err(e) if e.is_not_found() => Err(Failure::new(
            exit::NOT_FOUND,
            format!(
                "no semaphore named {name} in {}; nothing resized",
                store.url()
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `tessera delete NAME`: the semaphore and the rate limiter named NAME, whichever exist.
pub async fn delete(store_url: Option<&str>, name: &str) -> Outcome {
    Name::new(name)?;
    let store = crate::store_url::open_existing(store_url)
        .await?
        .required("nothing deleted")?;
    let semaphore = store.delete(name).await?;
    let rate = match store.delete_rate_limiter(name).await {
        Ok(existed) => existed,
        // A store without rate limiting holds no rate limiter to delete.
        Err(tessera::Error::Unsupported(_)) => false,
        Err(e) => return Err(e.into()),
    };
    let what = match (semaphore, rate) {
        (false, false) => {
            return Err(Failure::new(
                exit::NOT_FOUND,
                format!(
                    "no semaphore or rate limiter named {name} in {}; nothing deleted",
                    store.url()
                ),
            ))
        }
        (true, false) => "the semaphore",
        (false, true) => "the rate limiter",
        (true, true) => "the semaphore and the rate limiter",
    };
    let mut line = format!("deleted {what} {name}");
    if semaphore {
        line.push_str(
            "; the semaphore's holders and waiters are gone, holders are told they lost their permits",
        );
    }
    if rate {
        line.push_str("; the rate limiter's history and reservations are gone");
    }
    println!("{line}");
    Ok(exit::OK)
}
