use std::time::Duration;
use tessera::*;

#[tokio::test]
async fn memory_smoke() {
    let store = Store::connect("memory://smoke").await.unwrap();
    let sem = store.semaphore("s", 2).unwrap();
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    let s2 = sem.clone();
    let h = tokio::spawn(async move { s2.acquire_many(2).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(a);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!h.is_finished());
    assert!(b.release().await.unwrap());
    let c = h.await.unwrap();
    assert_eq!(c.seats(), &[0, 1]);
    let st = sem.status().await.unwrap();
    assert_eq!(st.used, 2);
    drop(c);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.status("s").await.unwrap().is_none());
}
