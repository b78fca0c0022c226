//! When each semaphore may next expire a lease or queue entry, as this process last heard it
//! from a step's reply: what [`crate::seam::Backend::next_expiry`] answers on the stores
//! whose expiries are purged only by steps (Redis, PostgreSQL). A waiter wakes then as well
//! as at its heartbeat, so a permit freed by a holder that died is handed on at its expiry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::Name;

/// Entries above which those that have passed are dropped.
const KEPT: usize = 1024;

/// Per semaphore: the instant, on this process's clock, of its next possible expiry.
#[derive(Debug, Default)]
pub struct Expiries(Mutex<HashMap<Name, Instant>>);

impl Expiries {
    /// A reply that has just arrived said `name` may next expire something `after` from its
    /// step (the step ran before the reply arrived, so the instant is not early).
    pub fn note(&self, name: &Name, after: Duration) {
        let now = Instant::now();
        let mut map = self.0.lock().unwrap();
        if map.len() >= KEPT {
            map.retain(|_, at| *at > now);
        }
        match map.get_mut(name) {
            Some(at) => *at = now + after,
            None => {
                map.insert(name.clone(), now + after);
            }
        }
    }

    /// The last instant noted for `name`.
    pub fn get(&self, name: &Name) -> Option<Instant> {
        self.0.lock().unwrap().get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_last_note_wins_and_passed_ones_are_dropped_when_many() {
        let e = Expiries::default();
        let a = Name::new("a").unwrap();
        assert_eq!(e.get(&a), None);
        e.note(&a, Duration::from_secs(60));
        e.note(&a, Duration::from_secs(1));
        let at = e.get(&a).unwrap();
        assert!(at <= Instant::now() + Duration::from_secs(1), "{at:?}");
        for i in 1..KEPT {
            e.note(&Name::new(format!("n{i}")).unwrap(), Duration::ZERO);
        }
        assert_eq!(e.0.lock().unwrap().len(), KEPT);
        // The map is full: the next note drops every entry that has passed.
        tokio::time::sleep(Duration::from_millis(2)).await;
        e.note(&Name::new("b").unwrap(), Duration::from_secs(5));
        assert_eq!(e.0.lock().unwrap().len(), 2);
    }
}
