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

/// `tessera delete NAME`.
pub async fn delete(store_url: Option<&str>, name: &str) -> Outcome {
    Name::new(name)?;
    let store = crate::store_url::open_existing(store_url)
        .await?
        .required("nothing deleted")?;
    if store.delete(name).await? {
        println!(
            "deleted {name} with its holders and waiters; holders are told they lost their permits"
        );
        Ok(exit::OK)
    } else {
        Err(Failure::new(
            exit::NOT_FOUND,
            format!(
                "no semaphore named {name} in {}; nothing deleted",
                store.url()
            ),
        ))
    }
}
