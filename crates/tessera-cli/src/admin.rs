//! Admin commands: `revoke`, `resize`, `delete`, `tenants`. Each validates its arguments
//! before it opens the store. `revoke`, `resize` and `delete` never create one, print one
//! line, and exit [`exit::NOT_FOUND`] when there was nothing to change (including when there
//! is no store yet); `tenants` lists limits without creating a store, and sets them ahead of
//! the traffic they shape (creating the store if needed).

use std::collections::BTreeMap;

use tessera::backend::Name;
use tessera::{LeaseId, TenantLimits};

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

/// `tessera tenants NAME [TENANT --ceiling N --floor N --window-ceiling P% | TENANT
/// --clear]`: with a tenant, sets (or clears) its limits on NAME (all of them: one left out
/// is removed) and prints the line of what is kept now;
/// without, lists every tenant's (`--json`: an object by tenant).
pub async fn tenants(store_url: Option<&str>, cmd: TenantsCmd) -> Outcome {
    Name::new(&cmd.name)?;
    let Some(tenant) = cmd.tenant.as_deref() else {
        let store = match crate::store_url::open_existing(store_url).await? {
            crate::store_url::Existing::Open(store) => Some(store),
            // No store yet: no limits either.
            crate::store_url::Existing::Missing { .. } => None,
        };
        let kept = match &store {
            Some(store) => store.tenant_limits(&cmd.name).await?,
            None => Default::default(),
        };
        print_limits(&cmd.name, &kept, cmd.json);
        return Ok(exit::OK);
    };
    tessera::Tenant::new(tenant, 1)?;
    let limits = match cmd.clear {
        true => TenantLimits::default(),
        false => TenantLimits::new(cmd.ceiling, cmd.floor.unwrap_or(0))?
            .with_window_ceiling(cmd.window_ceiling)?,
    };
    // Limits are set ahead of the traffic they shape: the store is created if needed.
    let store = crate::store_url::connect(store_url).await?;
    store.set_tenant_limits(&cmd.name, tenant, limits).await?;
    let kept = store.tenant_limits(&cmd.name).await?;
    match (cmd.json, limits.is_none()) {
        (true, _) => print_limits(&cmd.name, &kept, true),
        (false, true) => println!("cleared {tenant}'s limits on {}", cmd.name),
        (false, false) => println!(
            "{tenant} on {}: {}",
            cmd.name,
            describe(kept.get(tenant).copied().unwrap_or(limits))
        ),
    }
    Ok(exit::OK)
}

/// The arguments of `tessera tenants`.
#[derive(Debug, clap::Args)]
pub struct TenantsCmd {
    /// Semaphore name
    pub name: String,
    /// The tenant whose limits to set (without: list every tenant's)
    pub tenant: Option<String>,
    /// At most this many permits held by the tenant at once (1..=1000000; left out: no
    /// ceiling)
    #[arg(long, value_name = "N", requires = "tenant", conflicts_with = "clear")]
    pub ceiling: Option<u32>,
    /// Permits kept for the tenant while it holds fewer (at most the ceiling; left out: 0)
    #[arg(long, value_name = "N", requires = "tenant", conflicts_with = "clear")]
    pub floor: Option<u32>,
    /// At most this share of each rate window of NAME's admissions for the tenant, a
    /// percentage 1..=100 (`20%` or `20`; left out: none)
    #[arg(long, value_name = "PERCENT", requires = "tenant", conflicts_with = "clear", value_parser = percent)]
    pub window_ceiling: Option<u8>,
    /// Remove the tenant's limits
    #[arg(long, requires = "tenant")]
    pub clear: bool,
    /// Print the limits as JSON: an object by tenant, {"ceiling": N or null, "floor": N},
    /// with "window_ceiling": P where one is set
    #[arg(long)]
    pub json: bool,
}

/// A percentage of `--window-ceiling`: `20%` or `20`, 1 to 100.
fn percent(s: &str) -> Result<u8, String> {
    let digits = s.strip_suffix('%').unwrap_or(s);
    match digits.parse::<u8>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a percentage from 1% to 100%")),
    }
}

fn describe(l: TenantLimits) -> String {
    let ceiling = l
        .ceiling
        .map_or("no ceiling".into(), |c| format!("ceiling {c}"));
    let window = l.window_ceiling.map_or(String::new(), |p| {
        format!(", at most {p}% of each rate window")
    });
    format!("{ceiling}, floor {}{window}", l.floor)
}

fn print_limits(name: &str, kept: &BTreeMap<String, TenantLimits>, json: bool) {
    if json {
        println!("{}", serde_json::to_string(kept).expect("limits serialize"));
        return;
    }
    if kept.is_empty() {
        println!("no tenant limits on {name}");
        return;
    }
    let width = kept.keys().map(String::len).max().unwrap_or(0).max(6);
    println!("{:width$}  CEILING  FLOOR  WINDOWS", "TENANT");
    for (tenant, l) in kept {
        let ceiling = l.ceiling.map_or("-".into(), |c| c.to_string());
        let window = l.window_ceiling.map_or("-".into(), |p| format!("{p}%"));
        println!("{tenant:width$}  {ceiling:>7}  {:>5}  {window:>7}", l.floor);
    }
}
